//! Folding the plans of many batches into one write per row: a rebuild's bulk load, where
//! the events of one aggregate lie far apart in the stream and a batch sees each row about
//! once. Pure, like the planner: the Postgres side reads versions through it, hands it each
//! batch's plan, and writes what it holds in one go.
//!
//! A plan is folded only when the result cannot differ from writing it batch after batch:
//! its events applied, were duplicates, stale or ignored (no gap, nothing parked or
//! dead-lettered), every value it writes surely fits its column, and folding writes over or
//! deletes no value PostgreSQL might refuse unless that value is still checked (the adds a
//! delete drops, evaluated against the row as stored, as the planner does). Otherwise
//! [`Fold::absorb`] refuses it and changes nothing: the caller writes the fold, then the
//! batch, as before. (An add may still overflow where the fold is written: the caller then
//! writes the batches again one by one.) Every table but custom ones folds, where PostgreSQL
//! checks no more than the declared types (no CHECK constraint): a row's states between are
//! not checked. Per row the fold holds, in the order they are written: a check of dropped
//! adds, a delete (or the clear of its aggregate's children), an insert or merge, an update;
//! per aggregate, the version it moves to. A child row of an aggregate the tables held
//! nothing of (a rebuild's, see [`Fold::from_nothing`]) has no row stored to check or delete:
//! it is written as a new row, by `COPY` where its values allow.

mod pending;

use std::collections::HashMap;

use crate::plan::{AggregateWrite, ColumnWrite, Declared, Plan, RowKind, RowWrite, TypeRules};
use crate::table::same_text;
use crate::{Outcome, Table};
use pending::Pending;

/// Row writes of many plans, folded: per row, what is written of it once (see the module).
#[derive(Debug, Default)]
pub struct Fold {
    /// Per table (a projection has a few: found by a scan, most often by the name's address
    /// alone). Cleared, the maps keep their room for the next fold.
    tables: Vec<Held>,
    /// Per aggregate type and id, the version it moves to.
    aggregates: HashMap<String, HashMap<String, Mark, Hasher>, Hasher>,
    len: usize,
    /// What earlier folds wrote, kept once written (see [`Fold::written`]): the versions of
    /// gated rows (`None`: deleted), by table and key, and of aggregates, by type and id.
    known: Known,
    /// Whether what is held and known is every version the tables hold of the events folded
    /// (see [`Fold::from_nothing`]).
    complete: bool,
}

/// Versions a fold wrote, by table (or aggregate type) and key.
#[derive(Debug, Default)]
struct Known {
    rows: HashMap<&'static str, HashMap<String, Option<i64>, Hasher>, Hasher>,
    aggregates: HashMap<String, HashMap<String, i64, Hasher>, Hasher>,
    len: usize,
}

type Hasher = foldhash::fast::RandomState;

#[derive(Debug)]
struct Held {
    name: &'static str,
    /// Rows of a table keyed by one column, by key.
    rows: HashMap<String, Pending, Hasher>,
    /// Rows of a table keyed by two columns (child rows; fan-in rows with two keys), by
    /// the first.
    families: HashMap<String, Family, Hasher>,
}

/// The rows sharing a first key: an aggregate's children.
#[derive(Debug, Default)]
struct Family {
    /// Every child as stored deleted first (a clear).
    cleared: bool,
    /// Children of an aggregate the tables held nothing of when the fold first met it: none
    /// is stored (see [`Fold::fresh_family`]).
    fresh: bool,
    rows: Vec<(String, Pending)>,
}

/// An aggregate version move: the version it must still have, the version written.
#[derive(Debug, Clone, Copy)]
struct Mark {
    expected: Option<i64>,
    version: i64,
}

impl Fold {
    /// A fold of a stream read from its start into tables that hold nothing of it (a
    /// rebuild's shadow, for a partition with no checkpoint yet): a version neither held nor
    /// known is no row, with nothing to read, until the fold forgets what it wrote. Should the
    /// tables hold a row after all (an aggregate whose events another partition also
    /// carries), its insert finds it there and the write is refused, as a concurrent
    /// writer's would be.
    pub fn from_nothing() -> Self {
        Self { complete: true, ..Self::default() }
    }

    /// Whether every version the tables hold of the events folded is held or known (see
    /// [`Fold::from_nothing`]): those not found in the fold are no row.
    pub fn knows_all(&self) -> bool {
        self.complete
    }

