//! How every command reaches Kafka: bootstrap servers and librdkafka's security properties,
//! each settable as `--kafka-<property>` or `KAFKA_<PROPERTY>` (dots become dashes or
//! underscores), plus `--kafka-property KEY=VALUE` for anything else.

use std::time::Duration;

use anyhow::Context;
use projectionist_kafka::KafkaClientConfig;

use crate::unechoed::Unechoed;

/// The heading the Kafka options are listed under in `--help`.
pub(crate) const KAFKA_HEADING: &str = "Kafka connection";

/// Connection options of the subcommands that use a Kafka client (all but `migrate`, whose
/// help leaves them out), listed after each command's own options.
#[derive(clap::Args)]
#[command(next_help_heading = KAFKA_HEADING)]
pub(crate) struct KafkaArgs {
    /// Kafka bootstrap servers.
    #[arg(long, env = "KAFKA_BROKERS", default_value = "localhost:9092", global = true)]
    pub brokers: String,
    /// `security.protocol`: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.
    #[arg(long, env = "KAFKA_SECURITY_PROTOCOL", global = true)]
    kafka_security_protocol: Option<String>,
    /// `sasl.mechanism`: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER (or GSSAPI with the
    /// `gssapi` feature).
    #[arg(long, env = "KAFKA_SASL_MECHANISM", global = true)]
    kafka_sasl_mechanism: Option<String>,
    /// `sasl.username` (PLAIN, SCRAM).
    #[arg(long, env = "KAFKA_SASL_USERNAME", hide_env_values = true, global = true)]
    kafka_sasl_username: Option<String>,
    /// `sasl.password` (PLAIN, SCRAM); prefer the environment to the command line.
    #[arg(long, env = "KAFKA_SASL_PASSWORD", hide_env_values = true, global = true)]
    kafka_sasl_password: Option<String>,
    /// `ssl.ca.location`: PEM file of the CA(s) to trust (default: the system's trust store).
    #[arg(long, env = "KAFKA_SSL_CA_LOCATION", global = true)]
    kafka_ssl_ca_location: Option<String>,
    /// `ssl.certificate.location`: client certificate (PEM) for mutual TLS.
    #[arg(long, env = "KAFKA_SSL_CERTIFICATE_LOCATION", global = true)]
    kafka_ssl_certificate_location: Option<String>,
    /// `ssl.key.location`: client private key (PEM) for mutual TLS.
    #[arg(long, env = "KAFKA_SSL_KEY_LOCATION", global = true)]
    kafka_ssl_key_location: Option<String>,
    /// `ssl.key.password`: passphrase of the client key.
    #[arg(long, env = "KAFKA_SSL_KEY_PASSWORD", hide_env_values = true, global = true)]
    kafka_ssl_key_password: Option<String>,
    /// `ssl.endpoint.identification.algorithm`: `https` (default: the broker's certificate
    /// must match its host name) or `none`.
    #[arg(long, env = "KAFKA_SSL_ENDPOINT_IDENTIFICATION_ALGORITHM", global = true)]
    kafka_ssl_endpoint_identification_algorithm: Option<String>,
    /// `sasl.oauthbearer.method`: `oidc` for the client-credentials flow.
    #[arg(long, env = "KAFKA_SASL_OAUTHBEARER_METHOD", global = true)]
    kafka_sasl_oauthbearer_method: Option<String>,
    /// `sasl.oauthbearer.client.id`.
    #[arg(long, env = "KAFKA_SASL_OAUTHBEARER_CLIENT_ID", hide_env_values = true, global = true)]
    kafka_sasl_oauthbearer_client_id: Option<String>,
    /// `sasl.oauthbearer.client.secret`; prefer the environment to the command line.
    #[arg(long, env = "KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET", hide_env_values = true, global = true)]
    kafka_sasl_oauthbearer_client_secret: Option<String>,
    /// `sasl.oauthbearer.token.endpoint.url`: the identity provider's token endpoint.
    #[arg(long, env = "KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL", global = true)]
    kafka_sasl_oauthbearer_token_endpoint_url: Option<String>,
    /// `sasl.oauthbearer.scope`.
    #[arg(long, env = "KAFKA_SASL_OAUTHBEARER_SCOPE", global = true)]
    kafka_sasl_oauthbearer_scope: Option<String>,
    /// `sasl.oauthbearer.extensions`, `key=value,…` (e.g. Confluent Cloud's logicalCluster).
    #[arg(long, env = "KAFKA_SASL_OAUTHBEARER_EXTENSIONS", hide_env_values = true, global = true)]
    kafka_sasl_oauthbearer_extensions: Option<String>,
    /// Any other librdkafka property, `key=value`, for every Kafka client (repeatable; wins
    /// over the options above; values never logged).
    #[arg(long = "kafka-property", value_name = "KEY=VALUE", value_parser = Unechoed::new(parse_property), global = true)]
    kafka_properties: Vec<(String, String)>,
    /// Seconds to wait at start for broker metadata before failing with what went wrong.
    #[arg(long, env = "KAFKA_CONNECT_TIMEOUT_SECS", default_value_t = 30, global = true)]
    kafka_connect_timeout_secs: u64,
    /// librdkafka properties from the settings file (`--config`); the options above win.
    #[arg(skip)]
    pub file_properties: std::collections::BTreeMap<String, String>,
}

