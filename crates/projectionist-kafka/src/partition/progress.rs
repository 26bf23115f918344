//! A partition's progress: its checkpoint as the runner and the lag metrics see it, stored
//! only where it still stands and told to the waits, the Kafka copy of each commit, the
//! checkpoint moved past transaction markers at idle moments, and whether it caught up.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use projectionist_postgres::checkpoint::Passed;
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use super::Partition;
use crate::outage::{Throttle, LOG_EVERY};
use crate::tp::Tp;

impl Partition {
    /// The consumer's position in this partition: the next offset to read, past the
    /// transaction markers (and, on brokers that filter them, aborted records) read so far.
    /// Only this task reads the partition's queue, so with nothing buffered or in flight
    /// every message before it is applied.
    pub(super) fn position(&self) -> Option<i64> {
        let positions = self.consumer.position().ok()?;
        match positions.find_partition(&self.tp.topic, self.tp.partition).map(|e| e.offset()) {
            Some(Offset::Offset(o)) => Some(o),
            _ => None,
        }
    }

    /// Stores the checkpoint `next_offset` in `tx`, where it still stands where this process
    /// last read or stored it: else `Error::CheckpointMoved` (a rebuild's swap or rollback,
    /// `run --reset`, another process moved it), and the partition reads on from there
    /// instead of writing past it. Once `tx` commits, [`Partition::stored`] says so. Returns
    /// the checkpoint replaced (`None`: none was stored).
    pub(super) async fn store_checkpoint(
        &self,
        tx: &mut projectionist_postgres::PgConnection,
        next_offset: i64,
    ) -> projectionist_postgres::Result<Option<i64>> {
        let (name, topic, partition) = (self.projection.name(), &self.tp.topic, self.tp.partition);
        let expected = self.expected_checkpoint();
        projectionist_postgres::checkpoint::store(tx, name, topic, partition, expected, next_offset).await?;
        Ok(expected)
    }

    /// The checkpoint this process last read or stored (`None`: none is stored).
    pub(super) fn expected_checkpoint(&self) -> Option<i64> {
        Some(self.progress.stored.load(Ordering::SeqCst)).filter(|s| *s >= 0)
    }

    /// The checkpoint `next_offset` stored by this process is committed.
    pub(super) fn stored(&self, next_offset: i64) {
        self.progress.stored.store(next_offset, Ordering::SeqCst);
    }

    /// Tells the waits for the read model that the checkpoint `next_offset` committed (see
    /// [`projectionist_postgres::checkpoint::notify`]). A failure is only logged: what it
    /// tells is committed, and the waits read the checkpoints again within a second.
    /// `passed`: what the checkpoint passed, where known, so that the waits need not ask.
    pub(super) async fn notify_checkpoint(
        &self,
        conn: &mut projectionist_postgres::PgConnection,
        next_offset: i64,
        passed: Option<Passed<'_>>,
    ) {
        let (name, topic, partition) = (self.projection.name(), &self.tp.topic, self.tp.partition);
        let notified = projectionist_postgres::checkpoint::notify(conn, name, topic, partition, next_offset, passed);
        if let Err(e) = notified.await {
            let message = "Could not notify the waits of a checkpoint; they read it again within a second.";
            tracing::debug!(projection = %name, %topic, partition, error = %e, "{message}");
        }
    }

