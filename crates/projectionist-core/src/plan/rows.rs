//! The planner's pass over a batch: each event classified against the gates its aggregate
//! owns, its writes taken into the states of the rows they write, then the row writes and
//! aggregate version moves that realise them.

use std::ops::ControlFlow;

use super::coalesce::{coalesce, RowState};
use super::gate::{check, combine, transition, upsert, Verdict};
use super::row_id::RowId;
use super::*;
use crate::table::{check_key, Gate};

/// Plans `events` through the pass's steps for each event (see [`Pass::event`]), then makes
/// the plan of where the pass ends; `ordered_rows`: [`Plan::rows`] in their full order.
pub(super) fn plan_rows<'a>(
    tables: &[Table],
    types: &dyn TypeRules,
    stored: &Stored<'_>,
    events: &'a [(EventRef<'a>, Effect<'a>)],
    ordered_rows: bool,
) -> Result<Plan<'a>, PlanError> {
    let mut pass = Pass::new(tables, types, stored, events.len());
    // Per aggregate type, what gates its events: outside the pass, so that an event's steps
    // borrow it while they change the pass.
    let mut owned: Map<&str, Owned> = Map::default();
    for (index, (event, effect)) in events.iter().enumerate() {
        let writes = pass.check_writes(index, event, effect)?;
        let owned = owned.entry(event.aggregate_type).or_insert_with(|| Owned::of(tables, event.aggregate_type));
        if pass.event(index, event, effect, writes, owned)?.is_break() {
            break;
        }
    }
    Ok(pass.finish(ordered_rows))
}

/// What gates the events of one aggregate type in this projection.
struct Owned {
    /// The gated tables the type owns.
    gated: Vec<usize>,
    /// Whether its aggregate version gates it.
    aggregate_gated: bool,
    /// Whether that version may skip (kept only for deletable upsert tables).
    skips: bool,
}

impl Owned {
    fn of(tables: &[Table], aggregate_type: &str) -> Self {
        let gated = (0..tables.len()).filter(|&t| tables[t].is_gated() && tables[t].owns(aggregate_type));
        let skips = tables
            .iter()
            .filter(|t| t.owns(aggregate_type) && (!t.is_gated() || t.is_deletable()))
            .all(|t| t.is_deletable() && t.gate() == Gate::Upsert);
        Owned { gated: gated.collect(), aggregate_gated: aggregate_gated(tables, aggregate_type), skips }
    }
}

/// A row of the pass: (table, key, child key: "" but in child tables).
type RowKey<'a> = (usize, &'a str, &'a str);

