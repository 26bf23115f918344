//! Running projections against PostgreSQL: the object-safe form the engine holds, and
//! applying a batch of raw envelopes inside one transaction.

use std::any::Any;
use std::sync::Arc;

use async_trait::async_trait;
use std::collections::HashMap;

use projectionist_core::plan::{Effect, EventRef, Parked};
use projectionist_core::upcast::upcast;
use projectionist_core::{
    validate_projection_name, Envelope, EventDecoder, LazyEnvelope, OnGap, OnPoison, OnUnknownType, Outcome,
    OutcomeCounts, Projection, RawEnvelope, Table, Upcaster, Writes,
};
use sqlx::types::chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};

use crate::batch::{self, ParkedMap, RunContext};
use crate::park::{self, DeadLetter, HeldRow, Hold, Source, SourceMessage};
use crate::shared_rows::SharedRows;
use crate::{Checks, Error, Ident, Result};

/// How a batch is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Set-based: the batch planned in memory, a few statements per table; event by event
    /// (in the same transaction) when the database refuses a value or a concurrent writer
    /// moved the batch's rows. The default.
    Batch,
    /// One event at a time, each under a savepoint, waiting on concurrent writers' row
    /// locks: what a batch falls back to.
    PerEvent,
}

/// A rebuild's bulk load: the plans of its batches folded in memory (see
/// [`projectionist_core::fold`]), so that a row that many batches write far apart is written
/// about once, and written together with the checkpoint past the last batch folded. Nothing
/// folded is in PostgreSQL until [`PgProjection::write_folded`] commits: a process killed in
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

/// A batch decoded and projected once, outside any transaction, so that writing it again
/// (a retry, a prefix after a failure) decodes and projects nothing again. Made by
/// [`PgProjection::prepare`]: every event, those that cannot be applied as they stand
/// (poison: data that does not decode, a failing upcaster, …) marked with their error.
#[derive(Default)]
pub struct Prepared {
    events: Vec<PreparedEvent>,
    /// A problem of the whole batch (the projection's declarations): no event is prepared.
    failure: Option<Failure>,
    /// Where the events were read, as they arrived: set for parking and dead letters to
    /// store what they keep.
    source: Option<Source>,
    /// Events held for parked aggregates found poison when their aggregate resumed, by id
    /// in `projectionist_held`: dead-lettered when they drain.
    held_poison: HashMap<i64, Error>,
    /// What PostgreSQL checks of the projection's tables beyond their declarations, when
    /// the caller knows it (see [`Prepared::set_checked`]).
    checked: Option<Checks>,
    /// Whether the caller is the only writer of the tables (see [`Prepared::set_sole_writer`]).
    sole_writer: bool,
    /// Whether every transaction the batch is written in begins holding the swap lock (see
    /// [`Prepared::set_swap_locked`]).
    swap_locked: bool,
}

struct PreparedEvent {
    aggregate_type: String,
    aggregate_id: String,
    version: i64,
    occurred_at: DateTime<Utc>,
    step: Step,
}

impl PreparedEvent {
    /// This event as a discarded dead letter is met again: its version skipped, nothing
    /// written (see [`Prepared::skipping`]).
    fn skipped(&self) -> Self {
        PreparedEvent {
            aggregate_type: self.aggregate_type.clone(),
            aggregate_id: self.aggregate_id.clone(),
            version: self.version,
            occurred_at: self.occurred_at,
            step: Step::Ignored(DISCARDED.to_owned()),
        }
    }
}

/// The type an event skipped as a discarded dead letter counts as ignored under.
const DISCARDED: &str = "(discarded)";

/// A problem of the whole batch, blamed on its first event: that event's aggregate id, and why.
struct Failure {
    aggregate_id: String,
    error: Error,
}

/// What one prepared event does.
enum Step {
    /// The projection has no variant for its type (named).
    Ignored(String),
    /// The projection's writes.
    Writes(Writes),
    /// The typed envelope, for the projection's `apply` (an `Envelope<P::Event>`).
    Custom(Box<dyn Any + Send + Sync>),
    /// It cannot be applied as it stands, and why: dead-lettered (with a source) or halting.
    Poison(Error),
}

impl Prepared {
    /// Events prepared, poison ones included.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether no event was prepared.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The first event that cannot be applied as it stands (or, for a problem of the whole
    /// batch, its first event): its index, and why.
    pub fn failure(&self) -> Option<(usize, &Error)> {
        if let Some(f) = &self.failure {
            return Some((0, &f.error));
        }
        self.events.iter().enumerate().find_map(|(i, e)| match &e.step {
            Step::Poison(error) => Some((i, error)),
            _ => None,
        })
    }

    /// One event that moves its aggregate's gates past `version` and writes nothing (as an
    /// event of a type the projection ignores): a dead letter discarded on purpose.
    pub fn skipping(aggregate_type: &str, aggregate_id: &str, version: i64) -> Self {
        let event = PreparedEvent {
            aggregate_type: aggregate_type.to_owned(),
            aggregate_id: aggregate_id.to_owned(),
            version,
            occurred_at: Utc::now(),
            step: Step::Ignored(DISCARDED.to_owned()),
        };
        Prepared { events: vec![event], ..Prepared::default() }
    }

