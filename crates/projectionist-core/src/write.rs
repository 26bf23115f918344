//! What an event writes, as values: the engine gates and applies a whole batch of them
//! set-based, instead of running one statement per event.

use serde::Serialize;
use serde_json::Value;

use crate::envelope::Envelope;
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
    /// A child row: its aggregate's id and its own key.
    Child {
        /// The aggregate id (the parent).
        parent: String,
        /// The child's key.
        key: String,
    },
    /// A row of a fan-in table keyed by two columns.
    Keys(String, String),
    /// Every child row of an aggregate (a clear).
    Children {
        /// The aggregate id (the parent).
        parent: String,
    },
}

impl Target {
    /// The row's key and, for a child, the child's key (`""` otherwise; a clear: the parent
    /// and `None`).
    pub fn keys(&self) -> (&str, Option<&str>) {
        match self {
            Target::Aggregate { key, .. } | Target::Row(key) => (key, Some("")),
            Target::Child { parent, key } | Target::Keys(parent, key) => (parent, Some(key)),
            Target::Children { parent } => (parent, None),
        }
    }
}

/// One row write of one event, built with [`Table::write`] or [`Table::row`].
#[derive(Debug, Clone, PartialEq)]
#[must_use = "return the write from `project`"]
pub struct Write {
    pub(crate) table: Table,
    pub(crate) target: Target,
    pub(crate) changes: Vec<Change>,
    pub(crate) delete: bool,
    pub(crate) error: Option<String>,
}

/// The writes a table's rows start from.
impl Table {
    /// The row of `event`'s aggregate in this upsert or transition table, written at the
    /// event's version: add `set`s (and, for transitions, `add`s).
    pub fn write<E>(&self, event: &Envelope<E>) -> Write {
        Write::new(*self, Target::Aggregate { key: event.aggregate_id.clone(), version: event.version })
    }

    /// The row keyed `key` in this fan-in table: add `set`s and `add`s. Applied once per
    /// event, gated by the aggregate's version.
    pub fn row(&self, key: impl Into<String>) -> Write {
        Write::new(*self, Target::Row(key.into()))
    }

    /// The row keyed `first` and `second` in this fan-in table of two key columns (see
    /// [`Table::fan_in_keys`]): add `set`s and `add`s, or delete it.
    pub fn row_keys(&self, first: impl Into<String>, second: impl Into<String>) -> Write {
        Write::new(*self, Target::Keys(first.into(), second.into()))
    }

    /// The child keyed `key` of `event`'s aggregate in this child table: add `set`s and
    /// `add`s, or [`delete`](Write::delete) it. Applied once per event, gated by the
    /// aggregate's version.
    pub fn child_row<E>(&self, event: &Envelope<E>, key: impl Into<String>) -> Write {
        Write::new(*self, Target::Child { parent: event.aggregate_id.clone(), key: key.into() })
    }

    /// Removes every child of `event`'s aggregate from this child table (a cart checked
    /// out); what the event or a later one writes after it makes children again.
    pub fn clear<E>(&self, event: &Envelope<E>) -> Write {
        Write::new(*self, Target::Children { parent: event.aggregate_id.clone() }).delete()
    }
}

impl Write {
    pub(crate) fn new(table: Table, target: Target) -> Self {
        Self { table, target, changes: Vec::new(), delete: false, error: None }
    }

