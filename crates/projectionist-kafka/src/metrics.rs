//! Every metric projectionist emits, named in one place. Labels come from bounded sets
//! only (projection, topic, partition, reason) — never an event or aggregate id. Emitted
//! per batch, not per event.

use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};

/// Events that changed a read model. Labels: `projection`.
pub const EVENTS_APPLIED: &str = "projectionist_events_applied_total";
/// Events skipped by the version gate or the event filter. Labels: `projection`,
/// `reason` (`duplicate`, `stale`, `ignored`).
pub const EVENTS_SKIPPED: &str = "projectionist_events_skipped_total";
/// Events of a type the projection has no variant for (also counted in
/// [`EVENTS_SKIPPED`] as `ignored`). Labels: `projection`, `type` (the event type, for at
/// most 100 types per projection and process; any further ones as `other`).
pub const EVENTS_IGNORED: &str = "projectionist_events_ignored_total";
/// Events that halted their partition. Labels: `projection`, `reason` (`poison`, `gap`,
/// `error`).
pub const EVENTS_FAILED: &str = "projectionist_events_failed_total";
/// Events held behind a parked aggregate (its missing version never arrived), stored in
/// `projectionist_held`. Labels: `projection`.
pub const EVENTS_PARKED: &str = "projectionist_events_parked_total";
/// Held events applied (or found duplicate or stale) once their aggregate's missing version
/// arrived; also counted in [`EVENTS_APPLIED`] or [`EVENTS_SKIPPED`]. So, per projection:
/// read = applied + skipped + parked − drained. Labels: `projection`.
pub const EVENTS_DRAINED: &str = "projectionist_events_drained_total";
/// Aggregates parked: one of their events found its predecessor missing. Labels:
/// `projection`.
pub const AGGREGATES_PARKED: &str = "projectionist_aggregates_parked_total";
/// Parked aggregates resumed: the version they waited for arrived. Labels: `projection`.
pub const AGGREGATES_RESUMED: &str = "projectionist_aggregates_resumed_total";
/// Aggregates parked now, and events held for them, as stored (refreshed with the lag).
/// Labels: `projection`.
pub const AGGREGATES_PARKED_NOW: &str = "projectionist_aggregates_parked";
/// Events of an aggregate of the projection held now, as stored (refreshed with the lag).
/// Labels: `projection`.
pub const EVENTS_HELD_NOW: &str = "projectionist_events_held";
/// Dead letters kept: events that can never apply as they stand (with their aggregate
/// parked behind them), and messages that are not an envelope at all. Labels: `projection`,
/// `reason` (`envelope`, `key`, `tombstone`, `data`, `value`, `apply`, `declaration`).
pub const DEAD_LETTERS: &str = "projectionist_dead_letters_total";
/// Payload bytes of the projection's open dead letters, as stored (refreshed with the lag):
/// what `max_dead_letter_bytes` bounds. Labels: `projection`.
pub const DEAD_LETTER_BYTES_NOW: &str = "projectionist_dead_letter_bytes";
/// Events per applied batch (histogram). Labels: `projection`.
pub const BATCH_SIZE: &str = "projectionist_batch_size_events";
/// Time to apply and commit one batch (histogram). Labels: `projection`.
pub const BATCH_DURATION: &str = "projectionist_batch_duration_seconds";
/// Batch attempts retried after a transient database error, attempts while waiting out a
/// PostgreSQL outage included. Labels: `projection`.
pub const BATCH_RETRIES: &str = "projectionist_batch_retries_total";
/// Batches applied event by event because a concurrent writer moved their rows (another
/// process applying an overlapping batch). Labels: `projection`.
pub const BATCH_FALLBACKS: &str = "projectionist_batch_fallbacks_total";
/// Offsets between the projection's checkpoint and the partition's head (its last stable
/// offset: what a `read_committed` reader can reach): 0 when caught up. Refreshed for every
/// assigned partition with librdkafka's statistics (`statistics.interval.ms`), whether or
/// not anything arrives. Labels: `projection`, `topic`, `partition`.
pub const CONSUMER_LAG_MESSAGES: &str = "projectionist_consumer_lag_messages";
/// How far behind the head the projection is, in time: 0 when caught up, otherwise the age
/// of the oldest message read but not yet applied, by its broker timestamp (as Kafka lag
/// exporters measure it; a halted partition's age keeps growing). Refreshed with
/// [`CONSUMER_LAG_MESSAGES`]. Labels: `projection`, `topic`, `partition`.
pub const CONSUMER_LAG_SECONDS: &str = "projectionist_consumer_lag_seconds";
/// Age of the last applied event when it was applied (now − its `occurred_at`, set by the
/// producer): the end-to-end delay from the event to the read model. Not a lag: an old
/// stream replayed shows old events. Labels: `projection`, `topic`, `partition`.
pub const APPLIED_EVENT_AGE_SECONDS: &str = "projectionist_applied_event_age_seconds";
/// Checkpoints committed to PostgreSQL (one per batch). Labels: `projection`.
pub const CHECKPOINT_COMMITS: &str = "projectionist_checkpoint_commits_total";
/// Partition assignments and revocations. Labels: `projection`, `kind` (`assign`, `revoke`).
pub const REBALANCES: &str = "projectionist_rebalances_total";
/// Partitions halted and waiting for a fix. Labels: `projection`.
pub const PARTITIONS_HALTED: &str = "projectionist_partitions_halted";
/// 1 while some partition of the projection (or its checkpoint read on assignment) waits
/// for PostgreSQL to come back — unreachable, restarting, read-only — else 0. Applying
/// resumes by itself; `/ready` answers 503 meanwhile. Labels: `projection`.
pub const POSTGRES_WAITING: &str = "projectionist_postgres_waiting";
/// Gauge: 1 while a partition of the projection waits for the schema registry, else 0.
pub const REGISTRY_WAITING: &str = "projectionist_registry_waiting";
/// PostgreSQL pool connections. Labels: `state` (`in_use`, `idle`).
pub const PG_POOL_CONNECTIONS: &str = "projectionist_pg_pool_connections";
/// `/wait` requests waiting now for a projection to apply an event (read your writes).
pub const WAIT_REQUESTS: &str = "projectionist_wait_requests";
/// A `rebuild` process (the engine metrics above describe its shadow's run): messages its
/// shadow has applied so far of what the topics held when it started. Labels: `projection`.
pub const REBUILD_MESSAGES_DONE: &str = "projectionist_rebuild_messages_done";
/// A `rebuild` process: messages left between its shadow's checkpoints and the heads as they
/// were when it started (ETA: this over the rate of [`REBUILD_MESSAGES_DONE`]). Labels:
/// `projection`.
pub const REBUILD_MESSAGES_LEFT: &str = "projectionist_rebuild_messages_left";
/// A `rebuild` process's phase: 1 loading and catching up, 2 swapping, 0 over (swapped,
/// stopped or failed). Labels: `projection`.
pub const REBUILD_PHASE: &str = "projectionist_rebuild_phase";
/// How long a rebuild's swap transaction took (the live tables locked meanwhile). Labels:
/// `projection`.
pub const REBUILD_SWAP_SECONDS: &str = "projectionist_rebuild_swap_seconds";
/// Rebuilds ended. Labels: `projection`, `outcome` (`swapped`, `verified`, `differs`,
/// `stopped`, `failed`).
pub const REBUILDS: &str = "projectionist_rebuilds_total";
/// Trace spans sent to the OTLP collector (with traces on).
pub const TRACE_SPANS_EXPORTED: &str = "projectionist_trace_spans_exported_total";
/// Trace spans dropped rather than holding up the pipeline. Label: `reason` (`queue_full`,
/// `export_failed`).
pub const TRACE_SPANS_DROPPED: &str = "projectionist_trace_spans_dropped_total";
/// Halted partitions read again from their checkpoint, their halt's cause possibly gone.
pub const HALT_RETRIES: &str = "projectionist_halt_retries_total";

