//! One assigned partition's task: it reads the partition's own queue, cuts batches (see
//! [`crate::batcher`]), applies each in one PostgreSQL transaction together with its
//! checkpoint, commits the Kafka offset afterwards, waits out PostgreSQL outages (see
//! [`crate::outage`]), retries other transient failures a bounded number of times and
//! halts the partition at what retrying cannot fix. Partitions run side by side, each with
//! its own task.
//!
//! - `mod.rs` (here): the task's loop, its state, one method per thing it waits for;
//! - [`apply`]: one batch, decoded and projected once, put into the partition's sink;
//! - [`sink`]: where a batch goes: written with its checkpoint at once, or folded in memory
//!   and written once due (a rebuild's bulk load, [`fold`]);
//! - [`progress`]: the checkpoint stored, as others see it, Kafka commits, markers, caught-up;
//! - [`halt`]: where and why a partition stopped, reported in one place;
//! - [`heal`]: a halt whose cause can go away, retried;
//! - [`decode`]: messages and their envelopes.

mod apply;
mod decode;
mod fold;
#[cfg(test)]
mod fuzz;
mod halt;
mod heal;
mod progress;
mod schemas;
pub(crate) mod shared;
mod sink;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{FutureExt, StreamExt};
use projectionist_core::{OnGap, OnPoison};
use projectionist_postgres::{PgPool, SharedProjection};
use rdkafka::consumer::stream_consumer::StreamPartitionQueue;
use rdkafka::consumer::StreamConsumer;
use rdkafka::error::KafkaResult;
use rdkafka::message::BorrowedMessage;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::batcher::{Batcher, Limits};
use crate::context::EngineContext;
use crate::retry::RetryPolicy;
use crate::stats::{Stats, Tally};
use crate::tp::Tp;
use apply::Applied;
use decode::At;
pub(crate) use decode::Msg;
use fold::Reads;
use halt::retracted;
pub(crate) use halt::{forget, pause, report, Halt, HaltKind};
use heal::Healing;
use progress::MarkerRetry;
pub(crate) use shared::Progress;
pub(crate) use sink::Sink;

/// How long a revoked partition waits for its batch in flight before abandoning it (its
/// transaction rolls back; the next owner reads it again from the checkpoint), so that a
/// statement stuck on a lock cannot hold up the group's rebalance.
const REVOKE_GRACE: Duration = Duration::from_secs(15);

/// How long a seek to a moved checkpoint may take (see `Task::read_on_from`).
const SEEK_TIMEOUT: Duration = Duration::from_secs(10);

/// What the runner asks of a partition task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    /// Keep going.
    Run,
    /// The partition was revoked: finish the batch in flight (within [`REVOKE_GRACE`]),
    /// drop the rest (it is read again from the checkpoint by the next owner).
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

/// What the task needs besides its queue: what it works with (handles shared with the
/// runner and the other partitions), how it works ([`Settings`]) and where its batches go
/// ([`Sink`]).
pub(crate) struct Partition {
    pub tp: Tp,
    pub projection: SharedProjection,
    pub pool: PgPool,
    pub consumer: Arc<StreamConsumer<EngineContext>>,
    pub stats: Arc<Stats>,
    /// What became of the messages it read (shared by its assignments in this process).
    pub tally: Arc<Tally>,
    pub dead_letter_topic: Option<Arc<crate::dead_letters::DeadLetterTopic>>,
    pub checked: Arc<Checked>,
    /// Where its batches go: written at once, or folded (a rebuild's bulk load).
    pub sink: Sink,
    pub progress: Arc<Progress>,
    /// Its batches' bounds.
    pub limits: Limits,
    pub settings: Settings,
    /// How its topic's messages carry the envelope, and the registry's schemas.
    pub reader: projectionist_core::format::Reader,
}

/// How a projection's partitions work: the same for each of them.
#[derive(Clone)]
pub(crate) struct Settings {
    pub retry: RetryPolicy,
    pub exit_when_caught_up: bool,
    /// The longest delay between two tries of a halt that may heal; `None`: halts stay.
    pub heal: Option<Duration>,
    pub on_gap: OnGap,
    pub on_poison: OnPoison,
    /// No one else writes the projection's tables (a rebuild's shadow).
    pub sole_writer: bool,
    pub max_event_bytes: usize,
    pub bounds: projectionist_postgres::park::Bounds,
    /// The consumer group (named on the batch spans).
    pub group: Arc<str>,
    /// The aggregates whose events are applied (see [`crate::scope::Scope`]).
    pub scope: Arc<crate::scope::Scope>,
}

