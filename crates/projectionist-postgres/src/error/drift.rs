//! How a table in the database differs from its declaration: what `check_tables` finds and
//! [`Error::Drift`](super::Error::Drift) carries.

use std::fmt;

/// How a table in the database differs from its declaration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drift {
    /// The table, as declared.
    pub table: String,
    /// What differs, naming the column.
    pub problem: String,
    /// The statement that brings the table in line without touching a row, where that is
    /// safe: adding a declared column that is nullable and has no default (the rows already
    /// there get NULL in it, as if no event had set it yet). `None`: the table must be
    /// rebuilt from the stream.
    pub fix: Option<String>,
}

impl fmt::Display for Drift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "table {}: {}", self.table, self.problem)
    }
}
