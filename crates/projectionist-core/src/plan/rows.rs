//! The planner's pass over a batch: each event classified against the gates its aggregate
//! owns, its writes taken into the states of the rows they write, then the row writes and
//! aggregate version moves that realise them.

use super::coalesce::{coalesce, RowState};
use super::gate::{check, combine, transition, upsert, Verdict};
use super::*;
use crate::table::{check_key, Gate};

pub(super) fn plan_rows<'a>(
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
pub(super) fn row<'s, 'a>(
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
pub(super) fn mark<'s, 'a>(
    marks: &'s mut Map<(&'a str, &'a str), Moves>,
    stored: &Stored,
    key: (&'a str, &'a str),
) -> &'s mut Moves {
    marks.entry(key).or_insert_with(|| {
        let stored = stored.aggregates.get(&(key.0.to_owned(), key.1.to_owned())).copied();
        (stored, stored)
    })
}
