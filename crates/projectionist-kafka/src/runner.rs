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

use projectionist_postgres::{Folding, PgPool, SharedProjection};
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaErrorCode::InconsistentGroupProtocol;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::batcher::Limits;
use crate::context::{EngineContext, Rebalance};
use crate::outage::{Outage, Throttle};
use crate::partition::{Begin, Halt, HaltKind, Order, Partition, Progress};
use crate::retry::Retry;
use crate::stats::Stats;
use crate::tp::Tp;
use crate::{EngineConfig, Result};
use projectionist_postgres::checkpoint;

/// How long a runner may hold no partition before it says so.
const UNASSIGNED_WARN_AFTER: Duration = Duration::from_secs(30);
/// How often it says so again while that lasts.
const UNASSIGNED_LOG_EVERY: Duration = Duration::from_secs(60);

/// A running partition task.
struct Task {
    stop: watch::Sender<Order>,
    handle: JoinHandle<()>,
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
}

/// Where an assigned partition starts reading.
enum StartAt {
    /// At its checkpoint: the next offset to apply.
    Checkpoint(i64),
    /// At its earliest offset: no checkpoint yet, or a replay.
    Beginning,
    /// Nowhere: its checkpoint cannot be read (why); it halts.
    Unreadable(String),
}

impl StartAt {
    fn offset(&self) -> Offset {
        match self {
            Self::Checkpoint(next) => Offset::Offset(*next),
            Self::Beginning | Self::Unreadable(_) => Offset::Beginning,
        }
    }

    fn checkpoint(&self) -> Option<i64> {
        match self {
            Self::Checkpoint(next) => Some(*next),
            Self::Beginning | Self::Unreadable(_) => None,
        }
    }
}

