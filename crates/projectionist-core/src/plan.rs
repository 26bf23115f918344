//! Planning a batch: every event classified against the stored versions exactly as the
//! per-event gate would, and each row's applied chain coalesced into as few row writes as
//! keep the result identical to applying the events one at a time. Pure: the Postgres side
//! reads the versions, runs the plan's statements and checks their counts.
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

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use crate::table::{check_key, Gate, Table};
use crate::write::{Change, Op, Target, Write};
use crate::Outcome;

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

/// Versions stored when the batch starts, for every key the batch touches (absent: no row).
#[derive(Debug, Clone, Default)]
pub struct Stored {
    /// Per gated table name: key → version.
    pub rows: Map<&'static str, Versions>,
    /// Per (aggregate type, aggregate id): the aggregate version.
    pub aggregates: HashMap<(String, String), i64>,
    /// `None`: parking is off, a gap is [`Outcome::Gap`]. `Some`: a gap parks its aggregate
    /// (unless `gaps_halt`), a poison event dead-letters it; the aggregates of the batch
    /// parked when it starts.
    pub parked: Option<HashMap<(String, String), Parked>>,
    /// With parking on, a gap is still [`Outcome::Gap`] (only dead letters park).
    pub gaps_halt: bool,
}

/// A table's stored versions, by key (looked up for each event of a batch).
pub type Versions = Map<String, i64>;

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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Apply,
    Duplicate,
    Stale,
    Gap {
        expected: i64,
        found: i64,
    },
    /// An upsert table with no row, and no write for it; or no gate at all: nothing to move.
    NoGate,
}

fn transition(current: Option<i64>, version: i64) -> Verdict {
    match current {
        None if version == 1 => Verdict::Apply,
        None => Verdict::Gap { expected: 1, found: version },
        Some(s) if s == version - 1 => Verdict::Apply,
        Some(s) if s == version => Verdict::Duplicate,
        Some(s) if s > version => Verdict::Stale,
        Some(s) => Verdict::Gap { expected: s + 1, found: version },
    }
}

fn upsert(current: Option<i64>, version: i64, written: bool) -> Verdict {
    match current {
        None if written => Verdict::Apply,
        None => Verdict::NoGate,
        Some(s) if s < version => Verdict::Apply,
        Some(s) if s == version => Verdict::Duplicate,
        Some(_) => Verdict::Stale,
    }
}

/// A row's writes in the batch: the part that creates it (absolute values) and the part
/// that follows (built on what the row holds).
#[derive(Debug, Default)]
struct RowState<'a> {
    stored: Option<i64>,
    current: Option<i64>,
    /// Gated: the version the row was created at in this batch. Fan-in: the first write.
    created: Option<Option<i64>>,
    first: Vec<ColumnWrite<'a>>,
    rest: Vec<ColumnWrite<'a>>,
    /// Events of the plan that write the row.
    writers: u32,
    /// Whether a value PostgreSQL might refuse was superseded (see [`Plan::superseded`]).
    superseded: bool,
    /// A fan-in row deleted in the batch (before what `first` and `rest` hold).
    deleted: bool,
    /// Deleted or cleared in the batch at least once: what is written after is a new row.
    restarted: bool,
    /// Writes dropped by a delete or clear of the row as stored, to be checked against it
    /// ([`RowKind::Check`]).
    checks: Vec<ColumnWrite<'a>>,
}

impl<'a> RowState<'a> {
    fn column<'p>(part: &'p mut Vec<ColumnWrite<'a>>, column: &'static str) -> &'p mut ColumnWrite<'a> {
        match part.iter().position(|c| c.column == column) {
            Some(i) => &mut part[i],
            None => {
                part.push(ColumnWrite { column, base: None, deltas: Vec::new() });
                part.last_mut().expect("just pushed")
            }
        }
    }

    /// Deletes the row: what the batch wrote to it before is dropped, and the next write
    /// starts it again. A dropped value PostgreSQL might refuse is checked where that needs
    /// no write: a value set (then added to in an integer column) is checked here; adds
    /// alone to the row as stored (`merges`: a fan-in or child row, merged into whatever row
    /// is there; else a gated row the batch did not create) become a [`RowKind::Check`]
    /// against the stored row, and integer adds to a new fan-in or child row (its merge
    /// starts from the first add) are summed here. Anything else (adds to a gated row's
    /// default) is superseded (see [`Plan::superseded`]).
    fn delete(&mut self, declared: &Declared, merges: bool) {
        let on_stored = !self.restarted && (merges || self.created.is_none());
        let (composed, overwritten) = compose(std::mem::take(&mut self.first), std::mem::take(&mut self.rest));
        // What a later set replaced: checked here when its values are known, else in rounds.
        for column in overwritten.iter().filter(|c| c.might_be_refused(declared)) {
            let fits = |b| declared.column(column.column).surely_fits(b) && sums_fit(declared, column, b);
            self.superseded |= !column.base.is_some_and(fits);
        }
        for column in composed {
            if !column.might_be_refused(declared) {
                continue;
            }
            // A value set (and added to) is the same whatever the row holds: checked here.
            // Adds alone build on the stored row (checked against it) or, merged into a row
            // not there, start from the first add (checked here).
            let known = column.base.is_some();
            let fits_here = match column.base {
                Some(base) => declared.column(column.column).surely_fits(base) && sums_fit(declared, &column, base),
                None => merges && sums_fit(declared, &column, &Value::from(0)),
            };
            let checked = fits_here || (!known && on_stored && !merges);
            self.superseded |= !checked;
            if checked && !known && on_stored {
                self.checks.push(column);
            }
        }
        self.created = None;
        self.deleted = true;
        self.restarted = true;
    }

    /// Takes `changes` of a row of `table` into the first part (with `absolute`, a column's
    /// first value is its base, as on a row the event creates) or into the part that follows.
    fn take(&mut self, declared: &Declared, changes: &'a [Change], first: bool, absolute: bool) {
        let part = if first { &mut self.first } else { &mut self.rest };
        for change in changes {
            let column = Self::column(part, change.column);
            if absolute && column.base.is_none() && column.deltas.is_empty() {
                column.base = Some(&change.value);
            } else {
                if !self.superseded {
                    self.superseded = match change.op {
                        Op::Set => column.might_be_refused(declared),
                        Op::Add => column.is_chained_by_an_add(declared),
                    };
                }
                column.apply(change);
            }
        }
    }
}

/// A row's writes in the batch, `first` then `rest`, as one write per column, and the
/// writes of `first` that a set in `rest` replaced.
fn compose<'a>(
    mut first: Vec<ColumnWrite<'a>>,
    rest: Vec<ColumnWrite<'a>>,
) -> (Vec<ColumnWrite<'a>>, Vec<ColumnWrite<'a>>) {
    let mut overwritten = Vec::new();
    for c in rest {
        match first.iter_mut().find(|f| f.column == c.column) {
            Some(f) if c.base.is_none() => f.deltas.extend(c.deltas),
            Some(f) => overwritten.push(std::mem::replace(f, c)),
            None => first.push(c),
        }
    }
    (first, overwritten)
}

/// Whether `column`'s adds, summed from `base` one at a time, stay in its integer column's
/// range (no adds: yes, whatever the column).
pub(crate) fn sums_fit(declared: &Declared, column: &ColumnWrite<'_>, base: &Value) -> bool {
    if column.deltas.is_empty() {
        return true;
    }
    let (Some((min, max)), Some(base)) = (declared.column(column.column).int_range(), base.as_i64()) else {
        return false;
    };
    let mut sum = i128::from(base);
    column.deltas.iter().all(|d| match d.as_i64() {
        Some(d) => {
            sum += i128::from(d);
            (min..=max).contains(&i128::from(d)) && (min..=max).contains(&sum)
        }
        None => false,
    })
}

/// A gate's version where the batch starts and where it stands now.
type Moves = (Option<i64>, Option<i64>);

/// The planner's per-batch maps, keyed by what the batch's events hold.
type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Plans `events` (in offset order) against `stored` for a projection owning `tables`.
pub fn plan<'a>(
    tables: &[Table],
    stored: &Stored,
    events: &'a [(EventRef<'a>, Effect<'a>)],
) -> Result<Plan<'a>, PlanError> {
    plan_rows(tables, stored, events, true)
}

/// As [`plan`], with [`Plan::rows`] in no order but one (a row's insert before its update):
/// what a rebuild's fold takes (see [`Fold::absorb`](crate::fold::Fold::absorb)), which
/// writes nothing in the plan's order. Sorting each batch's rows by key is a few percent of
/// what a rebuild spends per event.
pub fn plan_unordered<'a>(
    tables: &[Table],
    stored: &Stored,
    events: &'a [(EventRef<'a>, Effect<'a>)],
) -> Result<Plan<'a>, PlanError> {
    plan_rows(tables, stored, events, false)
}