/// Times a partition waited past the pool's acquire timeout (10 s) for a PostgreSQL
/// connection, every connection of the process's budget in use. Label: `projection`.
pub const CONNECTION_WAITS: &str = "projectionist_pg_connection_waits_total";

/// Actions taken in the console. Labels: `action` (`retry`, `discard`, `skip`), `outcome`
/// (`done`, `still_failing`, `failed`, `refused`).
pub const CONSOLE_ACTIONS: &str = "projectionist_console_actions_total";

/// What kind of series a metric is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only grows (Prometheus `counter`).
    Counter,
    /// Goes up and down (Prometheus `gauge`).
    Gauge,
    /// A distribution (Prometheus `histogram`).
    Histogram,
}

/// One metric, as its description and the reference table (docs/reference.md) give it.
#[derive(Debug, Clone, Copy)]
pub struct Metric {
    /// Its name.
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: Kind,
    /// Its unit, where it has one.
    pub unit: Option<Unit>,
    /// Its labels, with their values where they come from a fixed set.
    pub labels: &'static str,
    /// What it counts or measures.
    pub help: &'static str,
}

const fn metric(
    name: &'static str,
    kind: Kind,
    unit: Option<Unit>,
    labels: &'static str,
    help: &'static str,
) -> Metric {
    Metric { name, kind, unit, labels, help }
}