/// What PostgreSQL checks of the projection's tables beyond their declarations (CHECK
/// constraints, domains, unique indexes, foreign keys: `Checks`), read at most once a minute and shared by its partitions, so that a batch does
/// not ask the catalog (see `Prepared::set_checked`): a constraint added while the engine
/// runs counts within a minute.
#[derive(Default)]
pub(crate) struct Checked(std::sync::Mutex<Option<(Instant, projectionist_postgres::Checks)>>);

impl Checked {
    const EVERY: Duration = Duration::from_secs(60);

    /// The tables, read again when a minute old; `None` when they cannot be read now (the
    /// batch then asks the catalog itself, and waits PostgreSQL out as it does).
    pub(crate) async fn get(
        &self,
        pool: &PgPool,
        projection: &dyn projectionist_postgres::PgProjection,
    ) -> Option<projectionist_postgres::Checks> {
        if let Some((at, tables)) = &*self.0.lock().expect("checked lock") {
            if at.elapsed() < Self::EVERY {
                return Some(tables.clone());
            }
        }
        let tables = projectionist_postgres::checked_tables(pool, projection).await.ok()?;
        *self.0.lock().expect("checked lock") = Some((Instant::now(), tables.clone()));
        Some(tables)
    }
}

/// The batch being applied, in a task of its own: aborted if dropped unfinished (the
/// partition's task ended), so that nothing commits behind a halt's back.
struct InFlight {
    handle: JoinHandle<Applied>,
    /// Its messages.
    size: usize,
    /// Broker timestamp of its first message.
    oldest: Option<i64>,
    /// Where its first message sits, and the aggregate it is about.
    first: (At, String),
    /// Its last message's offset.
    last_offset: i64,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

/// The task's state between two turns of its loop.
struct Task {
    partition: Arc<Partition>,
    batcher: Batcher<Msg>,
    in_flight: Option<InFlight>,
    /// Broker timestamp of the message a halt stopped at.
    halted_at: Option<i64>,
    order: Order,
    /// When a revoked partition stops waiting for its batch in flight.
    revoke_deadline: Option<Instant>,
    /// The high watermark to reach (`exit_when_caught_up`), once read.
    target: Option<i64>,
    markers: MarkerRetry,
    /// When its parked aggregates were last checked for a stale parking.
    swept: Instant,
    /// Batches go one message at a time up to this offset: a batch's task failed there, and
    /// the message at fault is being found (see `Task::panicked`).
    isolating: Option<i64>,
    /// The halt being retried, if one is (see `Task::heal`).
    healing: Option<Healing>,
}

/// Whether the loop goes on.
#[derive(PartialEq, Eq)]
enum Flow {
    Continue,
    Break,
}

impl Partition {
    fn name(&self) -> &str {
        self.projection.name()
    }

