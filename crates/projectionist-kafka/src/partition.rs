//! One assigned partition's task: it reads the partition's own queue, cuts batches (see
//! [`crate::batcher`]), applies each in one PostgreSQL transaction together with its
//! checkpoint, commits the Kafka offset afterwards, waits out PostgreSQL outages (see
//! [`crate::outage`]), retries other transient failures a bounded number of times and
//! halts the partition at what retrying cannot fix. Partitions run side by side, each with
//! its own task.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{FutureExt, StreamExt};
use projectionist_core::{Outcome, OutcomeCounts, RawEnvelope};
use projectionist_postgres::{Mode, PgPool, SharedProjection};
use rdkafka::consumer::stream_consumer::StreamPartitionQueue;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::KafkaResult;
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::batcher::{Batcher, Limits};
use crate::context::{EngineContext, Tp};
use crate::metrics as m;
use crate::outage::{Outage, Throttle, LOG_EVERY};
use crate::retry::{Retry, RetryPolicy};
use crate::runner::Stats;
use crate::Error;

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

/// What the runner asks of a partition task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// Keep going.
    No,
    /// The partition was revoked: finish the batch in flight, drop the rest (it is read
    /// again from the checkpoint by the next owner).
    Revoke,
    /// The engine stops: finish the batch in flight, apply what is buffered, then end.
    Shutdown,
}

/// How a partition task begins.
#[derive(Debug)]
pub(crate) enum Begin {
    /// Reading from its start offset.
    Run,
    /// Halted at once (its checkpoint could not be read): the halt is reported.
    Halt(Halt),
    /// Already halted earlier in this process: it stays paused, nothing is reported again.
    Halted,
}

/// A partition's progress, shared with the runner and the statistics callback.
#[derive(Debug)]
pub(crate) struct Progress {
    /// Next offset the checkpoint holds: the start checkpoint, then each commit's (−1 while
    /// unknown: no checkpoint yet).
    pub committed: AtomicI64,
    /// Reached the high watermark it had when assigned (or halted: it cannot move).
    pub caught_up: AtomicBool,
    /// Broker timestamp (ms since the epoch) of the oldest message read and not applied —
    /// in the batch in flight, buffered, or the one a halt stopped at; −1 when none.
    pub oldest_unapplied_ms: AtomicI64,
}

impl Progress {
    /// A partition starting at `checkpoint` (none: from the beginning).
    pub(crate) fn new(checkpoint: Option<i64>) -> Self {
        Self {
            committed: AtomicI64::new(checkpoint.unwrap_or(-1)),
            caught_up: AtomicBool::new(false),
            oldest_unapplied_ms: AtomicI64::new(-1),
        }
    }

    /// Lag against the partition's `head` (the next offset a `read_committed` reader can
    /// reach) and its `low` watermark: offsets between the checkpoint and the head, and
    /// seconds — 0 when caught up, else the age of the oldest message read and not applied
    /// (`None` while no such message is known). `None` when the head is unknown yet.
    pub(crate) fn lag(&self, head: i64, low: i64, now_ms: i64) -> Option<(i64, Option<f64>)> {
        if head < 0 {
            return None;
        }
        let committed = self.committed.load(Ordering::SeqCst);
        let applied_to = if committed >= 0 { committed } else { low.max(0) };
        let messages = (head - applied_to).max(0);
        if messages == 0 {
            return Some((0, Some(0.0)));
        }
        let oldest = self.oldest_unapplied_ms.load(Ordering::SeqCst);
        Some((messages, (oldest >= 0).then(|| (now_ms - oldest).max(0) as f64 / 1000.0)))
    }
}

/// A consumed message, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Msg {
    pub offset: i64,
    pub key: Option<String>,
    pub payload: Option<Vec<u8>>,
    /// The broker's timestamp (create or log-append time), ms since the epoch.
    pub timestamp: Option<i64>,
}

impl Msg {
    fn from_kafka(message: &BorrowedMessage<'_>) -> Self {
        Self {
            offset: message.offset(),
            key: message.key().map(|k| String::from_utf8_lossy(k).into_owned()),
            payload: message.payload().map(<[u8]>::to_vec),
            timestamp: message.timestamp().to_millis(),
        }
    }

