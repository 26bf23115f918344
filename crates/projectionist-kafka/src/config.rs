//! Engine configuration.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use projectionist_core::format::{Format, Formats};
use projectionist_core::{OnGap, OnPoison};

use crate::KafkaClientConfig;

/// How the engine connects, consumes and batches: one schema for the code, a settings file
/// and the defaults. Build it with [`EngineConfig::new`] and the `with_*` methods, or
/// deserialise it: `brokers` is required, every other field has the default documented here,
/// and unknown fields are rejected.
///
/// ```
/// let config: projectionist_kafka::EngineConfig = serde_json::from_str(
///     r#"{"brokers": "kafka-1:9092", "kafka": {"security.protocol": "SSL"}, "batch_max_events": 2000}"#,
/// )
/// .unwrap();
/// assert_eq!((config.batch_max_events, config.max_retries), (2000, 5));
/// ```
///
/// Serialising it writes every property's value as it is, secrets included; `Debug` redacts
/// them.
#[derive(Clone, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct EngineConfig {
    /// Where every Kafka client of the engine connects, and how: `brokers`
    /// (`host:port[,host:port…]`) and `kafka`, the librdkafka properties (e.g.
    /// `security.protocol`, `sasl.*`), flattened into this struct. Values of properties are
    /// never logged or printed.
    #[serde(flatten)]
    pub client: KafkaClientConfig,
    /// Consumer group id prefix. Every projection consumes in a group of its own,
    /// `<group_id>.<projection name>`, so that each reads every partition of its topics
    /// (projections sharing a group would split a topic between them, each missing the
    /// rest). Unset: `projectionist.<projection name>` (see [`EngineConfig::group_for`]).
    #[serde(default)]
    pub group_id: Option<String>,
    /// Static group membership: this process's stable name in each projection's group
    /// (librdkafka's `group.instance.id`), unique among the group's members — e.g. the pod
    /// name of a StatefulSet. On Apache Kafka a member restarted under the same name within
    /// the session timeout gets its partitions back without a rebalance. Unset: dynamic
    /// membership (a restart rejoins as a new member). The same name serves every
    /// projection of the process as it is: a static member's name must be unique within its
    /// group only, and each projection has a group of its own (see `group_id`); keeping
    /// the name also keeps the identity of members of running groups across an upgrade.
    #[serde(default)]
    pub group_instance_id: Option<String>,
    /// Most events in one batch (one Postgres transaction). Batches grow to this bound
    /// while a partition is behind (catch-up, replay) and stay small at the head.
    #[serde(default = "default_batch_max_events")]
    pub batch_max_events: usize,
    /// Most payload bytes in one batch (a single larger event still makes a batch alone).
    #[serde(default = "default_batch_max_bytes")]
    pub batch_max_bytes: usize,
    /// Longest a partition's oldest buffered event waits for the rest of its batch while
    /// events keep arriving; a partition with nothing more to read applies at once.
    #[serde(default = "default_batch_max_wait_ms")]
    pub batch_max_wait_ms: u64,
    /// A `rebuild`'s bounds of one batch in place of `batch_max_events`, for a projection with
    /// a custom table: far larger, since the rebuild reads from offset zero and each row's
    /// events within a batch are folded into one write (the larger the batch, the fewer rows
    /// PostgreSQL writes). Memory grows with it: about two batches of events per partition
    /// are held at once. A projection without custom tables is folded across batches (see
    /// `fold`) and is rebuilt in `run`'s batches: the fold does what larger batches would,
    /// and holds its rows rather than their events.
    #[serde(default = "default_rebuild_batch_max_events")]
    pub rebuild_batch_max_events: usize,
    /// A `rebuild`'s `batch_max_bytes`.
    #[serde(default = "default_rebuild_batch_max_bytes")]
    pub rebuild_batch_max_bytes: usize,
    /// Tries of a batch that fails with a transient database error (serialization failure,
    /// deadlock, concurrent writer), after the first; then the partition halts. Failures of
    /// the environment (PostgreSQL unreachable, restarting, read-only) are waited out for as
    /// long as they last and never count against this.
    #[serde(default = "default_max_retries")]
    pub max_retries: u32,
    /// First retry delay, doubled on each further retry.
    #[serde(default = "default_retry_backoff_ms")]
    pub retry_backoff_ms: u64,
    /// A partition halted by something that can be fixed while the run goes on (a
    /// permission, a missing table or column, a refused constraint, a bound, a failing
    /// `apply`) is read again from its checkpoint after 1 s, then 2, 4, … up to this many
    /// milliseconds between tries, until it gets past. 0: it stays halted until restarted.
    /// Poison, a gap, and a partition that lost its place never heal by themselves; nor does
    /// a run with `exit_when_caught_up` or a rebuild.
    #[serde(default = "default_halt_retry_max_delay_ms")]
    pub halt_retry_max_delay_ms: u64,
    /// Ignore stored checkpoints and read every assigned partition from its earliest
    /// offset, once per process; tables are kept (the version gate makes it a no-op on rows
    /// already current).
    #[serde(default)]
    pub from_beginning: bool,
    /// Stop once every assigned partition has reached the high watermark it had when it
    /// was assigned (for demos, tests and one-shot rebuilds).
    #[serde(default)]
    pub exit_when_caught_up: bool,
    /// What an event whose predecessor version never arrived (a gap) does: `park` its
    /// aggregate (its events are held in `projectionist_held` until the missing version
    /// arrives, while every other aggregate flows) or `halt` the partition.
    #[serde(default)]
    pub on_gap: OnGap,
    /// What an event that can never apply as it stands (poison) does: `dead-letter` (kept
    /// in `projectionist_dead_letters` with its exact bytes, its aggregate parked behind it,
    /// everything else flowing) or `halt` the partition.
    #[serde(default)]
    pub on_poison: OnPoison,
    /// Largest event payload taken, in bytes: a larger message is poison (`oversized`),
    /// dead-lettered alone without being parsed, or halting under `on_poison = halt`.
    #[serde(default = "default_max_event_bytes")]
    pub max_event_bytes: usize,
    /// Most aggregates a projection keeps parked (behind gaps and dead letters): a batch that
    /// would park more halts its partition, naming this bound, rather than hold events
    /// without end.
    #[serde(default = "default_max_parked_aggregates")]
    pub max_parked_aggregates: u64,
    /// Most events held for one parked aggregate: past it, its partition halts, naming this
    /// bound.
    #[serde(default = "default_max_held_per_aggregate")]
    pub max_held_per_aggregate: u64,
    /// Most open dead letters a projection keeps (neither retried nor discarded): a batch that
    /// would keep more halts its partition at the message past it, naming this bound, rather
    /// than store letters without end.
    #[serde(default = "default_max_dead_letters")]
    pub max_dead_letters: u64,
    /// Most payload bytes the open dead letters of a projection keep, as stored: past it, the
    /// partition halts as for `max_dead_letters`.
    #[serde(default = "default_max_dead_letter_bytes")]
    pub max_dead_letter_bytes: u64,
    /// Most bytes of one dead letter's payload stored: a longer payload is stored as its head
    /// (this many bytes), with its full length and SHA-256 (`dead-letters show` says so).
    /// Unset: `max_event_bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter_payload_max_bytes: Option<usize>,
    /// Also produce each dead letter to this topic once its batch commits, as Kafka Connect
    /// does: the message's key, payload and headers, plus `projectionist.projection`,
    /// `.topic`, `.partition`, `.offset`, `.dead_letter_id`, `.reason` and `.error` headers.
    /// PostgreSQL's table stays the record. Unset: none.
    #[serde(default)]
    pub dead_letter_topic: Option<String>,
    /// Settings of single projections that differ from the ones above, by projection name,
    /// e.g. `{"order_status": {"on_gap": "halt"}}`; see [`ProjectionSettings`]. A name that
    /// is not registered makes [`crate::Engine::run`] refuse to start.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub per_projection: BTreeMap<String, ProjectionSettings>,
    /// How each topic's messages carry the envelope, by topic, e.g. `{"orders": {"format":
    /// "cloudevents"}}`; a topic not listed carries projectionist's own JSON envelope.
    #[serde(default, skip_serializing_if = "formats_are_default")]
    pub topics: Formats,
}

