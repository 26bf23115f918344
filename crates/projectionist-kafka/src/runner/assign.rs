//! A rebalance, the runner's side: an assignment's checkpoints read in a task of their own,
//! its partitions started at them (one task each), and a revocation's tasks stopped.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use projectionist_postgres::{checkpoint, Folding, KnownVersions};
use rdkafka::consumer::Consumer;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::Instrument;

use super::{Runner, Task};
use crate::batcher::Limits;
use crate::outage::Outage;
use crate::partition::{Begin, Halt, HaltKind, Order, Partition, Progress, Settings, Sink};
use crate::retry::Retry;
use crate::tp::Tp;

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
pub(super) struct Assigning {
    pub(super) parts: Vec<Tp>,
    pub(super) read: JoinHandle<std::result::Result<HashMap<Tp, i64>, String>>,
}

impl Runner {
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
    pub(super) async fn begin_assign(&mut self, parts: Vec<Tp>) {
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
                    |e| Retry::in_pool(e, &pool),
                    |e, retrying| {
                        if retrying.kind == Retry::Queue {
                            outage.queued(pool.options().get_max_connections(), retrying);
                        } else if retrying.kind == Retry::WaitOut {
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
    pub(super) async fn assign(&mut self, parts: Vec<Tp>, stored: std::result::Result<HashMap<Tp, i64>, String>) {
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
        if !self.exclusive.sole_writer {
            // Halts recorded for `status` of these partitions are over: they start again.
            let mut by_topic: HashMap<&str, Vec<i32>> = HashMap::new();
            for (tp, _, _) in &queues {
                by_topic.entry(tp.topic.as_str()).or_default().push(tp.partition);
            }
            for (topic, partitions) in by_topic {
                crate::partition::forget(&self.pool, &name, topic, partitions);
            }
        }
        let limits = Limits {
            max_events: self.config.batch_max_events.max(1),
            max_bytes: self.config.batch_max_bytes.max(1),
            max_wait: self.config.batch_max_wait(),
        };
        for (tp, start, queue) in queues {
            let begin = self.begin(&tp, &start);
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
            let partition = self.partition(&tp, limits, read, progress.clone());
            let (stop, stopped) = watch::channel(Order::Run);
            let handle = tokio::spawn(partition.run(queue, stopped, begin));
            self.tasks.insert(tp.clone(), Task { stop, handle: Some(handle), progress: progress.clone() });
            self.consumer.context().owned.lock().expect("owned lock").insert(tp, progress);
        }
        let owned = self.tasks.len() as u32;
        let max = self.pool.options().get_max_connections();
        if owned > max {
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

    /// How the task of `tp`, to start at `start`, begins: halted already in this process,
    /// halting at once (its checkpoint cannot be read), or running.
    fn begin(&self, tp: &Tp, start: &StartAt) -> Begin {
        if self.stats.halted.lock().expect("halted lock").contains(tp) {
            tracing::warn!(
                projection = %self.name(),
                topic = %tp.topic,
                partition = tp.partition,
                "Partition assigned again, but it halted in this process: it stays halted until restarted."
            );
            return Begin::Halted;
        }
        match start {
            StartAt::Unreadable(reason) => Begin::Halt(Halt {
                offset: -1,
                timestamp: None,
                aggregate: "?".into(),
                reason: reason.clone(),
                kind: HaltKind::Error,
                heals: false,
            }),
            StartAt::Checkpoint(_) | StartAt::Beginning => Begin::Run,
        }
    }

    /// The task of `tp`: this runner's settings and handles, its checkpoint as `read`
    /// (`None`: none stored) and its `progress`.
    fn partition(&self, tp: &Tp, limits: Limits, read: Option<i64>, progress: Arc<Progress>) -> Partition {
        Partition {
            tp: tp.clone(),
            projection: self.projection.clone(),
            pool: self.pool.clone(),
            consumer: self.consumer.clone(),
            stats: self.stats.clone(),
            tally: self.stats.tally(tp),
            sink: self.sink(read),
            dead_letter_topic: self.dead_letter_topic.clone(),
            checked: self.checked.clone(),
            limits,
            settings: Settings {
                retry: self.config.retry_policy(),
                exit_when_caught_up: self.config.exit_when_caught_up,
                heal: (self.config.halt_retry_max_delay_ms > 0)
                    .then(|| std::time::Duration::from_millis(self.config.halt_retry_max_delay_ms)),
                on_gap: self.config.on_gap,
                on_poison: self.config.on_poison,
                sole_writer: self.exclusive.sole_writer,
                max_event_bytes: self.config.max_event_bytes,
                bounds: self.config.bounds(),
                group: self.config.group_for(self.projection.name()).into(),
                scope: self.scope.clone(),
            },
            progress,
            reader: self.projection.formats().reader(&tp.topic),
        }
    }

    /// Where the batches of a partition whose checkpoint is `read` go: a rebuild's fold
    /// ([`Exclusive::fold`](crate::Exclusive::fold)), else written at once.
    fn sink(&self, read: Option<i64>) -> Sink {
        if !self.exclusive.fold {
            return Sink::Live(KnownVersions::new());
        }
        // Read from its start with no checkpoint, as a rebuild's shadow first is: its
        // tables hold nothing of the partition (checkpoints commit with the rows).
        let fresh = self.exclusive.sole_writer && read.is_none();
        Sink::fold(if fresh { Folding::from_nothing() } else { Folding::default() })
    }

    /// Stops the revoked partitions' tasks (each finishes its batch in flight, so the next
    /// owner starts from the latest checkpoint), then completes the revocation.
    pub(super) async fn revoke(&mut self, parts: Vec<Tp>) {
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
    pub(super) async fn stop(&mut self, parts: &[Tp], how: Order) -> Vec<(Tp, i64)> {
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
            // A task that ended on its own was awaited and reported already.
            let ended = match task.handle {
                Some(handle) => handle.await.err(),
                None => None,
            };
            if let Some(e) = ended {
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
}

/// The partitions and checkpoints of the assignment being read, once read (never, when
/// there is none).
pub(super) async fn checkpoints_read(
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
