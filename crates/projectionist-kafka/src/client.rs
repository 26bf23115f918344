//! Connection settings shared by every Kafka client the product makes (the engine's
//! consumers, the `publish` producer, the admin client, the position readers of `status`
//! and progress), and a preflight that names what fails when the broker cannot be reached.
//!
//! Security is configured with librdkafka's own property names (`security.protocol`,
//! `sasl.mechanism`, `sasl.username`, `sasl.password`, `ssl.ca.location`,
//! `ssl.certificate.location`, `ssl.key.location`, `sasl.oauthbearer.*`, …), so whatever a
//! managed service documents for librdkafka applies as written.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientContext;

use crate::config::redact_userinfo;
use crate::{Error, Result};

/// Where every Kafka client connects and how: bootstrap servers plus librdkafka properties.
/// Deserialised, it reads `brokers` and `kafka` (the properties), as [`crate::EngineConfig`]
/// does.
#[derive(Clone, Default, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaClientConfig {
    /// Bootstrap servers, `host:port[,host:port…]`.
    pub brokers: String,
    /// librdkafka properties applied to every client (security, timeouts, …), the `kafka`
    /// table of a settings file. Only the values of properties known to hold no secret are
    /// ever shown.
    #[serde(default, rename = "kafka", alias = "properties")]
    pub properties: BTreeMap<String, String>,
}

/// Properties whose values are shown in `Debug` and logs; every other value is redacted.
const SHOWN: &[&str] = &[
    "security.protocol",
    "sasl.mechanism",
    "sasl.mechanisms",
    "sasl.oauthbearer.method",
    "sasl.oauthbearer.token.endpoint.url",
    "sasl.oauthbearer.scope",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.endpoint.identification.algorithm",
    "enable.ssl.certificate.verification",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "statistics.interval.ms",
    "debug",
];

/// Whether a property's value may be shown (an allowlist: unknown properties are secret).
pub fn is_shown(key: &str) -> bool {
    SHOWN.contains(&key)
}

/// The properties with every value not known to be harmless replaced by `<redacted>`.
pub fn redacted(properties: &BTreeMap<String, String>) -> BTreeMap<&str, &str> {
    properties.iter().map(|(k, v)| (k.as_str(), if is_shown(k) { v.as_str() } else { "<redacted>" })).collect()
}

impl KafkaClientConfig {
    /// No extra properties: a plaintext connection to `brokers`.
    pub fn new(brokers: impl Into<String>) -> Self {
        Self { brokers: brokers.into(), properties: BTreeMap::new() }
    }

