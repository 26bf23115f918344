//! Planning a batch: every event classified against the stored versions exactly as the
//! per-event gate would, and each row's applied chain coalesced into as few row writes as
//! keep the result identical to applying the events one at a time. Pure: the Postgres side
//! reads the versions, says what its columns take ([`TypeRules`]), runs the plan's
//! statements and checks their counts.
//!
//! What keeps a batch equal to its events applied one by one:
//! - an event moves only the gates its own aggregate type owns ([`Table::owns`]);
//! - only the event that creates a row writes absolute values; what later events add builds
//!   on what the row holds after its insert (its column defaults, NULLs), so a row created
//!   in the batch and then added to is an insert followed by an update;
//! - adds are never summed here: each column keeps its deltas in order and PostgreSQL folds
//!   them in the column's own arithmetic (`((c + a1) + a2) + …`), so fractions, rounding to
//!   a column's scale, floats and overflow behave as one `UPDATE` per event would;
//! - with parking on, an aggregate whose event is a gap is parked: its events after the gap
//!   are [`Outcome::Parked`] until the version it waits for arrives, and the plan ends right
//!   after that event ([`Plan::unparked`]), so the caller applies the held events (the
//!   drain) exactly where one event at a time would have.

mod coalesce;
mod columns;
mod gate;
mod row_id;
mod rows;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use crate::table::{Gate, Table};
use crate::write::{Change, Op, Write};
use crate::Outcome;

pub(crate) use coalesce::sums_fit;
pub(crate) use columns::Declared;
pub use columns::{ColumnValues, IntRange, RunningSums, TypeRules};
use rows::plan_rows;

/// The identity of an event being planned.
#[derive(Debug, Clone, Copy)]
pub struct EventRef<'a> {
    /// Its aggregate type (with the id, the aggregate's identity).
    pub aggregate_type: &'a str,
    /// Its aggregate id (keys the rows of the tables its type owns, and the aggregate version).
    pub aggregate_id: &'a str,
    /// Its version.
    pub version: i64,
}

/// What an event does, as planned.
#[derive(Debug, Clone, Copy)]
pub enum Effect<'a> {
    /// The projection handles the type and returned these writes (maybe none).
    Writes(&'a [Write]),
    /// The projection does not handle the type: [`Outcome::Ignored`], the gates still move.
    Ignored,
    /// The projection's `apply` writes it: the gates move as for any applied event, and
    /// `apply` runs only when the outcome is [`Outcome::Applied`].
    Custom,
    /// It can never apply as it stands (its data does not decode, the table refuses a value
    /// of it, …): where it would apply (or is a gap) it is [`Outcome::DeadLettered`] and
    /// parks its aggregate behind it; a version already applied is a duplicate or stale, as
    /// ever. Only with parking on.
    Poison,
}

/// Versions stored when the batch starts, for every key the batch touches (absent: no row),
/// keyed by what the batch's events hold (`'k`): nothing copied per key.
#[derive(Debug, Clone, Default)]
pub struct Stored<'k> {
    /// Per gated table name: key → version.
    pub rows: Map<&'static str, Versions<'k>>,
    /// Per (aggregate type, aggregate id): the aggregate version.
    pub aggregates: Map<(&'k str, &'k str), i64>,
    /// `None`: parking is off, a gap is [`Outcome::Gap`]. `Some`: a gap parks its aggregate
    /// (unless `gaps_halt`), a poison event dead-letters it; the aggregates of the batch
    /// parked when it starts.
    pub parked: Option<HashMap<(String, String), Parked>>,
    /// With parking on, a gap is still [`Outcome::Gap`] (only dead letters park).
    pub gaps_halt: bool,
}

/// A table's stored versions, by key (looked up for each event of a batch).
pub type Versions<'k> = Map<&'k str, i64>;

/// A parked aggregate: its events past the version it waits for are held, not applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parked {
    /// The version whose arrival resumes the aggregate (its missing predecessor); behind a
    /// dead letter, the dead letter's version.
    pub waiting_for: i64,
    /// Parked behind a dead letter of its own (version `waiting_for`): its events from that
    /// version on are held until an operator retries or discards the dead letter; nothing
    /// that arrives resumes it.
    pub dead_letter: bool,
}