fn plan_rows<'a>(
    tables: &[Table],
    stored: &Stored,
    events: &'a [(EventRef<'a>, Effect<'a>)],
    ordered_rows: bool,
) -> Result<Plan<'a>, PlanError> {
    // Keyed by what the events hold (no key copied per event); ordered at the end if asked.
    // Per (table, key, child key: "" but in child tables).
    let mut rows: Map<(usize, &'a str, &'a str), RowState<'a>> = Map::default();
    // The aggregates whose children a table's clear removed: (table, aggregate id).
    let mut cleared: Vec<(usize, &'a str)> = Vec::new();
    // The children written, per (table, aggregate id): what a clear drops.
    let mut children: Map<(usize, &'a str), Vec<&'a str>> = Map::default();
    // Per aggregate (type, id): the version stored, and the version it moves to.
    let mut marks: Map<(&'a str, &'a str), Moves> = Map::default();
    let mut outcomes = Vec::with_capacity(events.len());
    // Per aggregate type: the gated tables it owns, whether its aggregate version gates it,
    // and whether that version may skip (kept only for deletable upsert tables).
    let mut owned: Map<&str, (Vec<usize>, bool, bool)> = Map::default();
    // Aggregates parked or resumed in this plan (`None`: resumed).
    let mut parks: Map<(&'a str, &'a str), Option<Parked>> = Map::default();
    // The aggregates parked where the plan starts, looked up by what the events hold.
    let parked_before: Map<(&str, &str), Parked> =
        stored.parked.iter().flatten().map(|((t, i), p)| ((t.as_str(), i.as_str()), *p)).collect();
    let mut unparked = None;
    let declared: Vec<Declared> = tables.iter().map(Declared::of).collect();
    // Per event, kept from one to the next (cleared) so as not to allocate for each.
    let mut targets: Vec<usize> = Vec::new();
    let mut verdicts: Vec<(&str, Verdict)> = Vec::new();

    for (index, (event, effect)) in events.iter().enumerate() {
        let fail = |problem: String| PlanError { index, problem, disagreement: false };
        check_key("aggregate_id", event.aggregate_id).map_err(fail)?;
        check_key("aggregate_type", event.aggregate_type).map_err(fail)?;
        let writes = match effect {
            Effect::Writes(w) => *w,
            Effect::Custom if !aggregate_gated(tables, event.aggregate_type) => {
                return Err(fail(format!(
                    "an event of aggregate type {:?} is applied in apply(), but no custom or fan-in table \
                     declares that type: declare it with aggregate_types(..), so that its duplicates are \
                     told apart",
                    event.aggregate_type
                )));
            }
            Effect::Ignored | Effect::Custom | Effect::Poison => &[],
        };
        targets.clear();
        for w in writes {
            targets.push(check(tables, event, w).map_err(fail)?);
        }

        // Classify against every gate the aggregate owns in this projection.
        let (gated, aggregate_gated, skips) = owned.entry(event.aggregate_type).or_insert_with(|| {
            let gated = (0..tables.len()).filter(|&t| tables[t].is_gated() && tables[t].owns(event.aggregate_type));
            let skips = tables
                .iter()
                .filter(|t| t.owns(event.aggregate_type) && (!t.is_gated() || t.is_deletable()))
                .all(|t| t.is_deletable() && t.gate() == Gate::Upsert);
            (gated.collect(), aggregate_gated(tables, event.aggregate_type), skips)
        });
        let (gated, aggregate_gated, skips) = (gated.as_slice(), *aggregate_gated, *skips);
        let mark_key = (event.aggregate_type, event.aggregate_id);
        // A parked aggregate's events past the version it waits for are held.
        let parked = match parks.get(&mark_key) {
            Some(state) => *state,
            None if parked_before.is_empty() => None,
            None => parked_before.get(&mark_key).copied(),
        };
        // Parked before this plan, but the version it waits for was applied since (it arrived
        // on another partition): the parking is stale. The aggregate resumes here, before
        // this event, so that its held events apply first, then this event is planned again.
        if let Some(p) = parked.filter(|_| !parks.contains_key(&mark_key)) {
            let rows_now = gated.iter().map(|&t| row(&mut rows, stored, tables, t, event.aggregate_id).current);
            let mut gate = rows_now.max().flatten();
            if aggregate_gated {
                gate = gate.max(mark(&mut marks, stored, mark_key).1);
            }
            if gate.is_some_and(|at| at >= p.waiting_for) {
                parks.insert(mark_key, None);
                unparked = Some((event.aggregate_type.to_owned(), event.aggregate_id.to_owned()));
                break;
            }
        }
        let held = |p: Parked| event.version > p.waiting_for || (p.dead_letter && event.version == p.waiting_for);
        if parked.is_some_and(held) {
            outcomes.push(Outcome::Parked);
            continue;
        }
        verdicts.clear();
        let mut rows_at = None;
        for &t in gated {
            let table = &tables[t];
            let state = row(&mut rows, stored, tables, t, event.aggregate_id);
            rows_at = rows_at.max(state.current);
            let verdict = match table.gate() {
                // No row of a deletable table (never written, or deleted): the aggregate's
                // version decides.
                _ if table.is_deletable() && state.current.is_none() => Verdict::NoGate,
                Gate::Transition => transition(state.current, event.version),
                _ => upsert(state.current, event.version, targets.contains(&t)),
            };
            verdicts.push((table.name(), verdict));
        }
        if aggregate_gated {
            let mark = mark(&mut marks, stored, mark_key);
            // Not kept yet (a table declared deletable or fan-in since): where its rows stand.
            let at = mark.1.or(rows_at);
            let verdict = if skips { upsert(at, event.version, true) } else { transition(at, event.version) };
            verdicts.push(("the aggregate's version", verdict));
        }
        let verdict = combine(&verdicts).map_err(|problem| PlanError { index, problem, disagreement: true })?;
        if let (Verdict::Gap { expected, .. }, Some(_), false) = (verdict, &stored.parked, stored.gaps_halt) {
            parks.insert(mark_key, Some(Parked { waiting_for: expected, dead_letter: false }));
            outcomes.push(Outcome::Parked);
            continue;
        }
        if matches!(effect, Effect::Poison) && matches!(verdict, Verdict::Apply | Verdict::NoGate) {
            parks.insert(mark_key, Some(Parked { waiting_for: event.version, dead_letter: true }));
            outcomes.push(Outcome::DeadLettered);
            continue;
        }
        // The version a parked aggregate waits for: it resumes (unless already applied).
        let resumes = parked.is_some_and(|p| p.waiting_for == event.version);
        if resumes {
            parks.insert(mark_key, None);
            unparked = Some((event.aggregate_type.to_owned(), event.aggregate_id.to_owned()));
        }
        let handled = !matches!(effect, Effect::Ignored);
        outcomes.push(match verdict {
            Verdict::Gap { expected, found } => Outcome::Gap { expected, found },
            _ if !handled => Outcome::Ignored,
            Verdict::Apply | Verdict::NoGate => Outcome::Applied,
            Verdict::Duplicate => Outcome::Duplicate,
            Verdict::Stale => Outcome::Stale,
        });
        if !matches!(verdict, Verdict::Apply | Verdict::NoGate) {
            if resumes {
                break;
            }
            continue;
        }

        // Applied: move every gate, coalesce the writes.
        for (&t, (_, v)) in gated.iter().zip(&verdicts) {
            if *v == Verdict::NoGate {
                continue;
            }
            let state = rows.get_mut(&(t, event.aggregate_id, "")).expect("state made above");
            if state.current.is_none() {
                state.created = Some(Some(event.version));
            }
            state.current = Some(event.version);
        }
        if aggregate_gated {
            marks.get_mut(&mark_key).expect("mark made above").1 = Some(event.version);
        }
        for (write, &t) in writes.iter().zip(&targets) {
            let (key, Some(child)) = write.target.keys() else {
                // A clear: the aggregate's children written before it in the batch are
                // dropped (the clear deletes them); what follows makes them again.
                let parent = event.aggregate_id;
                for child in children.get(&(t, parent)).into_iter().flatten() {
                    let state = rows.get_mut(&(t, parent, *child)).expect("indexed when made");
                    state.delete(&declared[t], true);
                    state.deleted = false;
                    state.writers += 1;
                }
                if !cleared.contains(&(t, parent)) {
                    cleared.push((t, parent));
                }
                continue;
            };
            let state = rows.entry((t, key, child)).or_insert_with(|| {
                if tables[t].gate() == Gate::Child {
                    children.entry((t, key)).or_default().push(child);
                }
                RowState::default()
            });
            state.writers += 1;
            if write.delete {
                state.delete(&declared[t], !tables[t].is_gated());
                if tables[t].is_gated() {
                    state.current = None;
                }
            } else if tables[t].is_gated() {
                // A deletable table's row not there: made by this event (the aggregate's
                // version let it apply).
                if state.current.is_none() {
                    (state.created, state.current) = (Some(Some(event.version)), Some(event.version));
                }
                let creating = state.created == Some(Some(event.version));
                state.take(&declared[t], &write.changes, creating, creating);
            } else {
                // A fan-in row's first write in the batch merges into whatever row is there.
                let first = state.created.is_none();
                state.created = Some(None);
                state.take(&declared[t], &write.changes, first, false);
            }
        }
        if resumes {
            break;
        }
    }

    let mut plan = Plan { outcomes, unparked, ..Plan::default() };
    plan.parks = parks.into_iter().map(|((t, i), state)| ((t.to_owned(), i.to_owned()), state)).collect();
    plan.parks.sort_unstable_by(|(a, _), (b, _)| a.cmp(b));
    let mut ordered: Vec<(usize, RowWrite<'a>)> = Vec::with_capacity(rows.len());
    for &(t, key) in &cleared {
        let (table, child, kind) = (tables[t], None, RowKind::Clear);
        ordered.push((t, RowWrite { table, key, child, kind, expected: None, version: None, columns: Vec::new() }));
    }
    for ((t, key, child), state) in rows {
        let table = tables[t];
        if state.writers > 1 && !plan.rewritten.contains(&table) {
            plan.rewritten.push(table);
        }
        let mut superseded = state.superseded;
        let child = (!table.child_key().is_empty()).then_some(child);
        let mut push = |kind, expected, version, columns| {
            ordered.push((t, RowWrite { table, key, child, kind, expected, version, columns }))
        };
        if !state.checks.is_empty() {
            push(RowKind::Check, None, None, state.checks);
        }
        if !table.is_gated() {
            if state.deleted {
                push(RowKind::Delete, None, None, Vec::new());
            }
            if state.created.is_some() {
                push(RowKind::Merge, None, None, state.first);
            }
            if !state.rest.is_empty() {
                push(RowKind::Update, None, None, state.rest);
            }
        } else if state.current != state.stored || state.deleted {
            if state.deleted && state.stored.is_some() {
                push(RowKind::Delete, state.stored, None, Vec::new());
            }
            match state.created {
                // Deleted, and not made again.
                None if state.deleted => {}
                None => push(RowKind::Update, state.stored, state.current, state.rest),
                Some(created) => {
                    let (first, rest) = coalesce(&declared[t], state.first, state.rest, &mut superseded);
                    if rest.is_empty() {
                        push(RowKind::Insert, None, state.current, first);
                    } else {
                        push(RowKind::Insert, None, created, first);
                        push(RowKind::Update, created, state.current, rest);
                    }
                }
            }
        }
        if superseded && !plan.superseded.contains(&table) {
            plan.superseded.push(table);
        }
    }
    // Per table, deletes, then inserts and merges, then the updates that may build on them;
    // then by key, so that concurrent writers lock rows in one order.
    if ordered_rows {
        let step = |kind: RowKind| match kind {
            RowKind::Check => 0,
            RowKind::Clear | RowKind::Delete => 1,
            RowKind::Insert | RowKind::Merge => 2,
            RowKind::Update => 3,
        };
        ordered.sort_unstable_by(|(t, a), (u, b)| {
            (t, step(a.kind), a.kind, &a.key, &a.child).cmp(&(u, step(b.kind), b.kind, &b.key, &b.child))
        });
    } else if ordered.iter().any(|(_, r)| matches!(r.kind, RowKind::Check | RowKind::Clear | RowKind::Delete)) {
        // A row's check, then its delete (or clear), before its merge, whatever the order
        // of the rest.
        ordered.sort_by_key(|(_, r)| match r.kind {
            RowKind::Check => 0,
            RowKind::Clear | RowKind::Delete => 1,
            _ => 2,
        });
    }
    plan.rows = ordered.into_iter().map(|(_, r)| r).collect();
    for ((aggregate_type, aggregate_id), (stored, current)) in marks {
        if let (Some(version), true) = (current, current != stored) {
            let (aggregate_type, aggregate_id) = (aggregate_type.to_owned(), aggregate_id.to_owned());
            plan.aggregates.push(AggregateWrite { aggregate_type, aggregate_id, expected: stored, version });
        }
    }
    plan.aggregates
        .sort_unstable_by(|a, b| (&a.aggregate_type, &a.aggregate_id).cmp(&(&b.aggregate_type, &b.aggregate_id)));
    Ok(plan)
}

/// The state of row `key` of table `t` in the plan: as stored where the plan has not moved it.
fn row<'s, 'a>(
    rows: &'s mut Map<(usize, &'a str, &'a str), RowState<'a>>,
    stored: &Stored,
    tables: &[Table],
    t: usize,
    key: &'a str,
) -> &'s mut RowState<'a> {
    rows.entry((t, key, "")).or_insert_with(|| {
        let stored = stored.rows.get(tables[t].name()).and_then(|m| m.get(key)).copied();
        RowState { stored, current: stored, ..RowState::default() }
    })
}

/// The aggregate version of `key` (type, id) in the plan: where it was stored, where it is.
fn mark<'s, 'a>(
    marks: &'s mut Map<(&'a str, &'a str), Moves>,
    stored: &Stored,
    key: (&'a str, &'a str),
) -> &'s mut Moves {
    marks.entry(key).or_insert_with(|| {
        let stored = stored.aggregates.get(&(key.0.to_owned(), key.1.to_owned())).copied();
        (stored, stored)
    })
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

/// The columns of `table` its declarations make NOT NULL with no default: a row inserted
/// without them is refused, and the planner never completes such an insert with a later
/// event's values.
pub fn required_columns(table: &Table) -> Vec<&'static str> {
    Declared::of(table).required().collect()
}

/// Whether events of `aggregate_type` are gated by the aggregate's version: when a fan-in,
/// child, custom or [deletable](Table::deletable) table of the projection takes them.
pub fn aggregate_gated(tables: &[Table], aggregate_type: &str) -> bool {
    let by_aggregate = |t: &Table| matches!(t.gate(), Gate::FanIn | Gate::Child | Gate::Custom) || t.is_deletable();
    tables.iter().any(|t| by_aggregate(t) && t.owns(aggregate_type))
}

/// Folds what follows a row's insert into the insert where the result cannot depend on
/// what the insert left in the row: a set, or adds to a column the insert wrote. What is
/// left (adds to a column the insert did not write: its default, or NULL) stays an update.
/// `superseded` is set when an insert's value PostgreSQL might refuse is folded away.
fn coalesce<'a>(
    declared: &Declared,
    mut first: Vec<ColumnWrite<'a>>,
    rest: Vec<ColumnWrite<'a>>,
    superseded: &mut bool,
) -> (Vec<ColumnWrite<'a>>, Vec<ColumnWrite<'a>>) {
    if rest.iter().any(|c| c.base.is_none() && !first.iter().any(|f| f.column == c.column)) {
        return (first, rest);
    }
    // An insert without a value for a NOT NULL column that has no default is refused alone,
    // as it is one event at a time: what follows it is not folded in.
    if declared.required().any(|column| !first.iter().any(|f| f.column == column)) {
        return (first, rest);
    }
    for c in rest {
        match first.iter_mut().find(|f| f.column == c.column) {
            Some(f) if c.base.is_none() => {
                *superseded |= f.is_chained_by_an_add(declared);
                f.deltas.extend(c.deltas)
            }
            Some(f) => {
                *superseded |= f.might_be_refused(declared);
                *f = c;
            }
            None => first.push(c),
        }
    }
    (first, Vec::new())
}