    /// Runs the partition until `orders` say otherwise. A partition that begins halted
    /// reads nothing and only waits to be stopped.
    pub(crate) async fn run(
        self,
        queue: StreamPartitionQueue<EngineContext>,
        mut orders: watch::Receiver<Order>,
        begin: Begin,
    ) {
        let mut task = Task {
            batcher: Batcher::new(self.limits),
            partition: Arc::new(self),
            in_flight: None,
            halted_at: None,
            order: Order::Run,
            revoke_deadline: None,
            target: None,
            markers: MarkerRetry::new(),
            swept: Instant::now(),
            isolating: None,
            healing: None,
        };
        match begin {
            Begin::Run => {}
            Begin::Halt(halt) => task.halt(halt),
            Begin::Halted => {
                task.batcher.halt();
                task.partition.progress.set_caught_up();
                pause(&task.partition.consumer, &task.partition.tp);
            }
        }
        let mut stream = queue.stream();
        // Wakes an idle partition: checkpoint past trailing transaction markers, caught-up check.
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // Read what is ready without waiting, up to the batch bounds.
            let mut drained = false;
            while task.order == Order::Run && task.batcher.wants_more() {
                // Nothing ready, or an error (logged): apply what is buffered.
                if !stream.next().now_or_never().is_some_and(|received| task.receive(received)) {
                    drained = true;
                    break;
                }
            }
            if task.in_flight.is_none() && task.start_batch(drained, &orders) == Flow::Break {
                break;
            }
            task.idle_work(drained).await;
            let deadline = if task.batcher.in_flight() { None } else { task.batcher.deadline() };
            let revoke_deadline = task.in_flight.as_ref().and(task.revoke_deadline);
            let heal_at = task.healing.as_ref().and_then(|h| h.at);
            tokio::select! {
                biased;
                applied = join(&mut task.in_flight) => {
                    if task.finished(applied) == Flow::Break {
                        break;
                    }
                }
                changed = orders.changed(), if task.order == Order::Run => {
                    task.order = if changed.is_ok() { *orders.borrow() } else { Order::Shutdown };
                    if task.order == Order::Revoke {
                        task.revoke_deadline = Some(Instant::now() + REVOKE_GRACE);
                    }
                }
                received = stream.next(), if task.order == Order::Run && task.batcher.wants_more() => {
                    task.receive(received);
                }
                () = sleep_until(deadline) => {}
                () = sleep_until(revoke_deadline) => {
                    task.abandon().await;
                    break;
                }
                () = sleep_until(heal_at), if task.order == Order::Run => task.heal(),
                _ = tick.tick() => {}
            }
        }
        // Stopping: what the sink holds (a rebuild's fold) is written with its checkpoint, so
        // that the next run goes on after it (were it lost, the next run would read it again).
        if task.order == Order::Shutdown && !task.batcher.is_halted() && task.partition.sink.holds() {
            task.write_held(Reads::End).await;
        }
        // Revoked: what is buffered is left to the next owner. A halt that was to be retried
        // is not kept: if this process is given the partition again, it reads it again.
        task.partition.tally.unapplied(task.batcher.len());
        if let Some(healing) = task.healing.take().filter(|h| h.at.is_some() && task.order == Order::Revoke) {
            let partition = &task.partition;
            retracted(partition.name(), &partition.tp, &healing.reported, &partition.stats);
        }
    }
}

impl Task {
    fn name(&self) -> &str {
        self.partition.name()
    }

    /// Buffers a message read from the partition's queue; an error is logged (librdkafka
    /// recovers by itself). Returns whether a message was buffered.
    fn receive(&mut self, received: Option<KafkaResult<BorrowedMessage<'_>>>) -> bool {
        match received {
            Some(Ok(message)) => {
                projectionist_postgres::fault::point("partition-read");
                let partition = &self.partition;
                let (msg, bytes) = Msg::from_kafka(&message, &partition.reader, partition.settings.max_event_bytes);
                self.partition.tally.read.fetch_add(1, Ordering::Relaxed);
                self.batcher.push_read_now(msg, bytes, Instant::now);
                true
            }
            Some(Err(e)) => {
                let (topic, partition) = (&self.partition.tp.topic, self.partition.tp.partition);
                tracing::warn!(
                    projection = %self.name(),
                    %topic,
                    partition,
                    error = %e,
                    "Kafka error on the partition; continuing."
                );
                false
            }
            None => false,
        }
    }

    /// Cuts the next batch, if one is due, and starts applying it. Breaks once stopping
    /// leaves nothing to apply.
    fn start_batch(&mut self, drained: bool, orders: &watch::Receiver<Order>) -> Flow {
        let batch = match self.order {
            Order::Run => self.batcher.cut(Instant::now(), drained),
            Order::Shutdown => self.batcher.rest(),
            Order::Revoke => None,
        };
        let Some(batch) = batch else {
            return if self.order == Order::Run { Flow::Continue } else { Flow::Break };
        };
        // Everything read is in this batch: it may end past the last message, at the
        // position after the transaction markers read with it.
        let through = if drained && self.batcher.is_empty() { self.partition.position() } else { None };
        let (oldest, size) = (batch.first().and_then(|m| m.at.timestamp), batch.len());
        let first = batch
            .first()
            .map(|m| (m.at, m.aggregate()))
            .unwrap_or_else(|| (At { offset: -1, timestamp: None }, "?".into()));
        let last_offset = batch.last().map_or(-1, |m| m.at.offset);
        let handle = tokio::spawn(self.partition.clone().apply(batch, through, orders.clone()));
        self.in_flight = Some(InFlight { handle, size, oldest, first, last_offset });
        Flow::Continue
    }