use Kind::{Counter, Gauge, Histogram};

/// Every metric projectionist emits: the one list its descriptions and the reference table
/// come from.
pub const ALL: &[Metric] = &[
    metric(EVENTS_APPLIED, Counter, Some(Unit::Count), "projection", "Events that changed a read model."),
    metric(
        EVENTS_SKIPPED,
        Counter,
        Some(Unit::Count),
        "projection, reason (duplicate, stale, ignored)",
        "Events skipped: a duplicate or stale version, or a type the projection does not handle.",
    ),
    metric(
        EVENTS_IGNORED,
        Counter,
        Some(Unit::Count),
        "projection, type (at most 100 per projection, then other)",
        "Events of a type the projection does not handle, by type.",
    ),
    metric(
        EVENTS_FAILED,
        Counter,
        Some(Unit::Count),
        "projection, reason (poison, gap, error)",
        "Events that halted their partition.",
    ),
    metric(
        EVENTS_PARKED,
        Counter,
        Some(Unit::Count),
        "projection",
        "Events held behind a parked aggregate's missing version.",
    ),
    metric(
        EVENTS_DRAINED,
        Counter,
        Some(Unit::Count),
        "projection",
        "Held events applied once their missing version arrived.",
    ),
    metric(AGGREGATES_PARKED, Counter, Some(Unit::Count), "projection", "Aggregates parked behind a missing version."),
    metric(AGGREGATES_RESUMED, Counter, Some(Unit::Count), "projection", "Parked aggregates resumed."),
    metric(AGGREGATES_PARKED_NOW, Gauge, Some(Unit::Count), "projection", "Aggregates parked now."),
    metric(EVENTS_HELD_NOW, Gauge, Some(Unit::Count), "projection", "Events held now for parked aggregates."),
    metric(
        DEAD_LETTERS,
        Counter,
        Some(Unit::Count),
        "projection, reason (envelope, key, tombstone, data, value, apply, declaration)",
        "Dead letters kept, by reason.",
    ),
    metric(
        DEAD_LETTER_BYTES_NOW,
        Gauge,
        Some(Unit::Bytes),
        "projection",
        "Payload bytes of the open dead letters, as stored.",
    ),
    metric(BATCH_SIZE, Histogram, Some(Unit::Count), "projection", "Events per applied batch."),
    metric(BATCH_DURATION, Histogram, Some(Unit::Seconds), "projection", "Time to apply and commit one batch."),
    metric(
        BATCH_RETRIES,
        Counter,
        Some(Unit::Count),
        "projection",
        "Batch attempts retried after a transient database error, waits for PostgreSQL included.",
    ),
    metric(
        BATCH_FALLBACKS,
        Counter,
        Some(Unit::Count),
        "projection",
        "Batches applied event by event after a concurrent writer moved their rows.",
    ),
    metric(
        CONSUMER_LAG_MESSAGES,
        Gauge,
        Some(Unit::Count),
        "projection, topic, partition",
        "Offsets between the checkpoint and the partition's head; 0 when caught up.",
    ),
    metric(
        CONSUMER_LAG_SECONDS,
        Gauge,
        Some(Unit::Seconds),
        "projection, topic, partition",
        "Age of the oldest message not yet applied (broker time); 0 when caught up.",
    ),
    metric(
        APPLIED_EVENT_AGE_SECONDS,
        Gauge,
        Some(Unit::Seconds),
        "projection, topic, partition",
        "Age of the last applied event's occurred_at when applied.",
    ),
    metric(CHECKPOINT_COMMITS, Counter, Some(Unit::Count), "projection", "Checkpoints committed to PostgreSQL."),
    metric(
        REBALANCES,
        Counter,
        Some(Unit::Count),
        "projection, kind (assign, revoke)",
        "Partition assignments and revocations.",
    ),
    metric(PARTITIONS_HALTED, Gauge, Some(Unit::Count), "projection", "Partitions halted now."),
    metric(
        POSTGRES_WAITING,
        Gauge,
        None,
        "projection",
        "1 while a partition waits for PostgreSQL to come back, else 0.",
    ),
    metric(
        REGISTRY_WAITING,
        Gauge,
        None,
        "projection",
        "1 while a partition waits for the schema registry to answer, else 0.",
    ),
    metric(
        PG_POOL_CONNECTIONS,
        Gauge,
        Some(Unit::Count),
        "state (in_use, idle)",
        "PostgreSQL pool connections by state.",
    ),
    metric(WAIT_REQUESTS, Gauge, Some(Unit::Count), "", "/wait requests waiting for a projection to apply an event."),
    metric(
        REBUILD_MESSAGES_DONE,
        Gauge,
        Some(Unit::Count),
        "projection",
        "Messages a rebuild's shadow has applied so far.",
    ),
    metric(
        REBUILD_MESSAGES_LEFT,
        Gauge,
        Some(Unit::Count),
        "projection",
        "Messages left for a rebuild to reach the heads as they were at its start.",
    ),
    metric(
        REBUILD_PHASE,
        Gauge,
        None,
        "projection",
        "A rebuild's phase: 1 loading and catching up, 2 swapping, 0 over.",
    ),
    metric(
        REBUILD_SWAP_SECONDS,
        Gauge,
        Some(Unit::Seconds),
        "projection",
        "How long a rebuild's swap transaction took.",
    ),
    metric(
        REBUILDS,
        Counter,
        Some(Unit::Count),
        "projection, outcome (swapped, verified, differs, stopped, failed)",
        "Rebuilds ended, by outcome.",
    ),
    metric(TRACE_SPANS_EXPORTED, Counter, Some(Unit::Count), "", "Trace spans sent to the OTLP collector."),
    metric(
        TRACE_SPANS_DROPPED,
        Counter,
        Some(Unit::Count),
        "reason (queue_full, export_failed)",
        "Trace spans dropped rather than holding up the pipeline.",
    ),
    metric(
        HALT_RETRIES,
        Counter,
        Some(Unit::Count),
        "projection",
        "Halted partitions read again from their checkpoint, the halt's cause possibly gone.",
    ),
    metric(
        CONNECTION_WAITS,
        Counter,
        Some(Unit::Count),
        "projection",
        "Waits past the pool's acquire timeout for a PostgreSQL connection, every one of the budget in use.",
    ),
    metric(
        CONSOLE_ACTIONS,
        Counter,
        Some(Unit::Count),
        "action (retry, discard, skip), outcome (done, still_failing, failed, refused)",
        "Console actions, by action and outcome.",
    ),
];

