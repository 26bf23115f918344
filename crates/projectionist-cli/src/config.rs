//! `--config FILE`: settings kept in a TOML file, for deployments that keep them in a
//! repository. Every field is optional and unknown fields are rejected. What the command line
//! or the environment sets wins over the file, and the file over the built-in defaults.
//!
//! ```toml
//! brokers = "kafka-1:9092,kafka-2:9092"
//!
//! [kafka]
//! "security.protocol" = "SASL_SSL"
//! "sasl.mechanism" = "SCRAM-SHA-512"
//!
//! [run]
//! projections = ["bank_accounts"]
//! group_instance_id = "projector-0"
//! batch_max_events = 2000
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use clap::parser::ValueSource;
use clap::ArgMatches;
use serde::Deserialize;

use crate::RunArgs;

/// The file's settings.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ConfigFile {
    /// Kafka bootstrap servers, `host:port[,host:port…]` (as `--brokers`, `KAFKA_BROKERS`).
    pub brokers: Option<String>,
    /// librdkafka properties for every Kafka client, e.g. `"security.protocol" = "SSL"`. The
    /// `--kafka-*` options and `--kafka-property` win for the same key. Keep secrets out of
    /// files kept in repositories: pass them in the environment (`KAFKA_SASL_PASSWORD`, …).
    #[serde(default)]
    pub kafka: BTreeMap<String, String>,
    /// Settings of `run`.
    #[serde(default)]
    pub run: RunSettings,
}

/// `run`'s settings in the file; each is the option of the same name (dashes for
/// underscores) and defaults as that option does.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunSettings {
    /// Projections to run (default: all registered).
    pub projections: Option<Vec<String>>,
    /// Consumer group id prefix: each projection consumes in `<group_id>.<projection>`
    /// (default: `projectionist.<projection>`).
    pub group_id: Option<String>,
    /// Static group membership: this process's stable, unique name in the group.
    pub group_instance_id: Option<String>,
    /// Most events per batch.
    pub batch_max_events: Option<usize>,
    /// Most payload bytes per batch.
    pub batch_max_bytes: Option<usize>,
    /// Longest the oldest buffered event waits for the rest of its batch, in milliseconds.
    pub batch_max_wait_ms: Option<u64>,
    /// Retries of a batch after a retryable database error.
    pub max_retries: Option<u32>,
    /// First retry delay in milliseconds, doubled on each further retry.
    pub retry_backoff_ms: Option<u64>,
    /// Most PostgreSQL connections.
    pub pg_max_connections: Option<u32>,
    /// Address of the HTTP listener for /metrics, /health and /ready, or `off`.
    pub metrics_addr: Option<String>,
}

impl ConfigFile {
    /// Reads and checks `path`; errors name the file, and the line and field at fault.
    pub(crate) fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }

    /// Fills what `run` was not given on the command line or in the environment.
    pub(crate) fn apply_to_run(self, args: &mut RunArgs, matches: &ArgMatches) {
        let run = self.run;
        let unset = |id: &str| !given(matches, id);
        macro_rules! fill {
            ($field:ident) => {
                if let Some(value) = run.$field {
                    if unset(stringify!($field)) {
                        args.$field = value;
                    }
                }
            };
            (optional $field:ident) => {
                if unset(stringify!($field)) && run.$field.is_some() {
                    args.$field = run.$field;
                }
            };
        }
        fill!(projections);
        fill!(batch_max_events);
        fill!(batch_max_bytes);
        fill!(batch_max_wait_ms);
        fill!(max_retries);
        fill!(retry_backoff_ms);
        fill!(metrics_addr);
        fill!(optional group_id);
        fill!(optional group_instance_id);
        fill!(optional pg_max_connections);
    }
}

/// Whether `id` was set on the command line or in the environment (not a default).
pub(crate) fn given(matches: &ArgMatches, id: &str) -> bool {
    matches!(matches.value_source(id), Some(ValueSource::CommandLine | ValueSource::EnvVariable))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches};

    fn run_args(file: &str, argv: &[&str]) -> anyhow::Result<RunArgs> {
        let file: ConfigFile = toml::from_str(file)?;
        let matches = crate::Cli::command().try_get_matches_from(argv)?;
        let run = matches.subcommand_matches("run").expect("run");
        let mut args = RunArgs::from_arg_matches(run)?;
        file.apply_to_run(&mut args, run);
        Ok(args)
    }

    #[test]
    fn the_file_fills_what_the_command_line_leaves_at_its_default() {
        let file =
            "[run]\nbatch_max_events = 42\nmax_retries = 9\ngroup_instance_id = \"p-0\"\nprojections = [\"a\"]\n";
        let args = run_args(file, &["bin", "run", "--max-retries", "3"]).unwrap();
        assert_eq!(args.batch_max_events, 42, "from the file");
        assert_eq!(args.max_retries, 3, "the command line wins");
        assert_eq!(args.group_instance_id.as_deref(), Some("p-0"));
        assert_eq!(args.projections, ["a"]);
        let args = run_args("", &["bin", "run"]).unwrap();
        assert_eq!(args.batch_max_events, projectionist_kafka::EngineConfig::DEFAULT_BATCH_MAX_EVENTS, "default");
        assert_eq!(args.retry_backoff_ms, projectionist_kafka::EngineConfig::DEFAULT_RETRY_BACKOFF_MS);
    }

    #[test]
    fn the_files_kafka_properties_reach_every_client_below_the_command_line() {
        let file = "brokers = \"file:9092\"\n[kafka]\n\"client.rack\" = \"a\"\n\"client.id\" = \"from-file\"\n";
        let path = std::env::temp_dir().join(format!("projectionist-config-{}.toml", std::process::id()));
        std::fs::write(&path, file).unwrap();
        let argv = ["bin", "--config", path.to_str().unwrap(), "--kafka-property", "client.rack=b", "status"];
        let matches = crate::Cli::command().try_get_matches_from(argv).unwrap();
        let cli = crate::with_config_file(crate::Cli::from_arg_matches(&matches).unwrap(), &matches).unwrap();
        std::fs::remove_file(&path).unwrap();
        let client = cli.kafka.client().client_config();
        assert_eq!(client.get("client.rack"), Some("b"), "the command line wins");
        assert_eq!(client.get("client.id"), Some("from-file"));
        if std::env::var_os("KAFKA_BROKERS").is_none() {
            assert_eq!(cli.kafka.brokers, "file:9092", "the file wins over the default");
        }
    }

    #[test]
    fn unknown_fields_are_rejected_by_name() {
        let err = toml::from_str::<ConfigFile>("[run]\nbatch_max_event = 1\n").unwrap_err().to_string();
        assert!(err.contains("unknown field `batch_max_event`"), "{err}");
        let err = toml::from_str::<ConfigFile>("broker = \"x\"\n").unwrap_err().to_string();
        assert!(err.contains("unknown field `broker`"), "{err}");
    }

    #[test]
    fn the_example_file_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/projectionist.toml");
        let file = ConfigFile::load(&path).unwrap();
        assert!(file.brokers.is_some() && file.run.batch_max_events.is_some(), "{file:?}");
        let err = ConfigFile::load(Path::new("/nonexistent/projectionist.toml")).unwrap_err();
        assert!(format!("{err:#}").contains("/nonexistent/projectionist.toml"), "{err:#}");
    }
}
