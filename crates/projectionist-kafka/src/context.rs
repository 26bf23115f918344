//! The consumer context. librdkafka's rebalance callback runs on the thread that polls the
//! consumer, so it only reports the change to the projection's runner, which reads the
//! checkpoints (async), assigns, and starts or stops the partition tasks.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::topic_partition_list::TopicPartitionList;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::ClientContext;
use tokio::sync::mpsc;

/// A topic and partition.
pub(crate) type Tp = (String, i32);

/// A change of assignment, for the runner to act on. Eager protocol: the group waits
/// until the runner calls `assign` (after reading the checkpoints) or `unassign` (after
/// the revoked partitions finished their batches in flight).
#[derive(Debug)]
pub(crate) enum Rebalance {
    Assign(Vec<Tp>),
    Revoke(Vec<Tp>),
}

pub(crate) struct EngineContext {
    projection: String,
    events: mpsc::UnboundedSender<Rebalance>,
    /// Partitions owned now, kept by the runner (read by the statistics callback).
    pub(crate) owned: Arc<Mutex<HashSet<Tp>>>,
    /// Set once the runner stops: a revocation (from closing the consumer) is then
    /// completed here, as nobody else will.
    pub(crate) closing: AtomicBool,
}

impl EngineContext {
    pub(crate) fn new(projection: String, events: mpsc::UnboundedSender<Rebalance>) -> Self {
        Self { projection, events, owned: Arc::default(), closing: AtomicBool::new(false) }
    }

    fn revoke(&self, consumer: &BaseConsumer<Self>, parts: Vec<Tp>) {
        metrics::counter!(crate::metrics::REBALANCES, "projection" => self.projection.clone(), "kind" => "revoke")
            .increment(1);
        if self.closing.load(Ordering::SeqCst) || self.events.send(Rebalance::Revoke(parts)).is_err() {
            if let Err(e) = consumer.unassign() {
                tracing::error!(projection = %self.projection, error = %e, "Unassigning partitions failed.");
            }
        }
    }
}

impl ClientContext for EngineContext {
    /// librdkafka's periodic statistics (`statistics.interval.ms`): the lag per owned
    /// partition, from the broker's high (or, read_committed, last stable) offset.
    fn stats(&self, statistics: rdkafka::Statistics) {
        let owned = self.owned.lock().expect("owned lock").clone();
        for (topic, t) in &statistics.topics {
            for (partition, p) in &t.partitions {
                if *partition < 0 || !owned.contains(&(topic.clone(), *partition)) || p.consumer_lag < 0 {
                    continue;
                }
                metrics::gauge!(crate::metrics::CONSUMER_LAG_MESSAGES, "projection" => self.projection.clone(), "topic" => topic.clone(), "partition" => partition.to_string())
                    .set(p.consumer_lag as f64);
            }
        }
    }
}

impl ConsumerContext for EngineContext {
    fn rebalance(&self, consumer: &BaseConsumer<Self>, err: RDKafkaRespErr, tpl: &mut TopicPartitionList) {
        let parts: Vec<Tp> = tpl.elements().iter().map(|e| (e.topic().to_owned(), e.partition())).collect();
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                metrics::counter!(crate::metrics::REBALANCES, "projection" => self.projection.clone(), "kind" => "assign").increment(1);
                if !self.closing.load(Ordering::SeqCst) {
                    let _ = self.events.send(Rebalance::Assign(parts));
                }
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => self.revoke(consumer, parts),
            other => {
                tracing::error!(projection = %self.projection, error = ?other, "Rebalance failed; dropping the assignment.");
                self.revoke(consumer, parts);
            }
        }
    }
}
