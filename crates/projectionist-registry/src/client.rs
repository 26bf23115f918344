//! The registry's REST API: a schema by id, a subject's version; each answer classified.

use std::time::Duration;

use serde::Deserialize;

use crate::{config::redact_userinfo, Error, RegistryConfig, Result};

/// A schema as the registry gives it.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub(crate) struct Fetched {
    pub schema: String,
    /// `AVRO` when absent, as in Confluent's API.
    #[serde(rename = "schemaType", default)]
    pub schema_type: Option<String>,
    #[serde(default)]
    pub references: Vec<Reference>,
}

/// A reference from one schema to another: an import (Protobuf) or a named type (Avro).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub(crate) struct Reference {
    pub name: String,
    pub subject: String,
    pub version: i64,
}

/// What a GET came to.
#[derive(Debug)]
pub(crate) enum Answer<T> {
    Found(T),
    /// A registry's 404 (Confluent error codes 40401–40403).
    NotFound,
}

pub(crate) struct Client {
    http: reqwest::Client,
    base: String,
    /// The URL without credentials, for errors and logs.
    pub shown: String,
    auth: Option<(String, Option<String>)>,
}

impl Client {
    pub fn new(config: &RegistryConfig) -> Result<Self> {
        let timeout = Duration::from_millis(config.timeout_ms);
        let mut builder = reqwest::Client::builder().timeout(timeout).connect_timeout(timeout);
        if let Some(path) = &config.ca_file {
            let pem = read(path)?;
            for cert in reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| config_error(path, e))? {
                builder = builder.add_root_certificate(cert);
            }
        }
        if let Some(path) = &config.client_identity_file {
            let identity = reqwest::Identity::from_pem(&read(path)?).map_err(|e| config_error(path, e))?;
            builder = builder.identity(identity);
        }
        let http = builder.build().map_err(|e| Error::Config(format!("the HTTP client: {e}")))?;
        let auth = config.username.clone().map(|user| (user, config.password.clone()));
        Ok(Self { http, base: config.url.trim_end_matches('/').to_owned(), shown: redact_userinfo(&config.url), auth })
    }

    /// `GET /schemas/ids/{id}`.
    pub async fn schema(&self, id: u32) -> Result<Answer<Fetched>> {
        self.get(&format!("/schemas/ids/{id}")).await
    }

    /// `GET /subjects/{subject}/versions/{version}` (`version`: a number or `latest`).
    pub async fn subject_version(&self, subject: &str, version: &str) -> Result<Answer<Fetched>> {
        self.get(&format!("/subjects/{}/versions/{version}", encode_segment(subject))).await
    }

    async fn get<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<Answer<T>> {
        let mut request = self.http.get(format!("{}{path}", self.base)).header("Accept", "application/json");
        if let Some((user, password)) = &self.auth {
            request = request.basic_auth(user, password.as_ref());
        }
        let unavailable = |reason: String| Error::Unavailable { url: self.shown.clone(), reason };
        let response = request.send().await.map_err(|e| unavailable(cause(&e)))?;
        let status = response.status();
        let body = response.bytes().await.map_err(|e| unavailable(cause(&e)))?;
        classify(status.as_u16(), &body).map_err(|reason| unavailable(format!("GET {path}: {reason}")))
    }
}

/// A registry's answer: found, a registry's 404, or why the registry is taken as unavailable.
fn classify<T: serde::de::DeserializeOwned>(status: u16, body: &[u8]) -> Result<Answer<T>, String> {
    #[derive(Deserialize)]
    struct ErrorBody {
        error_code: i64,
    }
    match status {
        200 => serde_json::from_slice(body)
            .map(Answer::Found)
            .map_err(|e| format!("an answer that is not a registry's ({e})")),
        // Only a registry's own 404 means "no such schema"; any other 404 (a wrong base URL)
        // would turn every message into a dead letter, so it is an outage to fix instead.
        404 => match serde_json::from_slice::<ErrorBody>(body) {
            Ok(ErrorBody { error_code: 40401..=40403 }) => Ok(Answer::NotFound),
            _ => Err("404 without a registry's error code: is the URL the registry's API?".into()),
        },
        401 | 403 => Err(format!("HTTP {status}: check the registry's credentials")),
        _ => Err(format!("HTTP {status}: {}", String::from_utf8_lossy(&body[..body.len().min(200)]))),
    }
}

/// What went wrong, without reqwest's own message: that names the URL, which may hold
/// credentials.
fn cause(error: &reqwest::Error) -> String {
    let mut text = String::from(match () {
        _ if error.is_timeout() => "timed out",
        _ if error.is_connect() => "could not connect",
        _ => "the request failed",
    });
    let mut source = std::error::Error::source(error);
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

/// A subject as one path segment (subjects may hold `/` or spaces).
fn encode_segment(subject: &str) -> String {
    subject
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn read(path: &std::path::Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| config_error(path, e))
}

fn config_error(path: &std::path::Path, error: impl std::fmt::Display) -> Error {
    Error::Config(format!("{}: {error}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_tells_not_found_from_outage() {
        let found: Answer<Fetched> = classify(200, br#"{"schema":"\"string\""}"#).unwrap();
        assert!(matches!(found, Answer::Found(Fetched { schema_type: None, .. })));
        let registry_404 = br#"{"message":"Schema 999 not found.","error_code":40403}"#;
        assert!(matches!(classify::<Fetched>(404, registry_404), Ok(Answer::NotFound)));
        assert!(classify::<Fetched>(404, b"<html>no</html>").unwrap_err().contains("is the URL"));
        assert!(classify::<Fetched>(503, b"busy").unwrap_err().contains("503"));
        assert!(classify::<Fetched>(429, b"").unwrap_err().contains("429"));
        assert!(classify::<Fetched>(401, b"").unwrap_err().contains("credentials"));
        assert!(classify::<Fetched>(200, b"<html>").unwrap_err().contains("not a registry's"));
    }

    #[test]
    fn subjects_are_one_segment() {
        assert_eq!(encode_segment("orders-value"), "orders-value");
        assert_eq!(encode_segment("a/b c"), "a%2Fb%20c");
    }

    #[test]
    fn a_missing_ca_file_is_a_config_error() {
        let config = RegistryConfig::new("https://r").with_ca_file("/nonexistent/ca.pem");
        assert!(matches!(Client::new(&config), Err(Error::Config(_))));
    }
}
