//! One projection's consuming loop: per-partition batches, each applied in one Postgres
//! transaction together with its checkpoint, the Kafka offset committed afterwards.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use projectionist_core::{Outcome, OutcomeCounts, RawEnvelope};
use projectionist_postgres::{Mode, PgPool, SharedProjection};
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use tokio::sync::watch;

use crate::checkpoint;
use crate::metrics as m;
use crate::context::{EngineContext, Tp};
use crate::{EngineConfig, Error, Result};

/// Live counters of one projection, readable while it runs.
#[derive(Debug, Default)]
pub struct Stats {
    /// Messages read from Kafka (including ones later dropped by a rebalance).
    pub read: AtomicU64,
    /// Events that changed the read model.
    pub applied: AtomicU64,
    /// Redeliveries of applied versions.
    pub duplicate: AtomicU64,
    /// Versions older than the stored one.
    pub stale: AtomicU64,
    /// Event types the projection does not handle.
    pub ignored: AtomicU64,
    /// Batches committed.
    pub batches: AtomicU64,
    /// Halted partitions and why.
    pub halts: Mutex<Vec<String>>,
}

impl Stats {
    fn add(&self, c: &OutcomeCounts) {
        self.applied.fetch_add(c.applied, Ordering::Relaxed);
        self.duplicate.fetch_add(c.duplicate, Ordering::Relaxed);
        self.stale.fetch_add(c.stale, Ordering::Relaxed);
        self.ignored.fetch_add(c.ignored, Ordering::Relaxed);
        self.batches.fetch_add(1, Ordering::Relaxed);
    }

    /// Outcome counts so far.
    pub fn outcomes(&self) -> OutcomeCounts {
        OutcomeCounts {
            applied: self.applied.load(Ordering::Relaxed),
            duplicate: self.duplicate.load(Ordering::Relaxed),
            stale: self.stale.load(Ordering::Relaxed),
            gap: 0,
            ignored: self.ignored.load(Ordering::Relaxed),
        }
    }
}

/// A consumed message, owned.
struct Msg {
    offset: i64,
    key: Option<String>,
    payload: Option<Vec<u8>>,
}

struct Buffer {
    generation: u64,
    since: Instant,
    messages: Vec<Msg>,
}

pub(crate) struct Runner {
    pub(crate) projection: SharedProjection,
    pub(crate) pool: PgPool,
    pub(crate) config: EngineConfig,
    pub(crate) consumer: StreamConsumer<EngineContext>,
    pub(crate) stats: Arc<Stats>,
    buffers: BTreeMap<Tp, Buffer>,
    /// The assignment as of `generation`, refreshed only when a rebalance bumps it.
    owned: HashSet<Tp>,
    generation: u64,
    /// Next offset last committed per partition, re-committed synchronously at shutdown.
    committed: BTreeMap<Tp, i64>,
    halted: HashMap<Tp, i64>,
    targets: HashMap<Tp, i64>,
    target_generation: u64,
}

enum Applied {
    /// Every event applied.
    All,
    /// Applied up to (excluding) the event at `offset`, which stops the partition.
    Halt { offset: i64, aggregate: String, reason: String, kind: &'static str },
}

impl Runner {
    pub(crate) fn new(projection: SharedProjection, pool: PgPool, config: EngineConfig, consumer: StreamConsumer<EngineContext>, stats: Arc<Stats>) -> Self {
        Self {
            projection,
            pool,
            config,
            consumer,
            stats,
            buffers: BTreeMap::new(),
            owned: HashSet::new(),
            generation: 0,
            committed: BTreeMap::new(),
            halted: HashMap::new(),
            targets: HashMap::new(),
            target_generation: u64::MAX,
        }
    }

    fn name(&self) -> &str {
        self.projection.name()
    }