    fn bytes(&self) -> usize {
        self.payload.as_ref().map_or(0, Vec::len) + self.key.as_ref().map_or(0, String::len)
    }
}

/// What the task needs besides its queue.
pub(crate) struct Partition {
    pub tp: Tp,
    pub projection: SharedProjection,
    pub pool: PgPool,
    pub consumer: Arc<StreamConsumer<EngineContext>>,
    pub stats: Arc<Stats>,
    pub limits: Limits,
    pub retry: RetryPolicy,
    pub exit_when_caught_up: bool,
    pub progress: Arc<Progress>,
}

impl Partition {
    fn name(&self) -> &str {
        self.projection.name()
    }

    /// Runs the partition until `stop` says otherwise. A partition that begins halted
    /// reads nothing and only waits to be stopped.
    pub(crate) async fn run(
        self,
        queue: StreamPartitionQueue<EngineContext>,
        mut stop: watch::Receiver<Stop>,
        begin: Begin,
    ) {
        let this = Arc::new(self);
        let mut batcher: Batcher<Msg> = Batcher::new(this.limits);
        match begin {
            Begin::Run => {}
            Begin::Halt(halt) => {
                batcher.halt();
                this.halt(halt);
            }
            Begin::Halted => {
                batcher.halt();
                this.pause();
                this.progress.caught_up.store(true, Ordering::SeqCst);
            }
        }
        let mut stream = queue.stream();
        let mut in_flight: Option<JoinHandle<Applied>> = None;
        // Broker timestamp of the in-flight batch's first message, and of a halt's message.
        let (mut in_flight_oldest, mut halted_at) = (None, None);
        let mut stopping = Stop::No;
        let mut target = None;
        // Wakes an idle partition: checkpoint past trailing transaction markers, caught-up check.
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut markers = MarkerRetry::new();
        loop {
            // Read what is ready without waiting, up to the batch bounds.
            let mut drained = false;
            while stopping == Stop::No && batcher.wants_more() {
                // Nothing ready, or an error (logged): apply what is buffered.
                if !stream.next().now_or_never().is_some_and(|received| this.receive(received, &mut batcher)) {
                    drained = true;
                    break;
                }
            }
            if in_flight.is_none() {
                let batch = match stopping {
                    Stop::No => batcher.cut(Instant::now(), drained).map(|(batch, _)| batch),
                    Stop::Shutdown => batcher.rest(),
                    Stop::Revoke => None,
                };
                match batch {
                    Some(batch) => {
                        // Everything read is in this batch: it may end past the last message,
                        // at the position after the transaction markers read with it.
                        let through = if drained && batcher.is_empty() { this.position() } else { None };
                        in_flight_oldest = batch.first().and_then(|m| m.timestamp);
                        in_flight = Some(tokio::spawn(this.clone().apply(batch, through, stop.clone())));
                    }
                    None if stopping != Stop::No => break,
                    None => {}
                }
            }
            let idle = in_flight.is_none() && batcher.is_empty() && drained;
            if idle && stopping == Stop::No && !batcher.is_halted() {
                this.checkpoint_past_markers(&mut markers).await;
            }
            if this.exit_when_caught_up && idle {
                this.check_caught_up(&mut target, batcher.is_halted()).await;
            }
            let oldest = match in_flight {
                Some(_) => in_flight_oldest,
                None if batcher.is_halted() => halted_at,
                None => batcher.first().and_then(|m| m.timestamp),
            };
            this.progress.oldest_unapplied_ms.store(oldest.unwrap_or(-1), Ordering::SeqCst);
            let deadline = if batcher.in_flight() { None } else { batcher.deadline() };
            tokio::select! {
                biased;
                applied = join(&mut in_flight) => {
                    in_flight = None;
                    match applied {
                        Ok(applied) if applied.abandoned => {
                            // Stopped while waiting for PostgreSQL: nothing of the batch was
                            // committed, its events are read again from the checkpoint.
                            tracing::info!(projection = %this.name(), topic = %this.tp.0, partition = this.tp.1, "Stopped while waiting for PostgreSQL; the batch was not applied and is read again from the checkpoint.");
                            break;
                        }
                        Ok(applied) => {
                            halted_at = applied.halt.as_ref().and_then(|h| h.timestamp).or(halted_at);
                            this.settle(applied, &mut batcher);
                        }
                        Err(e) => {
                            // A panic in projection code: the batch rolled back with its transaction.
                            batcher.halt();
                            halted_at = in_flight_oldest;
                            this.halt(Halt {
                                offset: this.progress.committed.load(Ordering::SeqCst).max(0),
                                timestamp: in_flight_oldest,
                                aggregate: "?".into(),
                                reason: format!("the projection's task failed: {e}"),
                                kind: HaltKind::Error,
                            });
                        }
                    }
                }
                changed = stop.changed(), if stopping == Stop::No => {
                    stopping = if changed.is_ok() { *stop.borrow() } else { Stop::Shutdown };
                }
                received = stream.next(), if stopping == Stop::No && batcher.wants_more() => {
                    this.receive(received, &mut batcher);
                }
                () = sleep_until(deadline) => {}
                _ = tick.tick() => {}
            }
        }
    }