    /// Every event that cannot be applied as it stands (or, for a problem of the whole
    /// batch, its first event), in order: its index, and why.
    pub fn failures(&self) -> impl Iterator<Item = (usize, &Error)> {
        let batch = self.failure.as_ref().map(|f| (0, &f.error));
        batch.into_iter().chain(self.events.iter().enumerate().filter_map(|(i, e)| e.poison().map(|p| (i, p))))
    }

    /// Takes the first failure out (see [`Prepared::failure`]).
    pub fn take_failure(&mut self) -> Option<Error> {
        if let Some(f) = self.failure.take() {
            return Some(f.error);
        }
        let index = self.events.iter().position(|e| matches!(e.step, Step::Poison(_)))?;
        match std::mem::replace(&mut self.events[index].step, Step::Ignored(String::new())) {
            Step::Poison(error) => Some(error),
            _ => unreachable!("a poison step"),
        }
    }

    /// The error of the event at `index` when it is poison.
    pub fn poison_at(&self, index: usize) -> Option<&Error> {
        self.events.get(index)?.poison()
    }

    /// The batch's source, when set (see [`Prepared::set_source`]).
    pub fn source_mut(&mut self) -> Option<&mut Source> {
        self.source.as_mut()
    }

    /// Marks the event `error` is about as poison: what retrying the batch cannot fix (a
    /// value the table refuses, an `apply` that keeps failing), so that the next write
    /// dead-letters it and applies the rest. The event at `index`, or for
    /// [`Error::Held`] the held event it names. `Err(error)` when that event is poison
    /// already, or there is no such event: writing again would fail the same way.
    pub fn poison(&mut self, index: usize, error: Error) -> Result<()> {
        if let Error::Held { held, .. } = &error {
            if self.held_poison.contains_key(held) {
                return Err(error);
            }
            let Error::Held { held, source, .. } = error else { unreachable!("a held event's error") };
            self.held_poison.insert(held, *source);
            return Ok(());
        }
        match self.events.get_mut(index) {
            Some(e) if e.poison().is_none() => {
                e.step = Step::Poison(error);
                Ok(())
            }
            _ => Err(error),
        }
    }

    /// The aggregate id of the event at `index` (or, for a problem of the whole batch, of
    /// its first event).
    pub fn aggregate_id(&self, index: usize) -> Option<&str> {
        match self.events.get(index) {
            Some(e) => Some(&e.aggregate_id),
            None => self.failure.as_ref().map(|f| f.aggregate_id.as_str()),
        }
    }

    /// The aggregate (type and id) and version of the event at `index`.
    pub fn aggregate(&self, index: usize) -> Option<(&str, &str, i64)> {
        let e = self.events.get(index)?;
        Some((&e.aggregate_type, &e.aggregate_id, e.version))
    }

    /// The type of the prepared event at `index` when the projection has no variant for it
    /// (it is ignored), for the engine's count of ignored events by type.
    pub fn ignored_type(&self, index: usize) -> Option<&str> {
        match &self.events.get(index)?.step {
            Step::Ignored(event_type) => Some(event_type),
            _ => None,
        }
    }

    /// When the prepared event at `index` occurred.
    pub fn occurred_at(&self, index: usize) -> Option<DateTime<Utc>> {
        self.events.get(index).map(|e| e.occurred_at)
    }

    /// Keeps the first `len` events only (a problem of the whole batch goes too).
    pub fn truncate(&mut self, len: usize) {
        if len < self.events.len() || len == 0 {
            self.events.truncate(len);
            self.failure = None;
        }
    }

    /// Where the events were read, and each one's message as it arrived (in the order of
    /// the envelopes given to [`PgProjection::prepare`]), with the messages of the batch
    /// that are not even an envelope: what parking holds and dead letters keep. Without
    /// it, a gap is [`Outcome::Gap`] whatever the policy, and a poison event an error.
    pub fn set_source(&mut self, source: Source) {
        self.source = Some(source);
    }

    /// Sets what PostgreSQL checks of the projection's tables beyond their declarations
    /// ([`checked_tables`]), as the caller last read it, so that writing the batch does not
    /// ask the catalog. A run that writes a row of a table checked row by row twice is
    /// written in rounds, one that writes a table checked across rows event by event (see
    /// [`Checks`]), and a rebuild folds only where nothing is checked. Unset, the catalog is
    /// asked once per batch.
    pub fn set_checked(&mut self, checks: Checks) {
        self.checked = Some(checks);
    }

    /// Says that no one else writes the projection's tables while this batch is written (as
    /// a rebuild's shadow, behind its rebuild lock): the rows the batch builds on are read
    /// without row locks. Every write still checks the version it builds on, so a writer
    /// there after all is met as a conflict, never lost; only the waiting for one is gone.
    pub fn set_sole_writer(&mut self) {
        self.sole_writer = true;
    }

    /// Every transaction this batch is written in is begun by
    /// [`begin_sharing_swap_lock`](crate::rebuild::begin_sharing_swap_lock), which takes the
    /// projection's swap lock in the `BEGIN`'s own round trip: the write does not take it
    /// again.
    pub fn set_swap_locked(&mut self) {
        self.swap_locked = true;
    }
}

