//! Planning a batch: every event classified against the stored versions exactly as the
//! per-event gate would, and each row's applied chain coalesced into one row write. Pure:
//! the Postgres side reads the versions, runs the plan's statements and checks their counts.

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

use crate::table::{Gate, Table};
use crate::write::{Change, Op, Target, Write};
use crate::Outcome;

/// The identity of an event being planned.
#[derive(Debug, Clone, Copy)]
pub struct EventRef<'a> {
    /// Its aggregate type (keys the watermark).
    pub aggregate_type: &'a str,
    /// Its aggregate id (keys gated rows and the watermark).
    pub aggregate_id: &'a str,
    /// Its version.
    pub version: i64,
}

/// What an event does, as planned.
#[derive(Debug, Clone, Copy)]
pub enum Effect<'a> {
    /// The projection handles the type and returned these writes (maybe none).
    Writes(&'a [Write]),
    /// The projection does not handle the type: [`Outcome::Ignored`], the gate still moves.
    Unhandled,
}

/// Versions stored when the batch starts, for every key the batch touches (absent: no row).
#[derive(Debug, Clone, Default)]
pub struct Stored {
    /// Per gated table name: key → version.
    pub rows: HashMap<&'static str, HashMap<String, i64>>,
    /// Per (aggregate type, aggregate id): the watermark version.
    pub marks: HashMap<(String, String), i64>,
}

/// One coalesced row write.
#[derive(Debug, Clone, PartialEq)]
pub struct RowWrite {
    /// The table.
    pub table: Table,
    /// The row key.
    pub key: String,
    /// Gated tables: the version the row must still have (`None`: insert it). Fan-in: `None`.
    pub expected: Option<i64>,
    /// Gated tables: the version written. Fan-in: `None`.
    pub version: Option<i64>,
    /// Column changes; on an insert every change is a `Set`.
    pub changes: Vec<Change>,
}

/// One watermark move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkWrite {
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
pub struct Plan {
    /// One outcome per event, in order.
    pub outcomes: Vec<Outcome>,
    /// Row writes, by table in declaration order, then by key.
    pub rows: Vec<RowWrite>,
    /// Watermark moves, by aggregate.
    pub marks: Vec<MarkWrite>,
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
    /// An upsert table with no row, and no write for it: nothing to move.
    Free,
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
        None => Verdict::Free,
        Some(s) if s < version => Verdict::Apply,
        Some(s) if s == version => Verdict::Duplicate,
        Some(_) => Verdict::Stale,
    }
}

#[derive(Debug, Default)]
struct RowState {
    stored: Option<i64>,
    current: Option<i64>,
    changes: Vec<Change>,
    touched: bool,
}

/// Plans `events` (in offset order) against `stored` for a projection owning `tables`.
pub fn plan(tables: &[Table], stored: &Stored, events: &[(EventRef<'_>, Effect<'_>)]) -> Result<Plan, PlanError> {
    let gated: Vec<usize> = (0..tables.len()).filter(|&t| tables[t].is_gated()).collect();
    let fan_in = tables.iter().any(|t| t.gate() == Gate::FanIn);
    let mut rows: BTreeMap<(usize, String), RowState> = BTreeMap::new();
    let mut marks: BTreeMap<(String, String), (Option<i64>, Option<i64>)> = BTreeMap::new();
    let mut outcomes = Vec::with_capacity(events.len());

    for (index, (event, effect)) in events.iter().enumerate() {
        let fail = |problem: String| PlanError { index, problem, disagreement: false };
        let writes = match effect {
            Effect::Writes(w) => *w,
            Effect::Unhandled => &[],
        };
        let targets =
            writes.iter().map(|w| check(tables, event, w).map_err(fail)).collect::<Result<Vec<usize>, _>>()?;

        // Classify against every gate the aggregate owns in this projection.
        let mut verdicts: Vec<(&str, Verdict)> = Vec::with_capacity(gated.len() + 1);
        for &t in &gated {
            let table = &tables[t];
            let state = rows.entry((t, event.aggregate_id.to_owned())).or_insert_with(|| {
                let stored = stored.rows.get(table.name()).and_then(|m| m.get(event.aggregate_id)).copied();
                RowState { stored, current: stored, ..RowState::default() }
            });
            let verdict = match table.gate() {
                Gate::Transition => transition(state.current, event.version),
                _ => upsert(state.current, event.version, targets.contains(&t)),
            };
            verdicts.push((table.name(), verdict));
        }
        let mark_key = (event.aggregate_type.to_owned(), event.aggregate_id.to_owned());
        if fan_in {
            let mark = marks.entry(mark_key.clone()).or_insert_with(|| {
                let stored = stored.marks.get(&mark_key).copied();
                (stored, stored)
            });
            verdicts.push(("the fan-in watermark", transition(mark.1, event.version)));
        }
        let verdict = combine(&verdicts).map_err(|problem| PlanError { index, problem, disagreement: true })?;
        let handled = matches!(effect, Effect::Writes(_));
        outcomes.push(match verdict {
            Verdict::Gap { expected, found } => Outcome::Gap { expected, found },
            _ if !handled => Outcome::Ignored,
            Verdict::Apply | Verdict::Free => Outcome::Applied,
            Verdict::Duplicate => Outcome::Duplicate,
            Verdict::Stale => Outcome::Stale,
        });
        if !matches!(verdict, Verdict::Apply | Verdict::Free) {
            continue;
        }

        // Applied: move every gate, coalesce the writes.
        for (&t, (_, v)) in gated.iter().zip(&verdicts) {
            if *v == Verdict::Free {
                continue;
            }
            let state = rows.get_mut(&(t, event.aggregate_id.to_owned())).expect("state made above");
            state.current = Some(event.version);
            state.touched = true;
        }
        if fan_in {
            marks.get_mut(&mark_key).expect("mark made above").1 = Some(event.version);
        }
        for (write, &t) in writes.iter().zip(&targets) {
            let key = match &write.target {
                Target::Aggregate { key, .. } | Target::Row(key) => key.clone(),
            };
            let state = rows.entry((t, key)).or_default();
            state.touched = true;
            let absolute = tables[t].is_gated() && state.stored.is_none();
            merge(&mut state.changes, &write.changes, absolute)
                .map_err(|p| fail(format!("table {}: {p}", tables[t].name())))?;
        }
    }

    let mut plan = Plan { outcomes, ..Plan::default() };
    for ((t, key), state) in rows {
        let table = tables[t];
        if table.is_gated() {
            if state.current != state.stored {
                plan.rows.push(RowWrite {
                    table,
                    key,
                    expected: state.stored,
                    version: state.current,
                    changes: state.changes,
                });
            }
        } else if state.touched {
            plan.rows.push(RowWrite { table, key, expected: None, version: None, changes: state.changes });
        }
    }
    for ((aggregate_type, aggregate_id), (stored, current)) in marks {
        if let (Some(version), true) = (current, current != stored) {
            plan.marks.push(MarkWrite { aggregate_type, aggregate_id, expected: stored, version });
        }
    }
    Ok(plan)
}

