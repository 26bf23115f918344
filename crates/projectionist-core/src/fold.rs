//! Folding the plans of many batches into one write per row: a rebuild's bulk load, where
//! the events of one aggregate lie far apart in the stream and a batch sees each row about
//! once. Pure, like the planner: the Postgres side reads versions through it, hands it each
//! batch's plan, and writes what it holds in one go.
//!
//! A plan is folded only when the result cannot differ from writing it batch after batch:
//! its events applied, were duplicates, stale or ignored (no gap, nothing parked or
//! dead-lettered, no aggregate version, no fan-in row), every value it writes surely fits
//! its column, and folding writes over no value PostgreSQL might refuse. Otherwise
//! [`Fold::absorb`] refuses it and changes nothing: the caller writes the fold, then the
//! batch, as before. (An add may still overflow where the fold is written: the caller then
//! writes the batches again one by one.) The tables folded are the gated ones (upsert,
//! transition) without CHECK constraints: a row's states between are not checked.

use std::collections::HashMap;

use serde_json::Value;

use crate::plan::{ColumnWrite, Declared, Plan, RowKind, RowWrite};
use crate::{Outcome, Table};

/// Row writes of many plans, folded: per row, the insert that created it here (if it did)
/// and one update carrying every later change.
#[derive(Debug, Default)]
pub struct Fold {
    /// Per table name (a projection has a few: found by a scan, most often by the name's
    /// address alone), per key. Cleared, the maps keep their room for the next fold.
    rows: Vec<(&'static str, HashMap<String, Pending, Hasher>)>,
    len: usize,
}

type Hasher = foldhash::fast::RandomState;

#[derive(Debug, Default)]
struct Pending {
    insert: Option<Part>,
    update: Option<Part>,
}

impl Pending {
    /// The row's version once written.
    fn version(&self) -> Option<i64> {
        self.update.as_ref().or(self.insert.as_ref()).map(|p| p.version)
    }
}

#[derive(Debug)]
struct Part {
    expected: Option<i64>,
    version: i64,
    columns: Vec<Column>,
}

/// [`ColumnWrite`], owned.
#[derive(Debug)]
struct Column {
    column: &'static str,
    base: Option<Value>,
    deltas: Vec<Value>,
}

impl Column {
    fn of(declared: &Declared, c: &ColumnWrite<'_>) -> Self {
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
        if let (Some((min, max)), Some(base)) =
            (declared.column(self.column).int_range(), self.base.as_ref().and_then(Value::as_i64))
        {
            let mut total = i128::from(base);
            for d in &self.deltas {
                match d.as_i64() {
                    Some(d) if (min..=max).contains(&(total + i128::from(d))) => total += i128::from(d),
                    _ => return compact(declared, self),
                }
            }
            self.base = Some(Value::from(total as i64));
            self.deltas.clear();
            return;
        }
        compact(declared, self);
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

    fn write(&self) -> ColumnWrite<'_> {
        ColumnWrite { column: self.column, base: self.base.as_ref(), deltas: self.deltas.iter().collect() }
    }
}

impl Fold {
    /// Rows held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets what is held (once written).
    pub fn clear(&mut self) {
        for (_, rows) in &mut self.rows {
            rows.clear();
        }
        self.len = 0;
    }

    fn get(&self, table: &str, key: &str) -> Option<&Pending> {
        self.rows.iter().find(|(name, _)| same_name(name, table))?.1.get(key)
    }

    /// The version row `key` of `table` has once what is held is written; `None`: the fold
    /// holds no write of it (the table tells).
    pub fn version(&self, table: &str, key: &str) -> Option<i64> {
        self.get(table, key).and_then(Pending::version)
    }

