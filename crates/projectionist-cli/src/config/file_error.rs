//! A settings file's errors, told without its text. toml's own message quotes the line at
//! fault, and serde's repeat the value they refuse; the `[kafka]` table may hold passwords.
//! So an error names the file, line, column and key, and what was wrong, never a value.

use std::path::Path;

/// `error`, from parsing `text` (read from `path`), on one line without any of `text`'s values.
pub(crate) fn describe(path: &Path, text: &str, error: &toml::de::Error) -> String {
    let mut line = path.display().to_string();
    if let Some(span) = error.span() {
        let (row, column) = position(text, span.start);
        line.push_str(&format!(": line {row}, column {column}"));
    }
    // A syntax error's message is toml's own, from its grammar; a type error's is serde's,
    // which quotes the value.
    let syntax = toml::from_str::<toml::Table>(text).is_err();
    let message = if syntax { error.message().to_owned() } else { without_values(error.message()) };
    line.push_str(&format!(": {message}"));
    let key = error_keys(error).or_else(|| error.span().and_then(|span| statement_key(text, span.start)));
    if let Some(key) = key {
        line.push_str(&format!(" (at `{key}`)"));
    }
    line
}

/// The 1-based line and column (in characters) of byte `offset` of `text`.
fn position(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset.min(text.len())).unwrap_or(text);
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (before.matches('\n').count() + 1, before[line_start..].chars().count() + 1)
}

/// The keys toml found the error under, `kafka.sasl.password`: it prints them only when
/// it has no text to quote.
fn error_keys(error: &toml::de::Error) -> Option<String> {
    let mut bare = error.clone();
    bare.set_input(None);
    let shown = bare.to_string();
    let keys = shown.strip_prefix(error.message())?.strip_prefix("\nin `")?.strip_suffix("`\n")?;
    Some(keys.to_owned())
}

/// The key of the statement holding byte `offset`: the last line start before it where the
/// text up to there parses (so that no string or array is open there), when that line
/// starts with a key followed by `=` or `:`, or with a table header.
fn statement_key(text: &str, offset: usize) -> Option<String> {
    let before = text.get(..offset.min(text.len()))?;
    let starts = std::iter::once(0).chain(before.match_indices('\n').map(|(i, _)| i + 1));
    let start = starts.rev().find(|&start| toml::from_str::<toml::Table>(&text[..start]).is_ok())?;
    let line = text[start..].lines().next()?.trim_start();
    if let Some(header) = line.strip_prefix('[') {
        let header = header.trim_start_matches('[').trim_start();
        let key = leading_key(header)?;
        return header[key.len()..].trim_start().starts_with(']').then(|| format!("[{}]", key.trim()));
    }
    let key = leading_key(line)?;
    line[key.len()..].trim_start().starts_with(['=', ':']).then(|| key.trim().to_owned())
}

/// The key `line` starts with: bare or quoted parts joined by dots (without escapes).
fn leading_key(line: &str) -> Option<&str> {
    let mut end = 0;
    loop {
        let rest = &line[end..];
        let part = match rest.chars().next()? {
            quote @ ('"' | '\'') => {
                let close = rest[1..].find([quote, '\\', '\n'])? + 1;
                rest[close..].starts_with(quote).then_some(close + 1)?
            }
            _ => rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-')).unwrap_or(rest.len()),
        };
        if part == 0 {
            return None;
        }
        end += part;
        let after = &line[end..];
        match after.trim_start().strip_prefix('.') {
            Some(next) => end = line.len() - next.trim_start().len(),
            None => return Some(&line[..end]),
        }
    }
}

/// serde's `message` without the value it quotes. Messages about a field name it (a key);
/// the others lose everything between what was wrong and what was expected.
fn without_values(message: &str) -> String {
    let names_a_key = ["unknown field", "missing field", "duplicate field", "unexpected keys in table"];
    if names_a_key.iter().any(|prefix| message.starts_with(prefix)) {
        return message.to_owned();
    }
    // The expected part comes last and from the type, so the last ", expected " is its own.
    let expected = message.rsplit_once(", expected ").map(|(_, expected)| expected);
    let what = if let Some(rest) = message.strip_prefix("invalid type: ") {
        let kind = rest.split(|c: char| !(c.is_ascii_alphabetic() || c == ' ')).next().unwrap_or("").trim();
        format!("invalid type: {kind}")
    } else if message.starts_with("unknown variant") {
        "unknown variant".to_owned()
    } else {
        "invalid value".to_owned()
    };
    match expected {
        Some(expected) => format!("{what}, expected {expected}"),
        None => what,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_read_from_the_start_of_its_statement_only() {
        assert_eq!(leading_key("\"sasl.password\" = x"), Some("\"sasl.password\""));
        assert_eq!(leading_key("a . \"b.c\".d= 1"), Some("a . \"b.c\".d"));
        assert_eq!(leading_key("\"open"), None);
        let text = "[kafka]\n\"sasl.jaas.config\" = \"\"\"\nsecret = 1\n\"\"\"\n";
        let at = text.find("secret").unwrap();
        assert_eq!(statement_key(text, at).as_deref(), Some("\"sasl.jaas.config\""), "not a line of the string");
        assert_eq!(statement_key("[kafka]\nSw0rdf1sh\n", 9), None, "not followed by = or :");
        assert_eq!(statement_key("[ kafka ]\n", 3).as_deref(), Some("[kafka]"));
        assert_eq!(position("ab\ncdé\nf", 7), (2, 4));
    }

    #[test]
    fn serdes_messages_lose_the_value_they_quote() {
        assert_eq!(
            without_values("invalid type: string \"x, expected y\", expected u64"),
            "invalid type: string, expected u64"
        );
        assert_eq!(
            without_values("invalid type: integer `4242`, expected a string"),
            "invalid type: integer, expected a string"
        );
        assert_eq!(
            without_values("unknown variant `x`, expected `park` or `halt`"),
            "unknown variant, expected `park` or `halt`"
        );
        assert_eq!(without_values("something `x` custom"), "invalid value");
        assert_eq!(without_values("unknown field `x`, expected `y`"), "unknown field `x`, expected `y`");
    }
}
