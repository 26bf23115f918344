//! The console's pages, rendered as plain HTML (every value escaped).

use std::fmt::Write as _;

use projectionist_postgres::park::{self, StoredDeadLetter};

use super::{Console, Payload};
use crate::status;

/// `text` escaped for HTML text and attribute values.
pub(super) fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A whole page around `body`.
pub(super) fn frame(title: &str, body: &str) -> String {
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{} · projectionist</title>\
         <link rel=\"stylesheet\" href=\"/console/uplot.css\"><style>{STYLE}</style></head>\
         <body><header><a href=\"/console\">projectionist console</a></header><main>{body}</main></body></html>",
        esc(title)
    )
}

const STYLE: &str =
    "body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#222}header{background:#1f2937;padding:8px 16px}\
header a{color:#fff;text-decoration:none;font-weight:600}main{padding:8px 16px;max-width:1200px}\
table{border-collapse:collapse;margin:4px 0 16px}td,th{border-bottom:1px solid #ddd;padding:4px 8px;text-align:left;\
vertical-align:top}th{background:#f3f4f6}.num{text-align:right}.bad{color:#b91c1c}.ok{color:#15803d}\
pre{background:#f3f4f6;padding:8px;white-space:pre-wrap;word-break:break-all}form.act{display:inline-block;\
margin:2px 0}form.act input{width:9em}.lag-chart{min-height:230px}";

/// An error page.
pub(super) fn error(message: &str) -> String {
    frame("error", &format!("<h1>Cannot show this</h1><p class=\"bad\">{}</p>", esc(message)))
}

/// The result of an action, and the way back.
pub(super) fn done(title: &str, message: &str, ok: bool) -> String {
    let class = if ok { "ok" } else { "bad" };
    let body = format!(
        "<h1>{}</h1><p class=\"{class}\" id=\"result\">{}</p><p><a href=\"/console\">Back to the console</a></p>",
        esc(title),
        esc(message)
    );
    frame(title, &body)
}

/// The overview: readiness, halts, lag (table and chart), rebuilds, parked aggregates and
/// open dead letters.
pub(super) async fn overview(console: &Console) -> anyhow::Result<String> {
    let mut body = String::from("<h1>Projections</h1>");
    let state = console.readiness.state().await;
    let ready =
        if state.is_ready() { "<span class=\"ok\">ready</span>" } else { "<span class=\"bad\">not ready</span>" };
    let _ = write!(body, "<p id=\"ready\">{ready}: {}</p>", esc(&state.to_string()));
    halts(&mut body, &console.readiness.halts());
    let positions = status::positions(&console.pool, &console.client, &console.registrations).await?;
    lag(&mut body, console, &positions);
    let rebuilds = status::rebuilds(&console.pool, &console.registrations, &positions).await?;
    if !rebuilds.is_empty() {
        body.push_str(
            "<h2>Rebuilds under way</h2><table id=\"rebuilds\"><tr><th>projection</th><th class=\"num\">read</th>\
                       <th class=\"num\">of</th><th class=\"num\">behind live</th><th>ETA</th></tr>",
        );
        for (name, read, high, live) in rebuilds {
            let eta = console.history.lock().ok().and_then(|mut h| h.eta(name, read, high));
            let eta = eta.map_or("measuring…".to_owned(), |s| format!("{s} s"));
            let _ = write!(
                body,
                "<tr><td>{}</td><td class=\"num\">{read}</td><td class=\"num\">{high}</td><td class=\"num\">{live}</td><td>{eta}</td></tr>",
                esc(name)
            );
        }
        body.push_str("</table>");
    }
    parked(&mut body, console).await?;
    dead_letters(&mut body, console).await?;
    Ok(frame("console", &body))
}

fn halts(body: &mut String, halts: &[String]) {
    body.push_str("<h2>Halts</h2>");
    if halts.is_empty() {
        body.push_str("<p id=\"halts\">No partition is halted.</p>");
        return;
    }
    body.push_str("<ul id=\"halts\">");
    for halt in halts {
        let _ = write!(body, "<li class=\"bad\">{}</li>", esc(halt));
    }
    body.push_str(
        "</ul><p>Nothing at or after a halted offset is applied. A halt that says when it is retried heals by \
         itself once what its reason names is fixed (a table, a permission, a constraint). Any other halt stays \
         until the process restarts: fix the projection or the event's producer, or skip the event. \
         operations.md, \"When a partition halts\", has each case.</p>",
    );
}

