//! How to reach the registry.

use std::{fmt, path::PathBuf};

use serde::Deserialize;

/// How to reach a registry that speaks Confluent's REST API.
///
/// ```
/// use projectionist_registry::RegistryConfig;
///
/// let config = RegistryConfig::new("https://registry.example:8081")
///     .with_basic_auth("reader", "s3cret")
///     .with_ca_file("/etc/ssl/registry-ca.pem");
/// assert!(!format!("{config:?}").contains("s3cret"));
/// ```
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryConfig {
    /// The API's base URL, e.g. `http://127.0.0.1:8081` or Apicurio's
    /// `http://127.0.0.1:8080/apis/ccompat/v7`.
    pub url: String,
    /// A user name for HTTP basic auth (Confluent Cloud: the API key).
    #[serde(default)]
    pub username: Option<String>,
    /// Its password (Confluent Cloud: the API secret). Never logged.
    #[serde(default)]
    pub password: Option<String>,
    /// A PEM file of CA certificates to trust, besides the system's.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// A PEM file with a client certificate and its private key (mutual TLS).
    #[serde(default)]
    pub client_identity_file: Option<PathBuf>,
    /// How long one request may take, connection included, in milliseconds.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
}

fn default_timeout_ms() -> u64 {
    10_000
}

impl RegistryConfig {
    /// A registry at `url`, without auth, trusting the system's CAs.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            username: None,
            password: None,
            ca_file: None,
            client_identity_file: None,
            timeout_ms: default_timeout_ms(),
        }
    }

    /// With HTTP basic auth.
    pub fn with_basic_auth(mut self, username: impl Into<String>, password: impl Into<String>) -> Self {
        self.username = Some(username.into());
        self.password = Some(password.into());
        self
    }

    /// Trusting the CA certificates in a PEM file too.
    pub fn with_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_file = Some(path.into());
        self
    }

    /// Presenting the client certificate and key in a PEM file.
    pub fn with_client_identity_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.client_identity_file = Some(path.into());
        self
    }

    /// With another request timeout.
    pub fn with_timeout_ms(mut self, timeout_ms: u64) -> Self {
        self.timeout_ms = timeout_ms;
        self
    }
}

impl fmt::Debug for RegistryConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryConfig")
            .field("url", &redact_userinfo(&self.url))
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("ca_file", &self.ca_file)
            .field("client_identity_file", &self.client_identity_file)
            .field("timeout_ms", &self.timeout_ms)
            .finish()
    }
}

/// `url` without the user and password it may carry (`https://u:p@host` → `https://***@host`).
pub(crate) fn redact_userinfo(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://***{}", &rest[at..]),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_redacts_the_password_and_the_urls_userinfo() {
        let config = RegistryConfig::new("https://u:pw@host:8081/x").with_basic_auth("key", "secret");
        let debug = format!("{config:?}");
        assert!(!debug.contains("secret") && !debug.contains("pw"), "{debug}");
        assert!(debug.contains("https://***@host:8081/x") && debug.contains("key"), "{debug}");
    }

    #[test]
    fn redact_leaves_plain_urls() {
        assert_eq!(redact_userinfo("http://127.0.0.1:8181/apis/ccompat/v7"), "http://127.0.0.1:8181/apis/ccompat/v7");
        assert_eq!(redact_userinfo("http://h/a@b"), "http://h/a@b");
        assert_eq!(redact_userinfo("not a url"), "not a url");
    }

    #[test]
    fn deserializes_with_defaults() {
        let config: RegistryConfig = serde_json::from_str(r#"{"url":"http://r"}"#).unwrap();
        assert_eq!(config.timeout_ms, 10_000);
        assert!(serde_json::from_str::<RegistryConfig>(r#"{"url":"http://r","pasword":"x"}"#).is_err());
    }
}