/// The index of the declared table `write` targets, after checking it fits the declaration.
fn check(tables: &[Table], event: &EventRef<'_>, write: &Write) -> Result<usize, String> {
    let name = write.table.name();
    if let Some(e) = &write.error {
        return Err(e.clone());
    }
    let t = tables
        .iter()
        .position(|t| *t == write.table)
        .ok_or_else(|| format!("table {name} is written but not declared in tables()"))?;
    match (write.table.gate(), &write.target) {
        (Gate::Custom, _) => return Err(format!("table {name} is custom: write it in apply, not project")),
        (Gate::FanIn, Target::Aggregate { .. }) => {
            return Err(format!("table {name} is fan-in: use row(key), not write(event)"))
        }
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
        _ => {}
    }
    for change in &write.changes {
        if !write.table.has_column(change.column) {
            return Err(format!("table {name} declares no column {:?}", change.column));
        }
        if change.op == Op::Add && write.table.gate() == Gate::Upsert {
            return Err(format!(
                "table {name} is state transfer (upsert): set column {}, do not add to it",
                change.column
            ));
        }
    }
    Ok(t)
}

fn combine(verdicts: &[(&str, Verdict)]) -> Result<Verdict, String> {
    if let Some((_, gap)) = verdicts.iter().find(|(_, v)| matches!(v, Verdict::Gap { .. })) {
        return Ok(*gap);
    }
    let mut constrained = verdicts.iter().filter(|(_, v)| *v != Verdict::Free);
    let Some(&(first_name, first)) = constrained.next() else { return Ok(Verdict::Free) };
    match constrained.find(|(_, v)| *v != first) {
        None => Ok(first),
        Some((name, other)) => Err(format!(
            "the aggregate's gates disagree ({first_name}: {first:?}, {name}: {other:?}): a table was changed outside the engine, \
             or the projection's tables changed; reset the projection"
        )),
    }
}

/// Folds `new` into `acc`: a set replaces, an add accumulates (onto a set, or as a delta;
/// as an absolute value when the row is being created).
fn merge(acc: &mut Vec<Change>, new: &[Change], absolute: bool) -> Result<(), String> {
    for change in new {
        if change.op == Op::Add && !(change.value.is_number() || change.value.is_null()) {
            return Err(format!("add to column {} needs a number, got {}", change.column, change.value));
        }
        match acc.iter_mut().find(|c| c.column == change.column) {
            Some(prev) if change.op == Op::Set => {
                prev.op = Op::Set;
                prev.value = change.value.clone();
            }
            Some(prev) => {
                prev.value = add(&prev.value, &change.value)
                    .ok_or_else(|| format!("column {}: {} + {} overflows", change.column, prev.value, change.value))?;
            }
            None => acc.push(Change {
                column: change.column,
                op: if absolute { Op::Set } else { change.op },
                value: change.value.clone(),
            }),
        }
    }
    Ok(())
}

