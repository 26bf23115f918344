//! One row's writes held by a fold: what it writes over the row as stored, in the order
//! PostgreSQL is to see them (a check of dropped adds, a delete, an insert or merge, an
//! update), and how a later plan's write of the row folds into them.

use serde_json::Value;

use crate::plan::{sums_fit, ColumnWrite, Declared, RowKind, RowWrite};
use crate::Table;

/// [`ColumnWrite`], owned.
#[derive(Debug, Clone)]
pub(super) struct Column {
    pub(super) column: &'static str,
    pub(super) base: Option<Value>,
    pub(super) deltas: Vec<Value>,
}

impl Column {
    pub(super) fn of(declared: &Declared, c: &ColumnWrite<'_>) -> Self {
        let deltas = c.deltas.iter().map(|d| (*d).clone()).collect();
        let mut column = Self { column: c.column, base: c.base.cloned(), deltas };
        column.settle(declared);
        column
    }

    /// Keeps integer adds small: added into an integer base where no step leaves the column's
    /// range (the value one event at a time would reach), else a long chain compacted.
    fn settle(&mut self, declared: &Declared) {
        if self.deltas.is_empty() {
            return;
        }
        let range = declared.column(self.column).int_range();
        match range.zip(self.base.as_ref()).and_then(|(range, base)| range.total(base, &self.deltas)) {
            Some(total) => {
                self.base = Some(Value::from(total));
                self.deltas.clear();
            }
            None => compact(declared, self),
        }
    }

    /// Starts adds from zero, as a merge into no row does, where the column is an integer
    /// type and every step fits it: the row's value then stands on its own (a new row's).
    fn start_from_zero(&mut self, declared: &Declared) {
        if self.base.is_some() || self.deltas.is_empty() {
            return;
        }
        let range = declared.column(self.column).int_range();
        if let Some(total) = range.and_then(|range| range.total(&Value::from(0), &self.deltas)) {
            self.base = Some(Value::from(total));
            self.deltas.clear();
        }
    }

    /// Takes `c` in place of what is held, as [`Column::of`] would, keeping a string's room
    /// (a column set by every event, such as an `updated_at`, then costs no allocation).
    fn replace(&mut self, declared: &Declared, c: &ColumnWrite<'_>) {
        match (&mut self.base, c.base) {
            (Some(Value::String(held)), Some(Value::String(new))) => held.clone_from(new),
            (base, new) => *base = new.cloned(),
        }
        self.deltas.clear();
        self.deltas.extend(c.deltas.iter().map(|d| (*d).clone()));
        self.settle(declared);
    }

    /// Folds `c`, written after what is held: a set replaces it, adds follow it.
    fn take(&mut self, declared: &Declared, c: &ColumnWrite<'_>) {
        if c.base.is_some() {
            return self.replace(declared, c);
        }
        self.deltas.extend(c.deltas.iter().map(|d| (*d).clone()));
        self.settle(declared);
    }

    pub(super) fn write(&self) -> ColumnWrite<'_> {
        ColumnWrite { column: self.column, base: self.base.as_ref(), deltas: self.deltas.iter().collect() }
    }
}

/// One write of the row: an insert (a fan-in or child row: a merge) or an update.
#[derive(Debug, Clone)]
pub(super) struct Part {
    /// A gated update: the version the row must still have.
    pub(super) expected: Option<i64>,
    /// Gated: the version written.
    pub(super) version: Option<i64>,
    pub(super) columns: Vec<Column>,
}

impl Part {
    fn of(declared: &Declared, row: &RowWrite<'_>) -> Self {
        let columns = row.columns.iter().map(|c| Column::of(declared, c)).collect();
        Self { expected: row.expected, version: row.version, columns }
    }

    /// Whether a later write of the row can fold into this insert or merge: each column it
    /// writes is set, or added to a column this part sets (the result does not depend on
    /// what the row held before, nor on the defaults), as the planner folds within a batch.
    fn takes(&self, row: &RowWrite<'_>) -> bool {
        row.columns
            .iter()
            .all(|c| c.base.is_some() || self.columns.iter().any(|h| h.column == c.column && h.base.is_some()))
    }

    fn take(&mut self, declared: &Declared, row: &RowWrite<'_>) {
        for c in &row.columns {
            match self.columns.iter_mut().find(|h| h.column == c.column) {
                Some(held) => held.take(declared, c),
                None => self.columns.push(Column::of(declared, c)),
            }
        }
        if row.version.is_some() {
            self.version = row.version;
        }
    }
}

