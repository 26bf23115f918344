//! One projection's runner: it keeps the group consumer polled, acts on rebalances
//! (checkpoints read, partitions assigned, one task started per partition, tasks stopped
//! on revocation) and decides when the projection is caught up. It never blocks on
//! PostgreSQL for longer than a partition task takes to stop: checkpoints are read in a
//! task of their own (see [`Runner::begin_assign`]). The partitions' work —
//! batches, transactions, checkpoints, retries, halts — is in [`crate::partition`].

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use projectionist_postgres::{PgPool, SharedProjection};
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaErrorCode::InconsistentGroupProtocol;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::context::{EngineContext, Rebalance};
use crate::outage::Throttle;
use crate::partition::{Halt, HaltKind, Order, Progress};
use crate::scope::Scope;
use crate::stats::Stats;
use crate::tp::Tp;
use crate::{EngineConfig, Exclusive, Result};

mod assign;
use assign::{checkpoints_read, Assigning};

/// How long a runner may hold no partition before it says so.
const UNASSIGNED_WARN_AFTER: Duration = Duration::from_secs(30);
/// How often it says so again while that lasts.
const UNASSIGNED_LOG_EVERY: Duration = Duration::from_secs(60);

/// How many times a run about to stop looks for parked aggregates it can resume.
const MAX_RESUME_PASSES: usize = 16;

/// A running partition task.
struct Task {
    stop: watch::Sender<Order>,
    /// `None` once the task ended on its own and was reported (see [`Runner::supervise`]).
    handle: Option<JoinHandle<()>>,
    progress: Arc<Progress>,
}

pub(crate) struct Runner {
    projection: SharedProjection,
    /// The projection's consumer group.
    group: String,
    pool: PgPool,
    config: EngineConfig,
    consumer: Arc<StreamConsumer<EngineContext>>,
    rebalances: mpsc::UnboundedReceiver<Rebalance>,
    stats: Arc<Stats>,
    joined: Arc<AtomicBool>,
    tasks: HashMap<Tp, Task>,
    /// Partitions given by the group whose checkpoints are being read.
    assigning: Option<Assigning>,
    /// Partitions already replayed from offset zero (`from_beginning`: once per process).
    replayed: HashSet<Tp>,
    /// Since when the runner has held no partition (`None` while it holds some).
    unassigned_since: Option<Instant>,
    /// When to say again that no partition was assigned.
    unassigned_log: Throttle,
    /// Where dead letters are also produced, if anywhere.
    dead_letter_topic: Option<Arc<crate::dead_letters::DeadLetterTopic>>,
    /// The projection's checked tables, shared by its partitions.
    checked: Arc<crate::partition::Checked>,
    /// Notified by a partition that catches up (see `exit_when_caught_up`).
    caught_up_told: Arc<tokio::sync::Notify>,
    /// What the engine has to itself (see [`Exclusive`]).
    exclusive: Exclusive,
    /// The part of the topics read (see [`Scope`]).
    scope: Arc<Scope>,
}

/// A projection's membership of its consumer group: the group, the consumer, and the
/// rebalances its callbacks hand over.
pub(crate) struct Member {
    pub group: String,
    pub consumer: Arc<StreamConsumer<EngineContext>>,
    pub rebalances: mpsc::UnboundedReceiver<Rebalance>,
}

impl Runner {
    /// A runner of `projection` in its group (`member`), sharing `stats` and whether it
    /// holds partitions (`joined`) with the engine.
    pub(crate) fn new(
        projection: SharedProjection,
        pool: PgPool,
        config: EngineConfig,
        member: Member,
        stats: Arc<Stats>,
        joined: Arc<AtomicBool>,
    ) -> Self {
        let Member { group, consumer, rebalances } = member;
        Self {
            projection,
            group,
            pool,
            config,
            consumer,
            rebalances,
            stats,
            joined,
            tasks: HashMap::new(),
            assigning: None,
            replayed: HashSet::new(),
            unassigned_since: Some(Instant::now()),
            unassigned_log: Throttle::new(UNASSIGNED_LOG_EVERY),
            dead_letter_topic: None,
            checked: Arc::default(),
            caught_up_told: Arc::default(),
            exclusive: Exclusive::default(),
            scope: Arc::default(),
        }
    }

    /// What the engine has to itself (see [`Exclusive`]).
    pub(crate) fn exclusive(mut self, exclusive: Exclusive) -> Self {
        self.exclusive = exclusive;
        self
    }

    /// The part of the topics read (see [`Scope`]).
    pub(crate) fn scope(mut self, scope: Arc<Scope>) -> Self {
        self.scope = scope;
        self
    }

    /// Dead letters also go to this topic.
    pub(crate) fn with_dead_letter_topic(mut self, topic: Option<Arc<crate::dead_letters::DeadLetterTopic>>) -> Self {
        self.dead_letter_topic = topic;
        self
    }

    fn name(&self) -> &str {
        self.projection.name()
    }