    /// The consumer's position in this partition: the next offset to read, past the
    /// transaction markers (and, on brokers that filter them, aborted records) read so far.
    /// Only this task reads the partition's queue, so with nothing buffered or in flight
    /// every message before it is applied.
    fn position(&self) -> Option<i64> {
        let positions = self.consumer.position().ok()?;
        match positions.find_partition(&self.tp.0, self.tp.1).map(|e| e.offset()) {
            Some(Offset::Offset(o)) => Some(o),
            _ => None,
        }
    }

    /// With everything read applied, moves the checkpoint (and the Kafka offset) past what
    /// followed the last applied message without being one: a transaction's commit marker
    /// takes an offset of its own, so without this a caught-up projection would show lag.
    /// A failure (PostgreSQL away, say) is tried again at a later idle moment, after a
    /// growing delay, and logged when it begins and then at most every [`LOG_EVERY`].
    async fn checkpoint_past_markers(&self, retry: &mut MarkerRetry) {
        let Some(position) = self.position() else { return };
        if position <= self.progress.committed.load(Ordering::SeqCst) {
            return;
        }
        if retry.not_before.is_some_and(|t| Instant::now() < t) {
            return;
        }
        let stored = async {
            let mut conn = self.pool.acquire().await?;
            projectionist_postgres::checkpoint::store(
                &mut conn,
                self.projection.name(),
                &self.tp.0,
                self.tp.1,
                position,
            )
            .await
        };
        match stored.await {
            Ok(()) => {
                tracing::debug!(projection = %self.name(), topic = %self.tp.0, partition = self.tp.1, position, "Checkpoint moved past transaction markers.");
                *retry = MarkerRetry::new();
                self.committed(position, position);
            }
            Err(e) => {
                let delay = self.retry.wait_delay(retry.failures);
                retry.failures += 1;
                retry.not_before = Some(Instant::now() + delay);
                if retry.log.due() {
                    tracing::warn!(projection = %self.name(), topic = %self.tp.0, partition = self.tp.1, failures = retry.failures, error = %e, "Cannot move the checkpoint past transaction markers; trying again later.")
                }
            }
        }
    }

    /// Buffers a message read from the partition's queue; an error is logged (librdkafka
    /// recovers by itself). Returns whether a message was buffered.
    fn receive(&self, received: Option<KafkaResult<BorrowedMessage<'_>>>, batcher: &mut Batcher<Msg>) -> bool {
        match received {
            Some(Ok(message)) => {
                let msg = Msg::from_kafka(&message);
                self.stats.read.fetch_add(1, Ordering::Relaxed);
                let bytes = msg.bytes();
                batcher.push(msg, bytes, Instant::now());
                true
            }
            Some(Err(e)) => {
                tracing::warn!(projection = %self.name(), topic = %self.tp.0, partition = self.tp.1, error = %e, "Kafka error on the partition; continuing.");
                false
            }
            None => false,
        }
    }

    /// Takes a committed or halted batch's result.
    fn settle(&self, applied: Applied, batcher: &mut Batcher<Msg>) {
        if let Some(next) = applied.next_offset {
            self.committed(applied.first_offset, next);
        }
        match applied.halt {
            Some(halt) => {
                let dropped = batcher.halt();
                tracing::debug!(dropped, "Buffered messages after the halt dropped.");
                self.halt(halt);
            }
            None => batcher.committed(),
        }
    }