/// A row's writes held, in the order they are written.
#[derive(Debug, Default, Clone)]
pub(super) struct Pending {
    /// Adds a delete dropped, evaluated against the row as stored ([`RowKind::Check`]).
    pub(super) check: Vec<Column>,
    /// The row as stored deleted first: gated, at the version it must still have.
    pub(super) delete: Option<Option<i64>>,
    /// The row created (gated), or merged into whatever row is there (fan-in, child).
    pub(super) insert: Option<Part>,
    /// The row changed after that, or as stored.
    pub(super) update: Option<Part>,
    /// Adds a plan writes and then drops with the delete that follows in the same plan
    /// (its [`RowKind::Check`]): built on what is held, checked with it.
    pub(super) dropping: Vec<Column>,
    /// Deleted (or cleared) while held: what follows builds on no stored row.
    pub(super) restarted: bool,
    /// A child row of an aggregate the tables held nothing of (see
    /// [`Fold::from_nothing`](super::Fold::from_nothing)): no row is stored, so its checks
    /// and deletes there, which would find nothing, are not written, and its adds start from
    /// zero, as a merge into no row's do. Written as a new row once every value stands on its
    /// own ([`RowKind::Insert`]).
    pub(super) fresh: bool,
}

impl Pending {
    /// A gated row's version once written: `Some(None)` when the fold has deleted it, `None`
    /// when the fold writes nothing of it (the table tells).
    pub(super) fn state(&self) -> Option<Option<i64>> {
        match self.update.as_ref().or(self.insert.as_ref()) {
            Some(part) => Some(part.version),
            None if self.restarted => Some(None),
            None => None,
        }
    }

    /// The part a gated update of the row folds into: its insert, when the update takes
    /// nothing from the row before it; else its update.
    pub(super) fn merges_into(&self, row: &RowWrite<'_>) -> Option<&Part> {
        if self.update.is_none() && self.insert.as_ref().is_some_and(|i| i.takes(row)) {
            self.insert.as_ref()
        } else {
            self.update.as_ref()
        }
    }

    /// Folds a write of the row in (an insert, a merge or an update planned against the
    /// version the fold says).
    pub(super) fn write(&mut self, declared: &Declared, row: &RowWrite<'_>) {
        if row.kind == RowKind::Insert {
            self.insert = Some(Part::of(declared, row));
            return;
        }
        let into_insert = self.update.is_none() && self.insert.as_ref().is_some_and(|i| i.takes(row));
        match (into_insert, &mut self.insert, &mut self.update) {
            (true, Some(insert), _) => insert.take(declared, row),
            (_, _, Some(update)) => update.take(declared, row),
            // A fan-in or child row's first write: merged into whatever row is there.
            (_, insert @ None, update) if row.kind == RowKind::Merge && update.is_none() => {
                let mut part = Part::of(declared, row);
                if self.fresh {
                    part.columns.iter_mut().for_each(|c| c.start_from_zero(declared));
                }
                *insert = Some(part);
            }
            (_, _, update) => *update = Some(Part::of(declared, row)),
        }
    }

    /// The adds a delete of the row would drop that must be evaluated against the row as
    /// stored, as the planner keeps them ([`RowKind::Check`]); `None` where a dropped value
    /// cannot be checked so (it might be refused one event at a time): the plan is not folded.
    /// `merges`: a fan-in or child row (merged into whatever row is there).
    pub(super) fn dropped_checks(&self, declared: &Declared, merges: bool) -> Option<Vec<Column>> {
        self.dropped_checks_with(declared, merges, &[])
    }