/// Registers descriptions and units with the installed recorder.
pub fn describe() {
    for m in ALL {
        match (m.kind, m.unit) {
            (Counter, Some(unit)) => describe_counter!(m.name, unit, m.help),
            (Counter, None) => describe_counter!(m.name, m.help),
            (Gauge, Some(unit)) => describe_gauge!(m.name, unit, m.help),
            (Gauge, None) => describe_gauge!(m.name, m.help),
            (Histogram, Some(unit)) => describe_histogram!(m.name, unit, m.help),
            (Histogram, None) => describe_histogram!(m.name, m.help),
        }
    }
}

/// The reference table of [`ALL`], in Markdown: name, type, labels and meaning.
pub fn reference() -> String {
    let mut out = String::from("| metric | type | labels | what |\n|---|---|---|---|\n");
    for m in ALL {
        let kind = match m.kind {
            Counter => "counter",
            Gauge => "gauge",
            Histogram => "histogram",
        };
        let labels = if m.labels.is_empty() { "—" } else { m.labels };
        out.push_str(&format!("| `{}` | {kind} | {labels} | {} |\n", m.name, m.help));
    }
    out
}

/// A rebuild of `projection` has applied `done` messages, `left` to go.
pub fn rebuild_progress(projection: &str, done: u64, left: u64) {
    metrics::gauge!(REBUILD_MESSAGES_DONE, "projection" => projection.to_owned()).set(done as f64);
    metrics::gauge!(REBUILD_MESSAGES_LEFT, "projection" => projection.to_owned()).set(left as f64);
}

/// A rebuild of `projection` entered `phase` (see [`REBUILD_PHASE`]).
pub(crate) fn rebuild_phase(projection: &str, phase: u8) {
    metrics::gauge!(REBUILD_PHASE, "projection" => projection.to_owned()).set(f64::from(phase));
}

/// A rebuild of `projection` ended with `outcome`, its swap (if any) taking `swap`.
pub(crate) fn rebuild_ended(projection: &str, outcome: &'static str, swap: Option<std::time::Duration>) {
    rebuild_phase(projection, 0);
    if let Some(swap) = swap {
        metrics::gauge!(REBUILD_SWAP_SECONDS, "projection" => projection.to_owned()).set(swap.as_secs_f64());
    }
    metrics::counter!(REBUILDS, "projection" => projection.to_owned(), "outcome" => outcome).increment(1);
}