/// How a row write reaches the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RowKind {
    /// Nothing written: what the batch wrote to a stored row before deleting (or clearing)
    /// it, evaluated against the row as stored, so that a value PostgreSQL refuses (an
    /// overflow of an add) is refused as one event at a time refuses it. Before the table's
    /// other writes.
    Check,
    /// Every child of an aggregate deleted (a clear), before the table's other writes.
    Clear,
    /// A fan-in row deleted (what was written to it in the batch before is dropped; what
    /// is written after creates it again, merged or inserted after the delete).
    Delete,
    /// A gated row created in the batch (`ON CONFLICT DO NOTHING`, the count checked).
    Insert,
    /// A fan-in row's first write in the batch: inserted, or merged into the row there.
    Merge,
    /// An existing row: a gated row at its `expected` version, or a fan-in row written
    /// earlier in the batch.
    Update,
}

/// The new value of one column: `base` (or what the row holds), then each delta added in
/// order in the column's arithmetic.
#[derive(Debug, Clone, PartialEq)]
pub struct ColumnWrite<'a> {
    /// The column.
    pub column: &'static str,
    /// The value the column starts from: a set value, or the creating event's own value;
    /// `None`: what the row holds.
    pub base: Option<&'a Value>,
    /// Values added after the base, in event order.
    pub deltas: Vec<&'a Value>,
}

impl<'a> ColumnWrite<'a> {
    /// Whether PostgreSQL might refuse what this write holds, were it written (in a column
    /// of `table`): adds (an overflow, a type without `+`), or a base its declared type may
    /// not take. False only where the value surely fits.
    pub(crate) fn might_be_refused(&self, declared: &Declared) -> bool {
        !self.deltas.is_empty() || self.base.is_some_and(|v| !declared.column(self.column).surely_fits(v))
    }

    /// Whether adding to this write would sum a chain of steps PostgreSQL takes one by one,
    /// where the sum may differ from the steps: a `numeric(p, s)` rounds and checks each
    /// stored step, so 50 + 60 − 60 is refused in `numeric(4, 2)` one event at a time.
    /// Integers are summed exactly with each step's range checked (see the writer), and
    /// `double precision` and unconstrained `numeric` add in order as the steps would.
    fn is_chained_by_an_add(&self, declared: &Declared) -> bool {
        (self.base.is_some() || !self.deltas.is_empty()) && !declared.column(self.column).chains_exactly()
    }

    fn apply(&mut self, change: &'a Change) {
        match change.op {
            Op::Set => {
                self.base = Some(&change.value);
                self.deltas.clear();
            }
            Op::Add => self.deltas.push(&change.value),
        }
    }
}

/// One coalesced row write.
#[derive(Debug, Clone, PartialEq)]
pub struct RowWrite<'a> {
    /// The table.
    pub table: Table,
    /// The row key (of a child row, or a clear: the aggregate id).
    pub key: &'a str,
    /// A child row's own key (`None` for other tables, and for a clear).
    pub child: Option<&'a str>,
    /// How it is written.
    pub kind: RowKind,
    /// Gated updates: the version the row must still have.
    pub expected: Option<i64>,
    /// Gated tables: the version written. Fan-in: `None`.
    pub version: Option<i64>,
    /// The columns written. An insert's have a base; a merge's have a base (a set) or one
    /// delta (an add), never both.
    pub columns: Vec<ColumnWrite<'a>>,
}

/// One aggregate version move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AggregateWrite {
    /// Aggregate type.
    pub aggregate_type: String,
    /// Aggregate id.
    pub aggregate_id: String,
    /// The version it must still have (`None`: insert it).
    pub expected: Option<i64>,
    /// The version written.
    pub version: i64,
}

/// A planned batch: one outcome per event and the writes that realise them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan<'a> {
    /// One outcome per event, in order.
    pub outcomes: Vec<Outcome>,
    /// Row writes, by table in declaration order, inserts and merges before updates, then
    /// by key.
    pub rows: Vec<RowWrite<'a>>,
    /// Aggregate version moves, by aggregate.
    pub aggregates: Vec<AggregateWrite>,
    /// Aggregates parked or resumed by the plan, with their state at its end (`None`:
    /// resumed), by aggregate.
    pub parks: Vec<((String, String), Option<Parked>)>,
    /// The plan ended early, right after an event that resumed its aggregate (this one), or
    /// right before an event of an aggregate whose parking was stale (the version it waited
    /// for was applied since, on another partition): `outcomes` is shorter than the events.
    /// The caller applies the aggregate's held events in version order, then plans the rest.
    pub unparked: Option<(String, String)>,
    /// The tables where a row is written by more than one event of the plan (its writes
    /// coalesced into one, so that PostgreSQL sees only the row's last state): where a
    /// CHECK constraint could refuse a state between, they are written in [`rounds`].
    pub rewritten: Vec<Table>,
    /// The tables where the plan coalesced away a value PostgreSQL might refuse (a later set
    /// of the same row's column superseded it: a null in a NOT NULL column, a value its type
    /// may not take, adds never summed): written in [`rounds`] too, so that it is refused as
    /// it is one event at a time.
    pub superseded: Vec<Table>,
}