    /// With everything read applied, moves the checkpoint (and the Kafka offset) past what
    /// followed the last applied message without being one: a transaction's commit marker
    /// takes an offset of its own, so without this a caught-up projection would show lag.
    /// Done once the partition has been idle for [`MARKERS_AFTER`] since its last batch. A
    /// failure (PostgreSQL away, say) is tried again at a later idle moment, after a
    /// growing delay, and logged when it begins and then at most every [`LOG_EVERY`].
    /// `Err` with the checkpoint stored when it moved under this process (see
    /// [`Partition::store_checkpoint`]).
    pub(super) async fn checkpoint_past_markers(&self, retry: &mut MarkerRetry) -> Result<(), Option<i64>> {
        let Some(position) = self.position() else { return Ok(()) };
        if position <= self.progress.checkpoint.load(Ordering::SeqCst) {
            return Ok(());
        }
        let now = Instant::now();
        if retry.not_before.is_some_and(|t| now < t) || !retry.quiet() {
            return Ok(());
        }
        let stored = async {
            let mut conn = self.pool.acquire().await?;
            // Past transaction markers only: nothing in the range is kept out.
            let from = self.store_checkpoint(&mut conn, position).await?;
            let passed = from.map(|from| Passed { from, kept_out: &[] });
            self.notify_checkpoint(&mut conn, position, passed).await;
            Ok::<_, projectionist_postgres::Error>(())
        };
        match stored.await {
            Err(projectionist_postgres::Error::CheckpointMoved { stored, .. }) => return Err(stored),
            Ok(()) => {
                tracing::debug!(
                    projection = %self.name(),
                    topic = %self.tp.topic,
                    partition = self.tp.partition,
                    position,
                    "Checkpoint moved past transaction markers."
                );
                *retry = MarkerRetry::new();
                // What the next batch's checkpoint must find (else it reads on from here).
                self.stored(position);
                self.advance(position, position);
            }
            Err(e) => {
                let delay = self.settings.retry.wait_delay(retry.failures);
                retry.failures += 1;
                retry.not_before = Some(Instant::now() + delay);
                if retry.log.due() {
                    tracing::warn!(
                        projection = %self.name(),
                        topic = %self.tp.topic,
                        partition = self.tp.partition,
                        failures = retry.failures,
                        error = %e,
                        "Cannot move the checkpoint past transaction markers; trying again later."
                    )
                }
            }
        }
        Ok(())
    }

    /// Whether this partition reached the high watermark it had when first checked; the
    /// watermark query runs off the async runtime (it blocks).
    pub(super) async fn check_caught_up(&self, target: &mut Option<i64>, halted: bool) {
        if self.progress.is_caught_up() {
            return;
        }
        if halted {
            self.progress.set_caught_up();
            return;
        }
        let Some(target) = self.high_watermark(target).await else { return };
        // The checkpoint, not the position: at an idle moment it is moved past the markers
        // read, so it reaches the watermark exactly when everything before it is applied.
        if target == 0 || self.progress.checkpoint.load(Ordering::SeqCst) >= target {
            self.progress.set_caught_up();
        }
    }

    /// The high watermark this partition stops at (`exit_when_caught_up`): `target`, read
    /// when first asked for (off the async runtime: the query blocks); `None` while it
    /// cannot be read.
    pub(super) async fn high_watermark(&self, target: &mut Option<i64>) -> Option<i64> {
        if target.is_none() {
            let (consumer, Tp { topic, partition }) = (self.consumer.clone(), self.tp.clone());
            let high = tokio::task::spawn_blocking(move || {
                consumer.fetch_watermarks(&topic, partition, Duration::from_secs(5)).map(|(_, high)| high)
            })
            .await;
            match high {
                Ok(Ok(high)) => *target = Some(high),
                Ok(Err(e)) => {
                    let (topic, partition) = (&self.tp.topic, self.tp.partition);
                    tracing::warn!(%topic, partition, error = %e, "Cannot read the high watermark; trying again.")
                }
                Err(e) => tracing::warn!(error = %e, "Watermark query failed."),
            }
        }
        *target
    }

    /// The batch starting at `first` was folded, through `next`: its offsets count as read
    /// until the fold is written ([`Partition::written_fold`]).
    pub(super) fn folded(&self, first: i64, next: i64) {
        let offsets = moved(self.progress.checkpoint.load(Ordering::SeqCst), first, next);
        self.progress.folded.fetch_add(offsets, Ordering::Relaxed);
        self.stats.folded.fetch_add(offsets, Ordering::Relaxed);
    }