impl PreparedEvent {
    fn event(&self) -> EventRef<'_> {
        EventRef { aggregate_type: &self.aggregate_type, aggregate_id: &self.aggregate_id, version: self.version }
    }

    fn effect(&self) -> Effect<'_> {
        match &self.step {
            Step::Writes(w) => Effect::Writes(w.writes()),
            Step::Custom(_) => Effect::Custom,
            Step::Ignored(_) => Effect::Ignored,
            Step::Poison(_) => Effect::Poison,
        }
    }

    fn aggregate(&self) -> (&str, &str) {
        (&self.aggregate_type, &self.aggregate_id)
    }

    fn poison(&self) -> Option<&Error> {
        match &self.step {
            Step::Poison(e) => Some(e),
            _ => None,
        }
    }
}

/// What [`PgProjection::write`] did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Written {
    /// One outcome per event, up to and including the first [`Outcome::Gap`] (the batch
    /// ends there: nothing at or after it was written). [`Outcome::Parked`]: held.
    pub outcomes: Vec<Outcome>,
    /// Whether the set-based path gave way to the per-event path (a value the database
    /// refused, or a concurrent writer).
    pub per_event: bool,
    /// The outcomes of events held by earlier batches and applied by this one (their
    /// aggregate's missing version arrived).
    pub drained: OutcomeCounts,
    /// Aggregates parked by this batch (behind a gap or a dead letter).
    pub parked: u64,
    /// Aggregates resumed by this batch.
    pub resumed: u64,
    /// Dead letters this batch kept: its events that cannot be applied as they stand,
    /// held events found so when their aggregate resumed, and messages that are not an
    /// envelope at all; by reason (`envelope`, `data`, `value`, `apply`, …).
    pub dead_letters: std::collections::BTreeMap<&'static str, u64>,
    /// The ids of those dead letters.
    pub dead_letter_ids: Vec<i64>,
    /// The offsets of the batch's messages that are not in the read model: held behind a
    /// parked aggregate, dead-lettered, or skipped as a discarded dead letter (what the
    /// checkpoint's notification tells the waits: [`crate::checkpoint::Passed`]).
    pub kept_out: Vec<i64>,
}

/// A projection over PostgreSQL with its event type erased, so the engine can hold many
/// side by side. Every `Projection<PgConnection>` is one.
#[async_trait]
pub trait PgProjection: Send + Sync + 'static {
    /// See [`Projection::name`].
    fn name(&self) -> &str;
    /// See [`Projection::tables`].
    fn tables(&self) -> &[Table];
    /// See [`Projection::schema`].
    fn schema(&self) -> &[&str];
    /// See [`Projection::on_unknown_type`].
    fn on_unknown_type(&self) -> OnUnknownType;
    /// See [`Projection::upcasters`].
    fn upcasters(&self) -> &[Upcaster];
    /// The event types the projection's events have variants for (empty when its event
    /// type is not an enum tagged by `type`: it is offered every type).
    fn event_types(&self) -> &'static [&'static str];
    /// Decodes and projects `batch`, each event once, up to the first that fails (an
    /// [`Error::Decode`] naming it, or [`Error::Declaration`] for the whole batch). The
    /// envelopes are consumed: their fields move into the typed events, uncopied.
    fn prepare(&self, batch: Vec<RawEnvelope>) -> Prepared;
    /// [`PgProjection::prepare`] for envelopes whose data is still JSON text, as the engine
    /// reads them: each event decoded straight from it (a `Value` tree is built only for an
    /// event an upcaster of the projection reads).
    fn prepare_lazy(&self, batch: Vec<LazyEnvelope>) -> Prepared;
    /// Writes a prepared batch in offset order in the caller's transaction, up to its first
    /// [`Outcome::Gap`] (with [`OnGap::Halt`], or without a source): the outcomes then end
    /// with it, and nothing at or after it is written, so what precedes it can commit. With
    /// [`OnGap::Park`] and a source ([`Prepared::set_source`]) a gap parks its aggregate
    /// instead, and the parking is stored in the same transaction. An error about one event names it
    /// ([`Error::event_index`]): a write the declarations forbid, a value the database
    /// refuses, a failing `apply`; nothing of the batch is to be committed then.
    async fn write(&self, conn: &mut PgConnection, prepared: &Prepared, mode: Mode, on_gap: OnGap) -> Result<Written>;

    /// Folds `prepared` into `folding` without writing it (see [`Folding`]): the outcomes,
    /// or `None` when the batch cannot be folded (`folding` unchanged; the caller writes
    /// what it holds, then the batch). Only for a sole writer of the tables (a rebuild's
    /// shadow), whose rows nobody else moves: it reads the versions without row locks.
    async fn fold(
        &self,
        conn: &mut PgConnection,
        prepared: &Prepared,
        folding: &mut Folding,
    ) -> Result<Option<Written>>;

    /// Writes what `folding` holds in the caller's transaction; it stays held until
    /// [`Folding::written`].
    /// `then`: the batch written next in the same transaction, whose fan-in rows are locked
    /// together with the fold's (in one order: locked apart, two such transactions could
    /// deadlock).
    async fn write_folded(&self, conn: &mut PgConnection, folding: &Folding, then: Option<&Prepared>) -> Result<()>;
}

#[async_trait]
impl<P: Projection<PgConnection>> PgProjection for P {
    fn name(&self) -> &str {
        Projection::name(self)
    }