    pub(crate) async fn run(mut self, mut shutdown: watch::Receiver<bool>) -> Result<()> {
        let wait = self.config.batch_max_wait();
        loop {
            let deadline = self.buffers.values().map(|b| b.since + wait).min();
            tokio::select! {
                biased;
                _ = shutdown.changed() => break,
                received = self.consumer.recv() => {
                    let message = match received {
                        Ok(message) => message,
                        Err(e @ rdkafka::error::KafkaError::MessageConsumptionFatal(_)) => return Err(e.into()),
                        Err(e) => {
                            // Broker hiccups surface here too; librdkafka reconnects by itself.
                            tracing::warn!(projection = %self.name(), error = %e, "Kafka consumer error; continuing.");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    };
                    let tp = (message.topic().to_owned(), message.partition());
                    let msg = Msg {
                        offset: message.offset(),
                        key: message.key().map(|k| String::from_utf8_lossy(k).into_owned()),
                        payload: message.payload().map(<[u8]>::to_vec),
                    };
                    drop(message);
                    self.stats.read.fetch_add(1, Ordering::Relaxed);
                    self.accept(tp, msg).await?;
                }
                _ = sleep_until(deadline) => {
                    self.sync_assignment();
                    let due: Vec<Tp> = self.buffers.iter().filter(|(_, b)| b.since + wait <= Instant::now()).map(|(tp, _)| tp.clone()).collect();
                    for tp in due {
                        self.flush(&tp).await?;
                    }
                }
                _ = tokio::time::sleep(Duration::from_millis(250)), if self.config.exit_when_caught_up => {}
            }
            if self.config.exit_when_caught_up && self.caught_up()? {
                tracing::info!(projection = %self.name(), "Caught up with the high watermarks; stopping.");
                break;
            }
        }
        // Finish what is buffered: those events were read while we owned their partitions.
        self.sync_assignment();
        let pending: Vec<Tp> = self.buffers.keys().cloned().collect();
        for tp in pending {
            self.flush(&tp).await?;
        }
        // Make sure Kafka holds what Postgres holds for the partitions still owned: the exact
        // next offsets of committed batches, never the consumer's current position.
        let mut tpl = TopicPartitionList::new();
        for (tp, next) in &self.committed {
            if self.owned.contains(tp) {
                let _ = tpl.add_partition_offset(&tp.0, tp.1, Offset::Offset(*next));
            }
        }
        if tpl.count() > 0 {
            if let Err(e) = self.consumer.commit(&tpl, CommitMode::Sync) {
                tracing::warn!(error = %e, "Final Kafka offset commit failed; Postgres holds the position.");
            }
        }
        self.consumer.unsubscribe();
        Ok(())
    }

    /// Drops buffers made under an older assignment: nothing of them was committed and the
    /// partitions restart from their checkpoints.
    fn sync_assignment(&mut self) {
        if self.consumer.context().generation.load(Ordering::SeqCst) == self.generation {
            return;
        }
        let (generation, owned, unreadable) = {
            let mut a = self.consumer.context().assignment.lock().expect("assignment lock");
            (a.generation, a.owned.clone(), std::mem::take(&mut a.unreadable))
        };
        self.generation = generation;
        self.owned = owned;
        self.buffers.retain(|_, b| b.generation == generation);
        for (tp, reason) in unreadable {
            self.halt(&tp, -1, "?", &format!("cannot read its checkpoint from PostgreSQL: {reason}"), "error");
        }
    }

    fn projection_assignment(&self) -> std::sync::MutexGuard<'_, crate::context::Assignment> {
        self.consumer.context().assignment.lock().expect("assignment lock")
    }

    async fn accept(&mut self, tp: Tp, msg: Msg) -> Result<()> {
        self.sync_assignment();
        if !self.owned.contains(&tp) || self.halted.contains_key(&tp) {
            return Ok(());
        }
        let generation = self.generation;
        let buffer = self.buffers.entry(tp.clone()).or_insert_with(|| Buffer { generation, since: Instant::now(), messages: Vec::new() });
        buffer.messages.push(msg);
        if buffer.messages.len() >= self.config.batch_max_events {
            self.flush(&tp).await?;
        }
        Ok(())
    }

    async fn flush(&mut self, tp: &Tp) -> Result<()> {
        let Some(buffer) = self.buffers.remove(tp) else { return Ok(()) };
        if buffer.messages.is_empty() || self.halted.contains_key(tp) {
            return Ok(());
        }
        let span = tracing::info_span!(
            "batch",
            projection = %self.name(),
            topic = %tp.0,
            partition = tp.1,
            first_offset = buffer.messages[0].offset,
            last_offset = buffer.messages[buffer.messages.len() - 1].offset,
            size = buffer.messages.len(),
            applied = tracing::field::Empty,
            duplicate = tracing::field::Empty,
            stale = tracing::field::Empty,
            ignored = tracing::field::Empty,
        );
        let _entered = span.enter();

        // Decode up to the first poison message; apply what precedes it, then halt there.
        let mut envelopes = Vec::with_capacity(buffer.messages.len());
        let mut poison = None;
        for m in &buffer.messages {
            match decode(m) {
                Ok(e) => envelopes.push(e),
                Err(reason) => {
                    poison = Some((m.offset, m.key.clone().unwrap_or_else(|| "?".into()), reason));
                    break;
                }
            }
        }
        let offsets: Vec<i64> = buffer.messages.iter().map(|m| m.offset).collect();
        let mut outcome = self.apply(tp, &envelopes, &offsets).await?;
        if let (Applied::All, Some((offset, aggregate, reason))) = (&outcome, poison) {
            outcome = Applied::Halt { offset, aggregate, reason, kind: "poison" };
        }
        if let Applied::Halt { offset, aggregate, reason, kind } = outcome {
            self.halt(tp, offset, &aggregate, &reason, kind);
        }
        Ok(())
    }