/// The pass's state. Keyed by what the events hold (no key copied per event), each row and
/// aggregate looked up once per event (its place kept for the event's later steps); ordered
/// at the end if asked.
struct Pass<'a, 't> {
    tables: &'t [Table],
    stored: &'t Stored<'t>,
    declared: Vec<Declared>,
    /// Per gated table, its stored versions (`stored.rows` by table name, looked up once).
    stored_rows: Vec<Option<&'t Versions<'t>>>,
    /// Where each row's state is in `states`.
    rows: Map<RowId<'a>, usize>,
    /// The rows' states, in the order the pass first met them.
    states: Vec<(RowKey<'a>, RowState<'a>)>,
    /// The aggregates whose children a table's clear removed: (table, aggregate id).
    cleared: Vec<(usize, &'a str)>,
    /// The children written, per (table, aggregate id): their places in `states`, what a
    /// clear drops.
    children: Map<(usize, &'a str), Vec<usize>>,
    /// Per aggregate (type, id): the version stored, and the version it moves to.
    marks: Map<(&'a str, &'a str), Moves>,
    outcomes: Vec<Outcome>,
    /// Aggregates parked or resumed in this plan (`None`: resumed).
    parks: Map<(&'a str, &'a str), Option<Parked>>,
    /// The aggregates parked where the plan starts, looked up by what the events hold.
    parked_before: Map<(&'t str, &'t str), Parked>,
    unparked: Option<(String, String)>,
    /// Per event, kept from one to the next (cleared) so as not to allocate for each: the
    /// tables its writes target, and its gates' verdicts (in the order of [`Owned::gated`]).
    targets: Vec<usize>,
    verdicts: Vec<(&'static str, Verdict)>,
    /// Per event: the places in `states` of its rows in [`Owned::gated`]'s tables.
    gated_rows: Vec<usize>,
}

impl<'a, 't> Pass<'a, 't> {
    fn new(tables: &'t [Table], types: &dyn TypeRules, stored: &'t Stored<'t>, events: usize) -> Self {
        let parked_before = stored.parked.iter().flatten().map(|((t, i), p)| ((t.as_str(), i.as_str()), *p)).collect();
        Pass {
            tables,
            stored,
            declared: tables.iter().map(|t| Declared::of(t, types)).collect(),
            stored_rows: tables.iter().map(|t| stored.rows.get(t.name()).filter(|_| t.is_gated())).collect(),
            // About a row per event: room for them at once, not grown (and rehashed) by doubling.
            rows: Map::with_capacity_and_hasher(events, Default::default()),
            states: Vec::with_capacity(events),
            cleared: Vec::new(),
            children: Map::default(),
            marks: Map::default(),
            outcomes: Vec::with_capacity(events),
            parks: Map::default(),
            parked_before,
            unparked: None,
            targets: Vec::new(),
            verdicts: Vec::new(),
            gated_rows: Vec::new(),
        }
    }

    /// The aggregate version of `key` (type, id) in the pass: where it was stored, where it is.
    fn mark(&mut self, key: (&'a str, &'a str)) -> &mut Moves {
        let stored_marks = &self.stored.aggregates;
        self.marks.entry(key).or_insert_with(|| {
            let stored = stored_marks.get(&key).copied();
            (stored, stored)
        })
    }

    /// Checks the event's keys and writes: returns its writes, their tables in `targets`.
    fn check_writes(
        &mut self,
        index: usize,
        event: &EventRef<'a>,
        effect: &Effect<'a>,
    ) -> Result<&'a [Write], PlanError> {
        let fail = |problem: String| PlanError { index, problem, disagreement: false };
        check_key("aggregate_id", event.aggregate_id).map_err(fail)?;
        check_key("aggregate_type", event.aggregate_type).map_err(fail)?;
        let writes = match effect {
            Effect::Writes(w) => *w,
            Effect::Custom if !aggregate_gated(self.tables, event.aggregate_type) => {
                return Err(fail(format!(
                    "an event of aggregate type {:?} is applied in apply(), but no custom or fan-in table \
                     declares that type: declare it with aggregate_types(..), so that its duplicates are \
                     told apart",
                    event.aggregate_type
                )));
            }
            Effect::Ignored | Effect::Custom | Effect::Poison => &[],
        };
        self.targets.clear();
        for w in writes {
            self.targets.push(check(self.tables, event, w).map_err(fail)?);
        }
        Ok(writes)
    }

    /// Plans one event, its `writes` checked (see [`Pass::check_writes`]): held if its aggregate
    /// is parked, else its outcome, and if applied its writes taken. Breaks where the plan
    /// ends: before an event whose aggregate's parking is stale, after one that resumes it.
    fn event(
        &mut self,
        index: usize,
        event: &EventRef<'a>,
        effect: &Effect<'a>,
        writes: &'a [Write],
        owned: &Owned,
    ) -> Result<ControlFlow<()>, PlanError> {
        let mark_key = (event.aggregate_type, event.aggregate_id);
        // A parked aggregate's events past the version it waits for are held.
        let parked = match self.parks.get(&mark_key) {
            Some(state) => *state,
            None if self.parked_before.is_empty() => None,
            None => self.parked_before.get(&mark_key).copied(),
        };
        // Parked before this plan, but the version it waits for was applied since (it arrived
        // on another partition): the parking is stale. The aggregate resumes here, before
        // this event, so that its held events apply first, then this event is planned again.
        if let Some(p) = parked.filter(|_| !self.parks.contains_key(&mark_key)) {
            if self.applied_since(p, event, owned) {
                self.resume(mark_key);
                return Ok(ControlFlow::Break(()));
            }
        }
        let held = |p: Parked| event.version > p.waiting_for || (p.dead_letter && event.version == p.waiting_for);
        if parked.is_some_and(held) {
            self.outcomes.push(Outcome::Parked);
            return Ok(ControlFlow::Continue(()));
        }
        let verdict = self.classify(index, event, owned)?;
        if let (Verdict::Gap { expected, .. }, Some(_), false) = (verdict, &self.stored.parked, self.stored.gaps_halt) {
            self.parks.insert(mark_key, Some(Parked { waiting_for: expected, dead_letter: false }));
            self.outcomes.push(Outcome::Parked);
            return Ok(ControlFlow::Continue(()));
        }
        let applies = matches!(verdict, Verdict::Apply | Verdict::NoGate);
        if matches!(effect, Effect::Poison) && applies {
            self.parks.insert(mark_key, Some(Parked { waiting_for: event.version, dead_letter: true }));
            self.outcomes.push(Outcome::DeadLettered);
            return Ok(ControlFlow::Continue(()));
        }
        // The version a parked aggregate waits for: it resumes (unless already applied).
        let resumes = parked.is_some_and(|p| p.waiting_for == event.version);
        if resumes {
            self.resume(mark_key);
        }
        let handled = !matches!(effect, Effect::Ignored);
        self.outcomes.push(match verdict {
            Verdict::Gap { expected, found } => Outcome::Gap { expected, found },
            _ if !handled => Outcome::Ignored,
            Verdict::Apply | Verdict::NoGate => Outcome::Applied,
            Verdict::Duplicate => Outcome::Duplicate,
            Verdict::Stale => Outcome::Stale,
        });
        if applies {
            self.apply(event, writes, owned);
        }
        Ok(if resumes { ControlFlow::Break(()) } else { ControlFlow::Continue(()) })
    }

    /// Whether the version parking `p` waits for is applied: where the aggregate's gates
    /// stand now (its rows, its aggregate version).
    fn applied_since(&mut self, p: Parked, event: &EventRef<'a>, owned: &Owned) -> bool {
        let mut gate = None;
        for &t in &owned.gated {
            let at = self.place(t, event.aggregate_id, "");
            gate = gate.max(self.states[at].1.current);
        }
        if owned.aggregate_gated {
            gate = gate.max(self.mark((event.aggregate_type, event.aggregate_id)).1);
        }
        gate.is_some_and(|at| at >= p.waiting_for)
    }

    /// The aggregate resumes: the plan ends with it (see [`Plan::unparked`]).
    fn resume(&mut self, mark_key: (&'a str, &'a str)) {
        self.parks.insert(mark_key, None);
        self.unparked = Some((mark_key.0.to_owned(), mark_key.1.to_owned()));
    }

    /// Classifies the event against every gate the aggregate owns in this projection: each
    /// gate's verdict in `verdicts`, and the one they agree on.
    fn classify(&mut self, index: usize, event: &EventRef<'a>, owned: &Owned) -> Result<Verdict, PlanError> {
        self.verdicts.clear();
        self.gated_rows.clear();
        let mut rows_at = None;
        for &t in &owned.gated {
            let table = &self.tables[t];
            let at = self.place(t, event.aggregate_id, "");
            self.gated_rows.push(at);
            let state = &self.states[at].1;
            rows_at = rows_at.max(state.current);
            let verdict = match table.gate() {
                // No row of a deletable table (never written, or deleted): the aggregate's
                // version decides.
                _ if table.is_deletable() && state.current.is_none() => Verdict::NoGate,
                Gate::Transition => transition(state.current, event.version),
                _ => upsert(state.current, event.version, self.targets.contains(&t)),
            };
            self.verdicts.push((table.name(), verdict));
        }
        if owned.aggregate_gated {
            let mark = self.mark((event.aggregate_type, event.aggregate_id));
            // Not kept yet (a table declared deletable or fan-in since): where its rows stand.
            let at = mark.1.or(rows_at);
            let verdict = if owned.skips { upsert(at, event.version, true) } else { transition(at, event.version) };
            self.verdicts.push(("the aggregate's version", verdict));
        }
        combine(&self.verdicts).map_err(|problem| PlanError { index, problem, disagreement: true })
    }

    /// Applied: move every gate, coalesce the writes.
    fn apply(&mut self, event: &EventRef<'a>, writes: &'a [Write], owned: &Owned) {
        for (&at, (_, v)) in self.gated_rows.iter().zip(&self.verdicts) {
            if *v == Verdict::NoGate {
                continue;
            }
            let state = &mut self.states[at].1;
            if state.current.is_none() {
                state.created = Some(Some(event.version));
            }
            state.current = Some(event.version);
        }
        if owned.aggregate_gated {
            let mark_key = (event.aggregate_type, event.aggregate_id);
            self.marks.get_mut(&mark_key).expect("mark made above").1 = Some(event.version);
        }
        for (i, write) in writes.iter().enumerate() {
            let t = self.targets[i];
            match write.target.keys() {
                (key, Some(child)) => {
                    // A gated table's row is the event's own (checked): met in classify.
                    let at = match owned.gated.iter().position(|&g| g == t) {
                        Some(g) if child.is_empty() => self.gated_rows[g],
                        _ => self.place(t, key, child),
                    };
                    self.take(t, at, write, event.version);
                }
                (_, None) => self.clear(t, event.aggregate_id),
            }
        }
    }

    /// The place in `states` of row (`key`, `child`) of table `t`: where the pass has not met
    /// it yet, a new state, at its stored version (a gated row's; none for others).
    fn place(&mut self, t: usize, key: &'a str, child: &'a str) -> usize {
        let (states, children, table) = (&mut self.states, &mut self.children, &self.tables[t]);
        let stored_rows = self.stored_rows[t];
        *self.rows.entry(RowId::new(t, key, child)).or_insert_with(|| {
            let stored = stored_rows.and_then(|m| m.get(key)).copied();
            states.push(((t, key, child), RowState { stored, current: stored, ..RowState::default() }));
            if table.gate() == Gate::Child {
                children.entry((t, key)).or_default().push(states.len() - 1);
            }
            states.len() - 1
        })
    }

    /// A clear: the aggregate's children written before it in the batch are dropped (the
    /// clear deletes them); what follows makes them again.
    fn clear(&mut self, t: usize, parent: &'a str) {
        for &at in self.children.get(&(t, parent)).into_iter().flatten() {
            let state = &mut self.states[at].1;
            state.delete(&self.declared[t], true);
            state.deleted = false;
            state.writers += 1;
        }
        if !self.cleared.contains(&(t, parent)) {
            self.cleared.push((t, parent));
        }
    }

    /// Takes `write`, of an event applied at `version`, into the state of the row of table
    /// `t` at place `at` in `states`.
    fn take(&mut self, t: usize, at: usize, write: &'a Write, version: i64) {
        let (table, declared) = (&self.tables[t], &self.declared[t]);
        let state = &mut self.states[at].1;
        state.writers += 1;
        if write.delete {
            state.delete(declared, !table.is_gated());
            if table.is_gated() {
                state.current = None;
            }
        } else if table.is_gated() {
            // A deletable table's row not there: made by this event (the aggregate's
            // version let it apply).
            if state.current.is_none() {
                (state.created, state.current) = (Some(Some(version)), Some(version));
            }
            let creating = state.created == Some(Some(version));
            state.take(declared, &write.changes, creating, creating);
        } else {
            // A fan-in row's first write in the batch merges into whatever row is there.
            let first = state.created.is_none();
            state.created = Some(None);
            state.take(declared, &write.changes, first, false);
        }
    }

    /// The plan: each event's outcome, the row writes that realise the rows' states and the
    /// aggregate version moves.
    fn finish(self, ordered_rows: bool) -> Plan<'a> {
        let Pass { tables, declared, states, cleared, marks, outcomes, parks, unparked, .. } = self;
        let mut plan = Plan { outcomes, unparked, ..Plan::default() };
        plan.parks = parks.into_iter().map(|((t, i), state)| ((t.to_owned(), i.to_owned()), state)).collect();
        plan.parks.sort_unstable_by(|(a, _), (b, _)| a.cmp(b));
        let mut ordered: Vec<(usize, RowWrite<'a>)> = Vec::with_capacity(states.len());
        for &(t, key) in &cleared {
            let (table, child, kind) = (tables[t], None, RowKind::Clear);
            ordered.push((t, RowWrite { table, key, child, kind, expected: None, version: None, columns: Vec::new() }));
        }
        for ((t, key, child), state) in states {
            let table = tables[t];
            if state.writers > 1 && !plan.rewritten.iter().any(|r| r.same(&table)) {
                plan.rewritten.push(table);
            }
            let child = (!table.child_key().is_empty()).then_some(child);
            let push = |kind, expected, version, columns| {
                ordered.push((t, RowWrite { table, key, child, kind, expected, version, columns }))
            };
            if row_writes(&table, &declared[t], state, push) && !plan.superseded.contains(&table) {
                plan.superseded.push(table);
            }
        }
        plan.rows = order(ordered, ordered_rows);
        for ((aggregate_type, aggregate_id), (stored, current)) in marks {
            if let (Some(version), true) = (current, current != stored) {
                let (aggregate_type, aggregate_id) = (aggregate_type.to_owned(), aggregate_id.to_owned());
                plan.aggregates.push(AggregateWrite { aggregate_type, aggregate_id, expected: stored, version });
            }
        }
        plan.aggregates
            .sort_unstable_by(|a, b| (&a.aggregate_type, &a.aggregate_id).cmp(&(&b.aggregate_type, &b.aggregate_id)));
        plan
    }
}

/// The writes that realise `state`, the state of a row of `table` at the end of the pass,
/// handed to `push` (kind, expected version, version, columns) in order. Returns whether a
/// value PostgreSQL might refuse was superseded (see [`Plan::superseded`]).
fn row_writes<'a>(
    table: &Table,
    declared: &Declared,
    state: RowState<'a>,
    mut push: impl FnMut(RowKind, Option<i64>, Option<i64>, Vec<ColumnWrite<'a>>),
) -> bool {
    let mut superseded = state.superseded;
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
                let (first, rest) = coalesce(declared, state.first, state.rest, &mut superseded);
                if rest.is_empty() {
                    push(RowKind::Insert, None, state.current, first);
                } else {
                    push(RowKind::Insert, None, created, first);
                    push(RowKind::Update, created, state.current, rest);
                }
            }
        }
    }
    superseded
}