    /// Whether this partition reached the high watermark it had when first checked; the
    /// watermark query runs off the async runtime (it blocks).
    async fn check_caught_up(&self, target: &mut Option<i64>, halted: bool) {
        if self.progress.caught_up.load(Ordering::SeqCst) {
            return;
        }
        if halted {
            self.progress.caught_up.store(true, Ordering::SeqCst);
            return;
        }
        if target.is_none() {
            let (consumer, (topic, partition)) = (self.consumer.clone(), self.tp.clone());
            let high = tokio::task::spawn_blocking(move || {
                consumer.fetch_watermarks(&topic, partition, Duration::from_secs(5)).map(|(_, high)| high)
            })
            .await;
            match high {
                Ok(Ok(high)) => *target = Some(high),
                Ok(Err(e)) => {
                    tracing::warn!(topic = %self.tp.0, partition = self.tp.1, error = %e, "Cannot read the high watermark; trying again.")
                }
                Err(e) => tracing::warn!(error = %e, "Watermark query failed."),
            }
        }
        let Some(target) = *target else { return };
        // The checkpoint, not the position: at an idle moment it is moved past the markers
        // read, so it reaches the watermark exactly when everything before it is applied.
        if target == 0 || self.progress.committed.load(Ordering::SeqCst) >= target {
            self.progress.caught_up.store(true, Ordering::SeqCst);
        }
    }

    /// The checkpoint moved to `next` (from the batch starting at `first`, when it is the
    /// first since the partition started without one): progress, then Kafka's copy.
    fn committed(&self, first: i64, next: i64) {
        let previous = self.progress.committed.swap(next, Ordering::SeqCst);
        let from = if previous >= 0 { previous } else { first };
        self.stats.advanced.fetch_add((next - from).max(0) as u64, Ordering::Relaxed);
        self.commit_kafka(next);
    }

    fn commit_kafka(&self, next_offset: i64) {
        let mut tpl = TopicPartitionList::new();
        if tpl.add_partition_offset(&self.tp.0, self.tp.1, Offset::Offset(next_offset)).is_ok() {
            if let Err(e) = self.consumer.commit(&tpl, CommitMode::Async) {
                // Postgres holds the position; Kafka's copy only serves lag tools.
                tracing::warn!(topic = %self.tp.0, partition = self.tp.1, error = %e, "Kafka offset commit failed.");
            }
        }
    }

    fn pause(&self) {
        pause(&self.consumer, &self.tp);
    }

    fn halt(&self, halt: Halt) {
        let err = Error::Halted {
            projection: self.name().to_owned(),
            topic: self.tp.0.clone(),
            partition: self.tp.1,
            offset: halt.offset,
            aggregate: halt.aggregate,
            reason: halt.reason,
        };
        tracing::error!(error = %err, "Partition halted; nothing at or after this offset is applied until it is fixed.");
        self.pause();
        let halted = {
            let mut set = self.stats.halted.lock().expect("halted lock");
            set.insert(self.tp.clone());
            set.len()
        };
        self.progress.caught_up.store(true, Ordering::SeqCst);
        metrics::counter!(m::EVENTS_FAILED, "projection" => self.name().to_owned(), "reason" => halt.kind.label())
            .increment(1);
        metrics::gauge!(m::PARTITIONS_HALTED, "projection" => self.name().to_owned()).set(halted as f64);
        self.stats.halts.lock().expect("halts lock").push(err.to_string());
    }