    /// Sets a librdkafka property.
    pub fn with_property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.insert(key.into(), value.into());
        self
    }

    /// A librdkafka config for a new client: the properties, then `bootstrap.servers`.
    pub fn client_config(&self) -> ClientConfig {
        self.client_config_with_defaults(&[])
    }

    /// As [`Self::client_config`], with `defaults` set first so the properties override them.
    pub fn client_config_with_defaults(&self, defaults: &[(&str, &str)]) -> ClientConfig {
        let mut cfg = ClientConfig::new();
        for (k, v) in defaults {
            cfg.set(*k, *v);
        }
        for (k, v) in &self.properties {
            cfg.set(k, v);
        }
        cfg.set("bootstrap.servers", &self.brokers);
        cfg
    }

    /// Asks the brokers for cluster metadata until `timeout`, and fails as soon as librdkafka
    /// reports a TLS, certificate or authentication error, naming that part (never a secret).
    /// Blocking: call it from `spawn_blocking` in async code.
    pub fn preflight(&self, timeout: Duration) -> Result<()> {
        if self.property_is("security.protocol", "SASL_PLAINTEXT") && self.property_is("sasl.mechanism", "PLAIN") {
            tracing::warn!("SASL PLAIN over SASL_PLAINTEXT sends the password unencrypted; use SASL_SSL.");
        }
        let consumer: BaseConsumer<PreflightContext> = self
            .client_config_with_defaults(&[("socket.connection.setup.timeout.ms", "5000")])
            .set("group.id", "projectionist-preflight")
            .create_with_context(PreflightContext::default())
            .map_err(|e| self.connect_error(ConnectFailure::Configuration, refused(&e)))?;
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let fetched = consumer.fetch_metadata(None, left.min(Duration::from_millis(500)));
            let fetch_error = match fetched {
                Ok(_) => return Ok(()),
                Err(e) => e.to_string(),
            };
            // Serves queued events, so the error callback sees librdkafka's own reasons.
            let _ = consumer.poll(Duration::from_millis(50));
            let seen = consumer.context().seen.lock().expect("preflight lock").clone();
            let waited = timeout.saturating_sub(deadline.saturating_duration_since(Instant::now()));
            match seen.cause {
                Some((failure, detail)) if failure.is_definite() => return Err(self.connect_error(failure, detail)),
                // Every bootstrap broker refused or could not be resolved: after a few tries
                // (a broker starting up), that is the answer, with librdkafka's own reason.
                Some((failure, detail))
                    if seen.all_down && (waited >= GIVE_UP_WHEN_ALL_DOWN || unresolvable(&detail)) =>
                {
                    if let Some(silent) = self.silent(&detail, waited) {
                        return Err(silent);
                    }
                    let tried = format!("every bootstrap broker failed for {}s", waited.as_secs().max(1));
                    return Err(self.connect_error(failure, format!("{tried}; last: {detail}")));
                }
                cause if Instant::now() >= deadline => {
                    let (failure, detail) = cause.unwrap_or((ConnectFailure::Timeout, fetch_error));
                    if let Some(silent) = self.silent(&detail, waited) {
                        return Err(silent);
                    }
                    return Err(
                        self.connect_error(failure, format!("no metadata within {}s: {detail}", timeout.as_secs()))
                    );
                }
                _ => {}
            }
        }
    }

    /// When librdkafka gives no reason of a broker's own (a timeout, or only that the brokers
    /// are down) and a bootstrap broker takes a TCP connection all the same: a silent peer,
    /// said as what was seen, after `waited`.
    fn silent(&self, detail: &str, waited: Duration) -> Option<Error> {
        let no_reason = ["timed out", "Timed out", "brokers are down"].iter().any(|s| detail.contains(s));
        if !(detail.is_empty() || no_reason) {
            return None;
        }
        let connected = bootstrap_addresses(&self.brokers).into_iter().find(|address| {
            use std::net::ToSocketAddrs;
            let mut resolved = address.to_socket_addrs().ok().into_iter().flatten();
            resolved.any(|a| std::net::TcpStream::connect_timeout(&a, Duration::from_secs(1)).is_ok())
        })?;
        let detail = format!(
            "connected to {connected}, but no Kafka answer within {}s: a proxy or firewall holding the \
             connection, a listener that is not Kafka's, or a broker too busy to answer",
            waited.as_secs().max(1)
        );
        Some(self.connect_error(ConnectFailure::NoAnswer, detail))
    }

    fn property_is(&self, key: &str, value: &str) -> bool {
        self.properties.get(key).is_some_and(|v| v.eq_ignore_ascii_case(value))
    }

    fn connect_error(&self, failure: ConnectFailure, detail: String) -> Error {
        Error::Connect { brokers: redact_userinfo(&self.brokers), failure, detail: self.scrub(detail) }
    }

    /// Removes any secret property value from a message (librdkafka should never echo one;
    /// this makes sure).
    fn scrub(&self, mut text: String) -> String {
        for (k, v) in &self.properties {
            if !is_shown(k) && v.len() >= 4 {
                text = text.replace(v.as_str(), "<redacted>");
            }
        }
        text
    }
}

/// `e` as text; a property librdkafka refused is named with its value only when that is
/// known to be harmless (rdkafka's text ends with the value, and librdkafka's may quote it).
fn refused(e: &KafkaError) -> String {
    match e {
        KafkaError::ClientConfig(_, desc, key, value) if !is_shown(key) => {
            let unknown = desc.starts_with("No such configuration property");
            let desc = if unknown || !desc.contains(value.as_str()) {
                desc.clone()
            } else {
                format!("refused the value of configuration property \"{key}\"")
            };
            format!("Client config error: {desc} (the value of {key} is not shown)")
        }
        e => e.to_string(),
    }
}

impl From<&str> for KafkaClientConfig {
    fn from(brokers: &str) -> Self {
        Self::new(brokers)
    }
}

impl From<String> for KafkaClientConfig {
    fn from(brokers: String) -> Self {
        Self::new(brokers)
    }
}

impl From<&String> for KafkaClientConfig {
    fn from(brokers: &String) -> Self {
        Self::new(brokers.as_str())
    }
}

impl From<&KafkaClientConfig> for KafkaClientConfig {
    fn from(config: &KafkaClientConfig) -> Self {
        config.clone()
    }
}

impl fmt::Debug for KafkaClientConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaClientConfig")
            .field("brokers", &redact_userinfo(&self.brokers))
            .field("properties", &redacted(&self.properties))
            .finish()
    }
}