/// A table's columns as PostgreSQL takes their values, read from the declarations once per
/// plan (a value written over is checked against its column for each event).
pub(crate) struct Declared(Vec<(&'static str, ColumnType)>);

impl Declared {
    pub(crate) fn of(table: &Table) -> Self {
        Self(
            table
                .column_declarations()
                .iter()
                .map(|(name, declared)| (*name, ColumnType::of(Some(declared))))
                .collect(),
        )
    }

    pub(crate) fn column(&self, column: &str) -> ColumnType {
        self.0.iter().find(|(name, _)| *name == column).map_or(ColumnType::of(None), |(_, ty)| *ty)
    }

    /// The columns a row cannot be inserted without: `NOT NULL` with no default.
    pub(crate) fn required(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.0.iter().filter(|(_, ty)| ty.not_null && !ty.has_default).map(|(name, _)| *name)
    }
}

/// A table's columns as `COPY … FROM STDIN` takes their values: for a bulk load of new rows,
/// where `COPY` stores what the JSON path (`jsonb_populate_record`) stores.
pub struct CopyColumns(Declared);

impl CopyColumns {
    /// `table`'s columns, read from its declarations.
    pub fn of(table: &Table) -> Self {
        Self(Declared::of(table))
    }

    /// Whether `value`, given to `column` as its text (a string's content, a number's or a
    /// boolean's JSON text, `NULL` for null), is stored as the JSON path stores it: the type's
    /// text input reads both. Not for `json` and `jsonb` columns (the JSON path stores the
    /// value, its text normalised), nor for numbers and booleans into text columns (a number's
    /// text there is PostgreSQL's rendering of it), nor for `-0.0` (the JSON path reads it as
    /// a `numeric`, which has no negative zero), nor for types not known here.
    pub fn takes(&self, column: &str, value: &Value) -> bool {
        let known = self.0.column(column).known;
        match value {
            Value::Null => true,
            Value::String(_) => matches!(known, Some(Known::Text | Known::Timestamptz | Known::Uuid)),
            Value::Number(n) if n.as_f64().is_some_and(|f| f == 0.0 && f.is_sign_negative()) => false,
            Value::Number(_) => matches!(
                known,
                Some(Known::BigInt | Known::Int | Known::SmallInt | Known::Float | Known::Numeric { .. })
            ),
            Value::Bool(_) => known == Some(Known::Bool),
            Value::Array(_) | Value::Object(_) => false,
        }
    }
}

/// What a column's declaration says of the values it surely takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ColumnType {
    /// Declared at all (an undeclared column: nothing surely fits).
    declared: bool,
    /// The type, when one of those whose input is known here.
    known: Option<Known>,
    /// `NOT NULL` or `PRIMARY KEY`.
    not_null: bool,
    /// A `DEFAULT`, or a value PostgreSQL makes (`GENERATED`, `IDENTITY`, a `serial` type).
    has_default: bool,
    /// A `CHECK` or `REFERENCES` of its own: no value but `NULL` surely fits.
    constrained: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Known {
    Text,
    Json,
    BigInt,
    Int,
    SmallInt,
    Bool,
    Float,
    /// `numeric(p, s)`: numbers below 10^(p − s) − 1 in magnitude, whatever their rounding.
    Numeric {
        int_digits: u32,
    },
    Timestamptz,
    Uuid,
}

impl ColumnType {
    /// The declaration `declared` (`None`: not declared) classified.
    fn of(declared: Option<&str>) -> Self {
        let Some(declared) = declared else {
            return Self { declared: false, known: None, not_null: false, has_default: false, constrained: false };
        };
        let has =
            |needle: &str| declared.as_bytes().windows(needle.len()).any(|w| w.eq_ignore_ascii_case(needle.as_bytes()));
        // The type: the words before the first of the column's constraints.
        const CONSTRAINTS: [&str; 6] = ["not", "null", "default", "unique", "collate", "generated"];
        const KNOWN: [(&str, Known); 22] = [
            ("text", Known::Text),
            ("varchar", Known::Text),
            ("character varying", Known::Text),
            ("citext", Known::Text),
            ("jsonb", Known::Json),
            ("json", Known::Json),
            ("bigint", Known::BigInt),
            ("int8", Known::BigInt),
            ("integer", Known::Int),
            ("int", Known::Int),
            ("int4", Known::Int),
            ("smallint", Known::SmallInt),
            ("int2", Known::SmallInt),
            ("boolean", Known::Bool),
            ("bool", Known::Bool),
            ("double precision", Known::Float),
            ("float8", Known::Float),
            ("numeric", Known::Float),
            ("decimal", Known::Float),
            ("timestamptz", Known::Timestamptz),
            ("timestamp with time zone", Known::Timestamptz),
            ("uuid", Known::Uuid),
        ];
        let words = declared.split_whitespace().take_while(|w| !CONSTRAINTS.iter().any(|c| w.eq_ignore_ascii_case(c)));
        let is = |name: &str| {
            let mut words = words.clone();
            name.split(' ').all(|n| words.next().is_some_and(|w| w.eq_ignore_ascii_case(n))) && words.next().is_none()
        };
        // `numeric(p, s)` / `decimal(p, s)`: its digits before the point.
        let numeric = || {
            let ty: String = words.clone().collect();
            let lower = ty.to_ascii_lowercase();
            let args = lower.strip_prefix("numeric").or_else(|| lower.strip_prefix("decimal"))?;
            let args = args.strip_prefix('(')?.strip_suffix(')')?;
            let mut args = args.split(',').map(|a| a.trim().parse::<u32>().ok());
            let (precision, scale) = (args.next()??, args.next().unwrap_or(Some(0))?);
            Some(Known::Numeric { int_digits: precision.checked_sub(scale)? })
        };
        Self {
            declared: true,
            known: KNOWN.iter().find(|(name, _)| is(name)).map(|(_, known)| *known).or_else(numeric),
            not_null: has("not null") || has("primary key"),
            has_default: has("default") || has("generated") || has("serial"),
            constrained: has("check") || has("references"),
        }
    }

    /// The range of an integer column (`bigint`, `integer`, `smallint`), where every add is
    /// exact.
    pub(crate) fn int_range(self) -> Option<(i128, i128)> {
        match self.known? {
            Known::BigInt => Some((i64::MIN.into(), i64::MAX.into())),
            Known::Int => Some((i32::MIN.into(), i32::MAX.into())),
            Known::SmallInt => Some((i16::MIN.into(), i16::MAX.into())),
            _ => None,
        }
    }

    /// Whether adds to the column may be summed before PostgreSQL sees them: integers (the
    /// writer checks each step's range) and the types that add in order as the steps would
    /// (`double precision`, unconstrained `numeric`). Not `numeric(p, s)`, which rounds and
    /// checks each stored step, nor a type not known here.
    pub(crate) fn chains_exactly(self) -> bool {
        !self.constrained && matches!(self.known, Some(Known::BigInt | Known::Int | Known::SmallInt | Known::Float))
    }

    /// Whether `value` surely fits the column: what PostgreSQL's input of the type takes
    /// for certain. Anything else might be refused. Called for each value written over, so
    /// nothing here allocates but the JSON check.
    pub(crate) fn surely_fits(self, value: &Value) -> bool {
        if !self.declared {
            return false;
        }
        if value.is_null() {
            return !self.not_null;
        }
        if self.constrained {
            return false;
        }
        let no_nul = |s: &str| !s.contains('\0');
        match (self.known, value) {
            (Some(Known::Text), Value::String(s)) => no_nul(s),
            (Some(Known::Text), Value::Number(_) | Value::Bool(_)) => true,
            (Some(Known::Json), v) => !v.to_string().contains("\\u0000"),
            (Some(Known::BigInt), Value::Number(n)) => n.is_i64(),
            (Some(Known::Int), Value::Number(n)) => n.as_i64().is_some_and(|n| i32::try_from(n).is_ok()),
            (Some(Known::SmallInt), Value::Number(n)) => n.as_i64().is_some_and(|n| i16::try_from(n).is_ok()),
            (Some(Known::Bool), Value::Bool(_)) => true,
            (Some(Known::Float), Value::Number(_)) => true,
            (Some(Known::Numeric { int_digits }), Value::Number(n)) => {
                n.as_f64().is_some_and(|v| v.abs() < 10_f64.powi(int_digits.min(300) as i32) - 1.0)
            }
            (Some(Known::Timestamptz), Value::String(s)) => surely_a_timestamptz(s),
            (Some(Known::Uuid), Value::String(s)) => surely_a_uuid(s),
            _ => false,
        }
    }
}

/// Whether PostgreSQL surely takes `s` as a `uuid`: the canonical form only, 32 hex digits in
/// groups of 8-4-4-4-12 (PostgreSQL refuses forms other parsers take, such as `urn:uuid:…`).
fn surely_a_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter()
            .enumerate()
            .all(|(i, c)| if matches!(i, 8 | 13 | 18 | 23) { *c == b'-' } else { c.is_ascii_hexdigit() })
}

/// Whether PostgreSQL surely takes `s` as a `timestamptz`: an RFC 3339 timestamp of years 1
/// to 9999 (PostgreSQL refuses year 0, which RFC 3339 parsers take), a real date, seconds
/// below 60, an offset within ±14:59. Checked byte by byte: it runs for every such value
/// written over (a projection's `updated_at`, in each event).
fn surely_a_timestamptz(s: &str) -> bool {
    let b = s.as_bytes();
    let number = |from: usize, len: usize| -> Option<u32> {
        let digits = b.get(from..from + len)?;
        digits.iter().try_fold(0_u32, |n, d| d.is_ascii_digit().then(|| n * 10 + u32::from(d - b'0')))
    };
    let at = |i: usize, c: u8| b.get(i) == Some(&c);
    let (Some(year), Some(month), Some(day)) = (number(0, 4), number(5, 2), number(8, 2)) else { return false };
    let (Some(hour), Some(minute), Some(second)) = (number(11, 2), number(14, 2), number(17, 2)) else { return false };
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days = match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    };
    let shape = at(4, b'-') && at(7, b'-') && at(10, b'T') && at(13, b':') && at(16, b':');
    if !shape || year == 0 || !(1..=12).contains(&month) || !(1..=days).contains(&day) {
        return false;
    }
    if hour > 23 || minute > 59 || second > 59 {
        return false;
    }
    // A fraction of up to nine digits, then the offset.
    let mut i = 19;
    if at(i, b'.') {
        let digits = b[i + 1..].iter().take_while(|d| d.is_ascii_digit()).count();
        if !(1..=9).contains(&digits) {
            return false;
        }
        i += 1 + digits;
    }
    match b.get(i) {
        Some(b'Z') => i + 1 == b.len(),
        Some(b'+' | b'-') => {
            let (Some(h), Some(m)) = (number(i + 1, 2), number(i + 4, 2)) else { return false };
            at(i + 3, b':') && i + 6 == b.len() && h <= 14 && m <= 59
        }
        _ => false,
    }
}