fn lag(body: &mut String, console: &Console, positions: &[status::Position]) {
    body.push_str(
        "<h2>Lag</h2><div class=\"lag-chart\" id=\"lag-chart\" data-unit=\"offsets\"></div>\
         <div class=\"lag-chart\" id=\"lag-seconds-chart\" data-unit=\"seconds\"></div>\
         <script src=\"/console/uplot.js\"></script><script src=\"/console/chart.js\"></script>\
         <table id=\"lag\"><tr><th>projection</th><th>topic</th><th class=\"num\">partition</th>\
         <th class=\"num\">checkpoint</th><th class=\"num\">head</th><th class=\"num\">lag (offsets)</th>\
         <th class=\"num\">lag (seconds)</th></tr>",
    );
    let history = console.history.lock().ok();
    for p in positions {
        let lag = p.high - p.checkpoint.unwrap_or(p.low);
        let key = (p.projection.clone(), p.topic.clone(), p.partition);
        let seconds = history.as_ref().and_then(|h| h.seconds(&key)).map_or("-".to_owned(), |s| format!("{s:.1}"));
        let checkpoint = p.checkpoint.map_or("-".to_owned(), |c| c.to_string());
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{checkpoint}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{lag}</td><td class=\"num\">{seconds}</td></tr>",
            esc(&p.projection),
            esc(&p.topic),
            p.partition,
            p.high
        );
    }
    body.push_str("</table>");
}

/// The fields every action form carries: the token and who acts.
fn credentials() -> &'static str {
    "<input type=\"password\" name=\"token\" placeholder=\"token\" required aria-label=\"token\"> \
     <input type=\"text\" name=\"operator\" placeholder=\"your name\" aria-label=\"your name\">"
}

async fn parked(body: &mut String, console: &Console) -> anyhow::Result<()> {
    let parked = park::list(&console.pool, None).await?;
    body.push_str("<h2>Parked aggregates</h2>");
    if parked.is_empty() {
        body.push_str("<p id=\"parked\">No aggregate is parked.</p>");
        return Ok(());
    }
    body.push_str(
        "<table id=\"parked\"><tr><th>projection</th><th>aggregate</th><th class=\"num\">waiting for</th>\
         <th class=\"num\">held</th><th>since</th><th>reason</th><th>what to do</th></tr>",
    );
    for p in &parked {
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}/{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td><td>{}</td><td>{}",
            esc(&p.projection),
            esc(&p.aggregate_type),
            esc(&p.aggregate_id),
            p.waiting_for,
            p.held,
            p.since.format("%Y-%m-%d %H:%M:%S UTC"),
            esc(&p.reason),
            esc(&p.to_resume())
        );
        // Behind a dead letter, the dead letter's actions resume it; behind a gap, a skip.
        if console.actions() && p.dead_letter.is_none() {
            let _ = write!(
                body,
                "<form class=\"act\" method=\"post\" action=\"/console/parked/skip\">\
                 <input type=\"hidden\" name=\"projection\" value=\"{}\"><input type=\"hidden\" name=\"aggregate_type\" \
                 value=\"{}\"><input type=\"hidden\" name=\"aggregate_id\" value=\"{}\">\
                 <input type=\"text\" name=\"reason\" placeholder=\"why skip it\" required aria-label=\"reason\"> {}\
                 <button>Skip the missing version</button></form>",
                esc(&p.projection),
                esc(&p.aggregate_type),
                esc(&p.aggregate_id),
                credentials()
            );
        }
        body.push_str("</td></tr>");
    }
    body.push_str("</table>");
    Ok(())
}

async fn dead_letters(body: &mut String, console: &Console) -> anyhow::Result<()> {
    let letters = park::dead_letters(&console.pool, None, false).await?;
    body.push_str("<h2>Dead letters</h2>");
    if !console.actions() {
        body.push_str("<p>Actions are off: start `run` with --console-token (or PROJECTIONIST_CONSOLE_TOKEN).</p>");
    }
    if letters.is_empty() {
        body.push_str("<p id=\"dead-letters\">No open dead letter.</p>");
        return Ok(());
    }
    body.push_str(
        "<table id=\"dead-letters\"><tr><th class=\"num\">id</th><th>projection</th><th>aggregate</th>\
         <th>read at</th><th>error</th><th>actions</th></tr>",
    );
    for d in &letters {
        let aggregate = match (&d.aggregate_type, &d.aggregate_id, d.version) {
            (Some(t), Some(i), Some(v)) => format!("{}/{} v{v}", esc(t), esc(i)),
            _ => "none usable".to_owned(),
        };
        let at = format!("{}/{}@{}", d.topic, d.partition, d.offset.map_or("-".to_owned(), |o| o.to_string()));
        let _ = write!(
            body,
            "<tr data-id=\"{id}\"><td class=\"num\"><a href=\"/console/dead-letters/{id}\">{id}</a></td><td>{}</td>\
             <td>{aggregate}</td><td>{}</td><td>{}</td><td>",
            esc(&d.projection),
            esc(&at),
            esc(&d.error),
            id = d.id
        );
        if console.actions() {
            action_forms(body, d.id);
        }
        body.push_str("</td></tr>");
    }
    body.push_str("</table>");
    Ok(())
}