    /// With nothing in flight or buffered: the checkpoint past transaction markers, the
    /// caught-up check; always: the age of the oldest message not applied, for the lag.
    async fn idle_work(&mut self, drained: bool) {
        let idle = self.in_flight.is_none() && self.batcher.is_empty() && drained;
        // Nothing more to read for now: what the sink holds (a rebuild's fold) is written
        // before anything counts the partition's checkpoint (the markers, the caught-up check).
        if idle && !self.batcher.is_halted() && !self.write_held_if_due().await {
            return;
        }
        // Never past what the sink holds and has not written (it was not due above):
        // were the process to stop then, those events would be lost to the shadow.
        if idle && self.order == Order::Run && !self.batcher.is_halted() && !self.partition.sink.holds() {
            if let Err(stored) = self.partition.checkpoint_past_markers(&mut self.markers).await {
                self.read_on_from(stored);
            }
        }
        let running = idle && self.order == Order::Run && !self.batcher.is_halted();
        if running && self.partition.sink.sweeps_parking() && self.swept.elapsed() >= progress::SWEEP_EVERY {
            self.swept = Instant::now();
            self.partition.resume_stale().await;
        }
        if self.partition.settings.exit_when_caught_up && idle {
            self.partition.check_caught_up(&mut self.target, self.batcher.is_halted()).await;
        }
        let oldest = match &self.in_flight {
            Some(in_flight) => in_flight.oldest,
            None if self.batcher.is_halted() => self.halted_at,
            None => self.batcher.first().and_then(|m| m.at.timestamp),
        };
        self.partition.progress.oldest_unapplied_ms.store(oldest.unwrap_or(-1), Ordering::SeqCst);
    }

    /// Takes the result of the batch that was in flight.
    fn finished(&mut self, applied: Result<Applied, tokio::task::JoinError>) -> Flow {
        let in_flight = self.in_flight.take().expect("a batch was in flight");
        match applied {
            Ok(Applied::Abandoned) => {
                // Stopped while waiting for PostgreSQL: nothing of the batch was committed,
                // its events are read again from the checkpoint.
                let (topic, partition) = (&self.partition.tp.topic, self.partition.tp.partition);
                tracing::info!(
                    projection = %self.name(),
                    %topic,
                    partition,
                    "Stopped while waiting for PostgreSQL; the batch was not applied and is read again from the \
                     checkpoint."
                );
                return Flow::Break;
            }
            Ok(Applied::Committed { first_offset, next_offset, halt }) => {
                self.partition.advance(first_offset, next_offset);
                if self.isolating.is_some_and(|until| next_offset > until) {
                    self.isolating = None;
                    self.batcher.one_at_a_time(false);
                }
                self.markers.batch_committed();
                if self.healing.as_ref().is_some_and(|h| next_offset > h.offset) {
                    self.healed();
                }
                match halt {
                    Some(halt) => self.halt(halt),
                    None => self.batcher.settle(),
                }
            }
            Ok(Applied::Halted(halt)) => self.halt(halt),
            Ok(Applied::Moved(stored)) => self.read_on_from(stored),
            Err(e) => {
                // A panic in projection code: the batch rolled back with its transaction.
                self.partition.tally.unapplied(in_flight.size);
                self.panicked(&in_flight, &e);
            }
        }
        Flow::Continue
    }

    /// The task of `batch` failed (a panic: a bug in projection code or the engine), and
    /// nothing of it committed. A batch of one halts at its message. A larger one is read
    /// again from the checkpoint one message at a time, so that what precedes the message at
    /// fault applies and the halt names that message: what a skip moves past. A rebuild's
    /// fold, whose rows in memory the panic may have left half-made, halts at its checkpoint.
    fn panicked(&mut self, batch: &InFlight, e: &tokio::task::JoinError) {
        let kind = HaltKind::Error;
        if batch.size == 1 {
            let ((at, aggregate), reason) = (batch.first.clone(), format!("the projection's task failed on it: {e}"));
            return self.halt(Halt {
                offset: at.offset,
                timestamp: at.timestamp,
                aggregate,
                reason,
                kind,
                heals: false,
            });
        }
        let checkpoint = self.partition.progress.checkpoint.load(Ordering::SeqCst);
        if self.partition.sink.holds_rows() {
            let reason = format!("the projection's task failed on a batch of the rebuild: {e}");
            let (offset, timestamp, aggregate) = (checkpoint.max(0), batch.oldest, "?".into());
            return self.halt(Halt { offset, timestamp, aggregate, reason, kind, heals: false });
        }
        let (topic, partition) = (&self.partition.tp.topic, self.partition.tp.partition);
        tracing::warn!(
            projection = %self.name(),
            %topic,
            partition,
            first_offset = batch.first.0.offset,
            last_offset = batch.last_offset,
            error = %e,
            "A batch's task failed; nothing of it was committed. Reading it again one message at a time to apply \
             what precedes the message at fault and halt at that message."
        );
        self.isolating = Some(batch.last_offset);
        self.batcher.one_at_a_time(true);
        self.reread_from((checkpoint >= 0).then_some(checkpoint));
    }