    /// What was folded is written, with its checkpoint: no longer counted as folded.
    pub(super) fn written_fold(&self) {
        let offsets = self.progress.folded.swap(0, Ordering::Relaxed);
        self.stats.folded.fetch_sub(offsets, Ordering::Relaxed);
    }

    /// The checkpoint moved to `next` (from the batch starting at `first`, when it is the
    /// first since the partition started without one): progress, then Kafka's copy.
    pub(super) fn advance(&self, first: i64, next: i64) {
        let previous = self.progress.checkpoint.swap(next, Ordering::SeqCst);
        self.stats.advanced.fetch_add(moved(previous, first, next), Ordering::Relaxed);
        self.commit_kafka(next);
    }

    fn commit_kafka(&self, next_offset: i64) {
        let mut tpl = TopicPartitionList::new();
        if tpl.add_partition_offset(&self.tp.topic, self.tp.partition, Offset::Offset(next_offset)).is_ok() {
            if let Err(e) = self.consumer.commit(&tpl, CommitMode::Async) {
                // Postgres holds the position; Kafka's copy only serves lag tools.
                tracing::warn!(
                    topic = %self.tp.topic,
                    partition = self.tp.partition,
                    error = %e,
                    "Kafka offset commit failed."
                );
            }
        }
    }
}

/// How often an idle partition checks its parked aggregates for a parking gone stale (see
/// [`Partition::resume_stale`]).
pub(super) const SWEEP_EVERY: Duration = Duration::from_secs(5);

impl Partition {
    /// Resumes the aggregates this partition parked whose awaited version was applied on
    /// another partition since (see `projectionist_postgres::park::resume_stale`): without
    /// it, an aggregate with no later event on this partition would stay parked. A failure
    /// is logged and tried again at the next sweep.
    pub(super) async fn resume_stale(&self) {
        let (name, topic, partition) = (self.projection.name(), &self.tp.topic, self.tp.partition);
        match projectionist_postgres::park::resume_stale(&self.pool, self.projection.as_ref(), topic, partition).await {
            Ok(0) => {}
            Ok(resumed) => tracing::info!(
                projection = %name,
                %topic,
                partition,
                resumed,
                "Parked aggregates resumed: the version each waited for was applied on another partition."
            ),
            Err(e) => tracing::warn!(
                projection = %name,
                %topic,
                partition,
                error = %e,
                "Cannot check the parked aggregates for versions applied elsewhere; trying again later."
            ),
        }
    }
}

/// Offsets from the `checkpoint` (−1: none yet, then from the batch's `first`) to `next`.
fn moved(checkpoint: i64, first: i64, next: i64) -> u64 {
    let from = if checkpoint >= 0 { checkpoint } else { first };
    (next - from).max(0) as u64
}

/// When a partition's checkpoint moves past transaction markers: once idle a while, and after
/// a failure, again after a growing delay.
pub(super) struct MarkerRetry {
    failures: u32,
    not_before: Option<Instant>,
    /// Not before the partition has been idle for [`MARKERS_AFTER`] since its last batch.
    quiet_until: Option<Instant>,
    log: Throttle,
}

/// How long a partition stays idle after a batch before its checkpoint moves past
/// transaction markers alone. While events keep coming, the next batch's checkpoint takes
/// it past them anyway; moving it at once adds a transaction of its own after many of the
/// batches at the head (about one commit in eight at 10k/s in the bench), holding the next
/// batch back meanwhile.
pub(super) const MARKERS_AFTER: Duration = Duration::from_millis(100);

impl MarkerRetry {
    pub(super) fn new() -> Self {
        Self { failures: 0, not_before: None, quiet_until: None, log: Throttle::new(LOG_EVERY) }
    }

    /// A batch committed now: the markers wait for the partition to be idle a while.
    pub(super) fn batch_committed(&mut self) {
        self.quiet_until = Some(Instant::now() + MARKERS_AFTER);
    }

    /// Whether [`MARKERS_AFTER`] has passed since the last batch committed (or none has).
    pub(super) fn quiet(&self) -> bool {
        self.quiet_until.is_none_or(|t| Instant::now() >= t)
    }
}