    /// Applies `envelopes` (at `offsets`) with bounded retries; a gap, a poison event or a
    /// non-retryable failure halts at that event after applying what precedes it.
    async fn apply(&mut self, tp: &Tp, envelopes: &[RawEnvelope], offsets: &[i64]) -> Result<Applied> {
        let mut end = envelopes.len();
        let mut halt = None;
        let mut attempt = 0;
        while end > 0 {
            let batch = &envelopes[..end];
            let started = Instant::now();
            match self.try_apply(tp, batch, offsets[end - 1] + 1).await {
                Ok(Ok(counts)) => {
                    self.stats.add(&counts);
                    self.commit_kafka(tp, offsets[end - 1] + 1);
                    self.record_batch(tp, batch, &counts, started.elapsed());
                    break;
                }
                Ok(Err((index, reason))) => {
                    halt = Some(Applied::Halt { offset: offsets[index], aggregate: envelopes[index].aggregate_id.clone(), reason, kind: "gap" });
                    end = index;
                    attempt = 0;
                }
                Err(e) if e.is_retryable() && attempt < self.config.max_retries => {
                    let delay = Duration::from_millis(self.config.retry_backoff_ms << attempt.min(10));
                    tracing::warn!(error = %e, attempt = attempt + 1, delay_ms = delay.as_millis() as u64, "Retryable failure; trying the batch again.");
                    metrics::counter!(m::BATCH_RETRIES, "projection" => self.name().to_owned()).increment(1);
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                }
                Err(e) => {
                    let (index, reason, kind) = match &e {
                        projectionist_postgres::Error::Decode { index, source, .. } => (*index, source.to_string(), "poison"),
                        projectionist_postgres::Error::Invalid { index, problem, .. } => (*index, problem.clone(), "error"),
                        other if other.is_retryable() => (0, format!("{other} (gave up after {} retries)", self.config.max_retries), "error"),
                        other => (0, other.to_string(), "error"),
                    };
                    halt = Some(Applied::Halt { offset: offsets[index], aggregate: envelopes[index].aggregate_id.clone(), reason, kind });
                    end = index;
                    attempt = 0;
                }
            }
        }
        Ok(halt.unwrap_or(Applied::All))
    }

    /// One transaction: the batch and its checkpoint, set-based; per event when a
    /// concurrent writer moved the batch's rows. `Ok(Err(..))` names the first event that
    /// must not be applied (a gap), after rolling back.
    async fn try_apply(&self, tp: &Tp, batch: &[RawEnvelope], next_offset: i64) -> projectionist_postgres::Result<std::result::Result<OutcomeCounts, (usize, String)>> {
        match self.try_apply_in(tp, batch, next_offset, Mode::Batch).await {
            Err(e @ projectionist_postgres::Error::Conflict { .. }) => {
                tracing::info!(reason = %e, "Rows moved under the batch; applying it event by event.");
                metrics::counter!(m::BATCH_FALLBACKS, "projection" => self.name().to_owned()).increment(1);
                self.try_apply_in(tp, batch, next_offset, Mode::PerEvent).await
            }
            other => other,
        }
    }

    async fn try_apply_in(&self, tp: &Tp, batch: &[RawEnvelope], next_offset: i64, mode: Mode) -> projectionist_postgres::Result<std::result::Result<OutcomeCounts, (usize, String)>> {
        let mut tx = self.pool.begin().await?;
        let outcomes = self.projection.apply_raw(&mut tx, batch, mode).await?;
        if let Some((index, gap)) = outcomes.iter().enumerate().find(|(_, o)| matches!(o, Outcome::Gap { .. })) {
            return Ok(Err((index, format!("{gap}: the event's predecessor was never applied"))));
        }
        checkpoint::store(&mut tx, self.projection.name(), &tp.0, tp.1, next_offset).await?;
        tx.commit().await?;
        Ok(Ok(outcomes.iter().collect()))
    }

