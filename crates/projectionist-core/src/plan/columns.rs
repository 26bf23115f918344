//! What the planner and the fold ask of a column's values, and of whom: the database's crate
//! knows its column types (`projectionist_postgres::PgTypes`, PostgreSQL's) and answers
//! through [`TypeRules`]. The planner writes over (coalesces away) only values that surely
//! fit, and sums adds only where the sum is what the steps would store.

use serde_json::Value;

use crate::table::{same_text, Table};

/// A database's column types: what a column's declaration says of the values the database
/// takes in it ([`ColumnValues`]). Implemented by the database's crate
/// (`projectionist_postgres::PgTypes`); asked once per column for each plan.
pub trait TypeRules: Sync {
    /// What `declared`, a column's declaration as [`Table::columns`] takes it (its SQL type
    /// with its constraints), says of the column's values.
    fn column(&self, declared: &str) -> Box<dyn ColumnValues>;
}

/// What a column's declaration says of the values the database takes in it, as far as the
/// planner and the fold need to know.
pub trait ColumnValues {
    /// Whether the database surely takes `value` (null included) in the column: its input of
    /// the type takes it for certain, and no constraint of the column's own may refuse it.
    /// False wherever it might be refused. Asked for each value written over.
    fn surely_fits(&self, value: &Value) -> bool;

    /// An integer column's range: every add to it is exact, and each step is checked against
    /// the range.
    fn int_range(&self) -> Option<IntRange>;

    /// Whether adds to the column may be summed before the database sees them: where the sum
    /// is what adding the steps one by one stores (integers, each step's range checked; not
    /// a type that rounds or checks each stored step, nor one not known).
    fn chains_exactly(&self) -> bool;

    /// Whether a row cannot be inserted without a value for the column (`NOT NULL`, no
    /// default).
    fn required(&self) -> bool;
}

/// An integer column's range, from the least to the greatest value it stores: the one place
/// where a chain of adds to an integer column is summed before the database sees it (by the
/// planner, the fold and the database's statements), exactly when the chain's every step
/// would be stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntRange {
    /// The least value.
    pub min: i128,
    /// The greatest value.
    pub max: i128,
}

/// The running sums of a chain of adds: the lowest and the highest (0, before the first
/// add, included) and the last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunningSums {
    /// The lowest running sum.
    pub lo: i128,
    /// The highest running sum.
    pub hi: i128,
    /// The sum of every add.
    pub sum: i128,
}

impl IntRange {
    /// Whether the column stores `n`.
    pub fn contains(self, n: i128) -> bool {
        (self.min..=self.max).contains(&n)
    }

    /// The running sums of `deltas`, when each is an integer the range takes.
    pub fn sums<'v>(self, deltas: impl IntoIterator<Item = &'v Value>) -> Option<RunningSums> {
        let mut s = RunningSums { lo: 0, hi: 0, sum: 0 };
        for d in deltas {
            let d = d.as_i64().map(i128::from).filter(|&d| self.contains(d))?;
            s.sum += d;
            (s.lo, s.hi) = (s.lo.min(s.sum), s.hi.max(s.sum));
        }
        Some(s)
    }

    /// `base` with each of `deltas` added in turn, when `base`, every delta and every step
    /// on the way are integers the range takes: what the database would store.
    pub fn total<'v>(self, base: &Value, deltas: impl IntoIterator<Item = &'v Value>) -> Option<i64> {
        let base = i128::from(base.as_i64()?);
        let s = self.sums(deltas)?;
        [base, base + s.lo, base + s.hi].into_iter().all(|n| self.contains(n)).then(|| (base + s.sum) as i64)
    }
}

/// A column not declared: nothing surely fits it.
struct Undeclared;

impl ColumnValues for Undeclared {
    fn surely_fits(&self, _: &Value) -> bool {
        false
    }

    fn int_range(&self) -> Option<IntRange> {
        None
    }

    fn chains_exactly(&self) -> bool {
        false
    }

    fn required(&self) -> bool {
        false
    }
}

/// A table's columns as the database takes their values, read from the declarations once
/// per plan (a value written over is checked against its column for each event).
pub(crate) struct Declared(Vec<(&'static str, Box<dyn ColumnValues>)>);

impl Declared {
    pub(crate) fn of(table: &Table, types: &dyn TypeRules) -> Self {
        Self(table.column_declarations().iter().map(|(name, declared)| (*name, types.column(declared))).collect())
    }

    pub(crate) fn column(&self, column: &str) -> &dyn ColumnValues {
        self.0.iter().find(|(name, _)| same_text(name, column)).map_or(&Undeclared, |(_, values)| values.as_ref())
    }

    /// The columns a row cannot be inserted without: `NOT NULL` with no default.
    pub(crate) fn required(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.0.iter().filter(|(_, values)| values.required()).map(|(name, _)| *name)
    }
}
