//! The consumer context: decides where each assigned partition starts (the Postgres
//! checkpoint, or the earliest offset) inside librdkafka's rebalance callback.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::ClientContext;

use crate::checkpoint::BlockingReader;

pub(crate) type Tp = (String, i32);

/// What the rebalance callback tells the processing loop.
#[derive(Debug, Default)]
pub(crate) struct Assignment {
    /// Partitions owned now.
    pub owned: HashSet<Tp>,
    /// Bumped on every assign or revoke: buffered, uncommitted messages from an older
    /// generation are dropped (they are read again from the checkpoint).
    pub generation: u64,
    /// Start offset decided for each partition at its last assignment (`None`: earliest).
    pub starts: HashMap<Tp, Option<i64>>,
    /// Partitions whose checkpoints could not be read: assigned but paused.
    pub unreadable: Vec<(Tp, String)>,
}

pub(crate) struct EngineContext {
    projection: String,
    reader: BlockingReader,
    from_beginning: bool,
    replayed: Mutex<HashSet<Tp>>,
    pub(crate) assignment: Mutex<Assignment>,
    /// Set while the consumer holds an assignment from its group (read by readiness).
    joined: Arc<AtomicBool>,
    /// Mirrors `Assignment::generation`, so the loop can notice a rebalance without a lock.
    pub(crate) generation: AtomicU64,
}

impl EngineContext {
    pub(crate) fn new(projection: String, reader: BlockingReader, from_beginning: bool, joined: Arc<AtomicBool>) -> Self {
        Self { projection, reader, from_beginning, replayed: Mutex::default(), assignment: Mutex::default(), joined, generation: AtomicU64::new(0) }
    }

    fn read_with_retries(&self, parts: &[Tp]) -> Result<HashMap<Tp, i64>, String> {
        let mut last = String::new();
        for attempt in 0..5 {
            match self.reader.read(parts.to_vec()) {
                Ok(found) => return Ok(found),
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(200 << attempt));
        }
        Err(last)
    }

    fn assign(&self, consumer: &BaseConsumer<Self>, tpl: &mut TopicPartitionList) {
        let parts: Vec<Tp> = tpl.elements().iter().map(|e| (e.topic().to_owned(), e.partition())).collect();
        let stored = self.read_with_retries(&parts);
        let mut replayed = self.replayed.lock().expect("replayed lock");
        let mut starts = HashMap::new();
        let mut unreadable = Vec::new();
        for tp in &parts {
            let start = match &stored {
                _ if self.from_beginning && replayed.insert(tp.clone()) => None,
                Ok(found) => found.get(tp).copied(),
                Err(e) => {
                    unreadable.push((tp.clone(), e.clone()));
                    None
                }
            };
            let offset = start.map_or(Offset::Beginning, Offset::Offset);
            if let Err(e) = tpl.set_partition_offset(&tp.0, tp.1, offset) {
                tracing::error!(projection = %self.projection, topic = %tp.0, partition = tp.1, error = %e, "Cannot set start offset.");
            }
            starts.insert(tp.clone(), start);
        }
        drop(replayed);
        if let Err(e) = consumer.assign(tpl) {
            tracing::error!(projection = %self.projection, error = %e, "Assigning partitions failed.");
        }
        if !unreadable.is_empty() {
            let mut paused = TopicPartitionList::new();
            for ((t, p), _) in &unreadable {
                paused.add_partition(t, *p);
            }
            let _ = consumer.pause(&paused);
        }
        for (tp, start) in &starts {
            tracing::info!(projection = %self.projection, topic = %tp.0, partition = tp.1, start = ?start, "Partition assigned.");
        }
        metrics::counter!(crate::metrics::REBALANCES, "projection" => self.projection.clone(), "kind" => "assign").increment(1);
        self.joined.store(true, Ordering::SeqCst);
        let mut a = self.assignment.lock().expect("assignment lock");
        a.owned.extend(parts);
        a.starts.extend(starts);
        a.unreadable.extend(unreadable);
        a.generation += 1;
        self.generation.store(a.generation, Ordering::SeqCst);
    }

    fn revoke(&self, consumer: &BaseConsumer<Self>, tpl: &TopicPartitionList) {
        {
            let mut a = self.assignment.lock().expect("assignment lock");
            for e in tpl.elements() {
                a.owned.remove(&(e.topic().to_owned(), e.partition()));
                tracing::info!(projection = %self.projection, topic = e.topic(), partition = e.partition(), "Partition revoked.");
            }
            a.generation += 1;
                self.generation.store(a.generation, Ordering::SeqCst);
        }
        metrics::counter!(crate::metrics::REBALANCES, "projection" => self.projection.clone(), "kind" => "revoke").increment(1);
        self.joined.store(false, Ordering::SeqCst);
        if let Err(e) = consumer.unassign() {
            tracing::error!(projection = %self.projection, error = %e, "Unassigning partitions failed.");
        }
    }
}

impl ClientContext for EngineContext {
    /// librdkafka's periodic statistics (`statistics.interval.ms`): the lag per owned
    /// partition, from the broker's high (or, read_committed, last stable) offset.
    fn stats(&self, statistics: rdkafka::Statistics) {
        let owned = self.assignment.lock().expect("assignment lock").owned.clone();
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
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => self.assign(consumer, tpl),
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => self.revoke(consumer, tpl),
            other => {
                tracing::error!(projection = %self.projection, error = ?other, "Rebalance failed; dropping the assignment.");
                self.revoke(consumer, tpl);
            }
        }
    }
}