    /// Applies one batch, waiting out PostgreSQL outages for as long as they last and
    /// retrying other transient failures a bounded number of times; a gap, a poison event
    /// or a failure retrying does not cure halts at that event after applying (and
    /// committing) what precedes it. `through`: the position after the batch when it holds
    /// everything read (its checkpoint then also covers the transaction markers that
    /// followed it). Once `stop` says stop, a wait between attempts ends and the batch is
    /// abandoned (nothing of it committed): a revoked partition's next owner, or the next
    /// run, reads it again from the checkpoint, and a shutdown need not outlast an outage.
    async fn apply(self: Arc<Self>, messages: Vec<Msg>, through: Option<i64>, stop: watch::Receiver<Stop>) -> Applied {
        let span = tracing::info_span!(
            "batch",
            projection = %self.name(),
            topic = %self.tp.0,
            partition = self.tp.1,
            first_offset = messages.first().map_or(-1, |m| m.offset),
            last_offset = messages.last().map_or(-1, |m| m.offset),
            size = messages.len(),
            applied = tracing::field::Empty,
            duplicate = tracing::field::Empty,
            stale = tracing::field::Empty,
            ignored = tracing::field::Empty,
        );
        let this = self.clone();
        async move {
            let (envelopes, mut halt) = decode_until_poison(&messages);
            let mut end = envelopes.len();
            while end > 0 {
                let batch = &envelopes[..end];
                let after_last = messages[end - 1].offset + 1;
                let next_offset = match through {
                    Some(position) if end == messages.len() => position.max(after_last),
                    _ => after_last,
                };
                let started = Instant::now();
                let mut outage = Outage::new(this.stats.clone(), this.name());
                let mut stop = stop.clone();
                let result = this
                    .retry
                    .run_until(
                        || this.try_apply(batch, &messages, next_offset),
                        Retry::of,
                        |e, retrying| {
                            if retrying.kind == Retry::WaitOut {
                                outage.failed(e, retrying);
                            } else {
                                tracing::warn!(error = %e, attempt = retrying.attempt, delay_ms = retrying.delay.as_millis() as u64, "Retryable failure; trying the batch again.");
                            }
                            metrics::counter!(m::BATCH_RETRIES, "projection" => this.name().to_owned()).increment(1);
                        },
                        async move {
                            let _ = stop.wait_for(|s| *s != Stop::No).await;
                        },
                    )
                    .await;
                let Some(result) = result else {
                    return Applied { first_offset: messages[0].offset, next_offset: None, halt: None, abandoned: true };
                };
                match result {
                    Ok(Committed { counts, next_offset, gap }) => {
                        outage.over();
                        this.stats.add(&counts);
                        let applied = gap.as_ref().map_or(batch, |(index, _)| &batch[..*index]);
                        this.record_batch(applied, &counts, started.elapsed());
                        if let Some((index, reason)) = gap {
                            let m = &messages[index];
                            let aggregate = envelopes[index].aggregate_id.clone();
                            halt = Some(Halt { offset: m.offset, timestamp: m.timestamp, aggregate, reason, kind: HaltKind::Gap });
                        }
                        return Applied {
                            first_offset: messages[0].offset,
                            next_offset: Some(next_offset),
                            halt,
                            abandoned: false,
                        };
                    }
                    Err(e) => {
                        let (index, reason, kind) = classify(&e, this.retry.max_retries);
                        halt = Some(Halt { offset: messages[index].offset, timestamp: messages[index].timestamp, aggregate: envelopes[index].aggregate_id.clone(), reason, kind });
                        end = index;
                    }
                }
            }
            Applied { first_offset: messages.first().map_or(-1, |m| m.offset), next_offset: None, halt, abandoned: false }
        }
        .instrument(span)
        .await
    }

    /// One transaction: the batch and its checkpoint, set-based; per event when a
    /// concurrent writer moved the batch's rows. A gap ends the batch: the events before it
    /// commit with a checkpoint at its offset, and it is named.
    async fn try_apply(
        &self,
        batch: &[RawEnvelope],
        messages: &[Msg],
        next_offset: i64,
    ) -> projectionist_postgres::Result<Committed> {
        match self.try_apply_in(batch, messages, next_offset, Mode::Batch).await {
            Err(e @ projectionist_postgres::Error::Conflict { .. }) => {
                tracing::info!(reason = %e, "Rows moved under the batch; applying it event by event.");
                metrics::counter!(m::BATCH_FALLBACKS, "projection" => self.name().to_owned()).increment(1);
                self.try_apply_in(batch, messages, next_offset, Mode::PerEvent).await
            }
            other => other,
        }
    }

    async fn try_apply_in(
        &self,
        batch: &[RawEnvelope],
        messages: &[Msg],
        next_offset: i64,
        mode: Mode,
    ) -> projectionist_postgres::Result<Committed> {
        let mut tx = self.pool.begin().await?;
        let outcomes = self.projection.apply_raw(&mut tx, batch, mode).await?;
        let gap = match outcomes.last() {
            Some(gap @ Outcome::Gap { .. }) => {
                Some((outcomes.len() - 1, format!("{gap}: the event's predecessor was never applied")))
            }
            _ => None,
        };
        let next_offset = gap.as_ref().map_or(next_offset, |(index, _)| messages[*index].offset);
        projectionist_postgres::checkpoint::store(&mut tx, self.projection.name(), &self.tp.0, self.tp.1, next_offset)
            .await?;
        tx.commit().await?;
        let counts = outcomes.iter().filter(|o| !matches!(o, Outcome::Gap { .. })).collect();
        Ok(Committed { counts, next_offset, gap })
    }