fn formats_are_default(formats: &Formats) -> bool {
    formats.is_empty()
}

/// The settings one projection may set for itself, over the engine's (each unset one is the
/// engine's): what its gaps and poison events do, and the bounds and dead-letter topic of
/// its parking. See the fields of the same names on [`EngineConfig`].
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectionSettings {
    /// See [`EngineConfig::on_gap`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_gap: Option<OnGap>,
    /// See [`EngineConfig::on_poison`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_poison: Option<OnPoison>,
    /// See [`EngineConfig::max_event_bytes`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_event_bytes: Option<usize>,
    /// See [`EngineConfig::max_parked_aggregates`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_parked_aggregates: Option<u64>,
    /// See [`EngineConfig::max_held_per_aggregate`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_held_per_aggregate: Option<u64>,
    /// See [`EngineConfig::max_dead_letters`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_dead_letters: Option<u64>,
    /// See [`EngineConfig::max_dead_letter_bytes`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_dead_letter_bytes: Option<u64>,
    /// See [`EngineConfig::dead_letter_payload_max_bytes`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter_payload_max_bytes: Option<usize>,
    /// See [`EngineConfig::dead_letter_topic`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter_topic: Option<String>,
}

fn default_batch_max_events() -> usize {
    EngineConfig::DEFAULT_BATCH_MAX_EVENTS
}
fn default_batch_max_bytes() -> usize {
    EngineConfig::DEFAULT_BATCH_MAX_BYTES
}
fn default_batch_max_wait_ms() -> u64 {
    EngineConfig::DEFAULT_BATCH_MAX_WAIT_MS
}
fn default_rebuild_batch_max_events() -> usize {
    EngineConfig::DEFAULT_REBUILD_BATCH_MAX_EVENTS
}
fn default_rebuild_batch_max_bytes() -> usize {
    EngineConfig::DEFAULT_REBUILD_BATCH_MAX_BYTES
}
fn default_max_retries() -> u32 {
    EngineConfig::DEFAULT_MAX_RETRIES
}
fn default_retry_backoff_ms() -> u64 {
    EngineConfig::DEFAULT_RETRY_BACKOFF_MS
}
fn default_halt_retry_max_delay_ms() -> u64 {
    EngineConfig::DEFAULT_HALT_RETRY_MAX_DELAY_MS
}
fn default_max_event_bytes() -> usize {
    EngineConfig::DEFAULT_MAX_EVENT_BYTES
}
fn default_max_parked_aggregates() -> u64 {
    EngineConfig::DEFAULT_MAX_PARKED_AGGREGATES
}
fn default_max_held_per_aggregate() -> u64 {
    EngineConfig::DEFAULT_MAX_HELD_PER_AGGREGATE
}
fn default_max_dead_letters() -> u64 {
    EngineConfig::DEFAULT_MAX_DEAD_LETTERS
}
fn default_max_dead_letter_bytes() -> u64 {
    EngineConfig::DEFAULT_MAX_DEAD_LETTER_BYTES
}

