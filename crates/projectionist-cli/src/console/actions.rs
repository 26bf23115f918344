//! The console's actions: a dead letter retried or discarded, a parked aggregate's missing
//! version skipped, through the CLI's own code ([`crate::held`]). Each needs the console's
//! token; a request sent by another site is refused; each is logged with who and what.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use axum::Form;
use projectionist_kafka::metrics::CONSOLE_ACTIONS;
use projectionist_postgres::park::Resolve;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::{html, page, Console};

/// What every action's form carries.
#[derive(Deserialize)]
pub(super) struct Credentials {
    #[serde(default)]
    token: String,
    /// The name the operator typed, for the log.
    #[serde(default)]
    operator: String,
}

#[derive(Deserialize)]
pub(super) struct Retry {
    #[serde(flatten)]
    who: Credentials,
}

#[derive(Deserialize)]
pub(super) struct Discard {
    #[serde(flatten)]
    who: Credentials,
    #[serde(default)]
    reason: String,
}

#[derive(Deserialize)]
pub(super) struct Skip {
    #[serde(flatten)]
    who: Credentials,
    projection: String,
    aggregate_type: String,
    aggregate_id: String,
    #[serde(default)]
    reason: String,
}

pub(super) async fn retry(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Path(id): Path<i64>,
    Form(form): Form<Retry>,
) -> Response {
    let what = format!("retry dead letter {id}");
    if let Some(refused) = refused(&console, &headers, &form.who, ("retry", &what)) {
        return refused;
    }
    let done = crate::held::resolve(&console.pool, &console.registrations, id, Resolve::Retry).await;
    finish(&form.who, ("retry", &what), done)
}

pub(super) async fn discard(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Path(id): Path<i64>,
    Form(form): Form<Discard>,
) -> Response {
    let what = format!("discard dead letter {id}");
    if let Some(refused) = refused(&console, &headers, &form.who, ("discard", &what)) {
        return refused;
    }
    if form.reason.trim().is_empty() {
        return html(StatusCode::BAD_REQUEST, page::done("Refused", "say why the event may be lost (reason)", false));
    }
    let action = Resolve::Discard { reason: form.reason.clone() };
    let done = crate::held::resolve(&console.pool, &console.registrations, id, action).await;
    finish(&form.who, ("discard", &format!("{what} ({})", form.reason)), done)
}

pub(super) async fn skip(State(console): State<Arc<Console>>, headers: HeaderMap, Form(form): Form<Skip>) -> Response {
    let what =
        format!("skip the missing version of {}/{} in {}", form.aggregate_type, form.aggregate_id, form.projection);
    if let Some(refused) = refused(&console, &headers, &form.who, ("skip", &what)) {
        return refused;
    }
    if form.reason.trim().is_empty() {
        return html(StatusCode::BAD_REQUEST, page::done("Refused", "say why the version may be lost (reason)", false));
    }
    let aggregate = (form.aggregate_type.as_str(), form.aggregate_id.as_str());
    let skipped =
        crate::held::skip(&console.pool, &console.registrations, &form.projection, aggregate, &form.reason).await;
    finish(&form.who, ("skip", &format!("{what} ({})", form.reason)), skipped.map(|said| (true, said)))
}

/// The refusal of an action, if it is one: actions off, a request from another site, or a
/// token that does not match. Logged.
fn refused(console: &Console, headers: &HeaderMap, who: &Credentials, (action, what): Act) -> Option<Response> {
    let refused = || counted(action, "refused");
    let operator = operator(who);
    let Some(token) = &console.settings.token else {
        tracing::warn!(%operator, action = %what, "Console action refused: actions are off (no --console-token).");
        refused();
        return Some(html(
            StatusCode::FORBIDDEN,
            page::done("Refused", "actions are off: no token is configured", false),
        ));
    };
    if let Some(site) = cross_site(headers) {
        tracing::warn!(%operator, action = %what, from = %site, "Console action refused: sent by another site.");
        refused();
        return Some(html(StatusCode::FORBIDDEN, page::done("Refused", "a request from another site", false)));
    }
    if !same_token(token, &who.token) {
        tracing::warn!(%operator, action = %what, "Console action refused: wrong or missing token.");
        refused();
        return Some(html(
            StatusCode::FORBIDDEN,
            page::done("Refused", "wrong or missing token; nothing changed", false),
        ));
    }
    None
}