/// The retry and discard forms of dead letter `id`.
fn action_forms(body: &mut String, id: i64) {
    let _ = write!(
        body,
        "<form class=\"act\" method=\"post\" action=\"/console/dead-letters/{id}/retry\">{creds}\
         <button>Retry</button></form><br><form class=\"act\" method=\"post\" \
         action=\"/console/dead-letters/{id}/discard\"><input type=\"text\" name=\"reason\" placeholder=\"why discard it\" \
         required aria-label=\"reason\"> {creds}<button>Discard (accept its loss)</button></form>",
        creds = credentials()
    );
}

/// One dead letter: where it was read, its error, headers and payload as much as `shown`
/// lets (at most `most`), and its actions.
pub(super) fn dead_letter(d: &StoredDeadLetter, shown: Payload, most: Payload, actions: bool) -> String {
    let mut body = format!("<h1>Dead letter {}</h1><table id=\"letter\">", d.id);
    let at = format!("{}/{}@{}", d.topic, d.partition, d.offset.map_or("-".to_owned(), |o| o.to_string()));
    let aggregate = match (&d.aggregate_type, &d.aggregate_id, d.version) {
        (Some(t), Some(i), Some(v)) => format!("{t}/{i} version {v}"),
        _ => "none usable (dead-lettered alone)".to_owned(),
    };
    for (name, value) in [
        ("projection", d.projection.clone()),
        ("read at", at),
        ("aggregate", aggregate),
        ("reason", d.reason.clone()),
        ("attempts", format!("{} (first {}, last {})", d.attempts, d.first_seen, d.last_seen)),
        ("resolution", d.resolution.clone().unwrap_or_else(|| "open".to_owned())),
    ] {
        let _ = write!(body, "<tr><th>{name}</th><td>{}</td></tr>", esc(&value));
    }
    let _ = write!(
        body,
        "</table><h2>Error</h2><pre id=\"error\">{}</pre><h2>Headers</h2><table id=\"headers\">",
        esc(&d.error)
    );
    if d.header_names.is_empty() {
        body.push_str("<tr><td>none</td></tr>");
    }
    for (name, value) in d.header_names.iter().zip(&d.header_values) {
        let value = value.as_deref().map_or("(null)".to_owned(), |v| masked(v, shown));
        let _ = write!(body, "<tr><th>{}</th><td>{}</td></tr>", esc(&status::shown(name)), esc(&value));
    }
    let size = d.payload_bytes.unwrap_or(d.payload.len() as i64);
    let _ = write!(body, "</table><h2>Payload ({size} bytes, shown {})</h2>", format!("{shown:?}").to_lowercase());
    let _ = write!(body, "<pre id=\"payload\">{}</pre><p>", esc(&masked(&d.payload, shown)));
    for option in [Payload::None, Payload::Masked, Payload::Full].into_iter().filter(|p| *p <= most && *p != shown) {
        let name = format!("{option:?}").to_lowercase();
        let _ = write!(body, "<a href=\"?payload={name}\">show {name}</a> ");
    }
    body.push_str("</p>");
    if actions && d.resolution.is_none() {
        body.push_str("<h2>Actions</h2>");
        action_forms(&mut body, d.id);
    }
    frame(&format!("dead letter {}", d.id), &body)
}

/// Bytes as the console shows them: nothing but their size, their JSON shape with every
/// value masked, or as they are.
pub(super) fn masked(bytes: &[u8], shown: Payload) -> String {
    match shown {
        Payload::None => format!("({} bytes hidden)", bytes.len()),
        Payload::Full => status::shown(bytes),
        Payload::Masked => match serde_json::from_slice::<serde_json::Value>(bytes) {
            Ok(value) => mask(value).to_string(),
            Err(_) => format!("({} bytes, not JSON: masked)", bytes.len()),
        },
    }
}

/// `value` with its keys and shape kept and every scalar replaced by `***`.
fn mask(value: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Object(map) => Value::Object(map.into_iter().map(|(k, v)| (k, mask(v))).collect()),
        Value::Array(items) => Value::Array(items.into_iter().map(mask).collect()),
        Value::Null => Value::Null,
        _ => Value::from("***"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_is_hidden_masked_or_shown_as_asked() {
        let payload = br#"{"owner":"Ada","amount":5,"tags":["a",null]}"#;
        assert_eq!(masked(payload, Payload::None), "(44 bytes hidden)");
        assert_eq!(masked(payload, Payload::Masked), r#"{"amount":"***","owner":"***","tags":["***",null]}"#);
        assert_eq!(masked(payload, Payload::Full), String::from_utf8_lossy(payload));
        assert_eq!(masked(b"\xff secret", Payload::Masked), "(8 bytes, not JSON: masked)");
    }

    #[test]
    fn what_the_pages_show_is_escaped() {
        assert_eq!(esc("<script>\"a\"&'b'</script>"), "&lt;script&gt;&quot;a&quot;&amp;&#39;b&#39;&lt;/script&gt;");
    }
}
