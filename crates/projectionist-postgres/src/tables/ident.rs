//! SQL identifiers from configuration: validated, then always quoted.

use std::fmt;

use crate::error::Error;
use crate::error::Result;

/// A validated, quoted SQL identifier, optionally schema-qualified (`schema.table`).
///
/// Each part must be 1–63 bytes of ASCII letters, digits and `_`, not starting with a
/// digit. Names are used exactly as given (quoted), so reserved words such as `order` work
/// and case is preserved.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Ident {
    raw: String,
    quoted: String,
}

impl Ident {
    /// Validates `name` (`name` or `schema.name`).
    pub fn new(name: &str) -> Result<Self> {
        let parts: Vec<&str> = name.split('.').collect();
        if parts.len() > 2 {
            return Err(Error::Identifier { ident: name.into(), reason: "at most one '.' (schema.name)" });
        }
        for part in &parts {
            check_part(name, part)?;
        }
        let quoted = parts.iter().map(|p| format!("\"{p}\"")).collect::<Vec<_>>().join(".");
        Ok(Self { raw: name.to_owned(), quoted })
    }

    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.raw
    }

    /// The name quoted for SQL.
    pub fn quoted(&self) -> &str {
        &self.quoted
    }
}

fn check_part(whole: &str, part: &str) -> Result<()> {
    let err = |reason| Err(Error::Identifier { ident: whole.into(), reason });
    if part.is_empty() {
        return err("empty name");
    }
    if part.len() > 63 {
        return err("longer than 63 bytes (PostgreSQL would truncate it)");
    }
    if part.starts_with(|c: char| c.is_ascii_digit()) {
        return err("starts with a digit");
    }
    if !part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return err("only ASCII letters, digits and '_' are allowed");
    }
    Ok(())
}

impl fmt::Display for Ident {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.quoted)
    }
}

impl fmt::Debug for Ident {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Ident({})", self.quoted)
    }
}

#[cfg(test)]
mod tests {
    use super::Ident;

    #[test]
    fn quotes_valid_names() {
        assert_eq!(Ident::new("bank_accounts").unwrap().quoted(), "\"bank_accounts\"");
        assert_eq!(Ident::new("read.Orders").unwrap().quoted(), "\"read\".\"Orders\"");
        assert_eq!(Ident::new("order").unwrap().to_string(), "\"order\"");
    }

    #[test]
    fn rejects_hostile_names_with_the_reason() {
        let cases = [
            ("t\"; DROP TABLE x; --", "only ASCII letters"),
            ("a b", "only ASCII letters"),
            ("", "empty name"),
            ("a..b", "at most one"),
            ("s.", "empty name"),
            ("9lives", "starts with a digit"),
            ("naïve", "only ASCII letters"),
        ];
        for (name, reason) in cases {
            let err = Ident::new(name).unwrap_err().to_string();
            assert!(err.contains(reason), "{name:?}: {err}");
            assert!(err.starts_with("invalid identifier"), "{err}");
        }
        assert!(Ident::new(&"x".repeat(64)).unwrap_err().to_string().contains("63 bytes"));
        assert!(Ident::new(&"x".repeat(63)).is_ok());
    }
}