    /// Folds `plan` (planned against the versions the fold says, for the rows it holds) in,
    /// or refuses it and changes nothing (see the module). `tables`: the projection's.
    pub fn absorb(&mut self, tables: &[Table], plan: &Plan<'_>) -> bool {
        let simple = plan.aggregates.is_empty()
            && plan.parks.is_empty()
            && plan.unparked.is_none()
            && plan.superseded.is_empty()
            && plan
                .outcomes
                .iter()
                .all(|o| matches!(o, Outcome::Applied | Outcome::Duplicate | Outcome::Stale | Outcome::Ignored))
            && plan.rows.iter().all(|r| r.table.is_gated() && matches!(r.kind, RowKind::Insert | RowKind::Update));
        if !simple {
            return false;
        }
        let declared: Vec<(Table, Declared)> = tables.iter().map(|t| (*t, Declared::of(t))).collect();
        let declared = |table: &Table| declared.iter().find(|(t, _)| t.name() == table.name()).map(|(_, d)| d);
        // Every row first, so that a refusal changes nothing.
        let mut created: HashMap<(&str, &str), i64, Hasher> = HashMap::default();
        for row in &plan.rows {
            let Some(declared) = declared(&row.table) else { return false };
            // Every value surely taken: folded, a value refused could not be blamed on its
            // event (the batch is written as usual instead, which names it).
            // Adds only where a chain of them sums as its steps would (not `numeric(p, s)`).
            let fits = |c: &ColumnWrite<'_>| {
                let column = declared.column(c.column);
                c.base.is_none_or(|v| column.surely_fits(v))
                    && (c.deltas.is_empty() || column.chains_exactly())
                    && c.deltas.iter().all(|d| column.surely_fits(d))
            };
            if !row.columns.iter().all(fits) {
                return false;
            }
            // An insert without a NOT NULL column that has no default is refused: not folded,
            // so that nothing later completes it.
            if row.kind == RowKind::Insert && declared.required().any(|r| !row.columns.iter().any(|c| c.column == r)) {
                return false;
            }
            let held = self.get(row.table.name(), row.key);
            let version =
                created.get(&(row.table.name(), row.key)).copied().or_else(|| held.and_then(Pending::version));
            match (row.kind, version) {
                (RowKind::Insert, None) => {
                    created.insert((row.table.name(), row.key), row.version.unwrap_or_default());
                }
                (RowKind::Update, Some(v)) if row.expected == Some(v) => {
                    // A set over adds held (an overflow PostgreSQL would refuse, never seen).
                    // Held values all surely fit (checked as they came in, or sums kept in
                    // their column's range): only adds might be refused.
                    let part = held.and_then(|p| p.merges_into(row));
                    let refused = row.columns.iter().any(|c| {
                        c.base.is_some()
                            && part
                                .and_then(|p| p.columns.iter().find(|h| h.column == c.column))
                                .is_some_and(|h| !h.deltas.is_empty())
                    });
                    if refused {
                        return false;
                    }
                }
                // An update of a row the fold does not hold: planned against the table.
                (RowKind::Update, None) if held.is_none() => {}
                _ => return false,
            }
        }
        for row in &plan.rows {
            let (Some(version), Some(declared)) = (row.version, declared(&row.table)) else { continue };
            let name = row.table.name();
            let table = match self.rows.iter().position(|(held, _)| same_name(held, name)) {
                Some(i) => &mut self.rows[i].1,
                None => {
                    self.rows.push((name, HashMap::default()));
                    &mut self.rows.last_mut().expect("just pushed").1
                }
            };
            let pending = match table.get_mut(row.key) {
                Some(pending) => pending,
                None => {
                    self.len += 1;
                    table.entry(row.key.to_owned()).or_default()
                }
            };
            let columns = || row.columns.iter().map(|c| Column::of(declared, c)).collect();
            if row.kind == RowKind::Insert {
                pending.insert = Some(Part { expected: None, version, columns: columns() });
                continue;
            }
            let into_insert = pending.folds_into_insert(row);
            let part = match (into_insert, &mut pending.insert, &mut pending.update) {
                (true, Some(insert), _) => insert,
                (_, _, Some(update)) => update,
                (_, _, update) => {
                    *update = Some(Part { expected: row.expected, version, columns: columns() });
                    continue;
                }
            };
            for c in &row.columns {
                match part.columns.iter_mut().find(|h| h.column == c.column) {
                    Some(held) if c.base.is_none() => {
                        held.deltas.extend(c.deltas.iter().map(|d| (*d).clone()));
                        held.settle(declared);
                    }
                    Some(held) => held.replace(declared, c),
                    None => part.columns.push(Column::of(declared, c)),
                }
            }
            part.version = version;
        }
        true
    }