/// The index of the declared table `write` targets, after checking it fits the declaration.
fn check(tables: &[Table], event: &EventRef<'_>, write: &Write) -> Result<usize, String> {
    let name = write.table.name();
    if let Some(e) = &write.error {
        return Err(e.clone());
    }
    let t = tables
        .iter()
        .position(|t| t.same(&write.table))
        .ok_or_else(|| format!("table {name} is written but not declared in tables()"))?;
    match (write.table.gate(), &write.target) {
        (Gate::Custom, _) => return Err(format!("table {name} is custom: write it in apply, not project")),
        (Gate::FanIn, Target::Aggregate { .. }) => {
            return Err(format!("table {name} is fan-in: use row(key), not write(event)"))
        }
        (Gate::Child, Target::Aggregate { .. } | Target::Row(_)) => {
            return Err(format!("table {name} holds child rows: use child_row(event, key) or clear(event)"))
        }
        (_, Target::Child { .. } | Target::Children { .. }) if write.table.gate() != Gate::Child => {
            return Err(format!("table {name} is not a child table: child_row and clear take a Table::child"))
        }
        (Gate::Child, Target::Child { parent, .. } | Target::Children { parent })
            if parent != event.aggregate_id || !write.table.owns(event.aggregate_type) =>
        {
            return Err(format!(
                "table {name} holds children of aggregates of type {:?}: an event writes only its own \
                 aggregate's children (given {parent:?} of an event of {:?}/{:?})",
                write.table.aggregate_types_declared(),
                event.aggregate_type,
                event.aggregate_id
            ));
        }
        (Gate::Child, Target::Child { key, .. }) => {
            check_key("child key", key).map_err(|e| format!("table {name}: {e}"))?
        }
        // A fan-in row is gated by its writer's aggregate version, kept only for the types the
        // table declares: an event of another type would be applied again on each redelivery.
        (Gate::FanIn, _) if !write.table.owns(event.aggregate_type) => {
            return Err(format!(
                "table {name} takes events of aggregate types {:?}, not {:?}: declare the type with \
                 aggregate_types(..), so that the event's duplicates are told apart",
                write.table.aggregate_types_declared(),
                event.aggregate_type
            ));
        }
        (Gate::FanIn, Target::Row(_)) if !write.table.child_key().is_empty() => {
            return Err(format!("table {name} is keyed by two columns: use row_keys(a, b), not row(key)"))
        }
        (Gate::FanIn, Target::Keys(..)) if write.table.child_key().is_empty() => {
            return Err(format!("table {name} is keyed by one column: use row(key), not row_keys(a, b)"))
        }
        (Gate::FanIn, Target::Row(key)) => typed_key(&write.table, 0, key).map_err(|e| format!("table {name}: {e}"))?,
        (Gate::FanIn, Target::Keys(first, second)) => {
            typed_key(&write.table, 0, first).map_err(|e| format!("table {name}: {e}"))?;
            typed_key(&write.table, 1, second).map_err(|e| format!("table {name}: {e}"))?;
        }
        (_, Target::Keys(..)) => return Err(format!("table {name}: row_keys(a, b) takes a fan-in table of two keys")),
        (Gate::Upsert | Gate::Transition, Target::Row(_)) => {
            return Err(format!("table {name} is gated by version: use write(event), not row(key)"))
        }
        (Gate::Upsert | Gate::Transition, Target::Aggregate { key, version })
            if key != event.aggregate_id || *version != event.version =>
        {
            return Err(format!(
                "table {name}: write(event) was given {key} v{version}, not the event being projected"
            ));
        }
        (Gate::Upsert | Gate::Transition, _) if !write.table.owns(event.aggregate_type) => {
            return Err(format!(
                "table {name} holds aggregates of type {:?}, not {:?}: an event writes only its own aggregate's row",
                write.table.aggregate_types_declared(),
                event.aggregate_type
            ));
        }
        _ => {}
    }
    if write.delete && write.table.is_gated() && !write.table.is_deletable() {
        return Err(format!(
            "table {name}: delete() of a row of an upsert or transition table needs the table declared \
             .deletable(), so that the deleted row's version is kept (else a replay would make it again)"
        ));
    }
    if write.delete && !write.changes.is_empty() {
        return Err(format!("table {name}: a delete() sets no column (it has {} changes)", write.changes.len()));
    }
    for (i, change) in write.changes.iter().enumerate() {
        if !write.table.has_column(change.column) {
            return Err(format!("table {name} declares no column {:?}", change.column));
        }
        if write.changes[..i].iter().any(|c| c.column == change.column) {
            return Err(format!("table {name}: column {} is changed twice by one write", change.column));
        }
        if change.op == Op::Add {
            if write.table.gate() == Gate::Upsert {
                return Err(format!(
                    "table {name} is state transfer (upsert): set column {}, do not add to it",
                    change.column
                ));
            }
            if !matches!(change.value, Value::Number(_) | Value::String(_) | Value::Null) {
                return Err(format!("add to column {} needs a number, got {}", change.column, change.value));
            }
        }
    }
    Ok(t)
}