    /// Rows and aggregate versions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets what is held, and the versions written before.
    pub fn clear(&mut self) {
        for held in &mut self.tables {
            held.rows.clear();
            held.families.clear();
        }
        self.aggregates.clear();
        self.len = 0;
        self.forget_versions();
    }

    /// Forgets the versions kept from earlier folds (see [`Fold::written`]).
    pub fn forget_versions(&mut self) {
        self.known = Known::default();
        self.complete = false;
    }

    /// Forgets what is held once written, keeping the versions it wrote (up to about
    /// `keep` of them, the oldest forgotten first, all at once), so that the batches after
    /// it need not read them back: only where no one else writes the tables.
    pub fn written(&mut self, keep: usize) {
        if self.known.len + self.len > keep {
            self.forget_versions();
        }
        for held in &mut self.tables {
            let known = self.known.rows.entry(held.name).or_default();
            for (key, pending) in held.rows.drain() {
                if let Some(state) = pending.state() {
                    self.known.len += usize::from(known.insert(key, state).is_none());
                }
            }
            held.families.clear();
        }
        for (aggregate_type, marks) in self.aggregates.drain() {
            let known = self.known.aggregates.entry(aggregate_type).or_default();
            for (id, mark) in marks {
                self.known.len += usize::from(known.insert(id, mark.version).is_none());
            }
        }
        self.len = 0;
    }

    fn held(&self, table: &str) -> Option<&Held> {
        self.tables.iter().find(|h| same_text(h.name, table))
    }

    fn get(&self, table: &Table, key: &str, child: Option<&str>) -> Option<&Pending> {
        let held = self.held(table.name())?;
        match child {
            None => held.rows.get(key),
            Some(child) => held.families.get(key)?.rows.iter().find(|(c, _)| c == child).map(|(_, p)| p),
        }
    }

    /// The version row `key` of gated `table` has once what is held is written: `Some(None)`
    /// when the fold deletes it; `None` when the fold holds no write of it (the table tells).
    pub fn version(&self, table: &str, key: &str) -> Option<Option<i64>> {
        self.versions(table)(key)
    }

