//! Halts: where and why a partition stopped, and the one place a halt is reported (log,
//! pause, halted set, metrics), for the partition task and the runner alike.

use std::sync::Arc;

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::topic_partition_list::TopicPartitionList;

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
}

/// Reports `halt` of partition `tp` of `projection`: logged, the partition paused and
/// counted halted (it stays halted in this process), the failure counted.
pub(crate) fn report(
    projection: &str,
    tp: &Tp,
    halt: Halt,
    stats: &Stats,
    consumer: &Arc<StreamConsumer<EngineContext>>,
) {
    let err = crate::Error::Halted {
        projection: projection.to_owned(),
        topic: tp.topic.clone(),
        partition: tp.partition,
        offset: halt.offset,
        aggregate: halt.aggregate,
        reason: halt.reason,
    };
    tracing::error!(error = %err, "Partition halted; nothing at or after this offset is applied until it is fixed.");
    pause(consumer, tp);
    let halted = {
        let mut set = stats.halted.lock().expect("halted lock");
        set.insert(tp.clone());
        set.len()
    };
    metrics::counter!(m::EVENTS_FAILED, "projection" => projection.to_owned(), "reason" => halt.kind.label())
        .increment(1);
    metrics::gauge!(m::PARTITIONS_HALTED, "projection" => projection.to_owned()).set(halted as f64);
    stats.halts.lock().expect("halts lock").push(err.to_string());
}

/// Stops fetching a partition (what is fetched already stays unread in its queue). librdkafka
/// waits for its own thread here, so the call runs off the async runtime.
pub(crate) fn pause(consumer: &Arc<StreamConsumer<EngineContext>>, tp: &Tp) {
    let (consumer, tp) = (consumer.clone(), tp.clone());
    tokio::task::spawn_blocking(move || {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&tp.topic, tp.partition);
        if let Err(e) = consumer.pause(&tpl) {
            tracing::warn!(topic = %tp.topic, partition = tp.partition, error = %e, "Cannot pause the partition.");
        }
    });
}