/// An assignment waiting for its partitions' checkpoints.
struct Assigning {
    parts: Vec<Tp>,
    read: JoinHandle<std::result::Result<HashMap<Tp, i64>, String>>,
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
        }
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
                received = self.consumer.recv() => match received {
                    Ok(message) => {
                        let tp = Tp::new(message.topic(), message.partition());
                        let offset = message.offset();
                        drop(message);
                        self.stray(tp, offset).await;
                    }
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
                },
                () = self.caught_up_told.notified(), if self.config.exit_when_caught_up => {
                    if self.stop_caught_up() {
                        break;
                    }
                }
                _ = tick.tick() => {
                    self.warn_while_unassigned();
                    if self.stop_caught_up() {
                        break;
                    }
                }
            }
        }
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
        Ok(())
    }

    /// Starts reading the new partitions' checkpoints, in a task of its own, which
    /// [`Runner::assign`] takes up once it ends.
    ///
    /// Why not read them here: this loop is what polls the consumer, and a PostgreSQL
    /// outage is waited out for as long as it lasts. Blocked here, the consumer would go
    /// unpolled past `max.poll.interval.ms` and leave its group. Why not let each partition
    /// task read its own checkpoint: a partition is assigned at its start offset, which is
    /// the checkpoint; assigning first and seeking later would fetch from a guessed offset
    /// (Kafka's committed copy may be ahead of PostgreSQL's after a reset). So the group's
    /// assignment waits, unanswered, for the read, while the consumer keeps being polled
    /// and rebalances and shutdowns are still served (they drop the read); librdkafka keeps
    /// heartbeating meanwhile (join state `WAIT_ASSIGN_CALL`), so the member stays in its
    /// group however long PostgreSQL takes.
    async fn begin_assign(&mut self, parts: Vec<Tp>) {
        // A partition assigned again in the same process waits for its previous task.
        let again: Vec<Tp> = parts.iter().filter(|tp| self.tasks.contains_key(*tp)).cloned().collect();
        self.stop(&again, Order::Revoke).await;
        let mut parts = parts;
        if let Some(earlier) = self.assigning.take() {
            // librdkafka should wait for the first to be answered; should it not, read both.
            earlier.read.abort();
            let missing: Vec<Tp> = earlier.parts.into_iter().filter(|tp| !parts.contains(tp)).collect();
            parts.extend(missing);
        }
        let (pool, name, retry, stats) =
            (self.pool.clone(), self.name().to_owned(), self.config.retry_policy(), self.stats.clone());
        let to_read = parts.clone();
        let span = tracing::info_span!("checkpoints", projection = %name, partitions = to_read.len());
        let read = async move {
            let mut outage = Outage::new(stats, &name);
            let read = retry
                .run(
                    || async {
                        let parts: Vec<(String, i32)> =
                            to_read.iter().map(|tp| (tp.topic.clone(), tp.partition)).collect();
                        let read = checkpoint::read(&pool, &name, &parts).await?;
                        Ok::<_, projectionist_postgres::Error>(
                            read.into_iter().map(|((t, p), o)| (Tp::new(t, p), o)).collect(),
                        )
                    },
                    Retry::of,
                    |e, retrying| {
                        if retrying.kind == Retry::WaitOut {
                            outage.failed(e, retrying);
                        } else {
                            tracing::warn!(
                                error = %e,
                                attempt = retrying.attempt,
                                delay_ms = retrying.delay.as_millis() as u64,
                                "Cannot read checkpoints; trying again."
                            );
                        }
                    },
                )
                .await;
            if read.is_ok() {
                outage.over();
            }
            read.map_err(|e| e.to_string())
        };
        let read = tokio::spawn(read.instrument(span));
        self.assigning = Some(Assigning { parts, read });
    }

    /// Splits the new partitions' queues off the consumer's, assigns them at their
    /// checkpoints (`stored`, or why they could not be read) and starts a task for each.
    async fn assign(&mut self, parts: Vec<Tp>, stored: std::result::Result<HashMap<Tp, i64>, String>) {
        let name = self.name().to_owned();
        let mut tpl = TopicPartitionList::new();
        let mut queues = Vec::new();
        for tp in &parts {
            let start = match &stored {
                _ if self.config.from_beginning && self.replayed.insert(tp.clone()) => StartAt::Beginning,
                Ok(found) => found.get(tp).map_or(StartAt::Beginning, |next| StartAt::Checkpoint(*next)),
                Err(e) => StartAt::Unreadable(format!("cannot read its checkpoint from PostgreSQL: {e}")),
            };
            if let Err(e) = tpl.add_partition_offset(&tp.topic, tp.partition, start.offset()) {
                tracing::error!(
                    projection = %name,
                    topic = %tp.topic,
                    partition = tp.partition,
                    error = %e,
                    "Cannot set start offset."
                );
            }
            // Split before assigning: librdkafka then never forwards this partition's
            // messages to the consumer's own queue.
            let queue = self.consumer.split_partition_queue(&tp.topic, tp.partition);
            queues.push((tp.clone(), start, queue));
        }
        let consumer = self.consumer.clone();
        match tokio::task::spawn_blocking(move || crate::context::assign(consumer.as_ref(), &tpl)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(projection = %name, error = %e, "Assigning partitions failed."),
            Err(e) => tracing::error!(projection = %name, error = %e, "Assigning partitions failed."),
        }
        let limits = Limits {
            max_events: self.config.batch_max_events.max(1),
            max_bytes: self.config.batch_max_bytes.max(1),
            max_wait: self.config.batch_max_wait(),
        };
        for (tp, start, queue) in queues {
            let begin = if self.stats.halted.lock().expect("halted lock").contains(&tp) {
                tracing::warn!(
                    projection = %name,
                    topic = %tp.topic,
                    partition = tp.partition,
                    "Partition assigned again, but it halted in this process: it stays halted until restarted."
                );
                Begin::Halted
            } else {
                match &start {
                    StartAt::Unreadable(reason) => Begin::Halt(Halt {
                        offset: -1,
                        timestamp: None,
                        aggregate: "?".into(),
                        reason: reason.clone(),
                        kind: HaltKind::Error,
                    }),
                    StartAt::Checkpoint(_) | StartAt::Beginning => Begin::Run,
                }
            };
            tracing::info!(
                projection = %name,
                topic = %tp.topic,
                partition = tp.partition,
                start = ?start.checkpoint(),
                "Partition assigned."
            );
            let Some(queue) = queue else {
                tracing::error!(
                    projection = %name,
                    topic = %tp.topic,
                    partition = tp.partition,
                    "Cannot split the partition's queue off the consumer."
                );
                continue;
            };
            // What the first checkpoint stored must find: the one read, also when a replay
            // starts from the beginning past it.
            let read = stored.as_ref().ok().and_then(|found| found.get(&tp).copied());
            let progress = Arc::new(Progress::new(start.checkpoint(), read, self.caught_up_told.clone()));
            let partition = Partition {
                tp: tp.clone(),
                projection: self.projection.clone(),
                pool: self.pool.clone(),
                consumer: self.consumer.clone(),
                stats: self.stats.clone(),
                limits,
                retry: self.config.retry_policy(),
                exit_when_caught_up: self.config.exit_when_caught_up,
                on_gap: self.config.on_gap,
                on_poison: self.config.on_poison,
                dead_letter_topic: self.dead_letter_topic.clone(),
                checked: self.checked.clone(),
                sole_writer: self.config.sole_writer,
                // Read from its start with no checkpoint, as a rebuild's shadow first is: its
                // tables hold nothing of the partition (checkpoints commit with the rows).
                folding: self.config.fold.then(|| {
                    let fresh = self.config.sole_writer && read.is_none();
                    let folding = if fresh { Folding::from_nothing() } else { Folding::default() };
                    folding.into()
                }),
                max_event_bytes: self.config.max_event_bytes,
                bounds: projectionist_postgres::park::Bounds {
                    parked_aggregates: self.config.max_parked_aggregates,
                    held_per_aggregate: self.config.max_held_per_aggregate,
                },
                progress: progress.clone(),
            };
            let (stop, stopped) = watch::channel(Order::Run);
            let handle = tokio::spawn(partition.run(queue, stopped, begin));
            self.tasks.insert(tp.clone(), Task { stop, handle, progress: progress.clone() });
            self.consumer.context().owned.lock().expect("owned lock").insert(tp, progress);
        }
        let owned = self.tasks.len() as u32;
        let max = self.pool.options().get_max_connections();
        if owned >= max {
            tracing::warn!(
                projection = %name,
                partitions = owned,
                pool = max,
                "Fewer PostgreSQL connections than partitions owned: batches will wait for connections (raise \
                --pg-max-connections)."
            );
        }
        self.joined.store(true, Ordering::SeqCst);
    }

    /// Stops the revoked partitions' tasks (each finishes its batch in flight, so the next
    /// owner starts from the latest checkpoint), then completes the revocation.
    async fn revoke(&mut self, parts: Vec<Tp>) {
        if let Some(assigning) = &mut self.assigning {
            assigning.parts.retain(|tp| !parts.contains(tp));
            if assigning.parts.is_empty() {
                self.assigning.take().expect("assigning").read.abort();
            }
        }
        self.stop(&parts, Order::Revoke).await;
        for Tp { topic, partition } in &parts {
            tracing::info!(projection = %self.name(), topic = %topic, partition, "Partition revoked.");
        }
        self.joined.store(!self.tasks.is_empty(), Ordering::SeqCst);
        let consumer = self.consumer.clone();
        if let Err(e) = tokio::task::spawn_blocking(move || crate::context::unassign(consumer.as_ref(), &parts)).await {
            tracing::error!(projection = %self.name(), error = %e, "Unassigning partitions failed.");
        }
    }

    /// Stops the tasks of `parts` and waits for them; returns each one's checkpoint (the
    /// next offset to apply), where it has one.
    async fn stop(&mut self, parts: &[Tp], how: Order) -> Vec<(Tp, i64)> {
        let mut stopping = Vec::new();
        for tp in parts {
            if let Some(task) = self.tasks.remove(tp) {
                let _ = task.stop.send(how);
                stopping.push((tp.clone(), task));
            }
            self.consumer.context().owned.lock().expect("owned lock").remove(tp);
        }
        let mut checkpoints = Vec::new();
        for (tp, task) in stopping {
            if let Err(e) = task.handle.await {
                tracing::error!(
                    projection = %self.name(),
                    topic = %tp.topic,
                    partition = tp.partition,
                    error = %e,
                    "Partition task failed."
                );
            }
            let next = task.progress.checkpoint.load(Ordering::SeqCst);
            if next >= 0 {
                checkpoints.push((tp, next));
            }
        }
        checkpoints
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
        let halt = Halt { offset: at, timestamp: None, aggregate: "?".into(), reason, kind: HaltKind::Error };
        crate::partition::report(self.name(), &tp, halt, &self.stats, &self.consumer);
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

    fn caught_up(&self) -> bool {
        self.assigning.is_none() && !self.tasks.is_empty() && self.tasks.values().all(|t| t.progress.is_caught_up())
    }

    /// Whether to stop now (`exit_when_caught_up`, and every partition caught up or
    /// halted); says so when it is.
    fn stop_caught_up(&self) -> bool {
        if !self.config.exit_when_caught_up || !self.caught_up() {
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

/// The partitions and checkpoints of the assignment being read, once read (never, when
/// there is none).
async fn checkpoints_read(
    assigning: &mut Option<Assigning>,
) -> (Vec<Tp>, std::result::Result<HashMap<Tp, i64>, String>) {
    let Some(a) = assigning else { return std::future::pending().await };
    let read = match (&mut a.read).await {
        Ok(read) => read,
        Err(e) => Err(format!("the checkpoint read failed: {e}")),
    };
    let parts = assigning.take().map(|a| a.parts).unwrap_or_default();
    (parts, read)
}