    /// [`Fold::version`] of `table`'s rows, the table looked up once for a batch's keys.
    pub fn versions(&self, table: &str) -> impl Fn(&str) -> Option<Option<i64>> + '_ {
        let (held, known) = (self.held(table), self.known.rows.get(table));
        move |key| match held.and_then(|h| h.rows.get(key)).and_then(Pending::state) {
            Some(state) => Some(state),
            None => known?.get(key).copied(),
        }
    }

    /// Whether the tables hold no child of aggregate `key` in child `table`: the fold knows
    /// every version they hold (see [`Fold::from_nothing`]), and every aggregate type that
    /// owns the table had no version of `key` there (held with none expected, or neither
    /// held nor known). An aggregate's children are written only with its version.
    fn fresh_family(&self, table: &Table, key: &str) -> bool {
        let stored = |aggregate_type: &str| match self.aggregates.get(aggregate_type).and_then(|ids| ids.get(key)) {
            Some(mark) => mark.expected,
            None => self.known.aggregates.get(aggregate_type).and_then(|ids| ids.get(key)).copied(),
        };
        let owners = table.aggregate_types_declared();
        self.complete && !owners.is_empty() && owners.iter().all(|t| stored(t).is_none())
    }

    /// The aggregate version the fold moves an aggregate to (`None`: the table tells).
    pub fn aggregate(&self, aggregate_type: &str, aggregate_id: &str) -> Option<i64> {
        match self.aggregates.get(aggregate_type).and_then(|ids| ids.get(aggregate_id)) {
            Some(mark) => Some(mark.version),
            None => self.known.aggregates.get(aggregate_type)?.get(aggregate_id).copied(),
        }
    }

    /// Folds `plan` (planned against the versions the fold says, for the rows it holds) in,
    /// or refuses it and changes nothing (see the module). `tables`: the projection's, whose
    /// columns take the values `types` says, as planned.
    pub fn absorb(&mut self, tables: &[Table], types: &dyn TypeRules, plan: &Plan<'_>) -> bool {
        let declared: Vec<(Table, Declared)> = tables.iter().map(|t| (*t, Declared::of(t, types))).collect();
        let declared = |table: &Table| declared.iter().find(|(t, _)| same_text(t.name(), table.name())).map(|(_, d)| d);
        if !self.admits(plan, &declared) {
            return false;
        }
        for mark in &plan.aggregates {
            if !self.aggregates.contains_key(&mark.aggregate_type) {
                self.aggregates.insert(mark.aggregate_type.clone(), HashMap::default());
            }
            let held = self.aggregates.get_mut(&mark.aggregate_type).expect("just made");
            match held.get_mut(mark.aggregate_id.as_str()) {
                Some(held) => held.version = mark.version,
                None => {
                    self.len += 1;
                    let mark_now = Mark { expected: mark.expected, version: mark.version };
                    held.insert(mark.aggregate_id.clone(), mark_now);
                }
            }
        }
        for row in &plan.rows {
            let declared = declared(&row.table).expect("admitted");
            self.take(declared, row);
        }
        true
    }

    /// Whether `plan` folds (see the module), changing nothing.
    fn admits<'d>(&self, plan: &Plan<'_>, declared: &impl Fn(&Table) -> Option<&'d Declared>) -> bool {
        let simple = plan.parks.is_empty()
            && plan.unparked.is_none()
            && plan.superseded.is_empty()
            && plan
                .outcomes
                .iter()
                .all(|o| matches!(o, Outcome::Applied | Outcome::Duplicate | Outcome::Stale | Outcome::Ignored));
        let marks_agree = plan
            .aggregates
            .iter()
            .all(|m| self.aggregate(&m.aggregate_type, &m.aggregate_id).is_none_or(|held| m.expected == Some(held)));
        if !simple || !marks_agree {
            return false;
        }
        // Gated rows the plan creates, by table and key.
        let mut created: HashMap<(&str, &str), i64, Hasher> = HashMap::default();
        for row in &plan.rows {
            let Some(declared) = declared(&row.table) else { return false };
            if !values_fold(declared, row) {
                return false;
            }
            let admitted = if row.table.is_gated() {
                self.admits_gated(declared, row, &mut created)
            } else {
                self.admits_merged(declared, row)
            };
            if !admitted {
                return false;
            }
        }
        true
    }

    fn admits_gated<'p>(
        &self,
        declared: &Declared,
        row: &RowWrite<'p>,
        created: &mut HashMap<(&'p str, &'p str), i64, Hasher>,
    ) -> bool {
        let held = self.get(&row.table, row.key, None);
        let made = created.get(&(row.table.name(), row.key)).copied();
        let version = made.or_else(|| held.and_then(Pending::state).flatten());
        match (row.kind, version) {
            // Adds the plan drops with its delete: checked with what is held.
            (RowKind::Check, _) => held.is_none_or(|p| p.dropped_checks_with(declared, false, &row.columns).is_some()),
            // A row the fold does not hold: planned against the table.
            (RowKind::Delete, version) => held.is_none_or(|p| {
                version.is_some() && row.expected == version && p.dropped_checks(declared, false).is_some()
            }),
            (RowKind::Insert, None) => {
                created.insert((row.table.name(), row.key), row.version.unwrap_or_default());
                true
            }
            (RowKind::Update, Some(v)) if row.expected == Some(v) => {
                // A set over adds held (an overflow PostgreSQL would refuse, never seen).
                // Held values all surely fit (checked as they came in, or sums kept in
                // their column's range): only adds might be refused.
                let part = held.and_then(|p| p.merges_into(row));
                !row.columns.iter().any(|c| {
                    c.base.is_some()
                        && part
                            .and_then(|p| p.columns.iter().find(|h| h.column == c.column))
                            .is_some_and(|h| !h.deltas.is_empty())
                })
            }
            // An update of a row the fold does not hold: planned against the table.
            (RowKind::Update, None) => held.is_none(),
            _ => false,
        }
    }

    /// A fan-in or child row's write (merged into whatever row is there).
    fn admits_merged(&self, declared: &Declared, row: &RowWrite<'_>) -> bool {
        let two_keys = !row.table.child_key().is_empty();
        let family = self.held(row.table.name()).filter(|_| two_keys).and_then(|h| h.families.get(row.key));
        let held = self.get(&row.table, row.key, row.child);
        match row.kind {
            // Adds the plan drops with its delete (or clear): checked with what is held, or,
            // for a child of an aggregate cleared since, as merged into no row.
            RowKind::Check => {
                let cleared = Pending { restarted: true, ..Pending::default() };
                let held = held.or(family.is_some_and(|f| f.cleared).then_some(&cleared));
                held.is_none_or(|p| p.dropped_checks_with(declared, true, &row.columns).is_some())
            }
            RowKind::Delete => held.is_none_or(|p| p.dropped_checks(declared, true).is_some()),
            RowKind::Clear => {
                family.is_none_or(|f| f.rows.iter().all(|(_, p)| p.dropped_checks(declared, true).is_some()))
            }
            RowKind::Merge | RowKind::Update => true,
            RowKind::Insert => false,
        }
    }

    /// Folds one admitted row write in.
    fn take(&mut self, declared: &Declared, row: &RowWrite<'_>) {
        let name = row.table.name();
        let i = match self.tables.iter().position(|h| same_text(h.name, name)) {
            Some(i) => i,
            None => {
                let (rows, families) = (HashMap::default(), HashMap::default());
                self.tables.push(Held { name, rows, families });
                self.tables.len() - 1
            }
        };
        let fresh = row.table.gate() == crate::Gate::Child
            && !self.tables[i].families.contains_key(row.key)
            && self.fresh_family(&row.table, row.key);
        let held = &mut self.tables[i];
        let merges = !row.table.is_gated();
        let pending = match row.child.filter(|_| row.kind != RowKind::Clear) {
            None if row.kind != RowKind::Clear => {
                if !held.rows.contains_key(row.key) {
                    self.len += 1;
                    held.rows.insert(row.key.to_owned(), Pending::default());
                }
                held.rows.get_mut(row.key).expect("just made")
            }
            child => {
                if !held.families.contains_key(row.key) {
                    held.families.insert(row.key.to_owned(), Family { fresh, ..Family::default() });
                }
                let family = held.families.get_mut(row.key).expect("just made");
                if row.kind == RowKind::Clear {
                    family.cleared = true;
                    for (_, p) in &mut family.rows {
                        p.delete(declared, true, None);
                        p.delete = None;
                    }
                    return;
                }
                let child = child.expect("a two-key row names its second key");
                match family.rows.iter().position(|(c, _)| c == child) {
                    Some(at) => &mut family.rows[at].1,
                    None => {
                        self.len += 1;
                        let (restarted, fresh) = (family.cleared, family.fresh);
                        family.rows.push((child.to_owned(), Pending { restarted, fresh, ..Pending::default() }));
                        &mut family.rows.last_mut().expect("just pushed").1
                    }
                }
            }
        };
        match row.kind {
            RowKind::Check => pending.dropping.extend(row.columns.iter().map(|c| pending::Column::of(declared, c))),
            RowKind::Delete => pending.delete(declared, merges, row.expected),
            RowKind::Clear => unreachable!("a clear names no child"),
            RowKind::Insert | RowKind::Merge | RowKind::Update => pending.write(declared, row),
        }
    }

    /// What the fold holds, as the row writes of one plan, at most about `chunk` rows'
    /// writes at a time: every row's check, then deletes and clears, then inserts and
    /// merges, then updates (so that no chunk undoes what a later one builds on), each by
    /// table in `tables`' order and by key; in each chunk, by table, kind and key. Fan-in
    /// rows, which other partitions write too, come after every other row (their locks are
    /// then held the shortest).
    pub fn rows<'a>(&'a self, tables: &'a [Table], chunk: usize) -> impl Iterator<Item = Vec<RowWrite<'a>>> + 'a {
        let mut held: Vec<(usize, &'a str, Option<&'a str>, &'a Pending)> = Vec::with_capacity(self.len);
        let mut cleared: Vec<(usize, &'a str)> = Vec::new();
        for h in &self.tables {
            let Some(t) = tables.iter().position(|t| t.name() == h.name) else { continue };
            held.extend(h.rows.iter().map(|(key, p)| (t, key.as_str(), None, p)));
            for (key, family) in &h.families {
                // A fresh family's clear would find nothing stored.
                if family.cleared && !family.fresh {
                    cleared.push((t, key.as_str()));
                }
                held.extend(family.rows.iter().map(|(child, p)| (t, key.as_str(), Some(child.as_str()), p)));
            }
        }
        let fan_in = |t: usize| tables[t].gate() == crate::Gate::FanIn;
        held.sort_unstable_by(|a, b| (fan_in(a.0), a.0, a.1, a.2).cmp(&(fan_in(b.0), b.0, b.1, b.2)));
        cleared.sort_unstable();
        // The steps of the other rows, then those of the fan-in rows (from `shared` on).
        let shared = held.iter().position(|h| fan_in(h.0)).unwrap_or(held.len());
        let (mut step, mut at, mut one) = (0_u8, 0_usize, Vec::new());
        std::iter::from_fn(move || {
            let mut rows: Vec<(usize, RowWrite<'a>)> = Vec::new();
            while step < 8 && rows.len() < chunk.max(1) {
                let (first, end) = if step < 4 { (0, shared) } else { (shared, held.len()) };
                if step == 1 && at == 0 {
                    // Every child of these aggregates, as stored, deleted.
                    rows.extend(cleared.iter().map(|&(t, key)| {
                        let (table, kind) = (tables[t], RowKind::Clear);
                        (
                            t,
                            RowWrite {
                                table,
                                key,
                                child: None,
                                kind,
                                expected: None,
                                version: None,
                                columns: Vec::new(),
                            },
                        )
                    }));
                }
                match held[first..end].get(at) {
                    Some(&(t, key, child, pending)) => {
                        pending.writes(step % 4, (tables[t], key, child), &mut one);
                        rows.extend(one.drain(..).map(|r| (t, r)));
                        at += 1;
                    }
                    None => (step, at) = (step + 1, 0),
                }
            }
            rows.sort_by(|(t, a), (u, b)| (t, a.kind, a.key, a.child).cmp(&(u, b.kind, b.key, b.child)));
            (!rows.is_empty()).then(|| rows.into_iter().map(|(_, r)| r).collect())
        })
    }

    /// The aggregate version moves held, by aggregate.
    pub fn aggregates(&self) -> Vec<AggregateWrite> {
        let mut marks: Vec<AggregateWrite> = Vec::with_capacity(self.len);
        for (aggregate_type, ids) in &self.aggregates {
            marks.extend(ids.iter().map(|(aggregate_id, m)| AggregateWrite {
                aggregate_type: aggregate_type.clone(),
                aggregate_id: aggregate_id.clone(),
                expected: m.expected,
                version: m.version,
            }));
        }
        marks.sort_unstable_by(|a, b| (&a.aggregate_type, &a.aggregate_id).cmp(&(&b.aggregate_type, &b.aggregate_id)));
        marks
    }

    /// The fan-in rows held, as their table and keys (the second `""` for a table keyed by
    /// one column), to be locked before they are written.
    pub fn fan_in_rows(&self, tables: &[Table]) -> Vec<(&'static str, (&str, Option<&str>))> {
        let mut rows = Vec::new();
        for h in &self.tables {
            if !tables.iter().any(|t| t.name() == h.name && t.gate() == crate::Gate::FanIn) {
                continue;
            }
            rows.extend(h.rows.keys().map(|k| (h.name, (k.as_str(), Some("")))));
            for (key, family) in &h.families {
                rows.extend(family.rows.iter().map(|(c, _)| (h.name, (key.as_str(), Some(c.as_str())))));
            }
        }
        rows
    }
}

/// Whether every value `row` writes surely fits its column, adds only where a chain of them
/// sums as its steps would (not `numeric(p, s)`), and a row it may create has every NOT NULL
/// column without a default: folded, a value refused could not be blamed on its event (the
/// batch is written as usual instead, which names it), and nothing later completes a row.
fn values_fold(declared: &Declared, row: &RowWrite<'_>) -> bool {
    let fits = |c: &ColumnWrite<'_>| {
        let column = declared.column(c.column);
        c.base.is_none_or(|v| column.surely_fits(v))
            && (c.deltas.is_empty() || column.chains_exactly())
            && c.deltas.iter().all(|d| column.surely_fits(d))
    };
    let creates = matches!(row.kind, RowKind::Insert | RowKind::Merge);
    row.columns.iter().all(fits)
        && !(creates && declared.required().any(|r| !row.columns.iter().any(|c| c.column == r)))
}

#[cfg(test)]
mod tests;