    /// As [`Pending::dropped_checks`], with `more` adds written after what is held.
    pub(super) fn dropped_checks_with(
        &self,
        declared: &Declared,
        merges: bool,
        more: &[ColumnWrite<'_>],
    ) -> Option<Vec<Column>> {
        let mut composed: Vec<Column> = self.insert.iter().flat_map(|p| p.columns.iter().cloned()).collect();
        let more = more.iter().map(|c| Column {
            column: c.column,
            base: c.base.cloned(),
            deltas: c.deltas.iter().map(|d| (*d).clone()).collect(),
        });
        let after: Vec<Column> = self
            .update
            .iter()
            .flat_map(|p| p.columns.iter().cloned())
            .chain(self.dropping.iter().cloned())
            .chain(more)
            .collect();
        for c in &after {
            match composed.iter_mut().find(|h| h.column == c.column) {
                Some(held) if c.base.is_none() => held.deltas.extend(c.deltas.iter().cloned()),
                Some(held) => *held = c.clone(),
                None => composed.push(c.clone()),
            }
        }
        let on_stored = !self.restarted && (merges || self.insert.is_none());
        let mut checks = Vec::new();
        for column in composed.into_iter().filter(|c| !c.deltas.is_empty()) {
            let fits = match &column.base {
                Some(base) => sums_fit(declared, &column.write(), base),
                None if on_stored => {
                    checks.push(column);
                    continue;
                }
                // Merged into no row: it starts from the first add.
                None if merges => sums_fit(declared, &column.write(), &Value::from(0)),
                // Adds to a gated row's default.
                None => false,
            };
            if !fits {
                return None;
            }
        }
        Some(checks)
    }

    /// Deletes the row (see [`Pending::dropped_checks`], which must have allowed it).
    pub(super) fn delete(&mut self, declared: &Declared, merges: bool, expected: Option<i64>) {
        let checks = self.dropped_checks(declared, merges).expect("allowed before");
        self.check.extend(checks);
        self.dropping.clear();
        if self.delete.is_none() && (merges || self.insert.is_none()) {
            // Gated: the row as stored, at the version its update (or the plan) expected.
            self.delete = Some(self.update.as_ref().map_or(expected, |u| u.expected));
        }
        (self.insert, self.update, self.restarted) = (None, None, true);
    }

    /// The row's writes of `step` (0: checks; 1: deletes; 2: inserts and merges; 3: updates)
    /// into `out`, as row `key` (and `child`) of `table`.
    pub(super) fn writes<'a>(
        &'a self,
        step: u8,
        (table, key, child): (Table, &'a str, Option<&'a str>),
        out: &mut Vec<RowWrite<'a>>,
    ) {
        let columns = |p: &'a [Column]| p.iter().map(Column::write).collect();
        let row = |kind, expected, version, columns| RowWrite { table, key, child, kind, expected, version, columns };
        match (step, &self.delete, &self.insert, &self.update) {
            (0, ..) if !self.check.is_empty() && !self.fresh => {
                out.push(row(RowKind::Check, None, None, columns(&self.check)))
            }
            (1, Some(expected), ..) if !self.fresh => out.push(row(RowKind::Delete, *expected, None, Vec::new())),
            (2, _, Some(p), _) => {
                let stands_alone = self.fresh && p.columns.iter().all(|c| c.deltas.is_empty());
                let kind = if table.is_gated() || stands_alone { RowKind::Insert } else { RowKind::Merge };
                out.push(row(kind, p.expected, p.version, columns(&p.columns)));
            }
            (3, _, _, Some(p)) => out.push(row(RowKind::Update, p.expected, p.version, columns(&p.columns))),
            _ => {}
        }
    }
}

/// Keeps a long chain of integer adds short: `[lo, hi − lo, sum − hi]` passes through the
/// same lowest and highest running sums and ends at the same sum, so added to any base it
/// overflows exactly where the chain would, and ends at the same value. Only where the
/// column is an integer type and every value, before and after, fits it.
fn compact(declared: &Declared, column: &mut Column) {
    if column.deltas.len() <= 3 {
        return;
    }
    let Some(range) = declared.column(column.column).int_range() else { return };
    let Some(s) = range.sums(&column.deltas) else { return };
    let steps = [s.lo, s.hi - s.lo, s.sum - s.hi];
    if steps.iter().all(|&n| range.contains(n)) {
        column.deltas = steps.iter().map(|&n| Value::from(n as i64)).collect();
    }
}

#[cfg(test)]
mod tests {
    use super::{compact, Column, Declared, Table};
    use crate::test_types::TestTypes;
    use serde_json::{json, Value};

    const T: Table = Table::transition("t", "id").aggregate_type("a").columns(&[
        ("n", "bigint NOT NULL DEFAULT 0"),
        ("s", "smallint"),
        ("f", "double precision"),
    ]);

    fn column(name: &'static str, deltas: &[Value]) -> Column {
        Column { column: name, base: None, deltas: deltas.to_vec() }
    }

    /// The lowest and highest running sums and the sum of `deltas`.
    fn extremes(deltas: &[Value]) -> (i64, i64, i64) {
        let (mut lo, mut hi, mut sum) = (i64::MAX, i64::MIN, 0);
        for d in deltas {
            sum += d.as_i64().unwrap();
            (lo, hi) = (lo.min(sum), hi.max(sum));
        }
        (lo, hi, sum)
    }

    #[test]
    fn a_chain_of_integer_adds_is_kept_as_its_running_extremes() {
        let declared = Declared::of(&T, &TestTypes);
        let deltas: Vec<Value> = [5, -12, 40, 3, -70, 8].into_iter().map(Value::from).collect();
        let mut c = column("n", &deltas);
        compact(&declared, &mut c);
        assert_eq!(c.deltas.len(), 3);
        assert_eq!(extremes(&c.deltas), extremes(&deltas), "same lowest, highest and final sums");
        // A float column, or a value the column does not take: kept as they are.
        let mut f = column("f", &deltas);
        compact(&declared, &mut f);
        assert_eq!(f.deltas, deltas);
        let wide = [json!(1), json!(2), json!(40_000), json!(-3)];
        let mut s = column("s", &wide);
        compact(&declared, &mut s);
        assert_eq!(s.deltas, wide, "40,000 does not fit a smallint: refused as it would be");
        // Compacted steps that would not fit the column: kept as they are.
        let swing = [json!(-30_000), json!(30_000), json!(30_000), json!(-30_000)];
        let mut s = column("s", &swing);
        compact(&declared, &mut s);
        assert_eq!(s.deltas, swing);
    }
}