/// What an engine may assume it has to itself, as `rebuild` does behind its lock and `run`
/// never does: not settings (processes of `run` overlap in a rebalance and share their
/// partitions through the group), so not in [`EngineConfig`] nor in the settings file. Set
/// with [`Engine::exclusive`](crate::Engine::exclusive).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Exclusive {
    /// The only writer of its projections' tables (a rebuild's shadow): the rows a batch
    /// builds on are read without row locks; every write still checks the version it
    /// builds on.
    pub sole_writer: bool,
    /// Batches folded in memory and written together once due, with the checkpoint past the
    /// last (see `projectionist_postgres::Folding`): a rebuild's bulk load. Needs
    /// `sole_writer`.
    pub fold: bool,
    /// The only reader of its projections' topics in its groups: every partition read by
    /// direct assignment, without joining a consumer group (no join to wait for, no leave on
    /// exit).
    pub sole_reader: bool,
}

impl EngineConfig {
    /// Default of [`EngineConfig::batch_max_events`].
    pub const DEFAULT_BATCH_MAX_EVENTS: usize = 5000;
    /// Default of [`EngineConfig::batch_max_bytes`] (4 MiB).
    pub const DEFAULT_BATCH_MAX_BYTES: usize = 4 << 20;
    /// Default of [`EngineConfig::batch_max_wait_ms`].
    pub const DEFAULT_BATCH_MAX_WAIT_MS: u64 = 100;
    /// Default of [`EngineConfig::rebuild_batch_max_events`].
    pub const DEFAULT_REBUILD_BATCH_MAX_EVENTS: usize = 20_000;
    /// Default of [`EngineConfig::rebuild_batch_max_bytes`] (32 MiB).
    pub const DEFAULT_REBUILD_BATCH_MAX_BYTES: usize = 32 << 20;
    /// Default of [`EngineConfig::max_retries`].
    pub const DEFAULT_MAX_RETRIES: u32 = 5;
    /// Default of [`EngineConfig::retry_backoff_ms`].
    pub const DEFAULT_RETRY_BACKOFF_MS: u64 = 100;
    /// Default of [`EngineConfig::halt_retry_max_delay_ms`] (5 minutes).
    pub const DEFAULT_HALT_RETRY_MAX_DELAY_MS: u64 = 300_000;
    /// Default of [`EngineConfig::max_event_bytes`] (1 MiB, Kafka's default message size).
    pub const DEFAULT_MAX_EVENT_BYTES: usize = 1 << 20;
    /// Default of [`EngineConfig::max_parked_aggregates`].
    pub const DEFAULT_MAX_PARKED_AGGREGATES: u64 = 10_000;
    /// Default of [`EngineConfig::max_held_per_aggregate`].
    pub const DEFAULT_MAX_HELD_PER_AGGREGATE: u64 = 10_000;
    /// Default of [`EngineConfig::max_dead_letters`].
    pub const DEFAULT_MAX_DEAD_LETTERS: u64 = 10_000;
    /// Default of [`EngineConfig::max_dead_letter_bytes`] (256 MiB).
    pub const DEFAULT_MAX_DEAD_LETTER_BYTES: u64 = 256 << 20;

