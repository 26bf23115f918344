//! The fold sink's work (see [`super::sink`]), a rebuild's bulk load: batches folded in
//! memory instead of written (see [`projectionist_postgres::Folding`]), and what the fold
//! holds written with its checkpoint once due, at idle moments and at the end.

use projectionist_postgres::{folding, Prepared, Written};

use super::decode::At;
use super::{Partition, Task};

/// Whether a partition goes on reading its tables after writing what a rebuild folded: then
/// their statistics are read again once they have grown enough (see
/// [`projectionist_postgres::Folding::statistics_due`]); at the end of its reading, they are
/// left to the rebuild, which reads them once before its swap.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Reads {
    Follow,
    End,
}

impl Partition {
    /// Folds `prepared` (read up to `at`, its checkpoint `next_offset`) into `folding`,
    /// writing what it holds once due: what it did, or `None` when the batch cannot be
    /// folded (the sink writes it as usual, after what the fold holds: see
    /// `Partition::sink_batch`).
    pub(super) async fn try_fold(
        &self,
        prepared: &Prepared,
        at: &[At],
        next_offset: i64,
        folding: &mut projectionist_postgres::Folding,
    ) -> projectionist_postgres::Result<Option<Written>> {
        let mut conn = self.pool.acquire().await?;
        let Some(written) = folding::fold(&mut conn, self.projection.as_ref(), prepared, folding).await? else {
            return Ok(None);
        };
        drop(conn);
        folding.folded_through(next_offset);
        self.folded(at.first().map_or(next_offset, |a| a.offset), next_offset);
        if folding.due() {
            self.flush(folding, Reads::Follow).await?;
        }
        Ok(Some(written))
    }

    /// Writes what `folding` holds with the checkpoint past the last batch folded, in one
    /// transaction, then forgets it; nothing when it holds nothing.
    pub(super) async fn flush(
        &self,
        folding: &mut projectionist_postgres::Folding,
        reads: Reads,
    ) -> projectionist_postgres::Result<()> {
        let Some(through) = folding.through() else { return Ok(()) };
        let mut conn = self.pool.acquire().await?;
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        folding::write_folded(&mut tx, self.projection.as_ref(), folding, None).await?;
        self.store_checkpoint(&mut tx, through).await?;
        tx.commit().await?;
        self.stored(through);
        // What the fold wrote is not told: the waits read what it passed themselves.
        self.notify_checkpoint(&mut conn, through, None).await;
        drop(conn);
        folding.written(false);
        self.written_fold();
        if reads == Reads::Follow {
            self.analyze_if_due(folding).await;
        }
        Ok(())
    }

    /// Reads the statistics of the tables a fold fills again once they have grown enough
    /// (see [`projectionist_postgres::Folding::statistics_due`]); a failure is only logged.
    pub(super) async fn analyze_if_due(&self, folding: &mut projectionist_postgres::Folding) {
        if !folding.statistics_due() {
            return;
        }
        let analyzed = match self.pool.acquire().await {
            Ok(mut conn) => projectionist_postgres::analyze(&mut conn, self.projection.as_ref()).await,
            Err(e) => Err(e.into()),
        };
        if let Err(e) = analyzed {
            tracing::warn!(projection = %self.name(), error = %e, "Could not analyze the tables the rebuild fills.");
        }
    }
}

impl Task {
    /// Whether what the fold holds is written at this idle moment, and whether reads of its
    /// tables follow: once the partition has read up to the high watermark it stops at
    /// (`exit_when_caught_up`; the end of its reading), or has been quiet for
    /// [`MARKERS_AFTER`](super::progress::MARKERS_AFTER) since its last batch (a stream that
    /// keeps growing). A queue drained while the next fetch is on its way is neither: rows
    /// written then would be written again by the batches that follow.
    pub(super) async fn fold_due_at_idle(&mut self) -> Option<Reads> {
        if self.partition.settings.exit_when_caught_up {
            let high = self.partition.high_watermark(&mut self.target).await;
            if high.is_some_and(|high| self.partition.position().is_some_and(|p| p >= high)) {
                return Some(Reads::End);
            }
        }
        self.markers.quiet().then_some(Reads::Follow)
    }
}
