//! Halts: where and why a partition stopped, and the one place a halt is reported (log,
//! pause, halted set, metrics), for the partition task and the runner alike.

use std::sync::Arc;

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::topic_partition_list::TopicPartitionList;

use projectionist_postgres::halts::{self, StoredHalt};
use projectionist_postgres::PgPool;

use crate::context::EngineContext;
use crate::metrics as m;
use crate::stats::Stats;
use crate::tp::Tp;

/// Why a partition stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HaltKind {
    /// An event that cannot be decoded (or whose key contradicts it).
    Poison,
    /// An event whose predecessor version was never applied.
    Gap,
    /// A failure that bounded retries did not cure or that retrying cannot fix, or a
    /// checkpoint that cannot be read for such a reason (never an outage: those are waited
    /// out).
    Error,
}

impl HaltKind {
    /// The `reason` label of `projectionist_events_failed_total`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Poison => "poison",
            Self::Gap => "gap",
            Self::Error => "error",
        }
    }
}

/// Where and why a partition stopped: nothing at or after `offset` is applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Halt {
    pub offset: i64,
    /// The stopped message's broker timestamp (ms), when there is one.
    pub timestamp: Option<i64>,
    pub aggregate: String,
    pub reason: String,
    pub kind: HaltKind,
    /// Whether its cause can go away while the process runs (a permission, a table or
    /// column, a constraint, a bound, a failing `apply`), so that reading again from the
    /// checkpoint may get past it: a run retries such a halt with backoff (see [`super::heal`]).
    /// Not a poison event, a gap, or a partition that lost its place.
    pub heals: bool,
}

/// Reports `halt` of partition `tp` of `projection`: logged, the partition paused and
/// counted halted, the failure counted, and recorded in `live`'s `projectionist_halts` for
/// `status` (a live run's: not a rebuild's). It stays halted in this process unless
/// `healing` says when it is retried (and since when it is halted). Returns what the run's
/// halts list shows of it.
pub(crate) fn report(
    projection: &str,
    tp: &Tp,
    halt: Halt,
    (stats, live): (&Stats, Option<&PgPool>),
    consumer: &Arc<StreamConsumer<EngineContext>>,
    healing: Option<(std::time::Duration, chrono::DateTime<chrono::Utc>)>,
) -> String {
    if let Some(pool) = live {
        recorded(pool, projection, tp, &halt, healing);
    }
    let err = crate::Error::Halted {
        projection: projection.to_owned(),
        topic: tp.topic.clone(),
        partition: tp.partition,
        offset: halt.offset,
        aggregate: halt.aggregate,
        reason: halt.reason,
    };
    let shown = match healing {
        None => {
            tracing::error!(
                error = %err,
                "Partition halted; nothing at or after this offset is applied until it is fixed."
            );
            err.to_string()
        }
        Some((delay, since)) => {
            let (retry_in_s, since) = (delay.as_secs(), since.format("%Y-%m-%d %H:%M:%S UTC"));
            tracing::error!(
                error = %err,
                retry_in_s,
                %since,
                "Partition halted; nothing at or after this offset is applied until it is fixed. It is retried in \
                 {retry_in_s} s, from its checkpoint, until it gets past (halted since {since})."
            );
            format!("{err} (halted since {since}; retried in {retry_in_s} s, and on until it gets past)")
        }
    };
    pause(consumer, tp);
    let halted = {
        let mut set = stats.halted.lock().expect("halted lock");
        set.insert(tp.clone());
        set.len()
    };
    metrics::counter!(m::EVENTS_FAILED, "projection" => projection.to_owned(), "reason" => halt.kind.label())
        .increment(1);
    metrics::gauge!(m::PARTITIONS_HALTED, "projection" => projection.to_owned()).set(halted as f64);
    stats.halts.lock().expect("halts lock").push(shown.clone());
    shown
}

/// Records a halt for `status`, off the partition's way: a halt is reported whether or not
/// PostgreSQL takes the record.
fn recorded(
    pool: &PgPool,
    projection: &str,
    tp: &Tp,
    halt: &Halt,
    healing: Option<(std::time::Duration, chrono::DateTime<chrono::Utc>)>,
) {
    let now = chrono::Utc::now();
    let stored = StoredHalt {
        projection: projection.to_owned(),
        topic: tp.topic.clone(),
        partition: tp.partition,
        halted_at: halt.offset,
        reason: halt.reason.clone(),
        heals: healing.is_some(),
        since: healing.map_or(now, |(_, since)| since),
        retry_at: healing.and_then(|(delay, _)| chrono::Duration::from_std(delay).ok()).map(|delay| now + delay),
        reported_at: now,
    };
    let pool = pool.clone();
    tokio::spawn(async move {
        if let Err(e) = halts::record(&pool, &stored).await {
            tracing::warn!(error = %e, "Cannot record the halt for `status` (it is in the log and on /ready).");
        }
    });
}

/// Forgets the recorded halts of `projection`'s `partitions` of `topic` (for `status`):
/// assigned again, or past their halt. Off the partitions' way.
pub(crate) fn forget(pool: &PgPool, projection: &str, topic: &str, partitions: Vec<i32>) {
    let before = chrono::Utc::now();
    let (pool, projection, topic) = (pool.clone(), projection.to_owned(), topic.to_owned());
    tokio::spawn(async move {
        if let Err(e) = halts::clear(&pool, &projection, &topic, &partitions, before).await {
            tracing::debug!(error = %e, "Cannot clear the recorded halts for `status`.");
        }
    });
}

/// Takes back the report of a halt that is retried (or forgotten with its revoked
/// partition): the partition is no longer counted halted, nor listed.
pub(crate) fn retracted(projection: &str, tp: &Tp, reported: &str, stats: &Stats) {
    let halted = {
        let mut set = stats.halted.lock().expect("halted lock");
        set.remove(tp);
        set.len()
    };
    metrics::gauge!(m::PARTITIONS_HALTED, "projection" => projection.to_owned()).set(halted as f64);
    stats.halts.lock().expect("halts lock").retain(|h| h != reported);
}

/// Stops fetching a partition (what is fetched already stays unread in its queue).
pub(crate) fn pause(consumer: &Arc<StreamConsumer<EngineContext>>, tp: &Tp) {
    fetching(consumer, tp, false);
}

/// Fetches a paused partition again.
pub(crate) fn resume(consumer: &Arc<StreamConsumer<EngineContext>>, tp: &Tp) {
    fetching(consumer, tp, true);
}

/// Pauses or resumes fetching `tp`. librdkafka waits for its own thread here, so the call
/// runs off the async runtime.
fn fetching(consumer: &Arc<StreamConsumer<EngineContext>>, tp: &Tp, on: bool) {
    let (consumer, tp) = (consumer.clone(), tp.clone());
    tokio::task::spawn_blocking(move || {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&tp.topic, tp.partition);
        let (done, what) = if on { (consumer.resume(&tpl), "resume") } else { (consumer.pause(&tpl), "pause") };
        if let Err(e) = done {
            tracing::warn!(topic = %tp.topic, partition = tp.partition, error = %e, "Cannot {what} the partition.");
        }
    });
}