    /// Per-batch telemetry: counters, histograms, event age, pool use, span fields.
    fn record_batch(&self, tp: &Tp, batch: &[RawEnvelope], counts: &OutcomeCounts, took: Duration) {
        let projection = self.name().to_owned();
        let span = tracing::Span::current();
        span.record("applied", counts.applied).record("duplicate", counts.duplicate).record("stale", counts.stale).record("ignored", counts.ignored);
        tracing::debug!(took_ms = took.as_millis() as u64, "Batch committed.");
        metrics::counter!(m::EVENTS_APPLIED, "projection" => projection.clone()).increment(counts.applied);
        for (reason, n) in [("duplicate", counts.duplicate), ("stale", counts.stale), ("ignored", counts.ignored)] {
            metrics::counter!(m::EVENTS_SKIPPED, "projection" => projection.clone(), "reason" => reason).increment(n);
        }
        metrics::histogram!(m::BATCH_SIZE, "projection" => projection.clone()).record(batch.len() as f64);
        metrics::histogram!(m::BATCH_DURATION, "projection" => projection.clone()).record(took.as_secs_f64());
        metrics::counter!(m::CHECKPOINT_COMMITS, "projection" => projection.clone()).increment(1);
        if let Some(last) = batch.last() {
            let age = (chrono_now_ms() - last.occurred_at.timestamp_millis()).max(0) as f64 / 1000.0;
            metrics::gauge!(m::CONSUMER_LAG_SECONDS, "projection" => projection, "topic" => tp.0.clone(), "partition" => tp.1.to_string()).set(age);
        }
        let (size, idle) = (self.pool.size(), self.pool.num_idle() as u32);
        metrics::gauge!(m::PG_POOL_CONNECTIONS, "state" => "in_use").set(size.saturating_sub(idle) as f64);
        metrics::gauge!(m::PG_POOL_CONNECTIONS, "state" => "idle").set(idle as f64);
    }

    fn commit_kafka(&mut self, tp: &Tp, next_offset: i64) {
        self.committed.insert(tp.clone(), next_offset);
        let mut tpl = TopicPartitionList::new();
        if tpl.add_partition_offset(&tp.0, tp.1, Offset::Offset(next_offset)).is_ok() {
            if let Err(e) = self.consumer.commit(&tpl, CommitMode::Async) {
                // Postgres holds the position; Kafka's copy only serves lag tools.
                tracing::warn!(topic = %tp.0, partition = tp.1, error = %e, "Kafka offset commit failed.");
            }
        }
    }

    fn halt(&mut self, tp: &Tp, offset: i64, aggregate: &str, reason: &str, kind: &'static str) {
        let err = Error::Halted {
            projection: self.name().to_owned(),
            topic: tp.0.clone(),
            partition: tp.1,
            offset,
            aggregate: aggregate.to_owned(),
            reason: reason.to_owned(),
        };
        tracing::error!(error = %err, "Partition halted; nothing at or after this offset is applied until it is fixed.");
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&tp.0, tp.1);
        let _ = self.consumer.pause(&tpl);
        self.buffers.remove(tp);
        self.halted.insert(tp.clone(), offset);
        metrics::counter!(m::EVENTS_FAILED, "projection" => self.name().to_owned(), "reason" => kind).increment(1);
        metrics::gauge!(m::PARTITIONS_HALTED, "projection" => self.name().to_owned()).set(self.halted.len() as f64);
        self.stats.halts.lock().expect("halts lock").push(err.to_string());
    }

    /// Whether every owned partition has reached the high watermark it had when assigned
    /// (halted partitions count as done: they cannot move).
    fn caught_up(&mut self) -> Result<bool> {
        let (generation, owned, starts) = {
            let a = self.projection_assignment();
            (a.generation, a.owned.clone(), a.starts.clone())
        };
        if owned.is_empty() || !self.buffers.is_empty() {
            return Ok(false);
        }
        if generation != self.target_generation {
            self.targets.clear();
            for tp in &owned {
                let (_, high) = self.consumer.fetch_watermarks(&tp.0, tp.1, Duration::from_secs(5))?;
                self.targets.insert(tp.clone(), high);
            }
            self.target_generation = generation;
        }
        let positions = self.consumer.position()?;
        Ok(owned.iter().all(|tp| {
            if self.halted.contains_key(tp) {
                return true;
            }
            let target = self.targets.get(tp).copied().unwrap_or(0);
            let start = starts.get(tp).copied().flatten().unwrap_or(0);
            let position = match positions.find_partition(&tp.0, tp.1).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => o.max(start),
                _ => start,
            };
            target == 0 || position >= target
        }))
    }
}

fn decode(m: &Msg) -> std::result::Result<RawEnvelope, String> {
    let payload = m.payload.as_deref().ok_or("message has no payload (tombstone)")?;
    let envelope = RawEnvelope::from_slice(payload).map_err(|e| format!("undecodable envelope: {e}"))?;
    if let Some(key) = &m.key {
        if *key != envelope.aggregate_id {
            return Err(format!(
                "message key {key:?} differs from aggregate_id {:?}: per-aggregate ordering is not guaranteed",
                envelope.aggregate_id
            ));
        }
    }
    Ok(envelope)
}

fn chrono_now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}
