//! The schema registry every command reads payloads in Confluent's wire format through (Avro,
//! Protobuf, JSON Schema): its URL and credentials, from flags, the environment or the
//! settings file's `[registry]` table. Off unless a URL is given.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use projectionist_core::format::Schemas;
use projectionist_registry::{Registry, RegistryConfig};

/// The heading the registry's options are listed under in `--help`.
pub(crate) const REGISTRY_HEADING: &str = "Schema registry";

/// Where the schemas of wire-format payloads come from.
#[derive(clap::Args, Default)]
#[command(next_help_heading = REGISTRY_HEADING)]
pub(crate) struct RegistryArgs {
    /// The registry's base URL, Confluent's REST API: `http://host:8081`, or Apicurio's
    /// `…/apis/ccompat/v7`. Without it, a payload in the wire format is a dead letter.
    #[arg(long, env = "SCHEMA_REGISTRY_URL", hide_env_values = true, global = true)]
    schema_registry_url: Option<String>,
    /// A user name for HTTP basic auth (Confluent Cloud: the API key).
    #[arg(long, env = "SCHEMA_REGISTRY_USERNAME", hide_env_values = true, global = true)]
    schema_registry_username: Option<String>,
    /// Its password (Confluent Cloud: the API secret); prefer the environment.
    #[arg(long, env = "SCHEMA_REGISTRY_PASSWORD", hide_env_values = true, global = true)]
    schema_registry_password: Option<String>,
    /// A PEM file of CA certificates to trust, besides the system's.
    #[arg(long, env = "SCHEMA_REGISTRY_CA_FILE", global = true, value_name = "FILE")]
    schema_registry_ca_file: Option<PathBuf>,
    /// A PEM file with a client certificate and its key (mutual TLS).
    #[arg(long, env = "SCHEMA_REGISTRY_IDENTITY_FILE", global = true, value_name = "FILE")]
    schema_registry_identity_file: Option<PathBuf>,
    /// The settings file's `[registry]` table (the flags win, each for its own setting).
    #[arg(skip)]
    pub(crate) file: Option<RegistryConfig>,
}

impl RegistryArgs {
    /// The registry's settings: the file's, each flag over it; `None` without a URL.
    fn config(&self) -> Option<RegistryConfig> {
        let mut config = match (&self.schema_registry_url, &self.file) {
            (Some(url), Some(file)) => RegistryConfig { url: url.clone(), ..file.clone() },
            (Some(url), None) => RegistryConfig::new(url.clone()),
            (None, file) => file.clone()?,
        };
        if let Some(username) = &self.schema_registry_username {
            config.username = Some(username.clone());
        }
        if let Some(password) = &self.schema_registry_password {
            config.password = Some(password.clone());
        }
        if let Some(path) = &self.schema_registry_ca_file {
            config.ca_file = Some(path.clone());
        }
        if let Some(path) = &self.schema_registry_identity_file {
            config.client_identity_file = Some(path.clone());
        }
        Some(config)
    }

    /// A client of the registry, if one is configured (nothing is sent yet).
    pub(crate) fn schemas(&self) -> anyhow::Result<Option<Arc<dyn Schemas>>> {
        let Some(config) = self.config() else { return Ok(None) };
        let registry = Registry::new(&config).context("the schema registry's settings")?;
        Ok(Some(Arc::new(registry)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flags_win_over_the_file_each_for_its_own_setting() {
        let file: RegistryConfig =
            toml::from_str("url = \"http://file:8081\"\nusername = \"u\"\npassword = \"p\"").unwrap();
        let args =
            RegistryArgs { schema_registry_password: Some("flag".into()), file: Some(file), ..Default::default() };
        let config = args.config().unwrap();
        assert_eq!((config.url.as_str(), config.username.as_deref()), ("http://file:8081", Some("u")));
        assert_eq!(config.password.as_deref(), Some("flag"));
        assert!(RegistryArgs::default().config().is_none(), "off unless a URL is given");
        let url = RegistryArgs { schema_registry_url: Some("http://flag:8081".into()), ..Default::default() };
        assert_eq!(url.config().unwrap().url, "http://flag:8081");
    }
}