    /// The checkpoint moved under this process (a rebuild's swap or rollback, `run --reset`,
    /// another process given the partition): nothing of the batch was committed; what is
    /// buffered is dropped and the partition reads on from the checkpoint `stored` (`None`:
    /// from the start), as a newly assigned partition would. A seek drops what librdkafka
    /// had fetched past it.
    fn read_on_from(&mut self, stored: Option<i64>) {
        let (topic, number) = (&self.partition.tp.topic, self.partition.tp.partition);
        tracing::warn!(
            projection = %self.name(),
            %topic,
            partition = number,
            checkpoint = ?stored,
            dropped = self.batcher.len(),
            "The checkpoint moved under this process (a rebuild's swap or rollback, a reset, or another process); \
             nothing of the batch was committed, reading on from the checkpoint."
        );
        self.reread_from(stored);
    }

    /// Reads the partition again from the checkpoint `stored` (`None`: from the start), what
    /// is buffered dropped.
    fn reread_from(&mut self, stored: Option<i64>) {
        let partition = &self.partition;
        let (topic, number) = (&partition.tp.topic, partition.tp.partition);
        let dropped = self.batcher.restart();
        partition.tally.unapplied(dropped);
        partition.progress.checkpoint.store(stored.unwrap_or(-1), Ordering::SeqCst);
        partition.progress.stored.store(stored.unwrap_or(-1), Ordering::SeqCst);
        let offset = stored.map_or(rdkafka::Offset::Beginning, rdkafka::Offset::Offset);
        if let Err(e) = rdkafka::consumer::Consumer::seek(&*partition.consumer, topic, number, offset, SEEK_TIMEOUT) {
            // The partition cannot be read from there: it stops, and is read again from the
            // checkpoint by its next owner or run.
            let reason = format!("could not read on from the checkpoint that moved ({stored:?}): {e}");
            let at = stored.unwrap_or(0);
            self.halt(Halt {
                offset: at,
                timestamp: None,
                aggregate: "?".into(),
                reason,
                kind: HaltKind::Error,
                heals: false,
            });
        }
    }

    /// Stops the partition at `halt`: what is buffered after it is dropped, and it is
    /// reported; retried later if it may heal.
    fn halt(&mut self, halt: Halt) {
        let dropped = self.batcher.halt();
        self.partition.tally.unapplied(dropped);
        tracing::debug!(dropped, "Buffered messages after the halt dropped.");
        self.halted_at = halt.timestamp.or(self.halted_at);
        let retry = self.retry_at(&halt);
        let partition = &self.partition;
        partition.progress.set_caught_up();
        let live = (!partition.settings.sole_writer).then_some(&partition.pool);
        let reported =
            report(partition.name(), &partition.tp, halt, (&partition.stats, live), &partition.consumer, retry);
        if let Some(healing) = &mut self.healing {
            healing.reported = reported;
        }
    }

    /// Revoked, and the batch in flight outlasted [`REVOKE_GRACE`]: it is abandoned (its
    /// transaction rolls back), the next owner reads it again from the checkpoint.
    async fn abandon(&mut self) {
        if let Some(mut in_flight) = self.in_flight.take() {
            in_flight.handle.abort();
            // Aborted (or failed), it counted nothing of its messages.
            if (&mut in_flight.handle).await.is_err() {
                self.partition.tally.unapplied(in_flight.size);
            }
            let (topic, partition) = (&self.partition.tp.topic, self.partition.tp.partition);
            let grace_s = REVOKE_GRACE.as_secs();
            tracing::warn!(
                projection = %self.name(),
                %topic,
                partition,
                grace_s,
                "Revoked, and the batch in flight did not finish in time; it was abandoned and is read again from \
                 the checkpoint by the next owner."
            );
        }
    }
}

async fn join(in_flight: &mut Option<InFlight>) -> Result<Applied, tokio::task::JoinError> {
    match in_flight {
        Some(in_flight) => (&mut in_flight.handle).await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}
