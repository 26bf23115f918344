//! The gates' verdicts (how an event's version stands against its rows and its aggregate's
//! version) and the checks of a write against the projection's declarations.

use super::*;
use crate::table::{check_key, same_text, Gate};
use crate::write::{Target, Write};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
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

pub(super) fn transition(current: Option<i64>, version: i64) -> Verdict {
    match current {
        None if version == 1 => Verdict::Apply,
        None => Verdict::Gap { expected: 1, found: version },
        Some(s) if s == version - 1 => Verdict::Apply,
        Some(s) if s == version => Verdict::Duplicate,
        Some(s) if s > version => Verdict::Stale,
        Some(s) => Verdict::Gap { expected: s + 1, found: version },
    }
}

pub(super) fn upsert(current: Option<i64>, version: i64, written: bool) -> Verdict {
    match current {
        None if written => Verdict::Apply,
        None => Verdict::NoGate,
        Some(s) if s < version => Verdict::Apply,
        Some(s) if s == version => Verdict::Duplicate,
        Some(_) => Verdict::Stale,
    }
}

/// The index of the declared table `write` targets, after checking it fits the declaration.
pub(super) fn check(tables: &[Table], event: &EventRef<'_>, write: &Write) -> Result<usize, String> {
    let name = write.table.name();
    if let Some(e) = &write.error {
        return Err(e.clone());
    }
    let t = tables
        .iter()
        .position(|t| t.same(&write.table))
        .ok_or_else(|| format!("table {name} is written but not declared in tables()"))?;
    check_target(event, write)?;
    check_changes(write)?;
    Ok(t)
}

/// Checks that the table of `write` takes its target (the event's row, a keyed row, a child
/// or a clear), and that the target belongs to the event's own aggregate where it must.
fn check_target(event: &EventRef<'_>, write: &Write) -> Result<(), String> {
    let name = write.table.name();
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
    Ok(())
}

/// Checks what `write` does to its row: a delete its table can keep, and each change to a
/// declared column, once, an add only where the table and the value take one.
fn check_changes(write: &Write) -> Result<(), String> {
    let name = write.table.name();
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
        if write.changes[..i].iter().any(|c| same_text(c.column, change.column)) {
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
    Ok(())
}

/// Checks the `i`th key value of a fan-in row against its column's type: stored (no NUL, not
/// too long), and in the type's one canonical spelling, so that two writes of one row are
/// always one key in a batch (`2026-11-27`, not `2026-11-27 00:00`; `7`, not `07`).
pub(super) fn typed_key(table: &Table, i: usize, key: &str) -> Result<(), String> {
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

pub(super) fn combine(verdicts: &[(&str, Verdict)]) -> Result<Verdict, String> {
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