    fn tables(&self) -> &[Table] {
        Projection::tables(self)
    }

    fn schema(&self) -> &[&str] {
        Projection::schema(self)
    }

    fn on_unknown_type(&self) -> OnUnknownType {
        Projection::on_unknown_type(self)
    }

    fn upcasters(&self) -> &[Upcaster] {
        Projection::upcasters(self)
    }

    fn event_types(&self) -> &'static [&'static str] {
        projectionist_core::event_types::<P::Event>().unwrap_or_default()
    }

    fn prepare(&self, batch: Vec<RawEnvelope>) -> Prepared {
        prepare_all(self, batch.into_iter().map(LazyEnvelope::from))
    }

    fn prepare_lazy(&self, batch: Vec<LazyEnvelope>) -> Prepared {
        prepare_all(self, batch.into_iter())
    }

    async fn fold(
        &self,
        conn: &mut PgConnection,
        prepared: &Prepared,
        folding: &mut Folding,
    ) -> Result<Option<Written>> {
        let (name, tables) = (Projection::name(self), Projection::tables(self));
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
            folding.parked = Some(park::read(conn, name, &source.topic, source.partition).await?);
        }
        let parked = folding.parked.as_ref().expect("read above");
        let events: Vec<(EventRef<'_>, Effect<'_>)> = prepared.events.iter().map(|e| (e.event(), e.effect())).collect();
        let outcomes = batch::fold(conn, name, tables, &events, parked, &mut folding.fold).await?;
        Ok(outcomes.map(|outcomes| Written { outcomes, ..Written::default() }))
    }

    async fn write_folded(&self, conn: &mut PgConnection, folding: &Folding, then: Option<&Prepared>) -> Result<()> {
        if folding.is_empty() {
            return Ok(());
        }
        crate::swap_lock::share_swap_lock(conn, Projection::name(self)).await?;
        let then = SharedRows::of(then.iter().flat_map(|p| p.events.iter().map(PreparedEvent::effect)));
        batch::write_fold(conn, Projection::name(self), Projection::tables(self), &folding.fold, then).await
    }

    async fn write(&self, conn: &mut PgConnection, prepared: &Prepared, mode: Mode, on_gap: OnGap) -> Result<Written> {
        let name = Projection::name(self);
        if let Some(f) = &prepared.failure {
            return Err(f.error.clone_of_batch());
        }
        // Poison events are dead letters where the batch's messages are at hand, else errors.
        let poison = prepared.events.iter().any(|e| e.poison().is_some());
        let source = prepared.source.as_ref().filter(|s| on_gap == OnGap::Park || poison || !s.undecodable.is_empty());
        if source.is_none() && poison {
            let (index, _) = prepared.failure().expect("a poison event");
            return Err(prepared.events[index].poison().expect("poison").clone_of_batch().at(index));
        }
        if !prepared.swap_locked {
            crate::swap_lock::share_swap_lock(conn, name).await?;
        }
        let shared = SharedRows::of(prepared.events.iter().map(PreparedEvent::effect));
        let gaps_halt = on_gap == OnGap::Halt;
        // What PostgreSQL checks of the tables: as the caller last read it, else read once here.
        let read;
        let checked = match &prepared.checked {
            Some(known) => known,
            None => {
                read = crate::checks::read(conn, Projection::tables(self)).await?;
                &read
            }
        };
        // What every run of the batch starts from, besides the parked aggregates.
        let context = (gaps_halt, checked, prepared.sole_writer, &shared);
        let mut parked = match source {
            Some(source) => Some(park::read(conn, name, &source.topic, source.partition).await?),
            None => None,
        };
        let mut changes: HashMap<(String, String), Option<Parked>> = HashMap::new();
        // A poison event whose dead letter an operator discarded (met again: a replay after a
        // reset) is skipped again, as the discard skipped it, not parked behind it for good.
        let discarded = match source {
            Some(source) if poison => {
                let poisoned = prepared.events.iter().enumerate().filter(|(_, e)| e.poison().is_some());
                let offsets = poisoned.filter_map(|(i, _)| Some((i, source.messages.get(i)?.offset?)));
                park::discarded(conn, name, source, offsets.collect()).await?
            }
            _ => Vec::new(),
        };
        let skips: Vec<PreparedEvent> = discarded.iter().map(|&i| prepared.events[i].skipped()).collect();
        let events: Vec<&PreparedEvent> = prepared
            .events
            .iter()
            .enumerate()
            .map(|(i, e)| discarded.iter().position(|&d| d == i).map_or(e, |k| &skips[k]))
            .collect();
        let mut written = Written { outcomes: Vec::with_capacity(events.len()), ..Written::default() };
        // Held events applied (their ids), and held events found poison when drained.
        let mut drained = Vec::new();
        let mut dead: Vec<DeadLetter<'_>> = Vec::new();
        let mut held: Vec<(HeldRow, PreparedEvent)> = Vec::new();
        let mut held_dead: Vec<(usize, String, &'static str)> = Vec::new();
        while written.outcomes.len() < events.len() {
            let start = written.outcomes.len();
            let ran = self.write_events(conn, &events[start..], mode, &mut parked, context, &mut changes).await;
            let (outcomes, per_event, unparked) = ran.map_err(|e| e.shifted(start))?;
            written.outcomes.extend(outcomes);
            written.per_event |= per_event;
            if batch::ends_in_a_gap(&written.outcomes) {
                break;
            }
            if let Some(aggregate) = unparked {
                // The resumed aggregate's held events, in version order: those of earlier
                // batches (stored), then those of this one, as one event at a time would.
                // The event that resumed it, or, for a stale parking, the one before which it
                // resumed (see `Plan::unparked`).
                let resumed_at = written.outcomes.len().saturating_sub(1);
                let first_held = held.len();
                let decoder = EventDecoder::<P::Event>::new();
                let halt_on_unknown = Projection::on_unknown_type(self) == OnUnknownType::Halt;
                for row in park::held(conn, name, &aggregate).await? {
                    let event = match LazyEnvelope::from_slice(&row.payload) {
                        // Found poison by an earlier attempt at this batch.
                        Ok(raw) if prepared.held_poison.contains_key(&row.id) => {
                            let error = prepared.held_poison[&row.id].clone_of_batch();
                            let (aggregate_type, aggregate_id) = (raw.aggregate_type, raw.aggregate_id);
                            let version = raw.version;
                            PreparedEvent {
                                aggregate_type,
                                aggregate_id,
                                version,
                                occurred_at: Utc::now(),
                                step: Step::Poison(error),
                            }
                        }
                        Ok(raw) => prepare_event(self, &decoder, halt_on_unknown, resumed_at, raw),
                        Err(source) => PreparedEvent {
                            aggregate_type: aggregate.0.clone(),
                            aggregate_id: aggregate.1.clone(),
                            version: row.version,
                            occurred_at: Utc::now(),
                            step: Step::Poison(Error::Decode {
                                index: resumed_at,
                                aggregate: format!("{}/{}", aggregate.0, aggregate.1),
                                version: row.version,
                                source,
                            }),
                        },
                    };
                    held.push((row, event));
                }
                let mut drain: Vec<(Result<usize, usize>, &PreparedEvent)> = (first_held..held.len())
                    .map(|h| (Ok(h), &held[h].1))
                    .chain(
                        (0..written.outcomes.len())
                            .filter(|&i| {
                                written.outcomes[i] == Outcome::Parked
                                    && events[i].aggregate() == (aggregate.0.as_str(), aggregate.1.as_str())
                            })
                            .map(|i| (Err(i), events[i])),
                    )
                    .collect();
                drain.sort_by_key(|(_, e)| e.version);
                let drain_events: Vec<&PreparedEvent> = drain.iter().map(|(_, e)| *e).collect();
                // Held events' fan-in rows, locked with the batch's own, some maybe after them
                // (a rare path: a deadlock with another batch is then possible, and retried).
                let shared = shared.with(SharedRows::of(drain_events.iter().map(|e| e.effect())));
                let context = (gaps_halt, checked, prepared.sole_writer, &shared);
                let (outcomes, per_event, _) = self
                    .write_events(conn, &drain_events, mode, &mut parked, context, &mut changes)
                    .await
                    .map_err(|e| match e.event_index().and_then(|i| drain.get(i)).map(|(origin, _)| *origin) {
                        // A held event: named, so that the next attempt dead-letters it.
                        Some(Ok(h)) => Error::Held { index: resumed_at, held: held[h].0.id, source: Box::new(e) },
                        // An event of this batch parked before its aggregate resumed.
                        Some(Err(index)) => e.at(index),
                        None => e.at(resumed_at),
                    })?;
                written.per_event |= per_event;
                for ((origin, event), outcome) in drain.iter().zip(outcomes) {
                    match origin {
                        Err(index) => written.outcomes[*index] = outcome,
                        Ok(_) if outcome == Outcome::Parked => {}
                        Ok(h) => {
                            drained.push(held[*h].0.id);
                            written.drained.add(&outcome);
                            if outcome == Outcome::DeadLettered {
                                // As found when it was refused, where an earlier attempt found it.
                                let found = prepared.held_poison.get(&held[*h].0.id);
                                let error = found.or(event.poison()).expect("a dead letter is poison");
                                held_dead.push((*h, error.of_the_event(), error.reason()));
                            }
                        }
                    }
                }
            }
        }
        let Some(source) = source else { return Ok(written) };
        let mut hold = Vec::new();
        for (index, outcome) in written.outcomes.iter().enumerate() {
            if !matches!(outcome, Outcome::Parked | Outcome::DeadLettered) {
                continue;
            }
            let (e, message) = (events[index], source.messages.get(index));
            let message = message.ok_or_else(|| Error::Invalid {
                index,
                aggregate: format!("{}/{}", e.aggregate_type, e.aggregate_id),
                version: e.version,
                problem: "the batch's source holds no message for this event".into(),
            })?;
            let (aggregate_type, aggregate_id, version) = (&e.aggregate_type, &e.aggregate_id, e.version);
            if *outcome == Outcome::Parked {
                hold.push(Hold { aggregate_type, aggregate_id, version, message });
            } else {
                let error = e.poison().expect("a dead letter is poison");
                dead.push(DeadLetter {
                    aggregate: Some((aggregate_type, aggregate_id, version)),
                    topic: &source.topic,
                    partition: source.partition,
                    offset: message.offset,
                    key: message.key.as_deref(),
                    payload: &message.payload,
                    headers: &message.headers,
                    reason: error.reason(),
                    error: error.of_the_event(),
                });
            }
        }
        let held_headers: Vec<park::Headers> = held_dead.iter().map(|(h, ..)| held[*h].0.headers()).collect();
        for ((h, error, reason), headers) in held_dead.into_iter().zip(&held_headers) {
            let (row, e) = &held[h];
            dead.push(DeadLetter {
                aggregate: Some((&e.aggregate_type, &e.aggregate_id, e.version)),
                topic: &row.topic,
                partition: row.partition,
                offset: row.offset,
                key: row.key.as_deref(),
                payload: &row.payload,
                headers,
                reason,
                error,
            });
        }
        for undecodable in &source.undecodable {
            let message = &undecodable.message;
            dead.push(DeadLetter {
                aggregate: None,
                topic: &source.topic,
                partition: source.partition,
                offset: message.offset,
                key: message.key.as_deref(),
                payload: &message.payload,
                headers: &message.headers,
                reason: undecodable.reason,
                error: undecodable.error.clone(),
            });
        }
        for d in &dead {
            *written.dead_letters.entry(d.reason).or_default() += 1;
        }
        written.parked = changes.values().filter(|c| c.is_some()).count() as u64;
        written.resumed = changes.values().filter(|c| c.is_none()).count() as u64;
        written.dead_letter_ids = park::save(conn, name, source, &changes, &hold, &drained, &dead).await?;
        written.kept_out = kept_out(source, &hold, &dead, &discarded);
        Ok(written)
    }
}