/// Sets [`AGGREGATES_PARKED_NOW`], [`EVENTS_HELD_NOW`] and [`DEAD_LETTER_BYTES_NOW`] of
/// `projection` from the tables, in the background.
pub(crate) fn parked_now(pool: &projectionist_postgres::PgPool, projection: &str) {
    let (pool, projection) = (pool.clone(), projection.to_owned());
    tokio::spawn(async move {
        match projectionist_postgres::park::count(&pool, &projection).await {
            Ok((aggregates, events, _, dead_letter_bytes)) => {
                metrics::gauge!(AGGREGATES_PARKED_NOW, "projection" => projection.clone()).set(aggregates as f64);
                metrics::gauge!(EVENTS_HELD_NOW, "projection" => projection.clone()).set(events as f64);
                metrics::gauge!(DEAD_LETTER_BYTES_NOW, "projection" => projection).set(dead_letter_bytes as f64);
            }
            Err(e) => tracing::debug!(error = %e, "Cannot count the parked aggregates."),
        }
    });
}

/// `n` events of `event_type` (or `other`) ignored.
pub(crate) fn events_ignored(projection: &str, event_type: String, n: u64) {
    metrics::counter!(EVENTS_IGNORED, "projection" => projection.to_owned(), "type" => event_type).increment(n);
}

/// A batch committed: its outcome counters, size (`events` applied), duration and the age of
/// its last event (which occurred at `last_occurred_ms`, ms since the epoch);
/// the pool's use; the batch span's fields.
pub(crate) fn batch_committed(
    pool: &projectionist_postgres::PgPool,
    projection: &str,
    tp: &crate::tp::Tp,
    events: usize,
    last_occurred_ms: Option<i64>,
    counts: &projectionist_core::OutcomeCounts,
    took: std::time::Duration,
) {
    let projection = projection.to_owned();
    let span = tracing::Span::current();
    // As signed integers, which OpenTelemetry keeps as numbers.
    span.record("applied", counts.applied as i64)
        .record("duplicate", counts.duplicate as i64)
        .record("stale", counts.stale as i64)
        .record("ignored", counts.ignored as i64);
    tracing::debug!(took_ms = took.as_millis() as u64, "Batch committed.");
    metrics::counter!(EVENTS_APPLIED, "projection" => projection.clone()).increment(counts.applied);
    if counts.parked > 0 {
        metrics::counter!(EVENTS_PARKED, "projection" => projection.clone()).increment(counts.parked);
    }
    for (reason, n) in [("duplicate", counts.duplicate), ("stale", counts.stale), ("ignored", counts.ignored)] {
        metrics::counter!(EVENTS_SKIPPED, "projection" => projection.clone(), "reason" => reason).increment(n);
    }
    metrics::histogram!(BATCH_SIZE, "projection" => projection.clone()).record(events as f64);
    metrics::histogram!(BATCH_DURATION, "projection" => projection.clone()).record(took.as_secs_f64());
    metrics::counter!(CHECKPOINT_COMMITS, "projection" => projection.clone()).increment(1);
    if let Some(last) = last_occurred_ms {
        let age = (crate::tp::now_ms() - last).max(0) as f64 / 1000.0;
        let (topic, partition) = (tp.topic.clone(), tp.partition.to_string());
        metrics::gauge!(
            APPLIED_EVENT_AGE_SECONDS,
            "projection" => projection,
            "topic" => topic,
            "partition" => partition
        )
        .set(age);
    }
    let (size, idle) = (pool.size(), pool.num_idle() as u32);
    metrics::gauge!(PG_POOL_CONNECTIONS, "state" => "in_use").set(size.saturating_sub(idle) as f64);
    metrics::gauge!(PG_POOL_CONNECTIONS, "state" => "idle").set(idle as f64);
}

/// Sets `projection`'s halted-partitions and waiting-for-PostgreSQL gauges to 0, as a run
/// starts: a series that does not exist cannot make an alert on `> 0` fire well.
pub(crate) fn zero_alert_gauges(projection: &str) {
    metrics::gauge!(PARTITIONS_HALTED, "projection" => projection.to_owned()).set(0.0);
    metrics::gauge!(POSTGRES_WAITING, "projection" => projection.to_owned()).set(0.0);
    metrics::gauge!(REGISTRY_WAITING, "projection" => projection.to_owned()).set(0.0);
}
