//! The partition's task: its loop ([`Partition::run`]), its state between two turns
//! ([`Task`]) and one method per thing it waits for.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{FutureExt, StreamExt};
use rdkafka::consumer::stream_consumer::StreamPartitionQueue;
use rdkafka::error::KafkaResult;
use rdkafka::message::BorrowedMessage;
use tokio::sync::watch;

use std::sync::atomic::Ordering;

use super::apply::Applied;
use super::decode::At;
use super::fold::Reads;
use super::halt::retracted;
use super::progress::MarkerRetry;
use super::{
    pause, report, Begin, Flow, Halt, HaltKind, InFlight, Msg, Order, Partition, Task, REVOKE_GRACE, SEEK_TIMEOUT,
};
use crate::batcher::Batcher;
use crate::context::EngineContext;

impl Partition {
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
    pub(super) fn name(&self) -> &str {
        self.partition.name()
    }

    /// Buffers a message read from the partition's queue; an error is logged (librdkafka
    /// recovers by itself). Returns whether a message was buffered.
    pub(super) fn receive(&mut self, received: Option<KafkaResult<BorrowedMessage<'_>>>) -> bool {
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
    pub(super) fn start_batch(&mut self, drained: bool, orders: &watch::Receiver<Order>) -> Flow {
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
    pub(super) async fn idle_work(&mut self, drained: bool) {
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
        if running && self.partition.sink.sweeps_parking() && self.swept.elapsed() >= super::progress::SWEEP_EVERY {
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
    pub(super) fn finished(&mut self, applied: Result<Applied, tokio::task::JoinError>) -> Flow {
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
    pub(super) fn panicked(&mut self, batch: &InFlight, e: &tokio::task::JoinError) {
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
    pub(super) fn read_on_from(&mut self, stored: Option<i64>) {
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
    pub(super) fn reread_from(&mut self, stored: Option<i64>) {
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
    pub(super) fn halt(&mut self, halt: Halt) {
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
    pub(super) async fn abandon(&mut self) {
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