/// The offsets of `source`'s messages a batch kept out of the read model: those it held and
/// dead-lettered, and those skipped as discarded dead letters (`discarded`: their indexes).
fn kept_out(source: &Source, hold: &[Hold<'_>], dead: &[DeadLetter<'_>], discarded: &[usize]) -> Vec<i64> {
    let ours = |d: &&DeadLetter<'_>| d.topic == source.topic && d.partition == source.partition;
    let held = hold.iter().filter_map(|h| h.message.offset);
    let dead = dead.iter().filter(ours).filter_map(|d| d.offset);
    let skipped = discarded.iter().filter_map(|&i| source.messages.get(i)?.offset);
    held.chain(dead).chain(skipped).collect()
}

impl<P: Projection<PgConnection>> WriteEvents for P {}

/// Writing a sequence of prepared events, for [`PgProjection::write`].
#[async_trait]
trait WriteEvents: Projection<PgConnection> {
    /// Writes `events` in order: runs of planned events set-based, a custom event through
    /// `apply` between them; up to the first gap (parking off), or up to the event that
    /// resumes a parked aggregate (returned: its held events come next). `parked`: the
    /// parking state, kept up to date, and every aggregate parked or resumed in `changes`.
    async fn write_events(
        &self,
        conn: &mut PgConnection,
        events: &[&PreparedEvent],
        mode: Mode,
        parked: &mut Option<ParkedMap>,
        (gaps_halt, checked, sole_writer, shared): (bool, &Checks, bool, &SharedRows),
        changes: &mut HashMap<(String, String), Option<Parked>>,
    ) -> Result<(Vec<Outcome>, bool, Option<(String, String)>)> {
        let name = Projection::name(self);
        let tables = Projection::tables(self);
        let mut outcomes = Vec::with_capacity(events.len());
        let mut per_event = false;
        let mut start = 0;
        while start < events.len() {
            let end = events[start..]
                .iter()
                .position(|e| matches!(e.step, Step::Custom(_)))
                .map_or(events.len(), |p| start + p);
            let run_end = if end > start { end } else { end + 1 };
            let run: Vec<(EventRef<'_>, Effect<'_>)> =
                events[start..run_end.min(events.len())].iter().map(|e| (e.event(), e.effect())).collect();
            // A custom event goes alone, gated like any event; `apply` runs if it applies.
            let run_mode = if end > start { mode } else { Mode::PerEvent };
            let parking = RunContext { parked: parked.as_ref(), gaps_halt, checked, sole_writer, shared };
            let ran = batch::apply(conn, name, tables, &run, run_mode, parking).await.map_err(|e| e.shifted(start))?;
            per_event |= ran.per_event && end > start;
            for (aggregate, state) in ran.parks {
                if let Some(parked) = parked.as_mut() {
                    match state {
                        Some(p) => parked.insert(aggregate.clone(), p),
                        None => parked.remove(&aggregate),
                    };
                }
                changes.insert(aggregate, state);
            }
            if end == start {
                let Some(Step::Custom(env)) = events.get(end).map(|e| &e.step) else { unreachable!("a custom event") };
                let env = env.downcast_ref::<Envelope<Self::Event>>().expect("prepared by this projection");
                let outcome = match ran.outcomes.first() {
                    // Its aggregate's stale parking resumed before it: planned again after the drain.
                    None if ran.unparked.is_some() => return Ok((outcomes, per_event, ran.unparked)),
                    Some(Outcome::Applied) => self.apply(conn, env).await.map_err(|error| Error::Apply {
                        projection: name.into(),
                        index: end,
                        aggregate: format!("{}/{}", env.aggregate_type, env.aggregate_id),
                        version: env.version,
                        error,
                    })?,
                    Some(other) => *other,
                    None => unreachable!("one outcome per event"),
                };
                outcomes.push(outcome);
            } else {
                outcomes.extend(ran.outcomes);
            }
            if batch::ends_in_a_gap(&outcomes) || ran.unparked.is_some() {
                return Ok((outcomes, per_event, ran.unparked));
            }
            start = run_end;
        }
        Ok((outcomes, per_event, None))
    }
}

