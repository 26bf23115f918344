//! A row's writes in a batch, coalesced: the part that creates it and the part that follows,
//! what a delete drops and what must still be checked, and an insert's following writes
//! folded into it where the result cannot differ.

use super::*;
use crate::table::same_text;
use crate::write::Op;

/// A row's writes in the batch: the part that creates it (absolute values) and the part
/// that follows (built on what the row holds).
#[derive(Debug, Default)]
pub(super) struct RowState<'a> {
    pub(super) stored: Option<i64>,
    pub(super) current: Option<i64>,
    /// Gated: the version the row was created at in this batch. Fan-in: the first write.
    pub(super) created: Option<Option<i64>>,
    pub(super) first: Vec<ColumnWrite<'a>>,
    pub(super) rest: Vec<ColumnWrite<'a>>,
    /// Events of the plan that write the row.
    pub(super) writers: u32,
    /// Whether a value PostgreSQL might refuse was superseded (see [`Plan::superseded`]).
    pub(super) superseded: bool,
    /// A fan-in row deleted in the batch (before what `first` and `rest` hold).
    pub(super) deleted: bool,
    /// Deleted or cleared in the batch at least once: what is written after is a new row.
    pub(super) restarted: bool,
    /// Writes dropped by a delete or clear of the row as stored, to be checked against it
    /// ([`RowKind::Check`]).
    pub(super) checks: Vec<ColumnWrite<'a>>,
}

impl<'a> RowState<'a> {
    pub(super) fn column<'p>(part: &'p mut Vec<ColumnWrite<'a>>, column: &'static str) -> &'p mut ColumnWrite<'a> {
        match part.iter().position(|c| same_text(c.column, column)) {
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
    pub(super) fn delete(&mut self, declared: &Declared, merges: bool) {
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
    pub(super) fn take(&mut self, declared: &Declared, changes: &'a [Change], first: bool, absolute: bool) {
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
pub(super) fn compose<'a>(
    mut first: Vec<ColumnWrite<'a>>,
    rest: Vec<ColumnWrite<'a>>,
) -> (Vec<ColumnWrite<'a>>, Vec<ColumnWrite<'a>>) {
    let mut overwritten = Vec::new();
    for c in rest {
        match first.iter_mut().find(|f| same_text(f.column, c.column)) {
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
    column.deltas.is_empty()
        || declared
            .column(column.column)
            .int_range()
            .is_some_and(|r| r.total(base, column.deltas.iter().copied()).is_some())
}

/// Folds what follows a row's insert into the insert where the result cannot depend on
/// what the insert left in the row: a set, or adds to a column the insert wrote. What is
/// left (adds to a column the insert did not write: its default, or NULL) stays an update.
/// `superseded` is set when an insert's value PostgreSQL might refuse is folded away.
pub(super) fn coalesce<'a>(
    declared: &Declared,
    mut first: Vec<ColumnWrite<'a>>,
    rest: Vec<ColumnWrite<'a>>,
    superseded: &mut bool,
) -> (Vec<ColumnWrite<'a>>, Vec<ColumnWrite<'a>>) {
    if rest.iter().any(|c| c.base.is_none() && !first.iter().any(|f| same_text(f.column, c.column))) {
        return (first, rest);
    }
    // An insert without a value for a NOT NULL column that has no default is refused alone,
    // as it is one event at a time: what follows it is not folded in.
    if declared.required().any(|column| !first.iter().any(|f| f.column == column)) {
        return (first, rest);
    }
    for c in rest {
        match first.iter_mut().find(|f| same_text(f.column, c.column)) {
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