/// Checks the `i`th key value of a fan-in row against its column's type: stored (no NUL, not
/// too long), and in the type's one canonical spelling, so that two writes of one row are
/// always one key in a batch (`2026-11-27`, not `2026-11-27 00:00`; `7`, not `07`).
fn typed_key(table: &Table, i: usize, key: &str) -> Result<(), String> {
    let column = [table.key(), table.child_key()][i];
    check_key(&format!("key {column}"), key)?;
    let canonical = match table.key_types()[i] {
        "date" => {
            chrono::NaiveDate::parse_from_str(key, "%Y-%m-%d").is_ok_and(|d| d.format("%Y-%m-%d").to_string() == key)
        }
        "bigint" => key.parse::<i64>().is_ok_and(|n| n.to_string() == key),
        _ => true,
    };
    if canonical {
        Ok(())
    } else {
        Err(format!("key {column} is {key:?}, not a {} in its canonical form", table.key_types()[i]))
    }
}

fn combine(verdicts: &[(&str, Verdict)]) -> Result<Verdict, String> {
    if let Some((_, gap)) = verdicts.iter().find(|(_, v)| matches!(v, Verdict::Gap { .. })) {
        return Ok(*gap);
    }
    let mut constrained = verdicts.iter().filter(|(_, v)| *v != Verdict::NoGate);
    let Some(&(first_name, first)) = constrained.next() else { return Ok(Verdict::NoGate) };
    match constrained.find(|(_, v)| *v != first) {
        None => Ok(first),
        Some((name, other)) => Err(format!(
            "the aggregate's gates disagree ({first_name}: {first:?}, {name}: {other:?}): a table was changed outside \
            the engine, \
             or the projection's tables changed; reset the projection"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned(values: &[&Value]) -> Vec<Value> {
        values.iter().map(|v| (*v).clone()).collect()
    }
    use crate::Envelope;

    const ACC: Table =
        Table::transition("acc", "id").aggregate_type("account").columns(&[("balance", "bigint"), ("owner", "text")]);
    const SNAP: Table = Table::upsert("snap", "id").aggregate_type("account").columns(&[("owner", "text")]);
    const STATS: Table = Table::fan_in("stats", "customer").columns(&[("n", "bigint")]);

    fn env(id: &str, version: i64) -> Envelope<()> {
        Envelope {
            id: uuid::Uuid::nil(),
            aggregate_type: "account".into(),
            aggregate_id: id.into(),
            version,
            event_type: "T".into(),
            occurred_at: chrono::DateTime::from_timestamp(0, 0).unwrap(),
            event: (),
            metadata: None,
        }
    }

    fn r(id: &str, version: i64) -> EventRef<'static> {
        EventRef { aggregate_type: "account", aggregate_id: Box::leak(id.to_owned().into_boxed_str()), version }
    }

    #[test]
    fn only_values_that_surely_fit_their_column_may_be_written_over_unseen() {
        use serde_json::json;
        let fits = |declared: &str, value: Value| ColumnType::of(Some(declared)).surely_fits(&value);
        assert!(fits("text", json!("ann")) && !fits("text", json!("nul\u{0}")));
        assert!(fits("text", Value::Null) && !fits("text NOT NULL", Value::Null));
        assert!(fits("bigint NOT NULL DEFAULT 0", json!(i64::MIN)) && !fits("bigint", json!(1.5)));
        assert!(
            fits("smallint", json!(-32768)) && !fits("smallint", json!(32768)) && !fits("integer", json!(1u64 << 31))
        );
        assert!(fits("numeric", json!(1e300)) && !fits("numeric(10,2)", json!(1e8)), "a precision may overflow");
        assert!(fits("numeric(10,2)", json!(99_999_998.999)) && fits("NUMERIC (12, 2) NOT NULL", json!(-0.125)));
        assert!(
            fits("decimal(4)", json!(9998)) && !fits("decimal(4)", json!(9999.5)) && !fits("numeric(2,3)", json!(0))
        );
        assert!(fits("double precision", json!(0.1)) && !fits("real", json!(0.1)), "real: not known to fit");
        assert!(fits("timestamptz", json!("2026-11-24T20:56:28Z")) && !fits("timestamptz", json!("yesterday")));
        assert!(fits("timestamp with time zone NOT NULL", json!("2026-11-24T20:56:28+01:00")));
        assert!(
            fits("timestamptz", json!("2024-02-29T23:59:59.123456789Z"))
                && fits("timestamptz", json!("0001-01-01T00:00:00-14:59"))
        );
        for refused in [
            "0000-01-01T00:00:00Z",
            "2023-02-29T00:00:00Z",
            "2026-04-31T00:00:00Z",
            "2026-11-24T24:00:00Z",
            "2026-11-24T20:56:60Z",
            "2026-11-24T20:56:28.Z",
            "2026-11-24T20:56:28.1234567890Z",
            "2026-11-24T20:56:28+15:00",
            "2026-11-24T20:56:28",
            "2026-11-24T20:56:28Zx",
            "2026-11-24 20:56:28Z",
        ] {
            assert!(!fits("timestamptz", json!(refused)), "{refused} might be refused");
        }
        assert!(!fits("timestamp", json!("2026-11-24T20:56:28Z")), "only the types known");
        assert!(!fits("varchar(3)", json!("four")) && fits("character varying", json!("four")));
        assert!(fits("jsonb", json!({"a": [1, "b"]})) && !fits("jsonb", json!({"a": "\u{0}"})));
        assert!(!fits("text CHECK (last <> 'x')", json!("y")), "a constraint of its own");
        assert!(!ColumnType::of(None).surely_fits(&json!(1)), "an undeclared column");
        assert!(!ColumnType::of(None).surely_fits(&Value::Null), "an undeclared column");
        assert!(fits("uuid", json!("67e55044-10b1-426f-9247-bb680e5fe0c8")) && !fits("uuid", json!("x")));
        // Forms a UUID parser takes and PostgreSQL's input does not, or that only some take.
        for other in [
            "urn:uuid:67e55044-10b1-426f-9247-bb680e5fe0c8",
            "67e5504410b1426f9247bb680e5fe0c8",
            "{67e55044-10b1-426f-9247-bb680e5fe0c8}",
        ] {
            assert!(!fits("uuid", json!(other)), "{other}");
        }
    }

    #[test]
    fn a_state_between_that_postgres_could_refuse_is_not_coalesced_away() {
        use serde_json::json;
        const T: Table = Table::transition("t", "id").aggregate_type("account").columns(&[
            ("owner", "text"),
            ("x", "text NOT NULL"),
            ("d", "numeric(4,2) NOT NULL DEFAULT 0"),
            ("n", "bigint NOT NULL DEFAULT 0"),
        ]);
        let plan_of = |writes: &[Vec<Write>]| {
            let events: Vec<(EventRef<'_>, Effect<'_>)> =
                writes.iter().enumerate().map(|(i, w)| (r("a", i as i64 + 1), Effect::Writes(w))).collect();
            let p = plan(&[T], &Stored::default(), &events).unwrap();
            (p.rows.iter().map(|r| r.kind).collect::<Vec<_>>(), p.superseded)
        };
        // NOT NULL without a default: v1's insert without `x` is refused alone, v2 not folded in.
        let (kinds, _) =
            plan_of(&[vec![T.write(&env("a", 1)).set("owner", "o")], vec![T.write(&env("a", 2)).set("x", "y")]]);
        assert_eq!(kinds, vec![RowKind::Insert, RowKind::Update]);
        let (kinds, _) =
            plan_of(&[vec![T.write(&env("a", 1)).set("x", "o")], vec![T.write(&env("a", 2)).set("x", "y")]]);
        assert_eq!(kinds, vec![RowKind::Insert], "x set by the insert: folded");
        // numeric(4,2): 50 + 60 overflows one event at a time, whatever follows: in rounds.
        let adds = |first: Write| {
            vec![vec![first], vec![T.write(&env("a", 2)).add("d", 60)], vec![T.write(&env("a", 3)).add("d", -60)]]
        };
        let (_, superseded) = plan_of(&adds(T.write(&env("a", 1)).set("x", "o").set("d", json!(50))));
        assert_eq!(superseded, vec![T], "a numeric(p, s) chain is written step by step");
        let (_, superseded) = plan_of(&adds(T.write(&env("a", 1)).set("x", "o").add("d", json!(50))));
        assert_eq!(superseded, vec![T], "adds after an add too");
        let ints = |c| vec![vec![T.write(&env("a", 1)).set("x", "o").add(c, 5)], vec![T.write(&env("a", 2)).add(c, 6)]];
        assert!(plan_of(&ints("n")).1.is_empty(), "integers: summed, each step's range checked by the writer");
    }

    #[test]
    fn copy_takes_only_values_whose_text_is_stored_as_the_json_path_stores_it() {
        use serde_json::json;
        const T: Table = Table::upsert("t", "id").columns(&[
            ("name", "text"),
            ("at", "timestamptz NOT NULL"),
            ("n", "bigint"),
            ("f", "double precision"),
            ("d", "numeric(10,2)"),
            ("ok", "boolean"),
            ("doc", "jsonb"),
            ("other", "inet"),
        ]);
        let copy = CopyColumns::of(&T);
        for (column, value) in [
            ("name", json!("tab\there")),
            ("name", Value::Null),
            ("at", json!("2026-11-26T07:00:00Z")),
            ("n", json!(-12)),
            ("f", json!(0.1)),
            ("f", json!(0.0)),
            ("d", json!(1.25)),
            ("ok", json!(true)),
        ] {
            assert!(copy.takes(column, &value), "{column} takes {value}");
        }
        for (column, value) in [
            ("name", json!(1.5)),
            ("name", json!(false)),
            ("f", json!(-0.0)),
            ("doc", json!({"a": 1})),
            ("doc", json!("text")),
            ("other", json!("10.0.0.1")),
            ("missing", json!("x")),
            ("n", json!([1])),
        ] {
            assert!(!copy.takes(column, &value), "{column} does not take {value}");
        }
    }

    #[test]
    fn a_value_that_might_be_refused_written_over_names_its_table() {
        let w1 = [ACC.write(&env("a", 1)).set("owner", "nul\u{0}")];
        let w2 = [ACC.write(&env("a", 2)).set("owner", "ann")];
        let w3 = [ACC.write(&env("a", 3)).set("owner", "bob")];
        let events =
            [(r("a", 1), Effect::Writes(&w1)), (r("a", 2), Effect::Writes(&w2)), (r("a", 3), Effect::Writes(&w3))];
        let p = plan(&[ACC], &Stored::default(), &events).unwrap();
        assert_eq!(p.superseded, vec![ACC], "the NUL is written over in the insert");
        let p = plan(&[ACC], &Stored::default(), &events[1..]).unwrap();
        assert!(p.superseded.is_empty(), "ann surely fits text: {p:?}");
        let adds = [ACC.write(&env("a", 2)).add("balance", 5)];
        let set = [ACC.write(&env("a", 3)).set("balance", 0)];
        let mut stored = Stored::default();
        stored.rows.insert("acc", Versions::from_iter([("a".to_owned(), 1)]));
        let events = [(r("a", 2), Effect::Writes(&adds)), (r("a", 3), Effect::Writes(&set))];
        assert_eq!(plan(&[ACC], &stored, &events).unwrap().superseded, vec![ACC], "adds never summed");
    }

    #[test]
    fn rows_written_twice_are_named_and_rounds_cut_before_a_checked_row_is_written_again() {
        let a1 = [ACC.write(&env("a", 1)).add("balance", 1), STATS.row("c").add("n", 1)];
        let b1 = [ACC.write(&env("b", 1)).add("balance", 1), STATS.row("c").add("n", 1)];
        let a2 = [ACC.write(&env("a", 2)).add("balance", -5)];
        let b2 = [ACC.write(&env("b", 2)).add("balance", 5)];
        let events = [
            (r("a", 1), Effect::Writes(&a1)),
            (r("b", 1), Effect::Writes(&b1)),
            (r("a", 2), Effect::Writes(&a2)),
            (r("b", 2), Effect::Writes(&b2)),
            (r("c", 1), Effect::Ignored),
        ];
        let p = plan(&[ACC, STATS], &Stored::default(), &events).unwrap();
        assert!(p.rewritten.len() == 2 && p.rewritten.contains(&ACC) && p.rewritten.contains(&STATS), "{p:?}");
        assert_eq!(rounds(&events, &[ACC]), vec![2], "a and b again: a second round");
        assert_eq!(rounds(&events, &[STATS]), vec![1], "stats/c again at once");
        assert_eq!(rounds(&events, &[ACC, STATS]), vec![1, 3], "stats/c, then b");
        assert!(rounds(&events, &[SNAP]).is_empty(), "an unwritten table cuts nothing");
        let once = plan(&[ACC, STATS], &Stored::default(), &events[..1]).unwrap();
        assert!(once.rewritten.is_empty());
    }

    #[test]
    fn coalesces_a_chain_into_one_write_per_row() {
        let w1 = [ACC.write(&env("a", 1)).set("owner", "ann").add("balance", 100)];
        let w2 = [ACC.write(&env("a", 2)).add("balance", 50)];
        let w3 = [ACC.write(&env("b", 4)).add("balance", -5)];
        let old = [ACC.write(&env("b", 2)).add("balance", 1000)];
        let w4 = [ACC.write(&env("b", 5)).add("balance", -5).set("owner", "bob")];
        let mut stored = Stored::default();
        stored.rows.insert("acc", Versions::from_iter([("b".to_owned(), 3)]));
        let events = [
            (r("a", 1), Effect::Writes(&w1)),
            (r("a", 1), Effect::Writes(&w1)),
            (r("b", 4), Effect::Writes(&w3)),
            (r("a", 2), Effect::Writes(&w2)),
            (r("b", 2), Effect::Writes(&old)),
            (r("b", 5), Effect::Writes(&w4)),
        ];
        let p = plan(&[ACC], &stored, &events).unwrap();
        use Outcome::*;
        assert_eq!(p.outcomes, vec![Applied, Duplicate, Applied, Applied, Stale, Applied]);
        let cols =
            |r: &RowWrite| r.columns.iter().map(|c| (c.column, c.base.cloned(), owned(&c.deltas))).collect::<Vec<_>>();
        assert_eq!(p.rows.len(), 2);
        let a = &p.rows[0];
        assert_eq!((a.key, a.kind, a.expected, a.version), ("a", RowKind::Insert, None, Some(2)));
        assert_eq!(
            cols(a),
            vec![
                ("owner", Some(Value::from("ann")), vec![]),
                ("balance", Some(Value::from(100)), vec![Value::from(50)])
            ],
            "the creating event's add is absolute, the next one a delta folded in SQL"
        );
        let b = &p.rows[1];
        assert_eq!((b.key, b.kind, b.expected, b.version), ("b", RowKind::Update, Some(3), Some(5)));
        assert_eq!(
            cols(b),
            vec![
                ("balance", None, vec![Value::from(-5), Value::from(-5)]),
                ("owner", Some(Value::from("bob")), vec![])
            ]
        );
    }

    #[test]
    fn an_add_to_a_column_the_insert_left_to_its_default_is_an_update() {
        let w1 = [ACC.write(&env("a", 1)).set("owner", "ann")];
        let w2 = [ACC.write(&env("a", 2)).add("balance", 5)];
        let events = [(r("a", 1), Effect::Writes(&w1)), (r("a", 2), Effect::Writes(&w2))];
        let p = plan(&[ACC], &Stored::default(), &events).unwrap();
        let shape = p.rows.iter().map(|r| (r.kind, r.expected, r.version)).collect::<Vec<_>>();
        assert_eq!(shape, vec![(RowKind::Insert, None, Some(1)), (RowKind::Update, Some(1), Some(2))]);
        assert_eq!(owned(&p.rows[1].columns[0].deltas), vec![Value::from(5)]);
    }

    #[test]
    fn an_event_moves_only_the_gates_its_aggregate_type_owns() {
        let customer = EventRef { aggregate_type: "customer", aggregate_id: "a", version: 3 };
        let w = [ACC.write(&env("a", 1)).set("owner", "ann")];
        let events = [(customer, Effect::Ignored), (r("a", 1), Effect::Writes(&w))];
        let p = plan(&[ACC], &Stored::default(), &events).unwrap();
        assert_eq!(p.outcomes, vec![Outcome::Ignored, Outcome::Applied]);
        // Applied in `apply` with no custom table to gate it: its duplicates would apply again.
        assert!(plan(&[ACC], &Stored::default(), &[(customer, Effect::Custom)]).is_err());
        assert_eq!((p.rows.len(), p.rows[0].version), (1, Some(1)));
        let wrong = [ACC.write(&env("a", 3))];
        let err = plan(&[ACC], &Stored::default(), &[(customer, Effect::Writes(&wrong))]).unwrap_err();
        assert!(err.problem.contains("holds aggregates of type [\"account\"], not \"customer\""), "{err}");
    }

    #[test]
    fn an_ignored_event_moves_the_gate_and_a_gap_stops_nothing_else() {
        let w3 = [ACC.write(&env("a", 3)).add("balance", 1)];
        let mut stored = Stored::default();
        stored.rows.insert("acc", Versions::from_iter([("a".to_owned(), 1)]));
        let events = [
            (r("a", 2), Effect::Ignored),
            (r("a", 3), Effect::Writes(&w3)),
            (r("a", 5), Effect::Ignored),
            (r("z", 2), Effect::Writes(&[])),
        ];
        let p = plan(&[ACC], &stored, &events).unwrap();
        assert_eq!(
            p.outcomes,
            vec![
                Outcome::Ignored,
                Outcome::Applied,
                Outcome::Gap { expected: 4, found: 5 },
                Outcome::Gap { expected: 1, found: 2 }
            ]
        );
        assert_eq!((p.rows[0].expected, p.rows[0].version), (Some(1), Some(3)));
    }

    #[test]
    fn a_parking_whose_version_was_applied_elsewhere_resumes_before_the_event() {
        // Parked waiting for 2, but v2 was applied since (on another partition): the plan
        // ends before a4, resuming the aggregate so that its held events apply first.
        let (b1, a4) = ([ACC.write(&env("b", 1))], [ACC.write(&env("a", 4)).add("balance", 4)]);
        let key = ("account".to_owned(), "a".to_owned());
        let mut stored = Stored::default();
        stored.rows.insert("acc", Versions::from_iter([("a".to_owned(), 2)]));
        stored.parked = Some(HashMap::from([(key.clone(), super::Parked { waiting_for: 2, dead_letter: false })]));
        let events = [(r("b", 1), Effect::Writes(&b1)), (r("a", 4), Effect::Writes(&a4))];
        let p = plan(&[ACC], &stored, &events).unwrap();
        assert_eq!(p.outcomes, vec![Outcome::Applied], "b1, then the plan ends before a4");
        assert_eq!((p.unparked, p.parks), (Some(key.clone()), vec![(key.clone(), None)]));
        // Still waiting (the row at 1): a4 is held as before.
        stored.rows.insert("acc", Versions::from_iter([("a".to_owned(), 1)]));
        let p = plan(&[ACC], &stored, &events).unwrap();
        assert_eq!((p.outcomes, p.unparked), (vec![Outcome::Applied, Outcome::Parked], None));
    }

    #[test]
    fn with_parking_a_gap_parks_its_aggregate_and_the_awaited_version_ends_the_plan() {
        let w = |id: &str, v: i64| vec![ACC.write(&env(id, v)).add("balance", v)];
        let (a2, a3, a4, b1) = (w("a", 2), w("a", 3), w("a", 4), w("b", 1));
        let mut stored = Stored { parked: Some(HashMap::new()), ..Stored::default() };
        stored.rows.insert("acc", Versions::from_iter([("a".to_owned(), 1)]));
        let events = [
            (r("a", 3), Effect::Writes(&a3)),
            (r("a", 4), Effect::Writes(&a4)),
            (r("b", 1), Effect::Writes(&b1)),
            (r("a", 2), Effect::Writes(&a2)),
            (r("b", 2), Effect::Writes(&[])),
        ];
        let p = plan(&[ACC], &stored, &events).unwrap();
        use Outcome::*;
        assert_eq!(p.outcomes, vec![Parked, Parked, Applied, Applied], "the plan ends after a2");
        let key = ("account".to_owned(), "a".to_owned());
        assert_eq!(p.unparked, Some(key.clone()));
        assert_eq!(p.parks, vec![(key.clone(), None)], "parked, then resumed within the plan");
        let rows = p.rows.iter().map(|r| (r.key, r.expected, r.version)).collect::<Vec<_>>();
        assert_eq!(rows, vec![("b", None, Some(1)), ("a", Some(1), Some(2))], "a3 and a4 are held, not written");

        // Parked before the plan, waiting for 5: later versions are held, earlier ones
        // classified as ever; a gap below the awaited version lowers it.
        let mut parked = stored.clone();
        parked.rows.insert("acc", Versions::from_iter([("a".to_owned(), 2)]));
        parked.parked = Some(HashMap::from([(key.clone(), super::Parked { waiting_for: 5, dead_letter: false })]));
        let events = [(r("a", 6), Effect::Ignored), (r("a", 3), Effect::Writes(&a3)), (r("a", 5), Effect::Ignored)];
        let p = plan(&[ACC], &parked, &events).unwrap();
        assert_eq!(p.outcomes, vec![Parked, Applied, Parked]);
        let waiting = super::Parked { waiting_for: 4, dead_letter: false };
        assert_eq!((p.unparked, p.parks), (None, vec![(key.clone(), Some(waiting))]));

        // A poison event where it would apply is dead-lettered and parks its aggregate behind
        // it, the same version re-sent included; a version already applied is a duplicate.
        let events = [
            (r("a", 1), Effect::Poison),
            (r("a", 2), Effect::Poison),
            (r("a", 2), Effect::Writes(&a2)),
            (r("a", 3), Effect::Writes(&a3)),
        ];
        let p = plan(&[ACC], &stored, &events).unwrap();
        assert_eq!(p.outcomes, vec![Duplicate, DeadLettered, Parked, Parked]);
        assert!(p.rows.is_empty());
        let behind = super::Parked { waiting_for: 2, dead_letter: true };
        assert_eq!((p.unparked, p.parks), (None, vec![(key, Some(behind))]));

        // Parking off: a gap is a gap.
        let events = [(r("a", 2), Effect::Ignored)];
        let p = plan(&[ACC], &Stored::default(), &events).unwrap();
        assert_eq!((p.outcomes, p.parks.len()), (vec![Gap { expected: 1, found: 2 }], 0));
    }

    #[test]
    fn upserts_skip_versions_and_fan_in_follows_the_aggregate_version() {
        let s1 = [SNAP.write(&env("a", 2)).set("owner", "x"), STATS.row("c1").add("n", 1)];
        let s2 = [SNAP.write(&env("a", 1)).set("owner", "old"), STATS.row("c1").add("n", 1)];
        let events =
            [(r("a", 2), Effect::Writes(&s1)), (r("a", 2), Effect::Writes(&s1)), (r("a", 1), Effect::Writes(&s2))];
        let mut stored = Stored::default();
        stored.aggregates.insert(("account".into(), "a".into()), 1);
        let p = plan(&[SNAP, STATS], &stored, &events).unwrap();
        assert_eq!(p.outcomes, vec![Outcome::Applied, Outcome::Duplicate, Outcome::Stale]);
        assert_eq!(p.rows.len(), 2);
        assert_eq!(
            (p.rows[1].kind, owned(&p.rows[1].columns[0].deltas)),
            (RowKind::Merge, vec![Value::from(1)]),
            "counted once"
        );
        assert_eq!(
            p.aggregates,
            vec![AggregateWrite {
                aggregate_type: "account".into(),
                aggregate_id: "a".into(),
                expected: Some(1),
                version: 2
            }]
        );
    }

    #[test]
    fn a_fan_in_row_deleted_drops_what_came_before_and_starts_again_after() {
        let (set, delete, add) =
            ([STATS.row("c").set("n", 5)], [STATS.row("c").delete()], [STATS.row("c").add("n", 2)]);
        let events = [
            (r("a", 1), Effect::Writes(&set)),
            (r("a", 2), Effect::Writes(&delete)),
            (r("a", 3), Effect::Writes(&add)),
            (r("a", 2), Effect::Writes(&delete)),
        ];
        let p = plan(&[STATS], &Stored::default(), &events).unwrap();
        assert_eq!(p.outcomes[3], Outcome::Stale, "a replayed delete after the re-creation");
        let rows: Vec<(RowKind, Vec<Value>)> =
            p.rows.iter().map(|r| (r.kind, r.columns.iter().flat_map(|c| owned(&c.deltas)).collect())).collect();
        assert_eq!(rows, vec![(RowKind::Delete, vec![]), (RowKind::Merge, vec![Value::from(2)])]);
        assert!(p.superseded.is_empty(), "a set that surely fits, dropped: nothing PostgreSQL would refuse");
        // Deleted last: only the delete is written.
        let p = plan(&[STATS], &Stored::default(), &events[..2]).unwrap();
        assert_eq!(p.rows.iter().map(|r| r.kind).collect::<Vec<_>>(), vec![RowKind::Delete]);
        // An add dropped by the delete might have been refused (an overflow of what the row
        // holds): checked against the row as stored, nothing written, no rounds.
        let events = [(r("a", 1), Effect::Writes(&add)), (r("a", 2), Effect::Writes(&delete))];
        let p = plan(&[STATS], &Stored::default(), &events).unwrap();
        let rows: Vec<(RowKind, Vec<Value>)> =
            p.rows.iter().map(|r| (r.kind, r.columns.iter().flat_map(|c| owned(&c.deltas)).collect())).collect();
        assert_eq!(rows, vec![(RowKind::Check, vec![Value::from(2)]), (RowKind::Delete, vec![])]);
        assert!(p.superseded.is_empty());
        // Once deleted in the batch, the row is new: its adds start from zero, summed here.
        let events = [
            (r("a", 1), Effect::Writes(&delete)),
            (r("a", 2), Effect::Writes(&add)),
            (r("a", 3), Effect::Writes(&delete)),
        ];
        let p = plan(&[STATS], &Stored::default(), &events).unwrap();
        assert_eq!((p.rows.iter().map(|r| r.kind).collect::<Vec<_>>(), p.superseded), (vec![RowKind::Delete], vec![]));
        // An add to the stored row that a later set replaced, then the row deleted: the add
        // alone could overflow what the row holds; no check can stand for it, so in rounds.
        let events = [
            (r("a", 1), Effect::Writes(&add)),
            (r("a", 2), Effect::Writes(&set)),
            (r("a", 3), Effect::Writes(&delete)),
        ];
        assert_eq!(plan(&[STATS], &Stored::default(), &events).unwrap().superseded, vec![STATS]);
        // Unless a step leaves the column's range: in rounds.
        let big = [STATS.row("c").add("n", i64::MAX)];
        let events = [
            (r("a", 1), Effect::Writes(&delete)),
            (r("a", 2), Effect::Writes(&big)),
            (r("a", 3), Effect::Writes(&big)),
            (r("a", 4), Effect::Writes(&delete)),
        ];
        assert_eq!(plan(&[STATS], &Stored::default(), &events).unwrap().superseded, vec![STATS]);
    }

    #[test]
    fn a_row_made_and_deleted_in_the_batch_is_checked_in_memory_where_its_values_are_known() {
        const ORDERS: Table = Table::transition("orders", "id")
            .aggregate_type("account")
            .columns(&[("paid", "bigint"), ("late", "bigint")])
            .deletable();
        let (placed, paid, late, gone) = (
            [ORDERS.write(&env("a", 1)).set("paid", 0)],
            [ORDERS.write(&env("a", 2)).add("paid", 5)],
            [ORDERS.write(&env("a", 3)).add("late", 1)],
            [ORDERS.write(&env("a", 4)).delete()],
        );
        let events = [
            (r("a", 1), Effect::Writes(&placed)),
            (r("a", 2), Effect::Writes(&paid)),
            (r("a", 3), Effect::Writes(&[])),
            (r("a", 4), Effect::Writes(&gone)),
        ];
        let p = plan(&[ORDERS], &Stored::default(), &events).unwrap();
        assert!(p.superseded.is_empty() && p.rows.is_empty(), "0 + 5 fits: nothing to check, nothing written");
        // An add to a column the creating event left to its default: not known here.
        let events = [
            (r("a", 1), Effect::Writes(&placed)),
            (r("a", 2), Effect::Writes(&[])),
            (r("a", 3), Effect::Writes(&late)),
            (r("a", 4), Effect::Writes(&gone)),
        ];
        assert_eq!(plan(&[ORDERS], &Stored::default(), &events).unwrap().superseded, vec![ORDERS]);
    }

    #[test]
    fn a_deletable_row_deleted_keeps_its_version_in_the_aggregate_version_and_a_later_write_makes_it_again() {
        const LEDGER: Table =
            Table::transition("ledger", "id").aggregate_type("account").columns(&[("n", "bigint")]).deletable();
        let (delete, add, none) = ([LEDGER.write(&env("a", 4)).delete()], [LEDGER.write(&env("a", 6)).add("n", 2)], []);
        let events = [
            (r("a", 4), Effect::Writes(&delete)),
            (r("a", 5), Effect::Writes(&none)),
            (r("a", 6), Effect::Writes(&add)),
            (r("a", 2), Effect::Writes(&none)),
        ];
        let mut stored = Stored::default();
        stored.rows.insert("ledger", Versions::from_iter([("a".to_owned(), 3)]));
        let p = plan(&[LEDGER], &stored, &events).unwrap();
        assert_eq!(p.outcomes, vec![Outcome::Applied, Outcome::Applied, Outcome::Applied, Outcome::Stale]);
        let rows: Vec<_> = p.rows.iter().map(|r| (r.kind, r.expected, r.version)).collect();
        assert_eq!(rows, vec![(RowKind::Delete, Some(3), None), (RowKind::Insert, None, Some(6))]);
        assert_eq!((p.aggregates[0].expected, p.aggregates[0].version), (None, 6), "kept from where the row stood");
        // Deleted and not written again: only the delete; v5 moves the aggregate's version alone.
        let p = plan(&[LEDGER], &stored, &events[..2]).unwrap();
        assert_eq!(p.rows.iter().map(|r| r.kind).collect::<Vec<_>>(), vec![RowKind::Delete]);
        assert_eq!(p.aggregates[0].version, 5);
    }

    #[test]
    fn a_clear_drops_the_aggregates_children_written_before_it_and_is_written_first() {
        const LINES: Table =
            Table::child("lines", "account_id", "sku").aggregate_type("account").columns(&[("note", "text")]);
        let e = |v| env("a", v);
        let (w1, w2) = ([LINES.child_row(&e(1), "x").set("note", "one")], [LINES.clear(&e(2))]);
        let w3 = [LINES.child_row(&e(3), "y").set("note", "three")];
        let other = [LINES.child_row(&env("b", 1), "x").set("note", "b")];
        let events = [
            (r("a", 1), Effect::Writes(&w1)),
            (r("b", 1), Effect::Writes(&other)),
            (r("a", 2), Effect::Writes(&w2)),
            (r("a", 3), Effect::Writes(&w3)),
        ];
        let p = plan(&[LINES], &Stored::default(), &events).unwrap();
        let rows: Vec<_> = p.rows.iter().map(|r| (r.kind, r.key, r.child)).collect();
        assert_eq!(
            rows,
            vec![(RowKind::Clear, "a", None), (RowKind::Merge, "a", Some("y")), (RowKind::Merge, "b", Some("x"))],
            "a's x dropped by the clear, b's kept"
        );
        // In rounds, a clear after a child of its aggregate starts a new round (another
        // aggregate's child does not), and a child after the clear stays in its round.
        assert_eq!(rounds(&events, &[LINES]), vec![2]);
    }

    #[test]
    fn declarations_are_enforced_with_the_place_named() {
        let cases: Vec<(Vec<Write>, &str)> = vec![
            (vec![ACC.write(&env("a", 1)).set("nope", 1)], "declares no column \"nope\""),
            (vec![SNAP.write(&env("a", 1)).add("owner", 1)], "do not add"),
            (vec![STATS.write(&env("a", 1))], "use row(key)"),
            (vec![ACC.write(&env("other", 1))], "not the event being projected"),
            (vec![Table::transition("undeclared", "id").aggregate_type("account").write(&env("a", 1))], "not declared"),
            (vec![ACC.write(&env("a", 1)).add("balance", true)], "needs a number"),
            (vec![ACC.write(&env("a", 1)).add("balance", 1).set("balance", 2)], "changed twice"),
            (vec![STATS.row("k".repeat(crate::MAX_KEY_BYTES + 1))], "longer than"),
            (vec![ACC.write(&env("a", 1)).delete()], "declared .deletable()"),
            (vec![STATS.row("c").add("n", 1).delete()], "sets no column"),
            (vec![STATS.child_row(&env("a", 1), "x")], "not a child table"),
            (vec![LINES.row("x")], "holds child rows"),
            (vec![LINES.clear(&env("a", 1)).set("n", 1)], "sets no column"),
            (vec![LINES.child_row(&env("b", 1), "x")], "its own aggregate's children"),
            (vec![DAILY.row("2026-11-27")], "use row_keys(a, b)"),
            (vec![STATS.row_keys("a", "b")], "use row(key)"),
            (vec![DAILY.row_keys("2026-11-27 00:00", "EUR")], "not a date in its canonical form"),
            (vec![DAILY.row_keys("2026-02-30", "EUR")], "not a date"),
            (vec![BY_N.row("07")], "not a bigint in its canonical form"),
            (vec![ACC.row_keys("a", "b")], "takes a fan-in table of two keys"),
        ];
        const DAILY: Table = Table::fan_in_keys("daily", &[("day", "date"), ("currency", "text")]);
        const BY_N: Table = Table::fan_in_keys("by_n", &[("n", "bigint")]);
        const LINES: Table = Table::child("lines", "account_id", "sku").aggregate_type("account");
        for (writes, want) in cases {
            let tables = [ACC, SNAP, STATS, LINES, DAILY, BY_N];
            let err = plan(&tables, &Stored::default(), &[(r("a", 1), Effect::Writes(&writes))]).unwrap_err();
            assert!(err.to_string().contains(want) && err.index == 0, "{err} / {want}");
        }
    }

    #[test]
    fn events_whose_duplicates_could_not_be_told_apart_are_refused() {
        // A fan-in or custom table gates its writers by their aggregate's version, kept for
        // the types it declares: a writer of another type would count each redelivery.
        const NUMS: Table = Table::fan_in("nums", "k").aggregate_type("num").columns(&[("n", "bigint")]);
        const LOG: Table = Table::custom("log", "CREATE TABLE log (id text)").aggregate_type("num");
        let writes = [NUMS.row("k").add("n", 1)];
        let err = plan(&[NUMS], &Stored::default(), &[(r("a", 1), Effect::Writes(&writes))]).unwrap_err();
        assert!(err.to_string().contains("not \"account\""), "{err}");
        let err = plan(&[LOG], &Stored::default(), &[(r("a", 1), Effect::Custom)]).unwrap_err();
        assert!(err.to_string().contains("no custom or fan-in table declares that type"), "{err}");
        // Declared, both are gated: the redelivery is a duplicate.
        let events = [(r("a", 1), Effect::Custom), (r("a", 1), Effect::Custom)];
        let outcomes = plan(&[Table::custom("log", "").aggregate_type("account")], &Stored::default(), &events);
        assert_eq!(outcomes.unwrap().outcomes, vec![Outcome::Applied, Outcome::Duplicate]);
    }

    #[test]
    fn gates_that_disagree_and_keys_that_cannot_be_stored_are_errors() {
        let mut stored = Stored::default();
        stored.rows.insert("acc", Versions::from_iter([("a".to_owned(), 2)]));
        stored.aggregates.insert(("account".into(), "a".into()), 1);
        let err = plan(&[ACC, STATS], &stored, &[(r("a", 2), Effect::Ignored)]).unwrap_err();
        assert!(err.problem.contains("disagree") && err.disagreement, "{err}");
        let err = plan(&[ACC], &Stored::default(), &[(r(&"k".repeat(2000), 1), Effect::Ignored)]).unwrap_err();
        assert!(err.problem.contains("aggregate_id is 2000 bytes long") && !err.disagreement, "{err}");
        let err = plan(&[ACC], &Stored::default(), &[(r("a\0b", 1), Effect::Ignored)]).unwrap_err();
        assert!(err.problem.contains("NUL character"), "{err}");
    }
}