/// One event decoded (its envelope's fields moved, not copied) and projected; one that
/// cannot be is poison, with the error.
fn prepare_event<P: Projection<PgConnection>>(
    projection: &P,
    decoder: &EventDecoder<P::Event>,
    halt_on_unknown: bool,
    index: usize,
    envelope: LazyEnvelope,
) -> PreparedEvent {
    let LazyEnvelope { id, aggregate_type, aggregate_id, version, mut event_type, occurred_at, data, metadata } =
        envelope;
    let poison = |aggregate_type: String, aggregate_id: String, error: Error| PreparedEvent {
        aggregate_type,
        aggregate_id,
        version,
        occurred_at,
        step: Step::Poison(error),
    };
    // A tree only for an event an upcaster reads.
    let upcasters = Projection::upcasters(projection);
    let mut upcast_data = None;
    if upcasters.iter().any(|u| u.event_type() == event_type) {
        let mut tree = serde_json::from_str(data.get()).expect("a RawValue holds valid JSON");
        if let Err(source) = upcast(upcasters, &mut event_type, &mut tree, metadata.as_ref()) {
            let aggregate = format!("{aggregate_type}/{aggregate_id}");
            return poison(aggregate_type, aggregate_id, Error::Decode { index, aggregate, version, source });
        }
        upcast_data = Some(tree);
    }
    if !decoder.handles(&event_type) {
        if halt_on_unknown {
            let aggregate = format!("{aggregate_type}/{aggregate_id}");
            let known = decoder.types().unwrap_or_default().join(", ");
            let error = Error::UnknownType { index, aggregate, version, event_type, known };
            return poison(aggregate_type, aggregate_id, error);
        }
        let step = Step::Ignored(event_type);
        return PreparedEvent { aggregate_type, aggregate_id, version, occurred_at, step };
    }
    let decoded = match upcast_data {
        Some(tree) => decoder.event(&event_type, tree),
        None => decoder.event_from_json(&event_type, &data),
    };
    let event = match decoded {
        Ok(event) => event,
        Err(source) => {
            let aggregate = format!("{aggregate_type}/{aggregate_id}");
            return poison(aggregate_type, aggregate_id, Error::Decode { index, aggregate, version, source });
        }
    };
    let env = Envelope { id, aggregate_type, aggregate_id, version, event_type, occurred_at, event, metadata };
    let writes = projection.project(&env);
    if writes.is_custom() {
        let (aggregate_type, aggregate_id) = (env.aggregate_type.clone(), env.aggregate_id.clone());
        let step = Step::Custom(Box::new(env));
        return PreparedEvent { aggregate_type, aggregate_id, version, occurred_at, step };
    }
    // The envelope's names move on with the writes.
    let Envelope { aggregate_type, aggregate_id, .. } = env;
    PreparedEvent { aggregate_type, aggregate_id, version, occurred_at, step: Step::Writes(writes) }
}