    pub(crate) async fn run(mut self, mut shutdown: watch::Receiver<bool>) -> Result<()> {
        crate::metrics::parked_now(&self.pool, self.projection.name());
        // The alerts' gauges exist from the start, at 0: an alert on `> 0` needs a series.
        crate::metrics::zero_alert_gauges(self.projection.name());
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = shutdown.changed() => break,
                Some(change) = self.rebalances.recv() => match change {
                    Rebalance::Assign(parts) => self.begin_assign(parts).await,
                    Rebalance::Revoke(parts) => self.revoke(parts).await,
                },
                (parts, stored) = checkpoints_read(&mut self.assigning) => self.assign(parts, stored).await,
                // Serves rebalances and errors; messages go to the partitions' own queues.
                received = self.consumer.recv() => {
                    let stray = received.map(|m| (Tp::new(m.topic(), m.partition()), m.offset()));
                    self.received(stray).await?;
                }
                () = self.caught_up_told.notified(), if self.config.exit_when_caught_up => {
                    if self.stop_caught_up().await {
                        break;
                    }
                }
                _ = tick.tick() => {
                    self.supervise().await;
                    // The parking gauges, counted at most once a tick whatever the batches did.
                    if self.stats.parking_changed.swap(false, std::sync::atomic::Ordering::Relaxed) {
                        crate::metrics::parked_now(&self.pool, self.projection.name());
                    }
                    self.warn_while_unassigned();
                    if self.stop_caught_up().await {
                        break;
                    }
                }
            }
        }
        self.close().await;
        Ok(())
    }

    /// What the consumer's own queue gave: a stray message (its partition and offset), or an
    /// error (fatal: the run ends).
    async fn received(&mut self, received: std::result::Result<(Tp, i64), rdkafka::error::KafkaError>) -> Result<()> {
        match received {
            Ok((tp, offset)) => self.stray(tp, offset).await,
            Err(e @ rdkafka::error::KafkaError::MessageConsumptionFatal(_)) => return Err(e.into()),
            Err(rdkafka::error::KafkaError::MessageConsumption(InconsistentGroupProtocol)) => {
                tracing::error!(
                    projection = %self.name(),
                    group = %self.group,
                    "Cannot join the group: its members use another partition.assignment.strategy (eager \
                    range/roundrobin and cooperative-sticky never mix). Joining again once they leave or \
                    switch."
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => {
                // Broker hiccups surface here too; librdkafka reconnects by itself.
                tracing::warn!(projection = %self.name(), error = %e, "Kafka consumer error; continuing.");
                self.consumer.context().remember_error(e.to_string());
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }

    /// The run's end: the batches in flight finished, Kafka's offsets committed where
    /// PostgreSQL's checkpoints stand, the group left.
    async fn close(mut self) {
        if let Some(assigning) = self.assigning.take() {
            assigning.read.abort();
        }
        // Finish the batches in flight and what is buffered: those events were read while
        // we owned their partitions.
        let parts: Vec<Tp> = self.tasks.keys().cloned().collect();
        let checkpoints = self.stop(&parts, Order::Shutdown).await;
        // Make sure Kafka holds what Postgres holds: the exact next offsets of committed
        // batches, never the consumer's current position.
        let mut tpl = TopicPartitionList::new();
        for (tp, next) in checkpoints {
            let _ = tpl.add_partition_offset(&tp.topic, tp.partition, Offset::Offset(next));
        }
        self.consumer.context().closing.store(true, Ordering::SeqCst);
        let consumer = self.consumer.clone();
        let _ = tokio::task::spawn_blocking(move || {
            if tpl.count() > 0 {
                if let Err(e) = consumer.commit(&tpl, CommitMode::Sync) {
                    tracing::warn!(error = %e, "Final Kafka offset commit failed; Postgres holds the position.");
                }
            }
            consumer.unsubscribe();
        })
        .await;
        // Leaving the group is librdkafka's close, which the consumer's drop waits for in
        // 100 ms polls whatever the close takes: done off the runtime, and not awaited, so that
        // what follows the run (a rebuild's statistics and swap) goes on meanwhile. The
        // runtime's shutdown (a process's exit) waits for it.
        let Self { consumer, .. } = self;
        drop(tokio::task::spawn_blocking(move || drop(consumer)));
    }

    /// A message on the consumer's own queue: its partition's queue was not split in time.
    /// It cannot be put back in order, so the partition halts rather than skip it.
    async fn stray(&mut self, tp: Tp, offset: i64) {
        tracing::error!(
            projection = %self.name(),
            topic = %tp.topic,
            partition = tp.partition,
            offset,
            "Message arrived outside its partition's queue."
        );
        let checkpoints = self.stop(std::slice::from_ref(&tp), Order::Revoke).await;
        let at = checkpoints.first().map_or(offset, |(_, next)| *next);
        let reason =
            "a message arrived outside the partition's own queue; restart to resume from the checkpoint".to_owned();
        let halt =
            Halt { offset: at, timestamp: None, aggregate: "?".into(), reason, kind: HaltKind::Error, heals: false };
        let live = (!self.exclusive.sole_writer).then_some(&self.pool);
        crate::partition::report(self.name(), &tp, halt, (&self.stats, live), &self.consumer, None);
    }

    /// Partition tasks that ended on their own: only a panic ends a task that was not told to
    /// stop. Each is a halt at its checkpoint, reported as any halt is (log, gauge, `/ready`,
    /// the run's exit code), never silence. The partition stays assigned and halted in this
    /// process; the next run reads it again from the checkpoint PostgreSQL holds.
    async fn supervise(&mut self) {
        let ended: Vec<Tp> = self
            .tasks
            .iter()
            .filter(|(_, task)| task.handle.as_ref().is_some_and(JoinHandle::is_finished))
            .map(|(tp, _)| tp.clone())
            .collect();
        for tp in ended {
            let Some(task) = self.tasks.get_mut(&tp) else { continue };
            let Some(handle) = task.handle.take() else { continue };
            let why = match handle.await {
                Ok(()) => "it ended without being told to stop".to_owned(),
                Err(e) => e.to_string(),
            };
            task.progress.set_caught_up();
            let offset = task.progress.checkpoint.load(Ordering::SeqCst).max(0);
            let reason = format!(
                "the partition's task ended unexpectedly ({why}); this is a bug: report it. Restart the run to \
                 read on from the checkpoint PostgreSQL holds"
            );
            let halt =
                Halt { offset, timestamp: None, aggregate: "?".into(), reason, kind: HaltKind::Error, heals: false };
            let live = (!self.exclusive.sole_writer).then_some(&self.pool);
            crate::partition::report(self.name(), &tp, halt, (&self.stats, live), &self.consumer, None);
        }
    }

    /// Every owned partition reached the high watermark it had when assigned (halted ones
    /// count: they cannot move), and no assignment waits for its checkpoints.
    /// Says so, now and then, while the group assigns this runner no partition for longer
    /// than [`UNASSIGNED_WARN_AFTER`]: a group whose rebalance never completes (a dead
    /// member named leader, say) is otherwise silent.
    fn warn_while_unassigned(&mut self) {
        if !self.tasks.is_empty() || self.assigning.is_some() {
            self.unassigned_since = None;
            return;
        }
        let since = *self.unassigned_since.get_or_insert_with(Instant::now);
        if since.elapsed() >= UNASSIGNED_WARN_AFTER && self.unassigned_log.due() {
            let last_error = self.consumer.context().last_error().unwrap_or_else(|| "none reported".into());
            tracing::warn!(
                projection = %self.name(),
                group = %self.group,
                waited_s = since.elapsed().as_secs(),
                last_group_error = %last_error,
                "No partition assigned by the consumer group yet. Check that the topics exist, and the broker's \
                 group coordinator and its log, or run with another --group-id; a member of a group with more \
                 members than the topics have partitions stays idle by design."
            );
        }
    }

    /// Resumes the parked aggregates of the partitions not halted whose version each waits
    /// for was applied on another partition (what a live run's idle sweep does within
    /// seconds), until none is left, so that a one-shot run does not stop with an aggregate
    /// it could resume. A rebuild's shadow too: every partition's fold is written by then
    /// (see `Task::fold_due_at_idle`), and its batches parked what they read out of order,
    /// each partition knowing only its own parkings. `false` when PostgreSQL could not be
    /// asked (tried again on the next tick).
    async fn resumed_what_it_can(&self) -> bool {
        let halted = self.stats.halted.lock().expect("halted lock").clone();
        let live: Vec<&Tp> = self.tasks.keys().filter(|tp| !halted.contains(*tp)).collect();
        // A resumed aggregate may make another resumable (its events on two partitions).
        for _ in 0..MAX_RESUME_PASSES {
            let mut resumed = 0;
            for tp in &live {
                let (topic, partition) = (&tp.topic, tp.partition);
                let projection = self.projection.as_ref();
                match projectionist_postgres::park::resume_stale(&self.pool, projection, topic, partition).await {
                    Ok(n) => resumed += n,
                    Err(e) => {
                        tracing::warn!(
                            projection = %self.name(),
                            %topic,
                            partition,
                            error = %e,
                            "Cannot check the parked aggregates before stopping; trying again."
                        );
                        return false;
                    }
                }
            }
            if resumed == 0 {
                return true;
            }
            tracing::info!(projection = %self.name(), resumed, "Parked aggregates resumed before stopping.");
            self.stats.parking_changed.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        true
    }

    fn caught_up(&self) -> bool {
        self.assigning.is_none() && !self.tasks.is_empty() && self.tasks.values().all(|t| t.progress.is_caught_up())
    }

    /// Whether to stop now (`exit_when_caught_up`, every partition caught up or halted, and
    /// nothing parked that could be resumed); says so when it is.
    async fn stop_caught_up(&self) -> bool {
        if !self.config.exit_when_caught_up || !self.caught_up() || !self.resumed_what_it_can().await {
            return false;
        }
        match self.stats.partitions_halted() {
            0 => tracing::info!(projection = %self.name(), "Caught up with the high watermarks; stopping."),
            halted => tracing::warn!(
                projection = %self.name(),
                halted,
                "Every partition caught up with its high watermark or halted; stopping."
            ),
        }
        true
    }
}