    /// Per-batch telemetry: counters, histograms, event age, pool use, span fields.
    fn record_batch(&self, batch: &[RawEnvelope], counts: &OutcomeCounts, took: Duration) {
        let projection = self.name().to_owned();
        let span = tracing::Span::current();
        span.record("applied", counts.applied)
            .record("duplicate", counts.duplicate)
            .record("stale", counts.stale)
            .record("ignored", counts.ignored);
        tracing::debug!(took_ms = took.as_millis() as u64, "Batch committed.");
        metrics::counter!(m::EVENTS_APPLIED, "projection" => projection.clone()).increment(counts.applied);
        for (reason, n) in [("duplicate", counts.duplicate), ("stale", counts.stale), ("ignored", counts.ignored)] {
            metrics::counter!(m::EVENTS_SKIPPED, "projection" => projection.clone(), "reason" => reason).increment(n);
        }
        metrics::histogram!(m::BATCH_SIZE, "projection" => projection.clone()).record(batch.len() as f64);
        metrics::histogram!(m::BATCH_DURATION, "projection" => projection.clone()).record(took.as_secs_f64());
        metrics::counter!(m::CHECKPOINT_COMMITS, "projection" => projection.clone()).increment(1);
        if let Some(last) = batch.last() {
            let age = (now_ms() - last.occurred_at.timestamp_millis()).max(0) as f64 / 1000.0;
            metrics::gauge!(m::APPLIED_EVENT_AGE_SECONDS, "projection" => projection, "topic" => self.tp.0.clone(), "partition" => self.tp.1.to_string()).set(age);
        }
        let (size, idle) = (self.pool.size(), self.pool.num_idle() as u32);
        metrics::gauge!(m::PG_POOL_CONNECTIONS, "state" => "in_use").set(size.saturating_sub(idle) as f64);
        metrics::gauge!(m::PG_POOL_CONNECTIONS, "state" => "idle").set(idle as f64);
    }
}

/// Stops fetching a partition (what is fetched already stays unread in its queue). librdkafka
/// waits for its own thread here, so the call runs off the async runtime.
pub(crate) fn pause(consumer: &Arc<StreamConsumer<EngineContext>>, tp: &Tp) {
    let (consumer, tp) = (consumer.clone(), tp.clone());
    tokio::task::spawn_blocking(move || {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&tp.0, tp.1);
        if let Err(e) = consumer.pause(&tpl) {
            tracing::warn!(topic = %tp.0, partition = tp.1, error = %e, "Cannot pause the partition.");
        }
    });
}

/// A batch's result: the next offset committed (none when the halt came first) and the
/// halt, if one stopped the partition within the batch; or abandoned, nothing committed,
/// when the partition was stopped while the batch waited to be retried.
#[derive(Debug)]
pub(crate) struct Applied {
    first_offset: i64,
    next_offset: Option<i64>,
    halt: Option<Halt>,
    abandoned: bool,
}

/// A batch's committed transaction: its outcomes, the checkpoint it stored, and the gap that
/// ended it, if one did (its index in the batch, and why).
struct Committed {
    counts: OutcomeCounts,
    next_offset: i64,
    gap: Option<(usize, String)>,
}

/// How a partition's checkpoint past transaction markers is retried after failing.
struct MarkerRetry {
    failures: u32,
    not_before: Option<Instant>,
    log: Throttle,
}

impl MarkerRetry {
    fn new() -> Self {
        Self { failures: 0, not_before: None, log: Throttle::new(LOG_EVERY) }
    }
}