    fn push(mut self, column: &'static str, op: Op, value: impl Serialize) -> Self {
        if self.error.is_none() {
            match value.serialize(ValueSerializer) {
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

    /// Deletes the row instead: gated like any write (applied once per event, at the
    /// aggregate's version), so that a duplicate or a replay of an earlier event never
    /// brings it back, and a later write creates it again. Sets nothing: a delete with
    /// `set` or `add` is refused. On an upsert or transition table, only one declared
    /// [`deletable`](Table::deletable) (so that the row's version outlives it).
    pub fn delete(mut self) -> Self {
        self.delete = true;
        self
    }

    /// Whether the write deletes its row.
    pub fn deletes(&self) -> bool {
        self.delete
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
#[derive(Debug, Clone, Default)]
pub struct Writes {
    writes: Held,
    custom: bool,
}

/// The writes of one event: most write one row, held in place rather than in a vector of
/// its own (one allocation fewer per event, and the planner reads it where the event is).
#[derive(Debug, Clone, Default)]
#[expect(clippy::large_enum_variant, reason = "the one write held in place is the point")]
enum Held {
    #[default]
    None,
    One(Write),
    Many(Vec<Write>),
}

impl PartialEq for Writes {
    fn eq(&self, other: &Self) -> bool {
        self.custom == other.custom && self.writes() == other.writes()
    }
}

impl From<Vec<Write>> for Held {
    fn from(mut writes: Vec<Write>) -> Self {
        match writes.len() {
            0 => Held::None,
            1 => Held::One(writes.pop().expect("one write")),
            _ => Held::Many(writes),
        }
    }
}

impl Writes {
    /// No row changes; the version gate still moves.
    pub fn none() -> Self {
        Self::default()
    }

    /// Apply this event with the projection's `apply` (custom SQL, one event at a time).
    pub fn custom() -> Self {
        Self { writes: Held::None, custom: true }
    }

    /// Adds a write.
    pub fn and(mut self, write: Write) -> Self {
        self.writes = match std::mem::take(&mut self.writes) {
            Held::None => Held::One(write),
            Held::One(first) => Held::Many(vec![first, write]),
            Held::Many(mut writes) => {
                writes.push(write);
                Held::Many(writes)
            }
        };
        self
    }

    /// Whether the event goes to `apply`.
    pub fn is_custom(&self) -> bool {
        self.custom
    }

    /// The writes, in order.
    pub fn writes(&self) -> &[Write] {
        match &self.writes {
            Held::None => &[],
            Held::One(write) => std::slice::from_ref(write),
            Held::Many(writes) => writes,
        }
    }
}

impl From<Write> for Writes {
    fn from(write: Write) -> Self {
        Self { writes: Held::One(write), custom: false }
    }
}

impl FromIterator<Write> for Writes {
    fn from_iter<I: IntoIterator<Item = Write>>(iter: I) -> Self {
        Self { writes: iter.into_iter().collect::<Vec<_>>().into(), custom: false }
    }
}

/// `serde_json::to_value`, but a value serialised as a string of its `Display` (a timestamp,
/// a UUID, a decimal) is formatted into room made for it once, not grown a few characters
/// at a time: each event's `updated_at` goes through here.
struct ValueSerializer;

type Json = serde_json::value::Serializer;

macro_rules! forward {
    ($($method:ident($($arg:ident: $ty:ty),*) -> $ok:ty;)*) => {
        $(fn $method(self, $($arg: $ty),*) -> Result<$ok, serde_json::Error> {
            serde_json::value::Serializer.$method($($arg),*)
        })*
    };
}

impl serde::Serializer for ValueSerializer {
    type Ok = Value;
    type Error = serde_json::Error;
    type SerializeSeq = <Json as serde::Serializer>::SerializeSeq;
    type SerializeTuple = <Json as serde::Serializer>::SerializeTuple;
    type SerializeTupleStruct = <Json as serde::Serializer>::SerializeTupleStruct;
    type SerializeTupleVariant = <Json as serde::Serializer>::SerializeTupleVariant;
    type SerializeMap = <Json as serde::Serializer>::SerializeMap;
    type SerializeStruct = <Json as serde::Serializer>::SerializeStruct;
    type SerializeStructVariant = <Json as serde::Serializer>::SerializeStructVariant;

    forward! {
        serialize_bool(v: bool) -> Value;
        serialize_i8(v: i8) -> Value;
        serialize_i16(v: i16) -> Value;
        serialize_i32(v: i32) -> Value;
        serialize_i64(v: i64) -> Value;
        serialize_i128(v: i128) -> Value;
        serialize_u8(v: u8) -> Value;
        serialize_u16(v: u16) -> Value;
        serialize_u32(v: u32) -> Value;
        serialize_u64(v: u64) -> Value;
        serialize_u128(v: u128) -> Value;
        serialize_f32(v: f32) -> Value;
        serialize_f64(v: f64) -> Value;
        serialize_char(v: char) -> Value;
        serialize_str(v: &str) -> Value;
        serialize_bytes(v: &[u8]) -> Value;
        serialize_none() -> Value;
        serialize_unit() -> Value;
        serialize_unit_struct(name: &'static str) -> Value;
        serialize_unit_variant(name: &'static str, index: u32, variant: &'static str) -> Value;
        serialize_seq(len: Option<usize>) -> Self::SerializeSeq;
        serialize_tuple(len: usize) -> Self::SerializeTuple;
        serialize_tuple_struct(name: &'static str, len: usize) -> Self::SerializeTupleStruct;
        serialize_tuple_variant(name: &'static str, index: u32, variant: &'static str, len: usize)
            -> Self::SerializeTupleVariant;
        serialize_map(len: Option<usize>) -> Self::SerializeMap;
        serialize_struct(name: &'static str, len: usize) -> Self::SerializeStruct;
        serialize_struct_variant(name: &'static str, index: u32, variant: &'static str, len: usize)
            -> Self::SerializeStructVariant;
    }

    fn serialize_some<T: ?Sized + Serialize>(self, value: &T) -> Result<Value, serde_json::Error> {
        value.serialize(self)
    }

    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<Value, serde_json::Error> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<Value, serde_json::Error> {
        serde_json::value::Serializer.serialize_newtype_variant(name, index, variant, value)
    }

    fn collect_str<T: ?Sized + std::fmt::Display>(self, value: &T) -> Result<Value, serde_json::Error> {
        use std::fmt::Write as _;
        let mut text = String::with_capacity(40);
        write!(text, "{value}").map_err(serde::ser::Error::custom)?;
        Ok(Value::String(text))
    }
}

#[cfg(test)]
mod tests {
    use super::ValueSerializer;
    use serde::Serialize;
    use serde_json::{json, Value};

    #[derive(Serialize)]
    enum Shape {
        Unit,
        Newtype(i32),
        Tuple(i32, String),
        Struct { at: chrono::DateTime<chrono::Utc> },
    }

    #[derive(Serialize)]
    struct Wrapped(uuid::Uuid);

    fn both<T: Serialize>(value: T) -> (Value, Value) {
        (value.serialize(ValueSerializer).unwrap(), serde_json::to_value(&value).unwrap())
    }

    #[test]
    fn values_are_what_serde_json_makes_of_them() {
        let at = chrono::DateTime::parse_from_rfc3339("2026-11-26T07:15:00.123456Z").unwrap().to_utc();
        let id = uuid::Uuid::from_u128(0x6f1c_2a8e_8d0b_4c1e_9a57_2f4d_1c3b_5e70);
        let (ours, theirs) = both(at);
        assert_eq!(ours, theirs);
        assert_eq!(ours, json!("2026-11-26T07:15:00.123456Z"));
        assert_eq!(both(Wrapped(id)).0, both(Wrapped(id)).1);
        assert_eq!(both(Some(at)).0, both(Some(at)).1);
        assert_eq!(both(None::<i64>).0, Value::Null);
        for (ours, theirs) in [
            both(true),
            both(-7_i8),
            both(u64::MAX),
            both(i128::from(i64::MIN)),
            both(0.1_f64),
            both('x'),
            both("text"),
            both(()),
            both(vec![1, 2, 3]),
            both((1, "two")),
            both(std::collections::BTreeMap::from([("k", at)])),
            both(Shape::Unit),
            both(Shape::Newtype(4)),
            both(Shape::Tuple(5, "six".into())),
            both(Shape::Struct { at }),
            both(json!({"nested": [1, {"a": null}]})),
        ] {
            assert_eq!(ours, theirs);
        }
    }
}
