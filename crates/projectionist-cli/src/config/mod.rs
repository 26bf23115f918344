//! `run`'s settings, and `--config FILE`: the same settings kept in a TOML file, for
//! deployments that keep them in a repository.
//!
//! One schema serves all three sources. [`RunOptions`] is both `run`'s options and the file's
//! `[run]` table; every field is optional, and what no source gives is the engine's default,
//! from [`EngineConfig`]'s own serde defaults (which `--help` shows). The command line and the
//! environment win over the file: clap lays what it was given over the file's values
//! ([`clap::FromArgMatches::update_from_arg_matches`]). Unknown fields in the file are
//! rejected by name, with their line.
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

mod example;
mod file_error;

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use clap::parser::ValueSource;
use clap::ArgMatches;
use projectionist_core::{OnGap, OnPoison};
use projectionist_kafka::{EngineConfig, KafkaClientConfig, ProjectionSettings};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The file's settings.
#[derive(Default, Deserialize)]
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
    pub run: RunOptions,
    /// How each topic's messages carry the envelope, by topic (`--topic-format` wins).
    #[serde(default)]
    pub topics: projectionist_core::format::Formats,
    /// The schema registry of payloads in Confluent's wire format (the `--schema-registry-*`
    /// options win, each for its own setting).
    #[serde(default)]
    pub registry: Option<projectionist_registry::RegistryConfig>,
    /// Traces over OTLP (OpenTelemetry's environment and the `--otlp-*` options win).
    #[serde(default)]
    pub traces: Option<crate::traces::TracesConfig>,
}

/// Default of `--metrics-addr`.
pub(crate) const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9464";