/// Orders the plan's row writes: fully if `ordered_rows`, else only as far as a row's
/// writes need.
fn order(mut ordered: Vec<(usize, RowWrite<'_>)>, ordered_rows: bool) -> Vec<RowWrite<'_>> {
    // Per table, deletes, then inserts and merges, then the updates that may build on them;
    // then by key, so that concurrent writers lock rows in one order. What is sorted is each
    // write's place and sort key, not the writes themselves (a table's declaration each).
    if ordered_rows {
        let step = |kind: RowKind| match kind {
            RowKind::Check => 0,
            RowKind::Clear | RowKind::Delete => 1,
            RowKind::Insert | RowKind::Merge => 2,
            RowKind::Update => 3,
        };
        let mut keys: Vec<_> =
            ordered.iter().enumerate().map(|(i, (t, r))| (*t, step(r.kind), r.kind, r.key, r.child, i)).collect();
        keys.sort_unstable();
        let mut writes: Vec<Option<RowWrite<'_>>> = ordered.into_iter().map(|(_, r)| Some(r)).collect();
        return keys.iter().map(|k| writes[k.5].take().expect("each write sorted once")).collect();
    }
    if ordered.iter().any(|(_, r)| matches!(r.kind, RowKind::Check | RowKind::Clear | RowKind::Delete)) {
        // A row's check, then its delete (or clear), before its merge, whatever the order
        // of the rest.
        ordered.sort_by_key(|(_, r)| match r.kind {
            RowKind::Check => 0,
            RowKind::Clear | RowKind::Delete => 1,
            _ => 2,
        });
    }
    ordered.into_iter().map(|(_, r)| r).collect()
}