    /// Defaults for the given brokers, or for a client's brokers and properties (security
    /// settings and the like).
    pub fn new(client: impl Into<KafkaClientConfig>) -> Self {
        Self {
            client: client.into(),
            group_id: None,
            group_instance_id: None,
            batch_max_events: default_batch_max_events(),
            batch_max_bytes: default_batch_max_bytes(),
            batch_max_wait_ms: default_batch_max_wait_ms(),
            rebuild_batch_max_events: default_rebuild_batch_max_events(),
            rebuild_batch_max_bytes: default_rebuild_batch_max_bytes(),
            max_retries: default_max_retries(),
            retry_backoff_ms: default_retry_backoff_ms(),
            halt_retry_max_delay_ms: default_halt_retry_max_delay_ms(),
            from_beginning: false,
            exit_when_caught_up: false,
            on_gap: OnGap::Park,
            on_poison: OnPoison::DeadLetter,
            max_event_bytes: default_max_event_bytes(),
            max_parked_aggregates: default_max_parked_aggregates(),
            max_held_per_aggregate: default_max_held_per_aggregate(),
            max_dead_letters: default_max_dead_letters(),
            max_dead_letter_bytes: default_max_dead_letter_bytes(),
            dead_letter_payload_max_bytes: None,
            dead_letter_topic: None,
            per_projection: BTreeMap::new(),
            topics: Formats::default(),
        }
    }

    /// Sets `projection`'s own settings (see [`EngineConfig::per_projection`]).
    pub fn with_projection_settings(mut self, projection: impl Into<String>, settings: ProjectionSettings) -> Self {
        self.per_projection.insert(projection.into(), settings);
        self
    }

    /// The configuration `projection` runs with: this one with its own settings laid over.
    pub fn for_projection(&self, projection: &str) -> EngineConfig {
        let mut config = self.clone();
        config.per_projection.clear();
        let Some(own) = self.per_projection.get(projection) else { return config };
        let ProjectionSettings {
            on_gap,
            on_poison,
            max_event_bytes,
            max_parked_aggregates,
            max_held_per_aggregate,
            max_dead_letters,
            max_dead_letter_bytes,
            dead_letter_payload_max_bytes,
            dead_letter_topic,
        } = own.clone();
        config.on_gap = on_gap.unwrap_or(config.on_gap);
        config.on_poison = on_poison.unwrap_or(config.on_poison);
        config.max_event_bytes = max_event_bytes.unwrap_or(config.max_event_bytes);
        config.max_parked_aggregates = max_parked_aggregates.unwrap_or(config.max_parked_aggregates);
        config.max_held_per_aggregate = max_held_per_aggregate.unwrap_or(config.max_held_per_aggregate);
        config.max_dead_letters = max_dead_letters.unwrap_or(config.max_dead_letters);
        config.max_dead_letter_bytes = max_dead_letter_bytes.unwrap_or(config.max_dead_letter_bytes);
        config.dead_letter_payload_max_bytes = dead_letter_payload_max_bytes.or(config.dead_letter_payload_max_bytes);
        config.dead_letter_topic = dead_letter_topic.or(config.dead_letter_topic);
        config
    }

    /// Reads `topic`'s messages as `format` says (see [`EngineConfig::topics`]).
    pub fn with_topic_format(mut self, topic: impl Into<String>, format: Format) -> Self {
        self.topics.insert(topic, format);
        self
    }

    /// Reads keys and values in Confluent's wire format (Avro, Protobuf, JSON Schema) with
    /// the schemas `schemas` fetches, e.g. a `projectionist_registry::Registry`.
    pub fn with_schemas(mut self, schemas: std::sync::Arc<dyn projectionist_core::format::Schemas>) -> Self {
        self.topics = self.topics.with_schemas(schemas);
        self
    }

    /// Sets the consumer group id prefix: each projection consumes in
    /// `<group_id>.<projection>` (see the field).
    pub fn with_group_id(mut self, group_id: impl Into<String>) -> Self {
        self.group_id = Some(group_id.into());
        self
    }