/// `run`'s options, and the `[run]` table of the settings file (each option's name with
/// underscores for dashes). The engine's settings among them are serialised into an
/// [`EngineConfig`]; those of the binary itself (`#[serde(skip_serializing)]`) are read here.
#[derive(clap::Args, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunOptions {
    /// Replay from offset zero, ignoring stored checkpoints (tables are kept).
    #[arg(long)]
    #[serde(skip_deserializing, skip_serializing_if = "is_false")]
    pub from_beginning: bool,
    /// Truncate the projections' tables and forget their checkpoints first (rebuild).
    #[arg(long)]
    #[serde(skip)]
    pub reset: bool,
    /// Run only these projections (default: all registered).
    #[arg(long = "projection", value_name = "NAME")]
    #[serde(skip_serializing)]
    pub projections: Option<Vec<String>>,
    /// Consumer group id prefix. Each projection consumes in a group of its own so that each
    /// reads every partition: `<ID>.<projection>`. Default: projectionist.<projection>.
    #[arg(long)]
    pub group_id: Option<String>,
    /// Static group membership: this process's stable, unique name in the group (e.g. the
    /// pod name), the same in each projection's group. A restart under the same name gets its
    /// partitions back without a rebalance on Apache Kafka. Default: dynamic membership.
    #[arg(long, env = "PROJECTIONIST_GROUP_INSTANCE_ID")]
    pub group_instance_id: Option<String>,
    /// Most events per batch (one transaction per partition). Batches grow to this bound
    /// while a partition is behind and stay small at the head.
    #[arg(long, alias = "batch-size", env = "PROJECTIONIST_BATCH_MAX_EVENTS")]
    pub batch_max_events: Option<usize>,
    /// Most payload bytes per batch.
    #[arg(long, env = "PROJECTIONIST_BATCH_MAX_BYTES")]
    pub batch_max_bytes: Option<usize>,
    /// Longest a partition's oldest buffered event waits for the rest of its batch while
    /// events keep arriving, in milliseconds (with nothing more to read it applies at once).
    #[arg(long, alias = "batch-wait-ms", env = "PROJECTIONIST_BATCH_MAX_WAIT_MS")]
    pub batch_max_wait_ms: Option<u64>,
    /// `rebuild` only, for a projection with a custom table: most events per batch of its
    /// bulk load from offset zero. Far larger than a run's, since each row's events in a
    /// batch fold into one write; memory grows with it (about two batches per partition are
    /// held). A projection without custom tables folds across batches, in a run's batches.
    #[arg(long, env = "PROJECTIONIST_REBUILD_BATCH_MAX_EVENTS")]
    pub rebuild_batch_max_events: Option<usize>,
    /// `rebuild` only: most payload bytes per batch.
    #[arg(long, env = "PROJECTIONIST_REBUILD_BATCH_MAX_BYTES")]
    pub rebuild_batch_max_bytes: Option<usize>,
    /// Retries of a batch after a transient database error (serialization failure, deadlock,
    /// concurrent writer). PostgreSQL being unreachable, restarting or read-only is waited
    /// out for as long as it lasts, without counting against this.
    #[arg(long, env = "PROJECTIONIST_MAX_RETRIES")]
    pub max_retries: Option<u32>,
    /// First retry delay in milliseconds, doubled on each further retry.
    #[arg(long, env = "PROJECTIONIST_RETRY_BACKOFF_MS")]
    pub retry_backoff_ms: Option<u64>,
    /// A partition halted by what can be fixed while it runs (a permission, a missing table
    /// or column, a refused constraint, a bound, a failing `apply`) is read again from its
    /// checkpoint after 1 s, 2 s, 4 s, … up to this many milliseconds apart, until it gets
    /// past. 0: halts stay until restarted. Poison and gaps never heal by themselves.
    #[arg(long, env = "PROJECTIONIST_HALT_RETRY_MAX_DELAY_MS")]
    pub halt_retry_max_delay_ms: Option<u64>,
    /// An event whose predecessor version never arrived (a gap): `park` its aggregate (its
    /// events are held, and applied when the missing version arrives, while every other
    /// aggregate flows; `parked` lists them) or `halt` the partition.
    #[arg(long, env = "PROJECTIONIST_ON_GAP", value_name = "park|halt")]
    pub on_gap: Option<OnGap>,
    /// An event that can never apply as it stands (poison: not an envelope, data that does
    /// not decode, a value the table refuses, …): `dead-letter` (kept with its exact bytes,
    /// its aggregate parked behind it, everything else flowing; `dead-letters list` shows
    /// them) or `halt` the partition.
    #[arg(long, env = "PROJECTIONIST_ON_POISON", value_name = "dead-letter|halt")]
    pub on_poison: Option<OnPoison>,
    /// Largest event payload taken, in bytes: a larger message is dead-lettered alone
    /// (`oversized`), unparsed.
    #[arg(long, env = "PROJECTIONIST_MAX_EVENT_BYTES")]
    pub max_event_bytes: Option<usize>,
    /// Most aggregates a projection keeps parked; past it the partition halts, naming this.
    #[arg(long, env = "PROJECTIONIST_MAX_PARKED_AGGREGATES")]
    pub max_parked_aggregates: Option<u64>,
    /// Most events held for one parked aggregate; past it the partition halts, naming this.
    #[arg(long, env = "PROJECTIONIST_MAX_HELD_PER_AGGREGATE")]
    pub max_held_per_aggregate: Option<u64>,
    /// Most open dead letters a projection keeps (neither retried nor discarded); past it the
    /// partition halts at the message, naming this.
    #[arg(long, env = "PROJECTIONIST_MAX_DEAD_LETTERS")]
    pub max_dead_letters: Option<u64>,
    /// Most payload bytes a projection's open dead letters keep, as stored; past it the
    /// partition halts at the message, naming this.
    #[arg(long, env = "PROJECTIONIST_MAX_DEAD_LETTER_BYTES")]
    pub max_dead_letter_bytes: Option<u64>,
    /// Most bytes of one dead letter's payload stored: a longer one is stored as its head,
    /// with its full length and SHA-256. Default: `max_event_bytes`.
    #[arg(long, env = "PROJECTIONIST_DEAD_LETTER_PAYLOAD_MAX_BYTES")]
    pub dead_letter_payload_max_bytes: Option<usize>,
    /// Also produce each dead letter to this topic (its key, payload and headers, plus
    /// `projectionist.*` headers saying where it was read and why it failed).
    #[arg(long, env = "PROJECTIONIST_DEAD_LETTER_TOPIC")]
    pub dead_letter_topic: Option<String>,
    /// One projection's own value of one of the nine settings above (`on_gap`, `on_poison`,
    /// `max_event_bytes`, `max_parked_aggregates`, `max_held_per_aggregate`,
    /// `max_dead_letters`, `max_dead_letter_bytes`, `dead_letter_payload_max_bytes`,
    /// `dead_letter_topic`), e.g. `order_status.on_gap=halt`; repeat for more. In the file:
    /// a `[run.per_projection.order_status]` table.
    #[arg(long = "projection-setting", value_name = "PROJECTION.SETTING=VALUE", value_parser = crate::unechoed::Unechoed::new(projection_setting))]
    #[serde(skip)]
    pub projection_settings: Vec<(String, String, String)>,
    /// The file's `[run.per_projection.NAME]` tables.
    #[arg(skip)]
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub per_projection: BTreeMap<String, ProjectionSettings>,
    /// Most PostgreSQL connections of the whole process, across its projections and
    /// partitions (a rebuild's shadow included); partitions queue for one, in turn, when all
    /// are in use. Default: one per partition of the consumed topics (each applies its batches
    /// on its own connection, in parallel) plus two, at most 64 (a rebuild: plus four).
    #[arg(long, env = "PROJECTIONIST_PG_MAX_CONNECTIONS")]
    #[serde(skip_serializing)]
    pub pg_max_connections: Option<u32>,
    /// Stop once every assigned partition has reached its high watermark.
    #[arg(long)]
    #[serde(skip_deserializing, skip_serializing_if = "is_false")]
    pub exit_when_caught_up: bool,
    /// Address of the HTTP listener for /metrics, /health and /ready, or `off`.
    #[arg(long, env = "PROJECTIONIST_METRICS_ADDR")]
    #[serde(skip_serializing)]
    pub metrics_addr: Option<String>,
    /// Serve the operator's console at /console on that listener: lag, halts, rebuilds,
    /// parked aggregates and dead letters.
    #[arg(long)]
    #[serde(default, skip_serializing)]
    pub console: bool,
    /// The token the console's actions (retry, discard, skip) need; without it the console
    /// only shows. Prefer the environment.
    #[arg(long, env = "PROJECTIONIST_CONSOLE_TOKEN", hide_env_values = true)]
    #[serde(skip)]
    pub console_token: Option<String>,
    /// The most of a dead letter's payload and header values the console shows: `none`,
    /// `masked` (their JSON shape) or `full` (masked until asked). Default: masked.
    #[arg(long, value_enum)]
    #[serde(skip_serializing)]
    pub console_payload: Option<Payload>,
    /// Serve the console on a listener that is not on loopback (behind your own proxy).
    #[arg(long)]
    #[serde(default, skip_serializing)]
    pub console_remote: bool,
}