/// Decodes and projects each event of a batch (see [`PgProjection::prepare`]).
fn prepare_all<P: Projection<PgConnection>>(projection: &P, batch: impl Iterator<Item = LazyEnvelope>) -> Prepared {
    let mut batch = batch.peekable();
    if let Err(error) = check_declarations(Projection::name(projection), Projection::tables(projection)) {
        let aggregate_id = batch.next().map(|e| e.aggregate_id).unwrap_or_default();
        let failure = Some(Failure { aggregate_id, error });
        return Prepared { failure, ..Prepared::default() };
    }
    let decoder = EventDecoder::<P::Event>::new();
    let halt_on_unknown = Projection::on_unknown_type(projection) == OnUnknownType::Halt;
    let events = batch
        .enumerate()
        .map(|(index, envelope)| prepare_event(projection, &decoder, halt_on_unknown, index, envelope))
        .collect();
    Prepared { events, ..Prepared::default() }
}

fn check_declarations(projection: &str, tables: &[Table]) -> Result<()> {
    for table in tables {
        table.check().map_err(|problem| Error::Declaration { projection: projection.into(), problem })?;
    }
    Ok(())
}

/// What PostgreSQL checks of `projection`'s tables beyond their declarations (see
/// [`Checks`] and [`Prepared::set_checked`]).
pub async fn checked_tables(pool: &PgPool, projection: &dyn PgProjection) -> Result<Checks> {
    let mut conn = pool.acquire().await?;
    crate::checks::read(&mut conn, projection.tables()).await
}

/// A shared, type-erased projection.
pub type SharedProjection = Arc<dyn PgProjection>;

/// Checks a projection before the engine runs it: its name, every identifier of its table
/// declarations, and that each gated table names its aggregate type.
pub fn validate(projection: &dyn PgProjection) -> Result<()> {
    validate_projection_name(projection.name())
        .map_err(|_| Error::Identifier { ident: projection.name().into(), reason: "not a valid projection name" })?;
    for table in projection.tables() {
        for ident in table.identifiers() {
            Ident::new(ident)?;
        }
    }
    check_declarations(projection.name(), projection.tables())
}

