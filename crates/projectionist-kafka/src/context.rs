//! The consumer context. librdkafka's rebalance callback runs on the thread that polls the
//! consumer, so it only reports the change to the projection's runner, which reads the
//! checkpoints (async), assigns, and starts or stops the partition tasks.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::error::KafkaResult;
use rdkafka::topic_partition_list::TopicPartitionList;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::ClientContext;
use tokio::sync::mpsc;

use crate::partition::shared::Progress;
use crate::tp::Tp;

/// A change of assignment, for the runner to act on. The group waits until the runner has
/// assigned the partitions (after reading their checkpoints) or unassigned them (after they
/// finished their batches in flight). Eager protocol (`range`, `roundrobin`): every
/// rebalance revokes all partitions, then assigns the new set. Cooperative
/// (`cooperative-sticky`): only the partitions that move are revoked or assigned, and the
/// others keep running.
#[derive(Debug)]
pub(crate) enum Rebalance {
    Assign(Vec<Tp>),
    Revoke(Vec<Tp>),
}

pub(crate) struct EngineContext {
    projection: String,
    events: mpsc::UnboundedSender<Rebalance>,
    /// Partitions owned now and their progress, kept by the runner (read by the statistics
    /// callback).
    pub(crate) owned: Arc<Mutex<HashMap<Tp, Arc<Progress>>>>,
    /// Set once the runner stops: a revocation (from closing the consumer) is then
    /// completed here, as nobody else will.
    pub(crate) closing: AtomicBool,
    /// The last error librdkafka or the consumer reported, for the runner's warning while
    /// no partition is assigned.
    last_error: Mutex<Option<String>>,
    /// No broker reachable: set by librdkafka's "all brokers down", cleared by statistics
    /// that see a broker up (read by the readiness probe).
    unreachable: Arc<AtomicBool>,
}

impl EngineContext {
    pub(crate) fn new(
        projection: String,
        events: mpsc::UnboundedSender<Rebalance>,
        unreachable: Arc<AtomicBool>,
    ) -> Self {
        Self {
            projection,
            events,
            owned: Arc::default(),
            closing: AtomicBool::new(false),
            last_error: Mutex::default(),
            unreachable,
        }
    }

    /// Keeps `error` as the last one reported.
    pub(crate) fn remember_error(&self, error: String) {
        *self.last_error.lock().expect("last error lock") = Some(error);
    }

    /// The last error reported, if any.
    pub(crate) fn last_error(&self) -> Option<String> {
        self.last_error.lock().expect("last error lock").clone()
    }

    fn revoke(&self, consumer: &BaseConsumer<Self>, parts: Vec<Tp>) {
        metrics::counter!(crate::metrics::REBALANCES, "projection" => self.projection.clone(), "kind" => "revoke")
            .increment(1);
        if self.closing.load(Ordering::SeqCst) {
            unassign(consumer, &parts);
        } else if let Err(mpsc::error::SendError(Rebalance::Revoke(parts))) = self.events.send(Rebalance::Revoke(parts))
        {
            unassign(consumer, &parts);
        }
    }
}

/// Assigns `parts` at their offsets: the whole assignment under the eager protocol, an
/// addition to it under the cooperative one.
pub(crate) fn assign<C: Consumer<EngineContext>>(consumer: &C, parts: &TopicPartitionList) -> KafkaResult<()> {
    match consumer.rebalance_protocol() {
        RebalanceProtocol::Cooperative => consumer.incremental_assign(parts),
        _ => consumer.assign(parts),
    }
}

/// Gives up `parts`: the whole assignment under the eager protocol, just them under the
/// cooperative one. A failure is logged.
pub(crate) fn unassign<C: Consumer<EngineContext>>(consumer: &C, parts: &[Tp]) {
    let result = match consumer.rebalance_protocol() {
        RebalanceProtocol::Cooperative => {
            let mut tpl = TopicPartitionList::new();
            for tp in parts {
                tpl.add_partition(&tp.topic, tp.partition);
            }
            consumer.incremental_unassign(&tpl)
        }
        _ => consumer.unassign(),
    };
    if let Err(e) = result {
        tracing::error!(error = %e, "Unassigning partitions failed.");
    }
}

impl ClientContext for EngineContext {
    /// Logs librdkafka's error as the default does, and keeps it.
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        if error.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::AllBrokersDown) {
            self.unreachable.store(true, Ordering::SeqCst);
        }
        tracing::error!(projection = %self.projection, "librdkafka: {error}: {reason}");
        self.remember_error(format!("{error}: {reason}"));
    }

    /// librdkafka's periodic statistics (`statistics.interval.ms`): whether a broker is up,
    /// and the lag of every owned
    /// partition, in offsets and in time, against the head a `read_committed` reader can
    /// reach (the last stable offset). Exported whether or not anything arrives, so a
    /// caught-up projection reads 0 rather than "no data".
    fn stats(&self, statistics: rdkafka::Statistics) {
        // The brokers of the cluster (not the bootstrap addresses): is one of them up?
        let mut learned = statistics.brokers.values().filter(|b| b.nodeid >= 0).peekable();
        if learned.peek().is_some() {
            let up = learned.any(|b| b.state == "UP");
            self.unreachable.store(!up, Ordering::SeqCst);
        }
        let owned = self.owned.lock().expect("owned lock").clone();
        let now = crate::tp::now_ms();
        for (topic, t) in &statistics.topics {
            for (partition, p) in &t.partitions {
                let Some(progress) = owned.get(&Tp::new(topic.as_str(), *partition)) else { continue };
                let head = if p.ls_offset >= 0 { p.ls_offset } else { p.hi_offset };
                let Some((messages, seconds)) = progress.lag(head, p.lo_offset, now) else { continue };
                let labels = [
                    ("projection", self.projection.clone()),
                    ("topic", topic.clone()),
                    ("partition", partition.to_string()),
                ];
                metrics::gauge!(crate::metrics::CONSUMER_LAG_MESSAGES, &labels).set(messages as f64);
                if let Some(seconds) = seconds {
                    metrics::gauge!(crate::metrics::CONSUMER_LAG_SECONDS, &labels).set(seconds);
                }
            }
        }
    }
}

impl ConsumerContext for EngineContext {
    fn rebalance(&self, consumer: &BaseConsumer<Self>, err: RDKafkaRespErr, tpl: &mut TopicPartitionList) {
        let parts: Vec<Tp> = tpl.elements().iter().map(|e| Tp::new(e.topic(), e.partition())).collect();
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                metrics::counter!(
                    crate::metrics::REBALANCES,
                    "projection" => self.projection.clone(),
                    "kind" => "assign")
                .increment(1);
                if !self.closing.load(Ordering::SeqCst) {
                    let _ = self.events.send(Rebalance::Assign(parts));
                }
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => self.revoke(consumer, parts),
            other => {
                tracing::error!(
                    projection = %self.projection,
                    error = ?other,
                    "Rebalance failed; dropping the assignment."
                );
                self.revoke(consumer, parts);
            }
        }
    }
}