fn is_false(b: &bool) -> bool {
    !b
}

/// `PROJECTION.SETTING=VALUE`, split.
fn projection_setting(arg: &str) -> Result<(String, String, String), String> {
    let (name, value) = arg.split_once('=').ok_or("expected PROJECTION.SETTING=VALUE: no `=`")?;
    let (projection, setting) = name.split_once('.').ok_or("expected PROJECTION.SETTING=VALUE: no `.`")?;
    if projection.is_empty() || setting.is_empty() {
        return Err("expected PROJECTION.SETTING=VALUE".into());
    }
    Ok((projection.to_owned(), setting.to_owned(), value.to_owned()))
}

impl RunOptions {
    /// The engine's configuration: these options' engine settings over the engine's defaults,
    /// with `client`'s brokers and properties.
    pub(crate) fn engine_config(&self, client: &KafkaClientConfig) -> anyhow::Result<EngineConfig> {
        let mut fields = object(serde_json::to_value(self)?);
        fields.retain(|_, value| !value.is_null());
        for (projection, setting, value) in &self.projection_settings {
            let own = fields.entry("per_projection").or_insert_with(|| Map::new().into());
            let own = own.as_object_mut().expect("per_projection is a table");
            let own = own.entry(projection.as_str()).or_insert_with(|| Map::new().into());
            // A number or a name: `5` is 5, `halt` is "halt".
            let value = value.parse::<u64>().map_or_else(|_| Value::from(value.as_str()), Value::from);
            own.as_object_mut().expect("a projection's settings are a table").insert(setting.clone(), value);
        }
        fields.extend(object(serde_json::to_value(client)?));
        serde_json::from_value(Value::Object(fields)).context("run's settings")
    }

    /// The defaults of the options that have one, by field name: the engine's defaults and
    /// the binary's own.
    pub(crate) fn defaults() -> Map<String, Value> {
        let engine = serde_json::to_value(EngineConfig::new("")).expect("EngineConfig serialises");
        let mut defaults = object(engine);
        defaults.insert("metrics_addr".into(), DEFAULT_METRICS_ADDR.into());
        defaults.retain(|_, value| value.is_number() || value.as_str().is_some_and(|s| !s.is_empty()));
        defaults
    }
}

fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(fields) => fields,
        _ => Map::new(),
    }
}

pub(crate) use example::{example, in_the_file};

/// A default as `--help` and the reference show it: text unquoted, anything else as JSON.
pub(crate) fn shown(default: &Value) -> String {
    default.as_str().map_or_else(|| default.to_string(), str::to_owned)
}

/// `command` with the defaults of `run`'s options shown in their help (the options are
/// optional, so that a value given nowhere falls back to the file and then the default).
pub(crate) fn with_defaults_shown(command: clap::Command) -> clap::Command {
    command.mut_subcommand("run", |mut run| {
        for (id, default) in RunOptions::defaults() {
            if !run.get_arguments().any(|arg| arg.get_id() == id.as_str()) {
                continue;
            }
            let shown = shown(&default);
            let with_default = |help: &clap::builder::StyledStr| format!("{help} [default: {shown}]");
            run = run.mut_arg(id, |arg| {
                let long_help = arg.get_long_help().map(with_default);
                let help = arg.get_help().map(with_default).unwrap_or_else(|| format!("[default: {shown}]"));
                let arg = arg.help(help);
                match long_help {
                    Some(long_help) => arg.long_help(long_help),
                    None => arg,
                }
            });
        }
        run
    })
}

impl ConfigFile {
    /// Reads and checks `path`; errors name the file, and the line and key at fault, never
    /// a value (the `[kafka]` table may hold secrets).
    pub(crate) fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        toml::from_str(&text).map_err(|e| anyhow::anyhow!(file_error::describe(path, &text, &e)))
    }
}

/// Whether `id` was set on the command line or in the environment (not a default).
pub(crate) fn given(matches: &ArgMatches, id: &str) -> bool {
    matches!(matches.value_source(id), Some(ValueSource::CommandLine | ValueSource::EnvVariable))
}

/// How much of a dead letter's payload and header values the console shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Payload {
    /// Neither: their sizes and the header names only.
    None,
    /// Their shape: JSON with every value replaced by `***`.
    #[default]
    Masked,
    /// As they are (masked unless the operator asks to see them).
    Full,
}

#[cfg(test)]
mod tests;