    /// Sets the batch bounds: most events, most payload bytes, longest wait.
    pub fn with_batch(mut self, max_events: usize, max_bytes: usize, max_wait: Duration) -> Self {
        self.batch_max_events = max_events.max(1);
        self.batch_max_bytes = max_bytes.max(1);
        self.batch_max_wait_ms = max_wait.as_millis() as u64;
        self
    }

    /// Replays from offset zero (see the field).
    pub fn with_from_beginning(mut self, yes: bool) -> Self {
        self.from_beginning = yes;
        self
    }

    /// Stops once caught up (see the field).
    pub fn with_exit_when_caught_up(mut self, yes: bool) -> Self {
        self.exit_when_caught_up = yes;
        self
    }

    /// Parks or halts on a gap (see the field).
    pub fn with_on_gap(mut self, on_gap: OnGap) -> Self {
        self.on_gap = on_gap;
        self
    }

    /// Dead-letters or halts on a poison event (see the field).
    pub fn with_on_poison(mut self, on_poison: OnPoison) -> Self {
        self.on_poison = on_poison;
        self
    }

    /// How a batch, a checkpoint read and the start's table check retry: `max_retries` and
    /// `retry_backoff_ms`.
    pub(crate) fn retry_policy(&self) -> crate::retry::RetryPolicy {
        crate::retry::RetryPolicy {
            max_retries: self.max_retries,
            backoff: Duration::from_millis(self.retry_backoff_ms),
        }
    }

    /// Sets an extra librdkafka property.
    pub fn with_kafka_property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.client.properties.insert(key.into(), value.into());
        self
    }

    /// The consumer group of `projection`: `<group_id>.<projection>`, so that no two
    /// projections share a group — and a topic's partitions — and a projection's group never
    /// depends on which others run beside it; `projectionist.<projection>` without a group id.
    pub fn group_for(&self, projection: &str) -> String {
        format!("{}.{projection}", self.group_id.as_deref().unwrap_or("projectionist"))
    }

    /// The bounds on parking and dead letters a batch is refused past (see the fields).
    pub(crate) fn bounds(&self) -> projectionist_postgres::park::Bounds {
        projectionist_postgres::park::Bounds {
            parked_aggregates: self.max_parked_aggregates,
            held_per_aggregate: self.max_held_per_aggregate,
            dead_letters: self.max_dead_letters,
            dead_letter_bytes: self.max_dead_letter_bytes,
            dead_letter_payload: self.dead_letter_payload_max_bytes.unwrap_or(self.max_event_bytes),
        }
    }

    pub(crate) fn batch_max_wait(&self) -> Duration {
        Duration::from_millis(self.batch_max_wait_ms)
    }
}

impl fmt::Debug for EngineConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EngineConfig")
            .field("client", &self.client)
            .field("group_id", &self.group_id)
            .field("group_instance_id", &self.group_instance_id)
            .field("batch_max_events", &self.batch_max_events)
            .field("batch_max_bytes", &self.batch_max_bytes)
            .field("batch_max_wait_ms", &self.batch_max_wait_ms)
            .field("max_retries", &self.max_retries)
            .field("retry_backoff_ms", &self.retry_backoff_ms)
            .field("from_beginning", &self.from_beginning)
            .field("exit_when_caught_up", &self.exit_when_caught_up)
            .field("on_gap", &self.on_gap)
            .field("on_poison", &self.on_poison)
            .field("max_event_bytes", &self.max_event_bytes)
            .field("max_parked_aggregates", &self.max_parked_aggregates)
            .field("max_held_per_aggregate", &self.max_held_per_aggregate)
            .field("max_dead_letters", &self.max_dead_letters)
            .field("max_dead_letter_bytes", &self.max_dead_letter_bytes)
            .field("dead_letter_payload_max_bytes", &self.dead_letter_payload_max_bytes)
            .field("dead_letter_topic", &self.dead_letter_topic)
            .field("rebuild_batch_max_events", &self.rebuild_batch_max_events)
            .field("rebuild_batch_max_bytes", &self.rebuild_batch_max_bytes)
            .field("per_projection", &self.per_projection)
            .finish()
    }
}

/// Replaces any `user:password@` in a URL-ish string with `<redacted>@`.
pub fn redact_userinfo(s: &str) -> String {
    s.split(',')
        .map(|part| match (part.find("://"), part.rfind('@')) {
            (Some(scheme), Some(at)) if at > scheme => format!("{}<redacted>{}", &part[..scheme + 3], &part[at..]),
            (None, Some(at)) => format!("<redacted>{}", &part[at..]),
            _ => part.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests;