/// Applies `batch` in one transaction of its own and commits it (no checkpoint: the Kafka
/// engine adds its own in the same transaction): set-based, or per event where the batch
/// needs it. Used by tests and tools: unlike the engine, which halts a partition at a gap,
/// it goes on past one (the gap's event is not applied), so every event has an outcome.
pub async fn apply_batch(pool: &PgPool, projection: &dyn PgProjection, batch: &[RawEnvelope]) -> Result<Vec<Outcome>> {
    apply_batch_in(pool, projection, batch, Mode::Batch, Policy::HALT).await
}

/// What a batch does with an event that cannot be applied: a gap, a poison event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Policy {
    /// A gap parks its aggregate, or is [`Outcome::Gap`].
    pub on_gap: OnGap,
    /// A poison event is dead-lettered (its aggregate parked behind it), or an error.
    pub on_poison: OnPoison,
}

impl Policy {
    /// Gaps are [`Outcome::Gap`], poison events errors.
    pub const HALT: Self = Self { on_gap: OnGap::Halt, on_poison: OnPoison::Halt };
}

/// As [`apply_batch`], starting in the given mode, with the given policy: with
/// [`OnGap::Park`] a gap parks its aggregate as the engine does, and with
/// [`OnPoison::DeadLetter`] a poison event is dead-lettered (the held events and dead
/// letters stored as their envelopes' JSON, with no topic and no offset); [`Outcome::Parked`]
/// events can be applied by a later call, when the missing version comes.
pub async fn apply_batch_in(
    pool: &PgPool,
    projection: &dyn PgProjection,
    batch: &[RawEnvelope],
    mode: Mode,
    policy: Policy,
) -> Result<Vec<Outcome>> {
    let halts = |e: &Error| {
        policy.on_poison == OnPoison::Halt || matches!(e, Error::UnknownType { .. } | Error::Declaration { .. })
    };
    let mut tx = pool.begin().await?;
    let mut outcomes = Vec::with_capacity(batch.len());
    while outcomes.len() < batch.len() {
        let start = outcomes.len();
        let rest = &batch[start..];
        let mut prepared = projection.prepare(rest.to_vec());
        if let Some((index, e)) = prepared.failures().find(|(_, e)| halts(e)) {
            return Err(e.clone_of_batch().at(index).shifted(start));
        }
        let messages = rest.iter().map(|raw| SourceMessage { payload: raw.to_json(), ..SourceMessage::default() });
        prepared.set_source(Source {
            topic: String::new(),
            partition: 0,
            messages: messages.collect(),
            ..Source::default()
        });
        loop {
            let mut attempt = sqlx::Connection::begin(&mut *tx).await?;
            match projection.write(&mut attempt, &prepared, mode, policy.on_gap).await {
                Ok(written) => {
                    attempt.commit().await?;
                    outcomes.extend(written.outcomes);
                    break;
                }
                Err(e) => {
                    attempt.rollback().await?;
                    match e.event_index() {
                        // An event the batch cannot apply: dead-lettered, the rest written again.
                        Some(index) if !halts(&e) => prepared.poison(index, e).map_err(|e| e.shifted(start))?,
                        _ => return Err(e.shifted(start)),
                    }
                }
            }
        }
    }
    tx.commit().await?;
    Ok(outcomes)
}

/// Creates the projection's tables from their declarations, then runs its extra
/// [`Projection::schema`] statements.
pub async fn create_schema(pool: &PgPool, projection: &dyn PgProjection) -> Result<()> {
    validate(projection)?;
    let mut tx = pool.begin().await?;
    for table in projection.tables() {
        sqlx::raw_sql(&table.ddl()).execute(&mut *tx).await?;
    }
    for statement in projection.schema() {
        sqlx::raw_sql(statement).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Empties the projection's tables and forgets its aggregate versions, checkpoints and what
/// it parked and held, in one transaction, so the next run rebuilds it from the start of its
/// topics. Its dead letters stay, with what an operator did with them: one discarded is
/// skipped again when the replay meets it.
///
/// Refuses ([`Error::Drift`]) before emptying anything when a table does not exist or is not
/// as declared: the replay would halt on it, leaving the read model empty.
pub async fn reset(pool: &PgPool, projection: &dyn PgProjection) -> Result<()> {
    crate::check_tables(pool, projection).await?;
    let mut tx = pool.begin().await?;
    if !projection.tables().is_empty() {
        let tables = projection
            .tables()
            .iter()
            .map(|t| Ident::new(t.name()).map(|i| i.to_string()))
            .collect::<Result<Vec<_>>>()?;
        sqlx::raw_sql(&format!("TRUNCATE {}", tables.join(", "))).execute(&mut *tx).await?;
    }
    // Parking is re-derived as the stream is read again; dead letters stay, with what an
    // operator did with them (a discarded one is skipped again when met).
    for table in
        ["projectionist_aggregate_versions", "projectionist_checkpoints", "projectionist_parked", "projectionist_held"]
    {
        sqlx::query(&format!("DELETE FROM {table} WHERE projection = $1"))
            .bind(projection.name())
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(())
}