/// Which part of reaching Kafka failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectFailure {
    /// librdkafka refused the configuration (unknown property, bad value, missing file).
    Configuration,
    /// The TLS handshake failed (wrong protocol, client certificate refused, no common cipher).
    TlsHandshake,
    /// The broker's certificate was not trusted, or did not match its host name.
    Certificate,
    /// SASL authentication failed (credentials, mechanism, or the OAuth token request).
    Authentication,
    /// No broker answered (refused, unresolvable, or closed connections).
    Unreachable,
    /// No metadata arrived in time, without a more specific error.
    Timeout,
    /// A broker took the TCP connection and never answered.
    NoAnswer,
}

impl ConnectFailure {
    /// Classifies an error reported by librdkafka's error callback.
    pub fn classify(code: Option<RDKafkaErrorCode>, reason: &str) -> Self {
        // Reasons start with the broker's name (`sasl_ssl://host:port/id: …`), so match
        // phrases, not bare words like "ssl".
        let lower = reason.to_ascii_lowercase();
        if lower.contains("certificate verify failed")
            || lower.contains("broker certificate")
            || lower.contains("hostname mismatch")
        {
            Self::Certificate
        } else if code == Some(RDKafkaErrorCode::Authentication)
            || lower.contains("authentication")
            || lower.contains("oauthbearer token")
        {
            Self::Authentication
        } else if code == Some(RDKafkaErrorCode::SSL)
            || lower.contains("ssl handshake")
            || lower.contains("tls")
            // A TLS alert from the broker after the handshake's last flight (TLS 1.3 checks
            // the client's certificate there): Apache Kafka's "bad certificate" when the
            // client sent none, or one it does not trust.
            || lower.contains("ssl alert number")
        {
            Self::TlsHandshake
        } else if code == Some(RDKafkaErrorCode::InvalidArgument) || code == Some(RDKafkaErrorCode::UnknownProtocol) {
            Self::Configuration
        } else {
            Self::Unreachable
        }
    }

    /// A failure that waiting will not cure: report it at once.
    fn is_definite(self) -> bool {
        matches!(self, Self::Configuration | Self::TlsHandshake | Self::Certificate | Self::Authentication)
    }
}

impl fmt::Display for ConnectFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Configuration => "invalid client configuration",
            Self::TlsHandshake => "TLS handshake failed",
            Self::Certificate => "broker certificate not trusted",
            Self::Authentication => "SASL authentication failed",
            Self::Unreachable => "broker unreachable",
            Self::Timeout => "timed out",
            Self::NoAnswer => "broker silent",
        })
    }
}

/// How long the preflight keeps trying once every bootstrap broker has failed (refused
/// the connection): long enough for a broker that is just starting, short enough that a
/// wrong address is reported within seconds.
const GIVE_UP_WHEN_ALL_DOWN: Duration = Duration::from_secs(3);

/// The `host:port` of each bootstrap server (`scheme://` and user info left out).
fn bootstrap_addresses(brokers: &str) -> Vec<String> {
    let address = |server: &str| {
        let server = server.trim();
        let server = server.split_once("://").map_or(server, |(_, rest)| rest);
        server.rsplit_once('@').map_or(server, |(_, host)| host).to_owned()
    };
    brokers.split(',').filter(|s| !s.trim().is_empty()).map(address).collect()
}

/// Whether librdkafka's reason says a broker's name does not resolve (no use waiting).
fn unresolvable(reason: &str) -> bool {
    reason.contains("Failed to resolve")
}

/// What librdkafka reported during the preflight, classified.
#[derive(Default)]
struct PreflightContext {
    seen: Mutex<Seen>,
}

#[derive(Clone, Default)]
struct Seen {
    /// The most telling error: a definite one, else the last one naming a broker's failure
    /// ("Connection refused", "Failed to resolve"), never the "all brokers are down" summary.
    cause: Option<(ConnectFailure, String)>,
    /// Whether librdkafka said every bootstrap broker is down.
    all_down: bool,
}

impl ClientContext for PreflightContext {
    fn error(&self, error: KafkaError, reason: &str) {
        let code = error.rdkafka_error_code();
        let failure = ConnectFailure::classify(code, reason);
        let mut seen = self.seen.lock().expect("preflight lock");
        if code == Some(RDKafkaErrorCode::AllBrokersDown) {
            seen.all_down = true;
            if seen.cause.is_some() {
                return;
            }
        }
        // A definite cause is not overwritten by the failures that follow it.
        if !seen.cause.as_ref().is_some_and(|(f, _)| f.is_definite() && !failure.is_definite()) {
            seen.cause = Some((failure, reason.to_owned()));
        }
    }
}

impl ConsumerContext for PreflightContext {}

#[cfg(test)]
mod tests;