/// `a + b` as SQL would compute it: NULL absorbs, integers stay exact.
fn add(a: &Value, b: &Value) -> Option<Value> {
    if a.is_null() || b.is_null() {
        return Some(Value::Null);
    }
    if let (Some(x), Some(y)) = (a.as_i64(), b.as_i64()) {
        return x.checked_add(y).map(Value::from);
    }
    serde_json::Number::from_f64(a.as_f64()? + b.as_f64()?).map(Value::Number)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Envelope;

    const ACC: Table = Table::transition("acc", "id").columns(&[("balance", "bigint"), ("owner", "text")]);
    const SNAP: Table = Table::upsert("snap", "id").columns(&[("owner", "text")]);
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
    fn coalesces_a_chain_into_one_write_per_row() {
        let w1 = [ACC.write(&env("a", 1)).set("owner", "ann").add("balance", 100)];
        let w2 = [ACC.write(&env("a", 2)).add("balance", 50)];
        let w3 = [ACC.write(&env("b", 4)).add("balance", -5)];
        let old = [ACC.write(&env("b", 2)).add("balance", 1000)];
        let w4 = [ACC.write(&env("b", 5)).add("balance", -5).set("owner", "bob")];
        let mut stored = Stored::default();
        stored.rows.insert("acc", HashMap::from([("b".to_owned(), 3)]));
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
        assert_eq!(p.rows.len(), 2);
        let a = &p.rows[0];
        assert_eq!((a.key.as_str(), a.expected, a.version), ("a", None, Some(2)));
        assert_eq!(
            a.changes.iter().map(|c| (c.column, c.op, c.value.clone())).collect::<Vec<_>>(),
            vec![("owner", Op::Set, Value::from("ann")), ("balance", Op::Set, Value::from(150))]
        );
        let b = &p.rows[1];
        assert_eq!((b.key.as_str(), b.expected, b.version), ("b", Some(3), Some(5)));
        assert_eq!(
            b.changes.iter().map(|c| (c.column, c.op, c.value.clone())).collect::<Vec<_>>(),
            vec![("balance", Op::Add, Value::from(-10)), ("owner", Op::Set, Value::from("bob"))]
        );
    }

    #[test]
    fn an_ignored_event_moves_the_gate_and_a_gap_stops_nothing_else() {
        let w3 = [ACC.write(&env("a", 3)).add("balance", 1)];
        let mut stored = Stored::default();
        stored.rows.insert("acc", HashMap::from([("a".to_owned(), 1)]));
        let events = [
            (r("a", 2), Effect::Unhandled),
            (r("a", 3), Effect::Writes(&w3)),
            (r("a", 5), Effect::Unhandled),
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
    fn upserts_skip_versions_and_fan_in_follows_the_watermark() {
        let s1 = [SNAP.write(&env("a", 2)).set("owner", "x"), STATS.row("c1").add("n", 1)];
        let s2 = [SNAP.write(&env("a", 1)).set("owner", "old"), STATS.row("c1").add("n", 1)];
        let events =
            [(r("a", 2), Effect::Writes(&s1)), (r("a", 2), Effect::Writes(&s1)), (r("a", 1), Effect::Writes(&s2))];
        let mut stored = Stored::default();
        stored.marks.insert(("account".into(), "a".into()), 1);
        let p = plan(&[SNAP, STATS], &stored, &events).unwrap();
        assert_eq!(p.outcomes, vec![Outcome::Applied, Outcome::Duplicate, Outcome::Stale]);
        assert_eq!(p.rows.len(), 2);
        assert_eq!(p.rows[1].changes[0].value, Value::from(1), "counted once");
        assert_eq!(
            p.marks,
            vec![MarkWrite {
                aggregate_type: "account".into(),
                aggregate_id: "a".into(),
                expected: Some(1),
                version: 2
            }]
        );
    }

    #[test]
    fn declarations_are_enforced_with_the_place_named() {
        let cases: Vec<(Vec<Write>, &str)> = vec![
            (vec![ACC.write(&env("a", 1)).set("nope", 1)], "declares no column \"nope\""),
            (vec![SNAP.write(&env("a", 1)).add("owner", 1)], "do not add"),
            (vec![STATS.write(&env("a", 1))], "use row(key)"),
            (vec![ACC.write(&env("other", 1))], "not the event being projected"),
            (vec![Table::transition("undeclared", "id").write(&env("a", 1))], "not declared"),
            (vec![ACC.write(&env("a", 1)).add("balance", "x")], "needs a number"),
        ];
        for (writes, want) in cases {
            let err =
                plan(&[ACC, SNAP, STATS], &Stored::default(), &[(r("a", 1), Effect::Writes(&writes))]).unwrap_err();
            assert!(err.to_string().contains(want) && err.index == 0, "{err} / {want}");
        }
    }

    #[test]
    fn gates_that_disagree_are_an_error() {
        let mut stored = Stored::default();
        stored.rows.insert("acc", HashMap::from([("a".to_owned(), 2)]));
        stored.marks.insert(("account".into(), "a".into()), 1);
        let err = plan(&[ACC, STATS], &stored, &[(r("a", 2), Effect::Unhandled)]).unwrap_err();
        assert!(err.problem.contains("disagree") && err.disagreement, "{err}");
    }
}
