//! A rebuild's bulk load: batches folded in memory ([`fold`]) and written together with the
//! checkpoint past the last one ([`write_folded`]).

use projectionist_core::plan::{Effect, EventRef};
use sqlx::PgConnection;

use crate::error::Result;
use crate::projection::prepared::Prepared;
use crate::projection::prepared::{PreparedEvent, Step};
use crate::projection::PgProjection;
use crate::tables::checks::Checks;
use crate::tables::ident::Ident;
use crate::writing::batch::Written;
use crate::writing::batch::{self, ParkedMap};
use crate::writing::parking;
use crate::writing::shared_rows::SharedRows;

/// A rebuild's bulk load: the plans of its batches folded in memory (see
/// [`projectionist_core::fold`]), so that a row that many batches write far apart is written
/// about once, and written together with the checkpoint past the last batch folded. Nothing
/// folded is in PostgreSQL until [`write_folded`] commits: a process killed in
/// between starts again from the checkpoint before it.
#[derive(Debug, Default)]
pub struct Folding {
    fold: projectionist_core::fold::Fold,
    /// The checkpoint past the last batch folded.
    through: Option<i64>,
    /// When the first batch held was folded.
    since: Option<std::time::Instant>,
    /// The partition's parked aggregates, as last read (`None`: to be read again, after a
    /// batch written as usual, which may have parked or resumed some): their events are not
    /// folded, the others' are.
    parked: Option<ParkedMap>,
    /// Rows written by this fold, and as many when the tables were last analyzed for it.
    rows_written: usize,
    analyzed_at: usize,
}

impl Folding {
    /// Rows held before they are written (per partition; about a kilobyte each with their
    /// values, as measured on the bench's accounts).
    pub const MAX_ROWS: usize = 100_000;
    /// How long rows are held before they are written: what a rebuild killed loses at most.
    pub const MAX_AGE: std::time::Duration = std::time::Duration::from_secs(15);

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.fold.is_empty()
    }

    /// Whether what is held should be written now (too many rows, or held too long).
    pub fn due(&self) -> bool {
        self.fold.len() >= Self::MAX_ROWS || self.since.is_some_and(|s| s.elapsed() >= Self::MAX_AGE)
    }

    /// The checkpoint past the last batch folded, to store with the rows held.
    pub fn through(&self) -> Option<i64> {
        self.through
    }

    /// Notes the checkpoint past the batch just folded.
    pub fn folded_through(&mut self, next_offset: i64) {
        self.through = Some(next_offset);
        self.since.get_or_insert_with(std::time::Instant::now);
    }

    /// A fold of a partition read from its start into tables that hold nothing of it (see
    /// [`projectionist_core::fold::Fold::from_nothing`]): a rebuild's, with no checkpoint yet.
    pub fn from_nothing() -> Self {
        Self { fold: projectionist_core::fold::Fold::from_nothing(), ..Self::default() }
    }

    /// Versions of what was written that a fold keeps, per partition, so that the batches
    /// after it need not read them back (about 70 bytes each).
    pub const KEEP_VERSIONS: usize = 1_000_000;

    /// Forgets what was held, once written and committed. `wrote_batch`: a batch was
    /// written after it as usual (it may have parked aggregates, and moved versions the fold
    /// does not know: those it kept are forgotten).
    pub fn written(&mut self, wrote_batch: bool) {
        self.rows_written += self.fold.len();
        if wrote_batch {
            self.fold.clear();
        } else {
            self.fold.written(Self::KEEP_VERSIONS);
        }
        self.through = None;
        self.since = None;
        if wrote_batch {
            self.parked = None;
        }
    }

    /// Whether the tables have grown enough since they were last analyzed that their
    /// statistics should be read again ([`analyze`]): a rebuild fills empty tables fast, and
    /// PostgreSQL keeps planning their lookups as if they were empty until then (its cached
    /// plans included), which makes each lookup scan the whole table. Once it says so, it
    /// counts from now.
    pub fn statistics_due(&mut self) -> bool {
        let due = self.rows_written >= 2 * self.analyzed_at + 10_000;
        if due {
            self.analyzed_at = self.rows_written;
        }
        due
    }
}

/// Reads the statistics of `projection`'s tables again (`ANALYZE`), so that PostgreSQL plans
/// their lookups for the rows they hold now (see [`Folding::statistics_due`]).
pub async fn analyze(conn: &mut PgConnection, projection: &dyn PgProjection) -> Result<()> {
    let tables = projection.tables().iter().map(|t| Ident::new(t.name()).map(|i| i.to_string()));
    let mut tables = tables.collect::<Result<Vec<_>>>()?;
    // The aggregates' versions, which fan-in, child, custom and deletable tables keep, grow
    // as fast (the schema's own, as the search path finds it).
    if projection.tables().iter().any(|t| !t.is_gated() || t.is_deletable()) {
        tables.push("projectionist_aggregate_versions".to_owned());
    }
    sqlx::query(&format!("ANALYZE {}", tables.join(", "))).execute(&mut *conn).await?;
    Ok(())
}

/// Folds `prepared` into `folding` without writing it (see [`Folding`]): the outcomes, or
/// `None` when the batch cannot be folded (`folding` unchanged; the caller writes what it
/// holds, then the batch). Only for a sole writer of the tables (a rebuild's shadow), whose
/// rows nobody else moves: it reads the versions without row locks.
pub async fn fold(
    conn: &mut PgConnection,
    projection: &dyn PgProjection,
    prepared: &Prepared,
    folding: &mut Folding,
) -> Result<Option<Written>> {
    let (name, tables) = (projection.name(), projection.tables());
    // Folded: plain writes of upsert and transition tables PostgreSQL checks no further
    // than their types, every event an envelope that decoded, none of a parked aggregate.
    let Some(source) = &prepared.source else { return Ok(None) };
    let foldable = prepared.failure.is_none()
        && source.undecodable.is_empty()
        && prepared.events.iter().all(|e| matches!(e.step, Step::Writes(_) | Step::Ignored(_)))
        && tables.iter().all(|t| t.gate() != projectionist_core::Gate::Custom)
        && prepared.checked.as_ref().is_some_and(Checks::is_empty);
    if !foldable {
        return Ok(None);
    }
    if !prepared.sole_writer {
        // Another writer may move what an earlier fold wrote.
        folding.fold.forget_versions();
    }
    if folding.parked.is_none() {
        folding.parked = Some(parking::read(conn, name, &source.topic, source.partition).await?);
    }
    let parked = folding.parked.as_ref().expect("read above");
    let events: Vec<(EventRef<'_>, Effect<'_>)> = prepared.events.iter().map(|e| (e.event(), e.effect())).collect();
    let outcomes = batch::fold(conn, name, tables, &events, parked, &mut folding.fold).await?;
    Ok(outcomes.map(|outcomes| Written { outcomes, ..Written::default() }))
}

/// Writes what `folding` holds in the caller's transaction; it stays held until
/// [`Folding::written`]. `then`: the batch written next in the same transaction, whose
/// fan-in rows are locked together with the fold's (in one order: locked apart, two such
/// transactions could deadlock).
pub async fn write_folded(
    conn: &mut PgConnection,
    projection: &dyn PgProjection,
    folding: &Folding,
    then: Option<&Prepared>,
) -> Result<()> {
    if folding.is_empty() {
        return Ok(());
    }
    crate::swap_lock::share_swap_lock(conn, projection.name()).await?;
    let then = SharedRows::of(then.iter().flat_map(|p| p.events.iter().map(PreparedEvent::effect)));
    batch::write_fold(conn, projection.name(), projection.tables(), &folding.fold, then).await
}