/// Decodes messages up to the first poison one: the envelopes before it, and the halt it causes.
pub(crate) fn decode_until_poison(messages: &[Msg]) -> (Vec<RawEnvelope>, Option<Halt>) {
    let mut envelopes = Vec::with_capacity(messages.len());
    for m in messages {
        match decode(m) {
            Ok(e) => envelopes.push(e),
            Err(reason) => {
                let halt = Halt {
                    offset: m.offset,
                    timestamp: m.timestamp,
                    aggregate: m.key.clone().unwrap_or_else(|| "?".into()),
                    reason,
                    kind: HaltKind::Poison,
                };
                return (envelopes, Some(halt));
            }
        }
    }
    (envelopes, None)
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

/// Which event a failure that retries did not cure stops at, why, and its kind.
fn classify(e: &projectionist_postgres::Error, retries: u32) -> (usize, String, HaltKind) {
    match e {
        projectionist_postgres::Error::Decode { index, source, .. } => (*index, source.to_string(), HaltKind::Poison),
        projectionist_postgres::Error::Invalid { index, problem, .. } => (*index, problem.clone(), HaltKind::Error),
        other if other.is_retryable() => (0, format!("{other} (gave up after {retries} retries)"), HaltKind::Error),
        // Names the event at fault (a value the database refused, a failing `apply`), or
        // the batch's first event.
        other => (other.event_index().unwrap_or(0), other.to_string(), HaltKind::Error),
    }
}

async fn join(handle: &mut Option<JoinHandle<Applied>>) -> Result<Applied, tokio::task::JoinError> {
    match handle {
        Some(h) => h.await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

/// Now, in ms since the epoch.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(offset: i64, key: &str, payload: &str) -> Msg {
        Msg { offset, key: Some(key.into()), payload: Some(payload.as_bytes().to_vec()), timestamp: Some(offset) }
    }

    fn envelope(id: &str, version: u64) -> String {
        format!(
            r#"{{"id":"00000000-0000-4000-8000-00000000000{version}","aggregate_type":"account","aggregate_id":"{id}","version":{version},"type":"Opened","occurred_at":"2026-01-01T00:00:00Z","data":{{}}}}"#
        )
    }

    #[test]
    fn lag_is_zero_at_the_head_and_else_the_age_of_the_oldest_unapplied_message() {
        let now = 1_000_000;
        let progress = Progress::new(Some(100));
        assert_eq!(progress.lag(-1, 0, now), None, "head unknown yet: nothing exported");
        assert_eq!(progress.lag(100, 0, now), Some((0, Some(0.0))), "caught up");
        assert_eq!(progress.lag(90, 0, now), Some((0, Some(0.0))), "never negative");
        assert_eq!(progress.lag(105, 0, now), Some((5, None)), "behind, nothing read yet: age unknown");
        progress.oldest_unapplied_ms.store(now - 2_500, Ordering::SeqCst);
        assert_eq!(progress.lag(105, 0, now), Some((5, Some(2.5))));
        progress.committed.store(105, Ordering::SeqCst);
        assert_eq!(progress.lag(105, 0, now), Some((0, Some(0.0))), "applied: 0 again, whatever is remembered");
        let fresh = Progress::new(None);
        assert_eq!(fresh.lag(50, 20, now), Some((30, None)), "no checkpoint: counted from the low watermark");
    }

    #[test]
    fn decoding_stops_at_the_first_poison_message_and_names_it() {
        let messages = [msg(10, "a", &envelope("a", 1)), msg(11, "b", "{not json"), msg(12, "a", &envelope("a", 2))];
        let (envelopes, halt) = decode_until_poison(&messages);
        assert_eq!(envelopes.len(), 1);
        let halt = halt.expect("a halt");
        assert_eq!((halt.offset, halt.aggregate.as_str(), halt.kind), (11, "b", HaltKind::Poison));
        assert!(halt.reason.contains("undecodable envelope"), "{}", halt.reason);
    }

    #[test]
    fn a_key_that_contradicts_the_envelope_is_poison() {
        let (envelopes, halt) = decode_until_poison(&[msg(5, "x", &envelope("y", 1))]);
        assert!(envelopes.is_empty());
        let halt = halt.expect("a halt");
        assert_eq!((halt.offset, halt.kind), (5, HaltKind::Poison));
        assert!(halt.reason.contains("differs from aggregate_id"), "{}", halt.reason);
        let (_, tombstone) =
            decode_until_poison(&[Msg { offset: 6, key: Some("x".into()), payload: None, timestamp: None }]);
        assert!(tombstone.expect("a halt").reason.contains("tombstone"));
    }
}