/// `KEY=VALUE`, split. A key is a property name (letters, digits, `.`, `_`, `-`), so that
/// an argument such as `sasl.password:SECRET=x` is refused rather than sent to librdkafka
/// with part of the secret as its key. The error names a key written with `:` for `=`,
/// since what comes before the `:` cannot be the value; it repeats nothing else.
fn parse_property(s: &str) -> Result<(String, String), String> {
    let s = s.trim_start();
    let key_len = s.find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))).unwrap_or(s.len());
    let (key, rest) = s.split_at(key_len);
    match rest.trim_start().strip_prefix('=') {
        Some(value) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ if !key.is_empty() && rest.starts_with(':') => Err(format!("expected KEY=VALUE; `{key}` is followed by `:`")),
        _ => Err("expected KEY=VALUE".to_owned()),
    }
}

impl KafkaArgs {
    /// Brokers and properties for every client a command makes.
    pub fn client(&self) -> KafkaClientConfig {
        let named = [
            ("security.protocol", &self.kafka_security_protocol),
            ("sasl.mechanism", &self.kafka_sasl_mechanism),
            ("sasl.username", &self.kafka_sasl_username),
            ("sasl.password", &self.kafka_sasl_password),
            ("ssl.ca.location", &self.kafka_ssl_ca_location),
            ("ssl.certificate.location", &self.kafka_ssl_certificate_location),
            ("ssl.key.location", &self.kafka_ssl_key_location),
            ("ssl.key.password", &self.kafka_ssl_key_password),
            ("ssl.endpoint.identification.algorithm", &self.kafka_ssl_endpoint_identification_algorithm),
            ("sasl.oauthbearer.method", &self.kafka_sasl_oauthbearer_method),
            ("sasl.oauthbearer.client.id", &self.kafka_sasl_oauthbearer_client_id),
            ("sasl.oauthbearer.client.secret", &self.kafka_sasl_oauthbearer_client_secret),
            ("sasl.oauthbearer.token.endpoint.url", &self.kafka_sasl_oauthbearer_token_endpoint_url),
            ("sasl.oauthbearer.scope", &self.kafka_sasl_oauthbearer_scope),
            ("sasl.oauthbearer.extensions", &self.kafka_sasl_oauthbearer_extensions),
        ];
        let mut client = KafkaClientConfig::new(self.brokers.clone());
        for (key, value) in &self.file_properties {
            client = client.with_property(key.clone(), value.clone());
        }
        for (key, value) in named {
            if let Some(value) = value.as_deref().filter(|v| !v.is_empty()) {
                client = client.with_property(key, value);
            }
        }
        for (key, value) in &self.kafka_properties {
            client = client.with_property(key.clone(), value.clone());
        }
        client
    }

    /// Checks that the brokers answer with these settings, failing with the part that
    /// does not (TLS handshake, certificate, authentication) before any work starts.
    pub async fn preflight(&self, client: &KafkaClientConfig) -> anyhow::Result<()> {
        let (c, timeout) = (client.clone(), Duration::from_secs(self.kafka_connect_timeout_secs.max(1)));
        tokio::task::spawn_blocking(move || c.preflight(timeout)).await.context("Kafka preflight task")??;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    /// `--kafka-property ARG`'s error as clap renders it.
    fn error(arg: &str) -> String {
        let argv = ["bin", "--kafka-property", arg, "status"];
        match crate::command().try_get_matches_from(argv) {
            Ok(_) => panic!("{arg:?} parsed"),
            Err(e) => e.render().to_string(),
        }
    }

    #[test]
    fn a_malformed_property_is_refused_without_repeating_its_value() {
        for (arg, named) in [
            ("sasl.password:Sw0rdf1sh-cli", Some("sasl.password")),
            ("ssl.key.password:Sw0rdf1sh-cli", Some("ssl.key.password")),
            ("sasl.oauthbearer.client.secret:Sw0rdf1sh-cli", Some("sasl.oauthbearer.client.secret")),
            ("sasl.password Sw0rdf1sh-cli", None),
            ("Sw0rdf1sh-cli", None),
            ("=Sw0rdf1sh-cli", None),
            (" =Sw0rdf1sh-cli", None),
            ("sasl.password:Sw0rdf1sh=cli", Some("sasl.password")),
            ("sasl.password Sw0rdf1sh=cli", None),
        ] {
            let err = error(arg);
            assert!(!err.contains("Sw0rdf1sh"), "{arg:?} echoed: {err}");
            assert!(err.contains("--kafka-property") && err.contains("expected KEY=VALUE"), "{err}");
            if let Some(key) = named {
                assert!(err.contains(&format!("`{key}`")), "{arg:?} does not name its key: {err}");
            }
        }
    }
}