/// An event that cannot be planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("event #{index} of the batch: {problem}")]
pub struct PlanError {
    /// Position in the batch.
    pub index: usize,
    /// What is wrong, naming table and column.
    pub problem: String,
    /// The aggregate's gates disagree: a concurrent writer committed between the reads of
    /// two gates (read again and it passes), or a table was changed outside the engine.
    pub disagreement: bool,
}

/// A gate's version where the batch starts and where it stands now.
type Moves = (Option<i64>, Option<i64>);

/// The planner's per-batch maps, keyed by what the batch's events hold.
type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Plans `events` (in offset order) against `stored` for a projection owning `tables`, whose
/// columns take the values `types` says (`projectionist_postgres::PgTypes`).
pub fn plan<'a>(
    tables: &[Table],
    types: &dyn TypeRules,
    stored: &Stored<'_>,
    events: &'a [(EventRef<'a>, Effect<'a>)],
) -> Result<Plan<'a>, PlanError> {
    plan_rows(tables, types, stored, events, true)
}

/// As [`plan`], with [`Plan::rows`] in no order but one (a row's insert before its update):
/// what a rebuild's fold takes (see [`Fold::absorb`](crate::fold::Fold::absorb)), which
/// writes nothing in the plan's order. Sorting each batch's rows by key is a few percent of
/// what a rebuild spends per event.
pub fn plan_unordered<'a>(
    tables: &[Table],
    types: &dyn TypeRules,
    stored: &Stored<'_>,
    events: &'a [(EventRef<'a>, Effect<'a>)],
) -> Result<Plan<'a>, PlanError> {
    plan_rows(tables, types, stored, events, false)
}

/// Where to cut `events` so that no row of the `checked` tables is written twice within a
/// run: the index each run after the first starts at. Written run after run, every state a
/// row goes through is one PostgreSQL checks, as when events are applied one at a time.
pub fn rounds(events: &[(EventRef<'_>, Effect<'_>)], checked: &[Table]) -> Vec<usize> {
    let mut cuts = Vec::new();
    // Rows written in the round (a child by its aggregate and key), and per table the
    // aggregates with rows written in it: a clear after one of their children drops it
    // (written after the clear, a child is written after it in the round too).
    let mut written: HashSet<(&str, &str, &str)> = HashSet::new();
    let mut parents: HashSet<(&str, &str)> = HashSet::new();
    for (index, (_, effect)) in events.iter().enumerate() {
        let Effect::Writes(writes) = effect else { continue };
        let rows = writes.iter().filter(|w| checked.iter().any(|t| t.same(&w.table))).map(|w| {
            let (key, child) = w.target.keys();
            (w.table.name(), key, child)
        });
        let rows: Vec<(&str, &str, Option<&str>)> = rows.collect();
        let again = |&(t, key, child): &(&str, &str, Option<&str>)| match child {
            Some(child) => written.contains(&(t, key, child)),
            None => parents.contains(&(t, key)),
        };
        if rows.iter().any(again) {
            cuts.push(index);
            written.clear();
            parents.clear();
        }
        for (t, key, child) in rows {
            parents.insert((t, key));
            if let Some(child) = child {
                written.insert((t, key, child));
            }
        }
    }
    cuts
}

/// Whether events of `aggregate_type` are gated by the aggregate's version: when a fan-in,
/// child, custom or [deletable](Table::deletable) table of the projection takes them.
pub fn aggregate_gated(tables: &[Table], aggregate_type: &str) -> bool {
    let by_aggregate = |t: &Table| matches!(t.gate(), Gate::FanIn | Gate::Child | Gate::Custom) || t.is_deletable();
    tables.iter().any(|t| by_aggregate(t) && t.owns(aggregate_type))
}
