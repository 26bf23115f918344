//! A statement's shape: the kind of row write it does and how it computes each column. The
//! rows a statement carries ([`rows`](super::rows)) and the statement itself
//! ([`statements`](super::statements)) both go by it.

use projectionist_core::plan::RowKind;

use crate::tables::types::IntType;

/// How a statement computes one column, by what the plan holds for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ColumnKind {
    /// `c = value`.
    Set,
    /// `c = t.c + value` (a merge's insert: `c = value`).
    Add,
    /// `c = ((t.c + d1) + d2) + …`.
    FoldStored,
    /// `c = ((value + d1) + d2) + …`.
    FoldValue,
    /// An integer column and integer deltas: `c = t.c + sum`, computed exactly, failing
    /// exactly when one of the steps of `FoldStored` would overflow (the lowest or the
    /// highest running sum leaves the type's range), without a fold per row.
    SumStored(IntType),
}

impl ColumnKind {
    pub(super) fn folds(self) -> bool {
        matches!(self, Self::FoldStored | Self::FoldValue)
    }
}

/// What one statement does: its kind of row write, touching these columns in these ways.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Shape {
    pub(super) kind: RowKind,
    pub(super) columns: Vec<(&'static str, ColumnKind)>,
}

impl Shape {
    /// Whether `other` is this shape (`==`, asked for every row written).
    pub(super) fn same(&self, other: &Shape) -> bool {
        self.kind == other.kind
            && self.columns.len() == other.columns.len()
            && self.columns.iter().zip(&other.columns).all(|((a, x), (b, y))| x == y && same_name(a, b))
    }
}

/// Whether two names of a declaration are the same: by address first (they are its
/// `'static` text), then by their bytes.
pub(super) fn same_name(a: &str, b: &str) -> bool {
    std::ptr::eq(a, b) || a == b
}
