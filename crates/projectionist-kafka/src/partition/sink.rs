//! Where a prepared batch goes ([`Sink`], chosen once when the partition is built): written at
//! once in one transaction with its checkpoint (the live sink), or folded in memory and
//! written with its checkpoint once due (a rebuild's bulk load; the fold's own work is in
//! [`super::fold`]). The batch path and the task's loop ask the sink; neither tests which
//! one it is.

use std::sync::atomic::Ordering;
use std::time::Duration;

use projectionist_postgres::writer::{self, Batch, Committed};
use projectionist_postgres::{Folding, KnownVersions, Prepared};
use tokio::sync::Mutex;

use super::decode::At;
use super::fold::Reads;
use super::{Halt, HaltKind, Partition, Task};

/// Where a partition's prepared batches go.
pub(crate) enum Sink {
    /// Each batch written with its parking bounds and checkpoint in one transaction,
    /// committed, and told to the waits (`writer::commit_batch`); the versions its batches
    /// committed remembered, so that the next batch reads only those it does not know.
    Live(KnownVersions),
    /// A rebuild's bulk load (see [`Folding`]): batches folded in memory and written with the
    /// checkpoint past the last once due (at idle moments and at the end, see
    /// `Task::write_held`); a batch that cannot be folded is written as the live sink writes
    /// it, after what the fold holds, in the same transaction. Locked by the batch in flight
    /// and, between batches, by the task.
    Fold(Box<Mutex<Folding>>),
}

impl Sink {
    /// The sink of a rebuild's bulk load, folding into `folding`.
    pub(crate) fn fold(folding: Folding) -> Self {
        Self::Fold(Box::new(Mutex::new(folding)))
    }

    /// Whether it holds what is not yet written: a fold's rows, or no rows but the
    /// checkpoint past batches that changed none (duplicates, stale events), which is stored
    /// all the same (a fold locked by a batch in flight counts as holding). The live sink
    /// holds nothing.
    pub(super) fn holds(&self) -> bool {
        match self {
            Self::Live(_) => false,
            Self::Fold(folding) => folding.try_lock().map_or(true, |f| f.through().is_some()),
        }
    }

    /// Whether it keeps rows in memory between batches (a rebuild's fold).
    pub(super) fn holds_rows(&self) -> bool {
        matches!(self, Self::Fold(_))
    }

    /// Whether the partition looks for its stale parkings at idle moments (see
    /// `Partition::resume_stale`): not beside a fold, which keeps the versions and parkings
    /// it read in memory (writes of its own would move them under it).
    pub(super) fn sweeps_parking(&self) -> bool {
        matches!(self, Self::Live(_))
    }
}

impl Partition {
    /// Puts `prepared` (read at `at`) into the partition's sink with the checkpoint
    /// `next_offset`: written in one transaction with it (a gap ends the batch: the events
    /// before it commit with a checkpoint at its offset, and it is named), or folded.
    pub(super) async fn sink_batch(
        &self,
        prepared: &Prepared,
        at: &[At],
        next_offset: i64,
    ) -> projectionist_postgres::Result<Committed> {
        let Sink::Fold(folding) = &self.sink else {
            return self.commit(prepared, at, next_offset, None).await;
        };
        let mut folding = folding.lock().await;
        if let Some(written) = self.try_fold(prepared, at, next_offset, &mut folding).await? {
            return Ok(Committed { written, next_offset, gap: None });
        }
        // A batch that cannot be folded: written as usual, after what the fold holds.
        let committed = self.commit(prepared, at, next_offset, Some(&folding)).await?;
        folding.written(true);
        self.written_fold();
        self.analyze_if_due(&mut folding).await;
        Ok(committed)
    }

    /// Writes `prepared` with its checkpoint `next_offset` in one transaction, after what
    /// `folding` holds (a rebuild's fold, when the batch could not be folded into it), and
    /// commits it (see `writer::commit_batch`).
    async fn commit(
        &self,
        prepared: &Prepared,
        at: &[At],
        next_offset: i64,
        folding: Option<&Folding>,
    ) -> projectionist_postgres::Result<Committed> {
        let offsets: Vec<i64> = at.iter().map(|a| a.offset).collect();
        let batch = Batch {
            topic: &self.tp.topic,
            partition: self.tp.partition,
            expected: self.expected_checkpoint(),
            next_offset,
            offsets: &offsets,
            on_gap: self.settings.on_gap,
            bounds: self.settings.bounds,
            folding,
            known: match &self.sink {
                Sink::Live(known) => Some(known),
                Sink::Fold(_) => None,
            },
        };
        let committed = writer::commit_batch(&self.pool, self.projection.as_ref(), prepared, batch).await?;
        self.stored(committed.next_offset);
        Ok(committed)
    }

    /// Writes what the sink holds with its checkpoint (see [`Sink::holds`]); nothing when it
    /// holds nothing. `reads`: whether this partition goes on reading its tables after it.
    pub(super) async fn write_held(&self, reads: Reads) -> projectionist_postgres::Result<()> {
        match &self.sink {
            Sink::Live(_) => Ok(()),
            Sink::Fold(folding) => self.flush(&mut *folding.lock().await, reads).await,
        }
    }
}

impl Task {
    /// At an idle moment, writes what the sink holds when it is due then (see
    /// `Task::fold_due_at_idle`); `false` when it was due and could not be written now.
    pub(super) async fn write_held_if_due(&mut self) -> bool {
        if !self.partition.sink.holds() {
            return true;
        }
        match self.fold_due_at_idle().await {
            Some(reads) => self.write_held(reads).await,
            None => true,
        }
    }

    /// Writes what the sink holds; `false` when it could not be written now (waited out on
    /// the next turn when PostgreSQL is away; otherwise the partition halts).
    pub(super) async fn write_held(&mut self, reads: Reads) -> bool {
        let Err(e) = self.partition.write_held(reads).await else { return true };
        let (topic, partition) = (&self.partition.tp.topic, self.partition.tp.partition);
        // A row count the fold's plan did not expect is no passing failure: another partition
        // wrote the rows it meant to create (an aggregate's events on two partitions). Halted,
        // the rebuild goes on batch by batch, which plans against the rows as they are.
        let conflict = matches!(e, projectionist_postgres::Error::Conflict { .. });
        if !conflict && crate::retry::Retry::of(&e) != crate::retry::Retry::Never {
            let message = "Could not write the rebuild's folded rows; trying again.";
            tracing::warn!(projection = %self.name(), %topic, partition, error = %e, "{message}");
            tokio::time::sleep(Duration::from_millis(500)).await;
            return false;
        }
        let offset = self.partition.progress.checkpoint.load(Ordering::SeqCst).max(0);
        let reason = format!("the rows folded by the rebuild's bulk load were refused: {e}");
        self.halt(Halt { offset, timestamp: None, aggregate: "?".into(), reason, kind: HaltKind::Error, heals: false });
        false
    }
}