    /// What the fold holds, as the row writes of one plan, at most `chunk` rows' writes at a
    /// time: by table in `tables`' order and by key, in each chunk inserts before updates.
    pub fn rows<'a>(&'a self, tables: &'a [Table], chunk: usize) -> impl Iterator<Item = Vec<RowWrite<'a>>> + 'a {
        let mut held: Vec<(usize, &'a str, &'a Pending)> = Vec::with_capacity(self.len);
        for (name, rows) in &self.rows {
            if let Some(t) = tables.iter().position(|t| t.name() == *name) {
                held.extend(rows.iter().map(|(key, pending)| (t, key.as_str(), pending)));
            }
        }
        held.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        let mut held = held.into_iter();
        std::iter::from_fn(move || {
            let mut rows: Vec<(usize, RowWrite<'a>)> = Vec::with_capacity(chunk.min(self.len) * 2);
            for (t, key, pending) in held.by_ref().take(chunk.max(1)) {
                let parts = [(RowKind::Insert, &pending.insert), (RowKind::Update, &pending.update)];
                for (kind, part) in parts {
                    if let Some(p) = part {
                        let columns = p.columns.iter().map(Column::write).collect();
                        let (table, expected, version) = (tables[t], p.expected, Some(p.version));
                        rows.push((t, RowWrite { table, key, child: None, kind, expected, version, columns }));
                    }
                }
            }
            rows.sort_by(|(t, a), (u, b)| (t, a.kind, a.key).cmp(&(u, b.kind, b.key)));
            (!rows.is_empty()).then(|| rows.into_iter().map(|(_, r)| r).collect())
        })
    }
}

/// Whether two table names are the same: most often the same `&'static str`, compared by
/// address without reading it.
fn same_name(a: &str, b: &str) -> bool {
    std::ptr::eq(a, b) || a == b
}

impl Part {
    /// Whether an update of the row can fold into this insert: each column it writes is set,
    /// or added to a column the insert writes (the result does not depend on what the insert
    /// left in the row, its defaults), as the planner folds within a batch.
    fn takes(&self, row: &RowWrite<'_>) -> bool {
        row.columns.iter().all(|c| c.base.is_some() || self.columns.iter().any(|h| h.column == c.column))
    }
}

impl Pending {
    /// Whether an update of the row folds into its insert (no update part yet, and
    /// [`Part::takes`] it); else into its update part, made when there is none.
    fn folds_into_insert(&self, row: &RowWrite<'_>) -> bool {
        self.update.is_none() && self.insert.as_ref().is_some_and(|i| i.takes(row))
    }

    /// The part an update of the row folds into, when one does.
    fn merges_into(&self, row: &RowWrite<'_>) -> Option<&Part> {
        if self.folds_into_insert(row) {
            self.insert.as_ref()
        } else {
            self.update.as_ref()
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
    let Some((min, max)) = declared.column(column.column).int_range() else { return };
    let (mut lo, mut hi, mut sum) = (i128::MAX, i128::MIN, 0_i128);
    for d in &column.deltas {
        let Some(n) = d.as_i64().map(i128::from).filter(|n| (min..=max).contains(n)) else { return };
        sum += n;
        lo = lo.min(sum);
        hi = hi.max(sum);
    }
    let steps = [lo, hi - lo, sum - hi];
    if steps.iter().all(|n| (min..=max).contains(n)) {
        column.deltas = steps.iter().map(|n| Value::from(*n as i64)).collect();
    }
}

#[cfg(test)]
mod tests {
    use super::{compact, Column, Declared};
    use crate::Table;
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
        let declared = Declared::of(&T);
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
