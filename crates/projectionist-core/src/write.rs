//! What an event writes, as values: the engine gates and applies a whole batch of them
//! set-based, instead of running one statement per event.

use serde::Serialize;
use serde_json::Value;

use crate::table::Table;

/// How a column changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `column = value`.
    Set,
    /// `column = column + value`, in the column's own SQL arithmetic (on a row this event
    /// creates: `column = value`).
    Add,
}

/// One column change of a [`Write`].
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// The column.
    pub column: &'static str,
    /// Set or add.
    pub op: Op,
    /// The value, as JSON; PostgreSQL converts it to the column's type.
    pub value: Value,
}

/// Which row a write targets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The event's aggregate row of an upsert or transition table, at the event's version.
    Aggregate {
        /// The aggregate id.
        key: String,
        /// The event's version.
        version: i64,
    },
    /// A fan-in row, by key.
    Row(String),
}

/// One row write of one event, built with [`Table::write`] or [`Table::row`].
#[derive(Debug, Clone, PartialEq)]
#[must_use = "return the write from `project`"]
pub struct Write {
    pub(crate) table: Table,
    pub(crate) target: Target,
    pub(crate) changes: Vec<Change>,
    pub(crate) error: Option<String>,
}

impl Write {
    pub(crate) fn new(table: Table, target: Target) -> Self {
        Self { table, target, changes: Vec::new(), error: None }
    }

    fn push(mut self, column: &'static str, op: Op, value: impl Serialize) -> Self {
        if self.error.is_none() {
            match serde_json::to_value(value) {
                Ok(value) => self.changes.push(Change { column, op, value }),
                Err(e) => {
                    self.error =
                        Some(format!("column {column} of table {}: value does not serialise: {e}", self.table.name()))
                }
            }
        }
        self
    }

    /// Sets `column` to `value` (anything serde serialises: numbers, strings, timestamps,
    /// JSON, `None` for NULL).
    pub fn set(self, column: &'static str, value: impl Serialize) -> Self {
        self.push(column, Op::Set, value)
    }

    /// Adds `value` (a number, or a string PostgreSQL reads as one, e.g. a decimal) to
    /// `column`, as `column = column + value` would in SQL: the value is first converted to
    /// the column's type (a `numeric(12,2)` rounds it to cents), NULL absorbs, overflow is
    /// an error — and a batch gives exactly what applying its events one at a time gives.
    /// On a row the event creates, sets it. Not allowed on upsert tables (state transfer
    /// carries absolute values).
    pub fn add(self, column: &'static str, value: impl Serialize) -> Self {
        self.push(column, Op::Add, value)
    }

    /// This write and `other`.
    pub fn and(self, other: Write) -> Writes {
        Writes::from_iter([self, other])
    }

    /// The table written.
    pub fn table(&self) -> &Table {
        &self.table
    }

    /// The row targeted.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// The column changes, in the order given.
    pub fn changes(&self) -> &[Change] {
        &self.changes
    }

    /// A problem found while building the write (a value that did not serialise).
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }
}

/// Everything one event writes: what a projection's `project` returns.
///
/// Empty writes still move the aggregate's version gate (its rows and aggregate version), so the
/// aggregate's next event applies. [`Writes::custom`] hands the event to the projection's
/// `apply` instead (the per-event slow path for custom SQL).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Writes {
    writes: Vec<Write>,
    custom: bool,
}

impl Writes {
    /// No row changes; the version gate still moves.
    pub fn none() -> Self {
        Self::default()
    }

    /// Apply this event with the projection's `apply` (custom SQL, one event at a time).
    pub fn custom() -> Self {
        Self { writes: Vec::new(), custom: true }
    }

    /// Adds a write.
    pub fn and(mut self, write: Write) -> Self {
        self.writes.push(write);
        self
    }

    /// Whether the event goes to `apply`.
    pub fn is_custom(&self) -> bool {
        self.custom
    }

    /// The writes, in order.
    pub fn writes(&self) -> &[Write] {
        &self.writes
    }
}

impl From<Write> for Writes {
    fn from(write: Write) -> Self {
        Self { writes: vec![write], custom: false }
    }
}

impl FromIterator<Write> for Writes {
    fn from_iter<I: IntoIterator<Item = Write>>(iter: I) -> Self {
        Self { writes: iter.into_iter().collect(), custom: false }
    }
}