/// The action's result page, logged.
fn finish(who: &Credentials, (action, what): Act, done: anyhow::Result<(bool, String)>) -> Response {
    let operator = operator(who);
    match done {
        Ok((resolved, said)) => {
            counted(action, if resolved { "done" } else { "still_failing" });
            tracing::info!(%operator, action = %what, result = %said, "Console action done.");
            html(StatusCode::OK, page::done(if resolved { "Done" } else { "Still failing" }, &said, resolved))
        }
        Err(e) => {
            counted(action, "failed");
            let e = format!("{e:#}");
            tracing::warn!(%operator, action = %what, error = %e, "Console action failed.");
            html(StatusCode::CONFLICT, page::done("Not done", &e, false))
        }
    }
}

/// An action: its name in the metric, and what it does in words for the log.
type Act<'a> = (&'static str, &'a str);

/// One more `action` with `outcome` in `projectionist_console_actions_total`.
fn counted(action: &'static str, outcome: &'static str) {
    metrics::counter!(CONSOLE_ACTIONS, "action" => action, "outcome" => outcome).increment(1);
}

fn operator(who: &Credentials) -> String {
    let name: String = who.operator.trim().chars().filter(|c| !c.is_control()).take(64).collect();
    if name.is_empty() {
        "unnamed".to_owned()
    } else {
        name
    }
}

/// Where a request came from when another site sent it: its `Origin` not this `Host`, or
/// the browser saying `Sec-Fetch-Site: cross-site` (or `same-site`: another subdomain).
fn cross_site(headers: &HeaderMap) -> Option<String> {
    let text = |name: header::HeaderName| headers.get(name).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    if let Some(site) = text(header::HeaderName::from_static("sec-fetch-site")) {
        if site != "same-origin" && site != "none" {
            return Some(format!("Sec-Fetch-Site: {site}"));
        }
    }
    let origin = text(header::ORIGIN)?;
    let host = text(header::HOST).unwrap_or_default();
    let origin_host = origin.split_once("://").map_or(origin.as_str(), |(_, rest)| rest);
    (origin_host != host).then(|| format!("Origin: {origin}"))
}

/// Whether `given` is the token, compared in constant time (their SHA-256 digests, so that
/// neither the length nor a prefix shows in the time taken).
fn same_token(token: &str, given: &str) -> bool {
    let (a, b) = (Sha256::digest(token.as_bytes()), Sha256::digest(given.as_bytes()));
    a.iter().zip(b.iter()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderMap, HeaderValue};

    use super::{cross_site, same_token};

    #[test]
    fn the_token_must_match_exactly() {
        assert!(same_token("s3cret", "s3cret"));
        for wrong in ["", "s3cre", "s3cret ", "S3cret"] {
            assert!(!same_token("s3cret", wrong), "{wrong:?}");
        }
    }

    #[test]
    fn a_request_from_another_site_is_told_apart() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut map = HeaderMap::new();
            for (k, v) in pairs {
                map.insert(*k, HeaderValue::from_static(v));
            }
            map
        };
        assert_eq!(cross_site(&headers(&[("host", "127.0.0.1:9464")])), None, "no Origin: a form or curl");
        let same = headers(&[("host", "127.0.0.1:9464"), ("origin", "http://127.0.0.1:9464")]);
        assert_eq!(cross_site(&same), None);
        let other = headers(&[("host", "127.0.0.1:9464"), ("origin", "http://evil.example")]);
        assert_eq!(cross_site(&other).as_deref(), Some("Origin: http://evil.example"));
        let fetch = headers(&[("host", "127.0.0.1:9464"), ("sec-fetch-site", "cross-site")]);
        assert_eq!(cross_site(&fetch).as_deref(), Some("Sec-Fetch-Site: cross-site"));
        let own = headers(&[("host", "127.0.0.1:9464"), ("sec-fetch-site", "same-origin")]);
        assert_eq!(cross_site(&own), None);
    }
}
