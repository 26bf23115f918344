//! A statement's rows as they travel to PostgreSQL. Each row is first a list of fields (its
//! keys, its columns' values, its version and the version it must still have, per summed
//! column its running sums, per folded column its deltas); a statement's rows then go
//! either as one array per field — each element the value's text, cast to the column's
//! type in the statement, or an integer — or as a JSON array of objects that
//! `jsonb_populate_record` turns into the table's records.
//!
//! The arrays cost PostgreSQL about a third of what reading the JSON does (the engine about
//! as much to write), so a row goes that way when every value of it is one its column's text
//! input stores as the JSON path stores it ([`TextInput::takes`]) and its type is one a
//! cast from `text` reads with that input ([`TextInput::cast`]); any other row (a `jsonb`
//! value, a number into a text column, a folded column's deltas, a type not known here)
//! goes as JSON, so what a row stores never depends on the way it went.

use std::io::Write as _;

use projectionist_core::plan::{RowWrite, RunningSums};
use projectionist_core::Table;
use serde::Serialize;
use serde_json::Value;
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::types::Oid;
use sqlx::postgres::{PgArgumentBuffer, PgTypeInfo, Postgres};

use super::shape::{ColumnKind, Shape};
use crate::tables::types::{IntType, TextColumns, TextInput};

/// One value of a row's statement.
#[derive(Debug, Clone, Copy)]
pub(super) enum Field<'v> {
    /// A key (absent: NULL; a clear has no child key).
    Key(Option<&'v str>),
    /// A column's value, as the plan holds it.
    Value(&'v Value),
    /// An integer column's value and deltas, added here.
    Total(i64),
    /// A running sum of an integer column's deltas (read as `numeric`).
    Sum(i128),
    /// A folded column's deltas, in order.
    Deltas(&'v [&'v Value]),
    /// A version: the one written, the one the row must still have (absent: NULL).
    Version(Option<i64>),
}

/// A row's fields: each one's column and the suffix that names it (`$lo`, `$d`, …; the
/// version the row must still have is `$expected`).
pub(super) type Fields<'v> = Vec<(&'static str, &'static str, Field<'v>)>;

/// The name the version a row must still have goes by.
pub(super) const EXPECTED: &str = "$expected";

/// `row`'s fields into `fields`, and its statement's shape into `shape`.
pub(super) fn fields<'v>(row: &'v RowWrite<'v>, fields: &mut Fields<'v>, shape: &mut Shape) {
    let table = &row.table;
    fields.clear();
    fields.push((table.key(), "", Field::Key(Some(row.key))));
    if !table.child_key().is_empty() {
        fields.push((table.child_key(), "", Field::Key(row.child)));
    }
    shape.kind = row.kind;
    shape.columns.clear();
    let int = |name: &str| table.column_type(name).and_then(IntType::of);
    for column in &row.columns {
        let name = column.column;
        let deltas = column.deltas.as_slice();
        let kind = match (column.base, deltas) {
            (Some(base), []) => {
                fields.push((name, "", Field::Value(base)));
                ColumnKind::Set
            }
            // An integer column, every step known: added here, exactly, as the column would.
            (Some(base), _) => match int(name).and_then(|ty| ty.range().total(base, deltas.iter().copied())) {
                Some(total) => {
                    fields.push((name, "", Field::Total(total)));
                    ColumnKind::Set
                }
                None => {
                    fields.extend([(name, "", Field::Value(base)), (name, "$d", Field::Deltas(deltas))]);
                    ColumnKind::FoldValue
                }
            },
            (None, [delta]) => {
                fields.push((name, "", Field::Value(delta)));
                ColumnKind::Add
            }
            (None, _) => match int(name).and_then(|ty| Some((ty, ty.range().sums(deltas.iter().copied())?))) {
                Some((ty, RunningSums { lo, hi, sum })) => {
                    let sums = [("$lo", lo), ("$hi", hi), ("$sum", sum)];
                    fields.extend(sums.map(|(part, n)| (name, part, Field::Sum(n))));
                    ColumnKind::SumStored(ty)
                }
                None => {
                    fields.push((name, "$d", Field::Deltas(deltas)));
                    ColumnKind::FoldStored
                }
            },
        };
        shape.columns.push((name, kind));
    }
    if table.is_gated() {
        fields
            .extend([(table.version(), "", Field::Version(row.version)), (EXPECTED, "", Field::Version(row.expected))]);
    }
}

/// Per field of a statement's rows (a table's rows of one shape), how it goes as an element
/// of an array, if it can.
pub(super) struct Inputs(Vec<Input>);

#[derive(Clone, Copy)]
enum Input {
    /// As text, cast to the type named.
    Cast(TextInput, &'static str),
    /// As text, cast to `numeric`.
    Numeric,
    /// As a `bigint`.
    Bigint,
    /// Never: the row goes as JSON.
    Json,
}

impl Inputs {
    /// The inputs of `table`'s rows whose fields are those of `fields`.
    pub(super) fn of(table: &Table, fields: &Fields<'_>) -> Self {
        let columns = TextColumns::of(table);
        let input = |&(name, _, field): &(&'static str, &'static str, Field<'_>)| match field {
            Field::Key(_) | Field::Value(_) | Field::Total(_) => {
                columns.input(name).and_then(|input| Some(Input::Cast(input, input.cast()?))).unwrap_or(Input::Json)
            }
            Field::Sum(_) => Input::Numeric,
            Field::Version(_) => Input::Bigint,
            Field::Deltas(_) => Input::Json,
        };
        Inputs(fields.iter().map(input).collect())
    }

    /// Whether every field of a row can go as an element of an array (see the module's docs).
    pub(super) fn take(&self, fields: &Fields<'_>) -> bool {
        self.0.iter().zip(fields).all(|(input, &(.., field))| match (input, field) {
            (Input::Cast(input, _), Field::Key(key)) => key.is_none_or(|k| input.takes_str(k)),
            (Input::Cast(input, _), Field::Value(value)) => input.takes(value),
            (Input::Cast(..), Field::Total(_)) | (Input::Numeric, Field::Sum(_)) => true,
            (Input::Bigint, Field::Version(_)) => true,
            _ => false,
        })
    }
}

/// A statement's rows.
pub(super) enum Rows {
    /// A JSON array of objects, as text, and how many.
    Json { json: Vec<u8>, count: usize },
    /// One array per field.
    Arrays(Arrays),
}

impl Rows {
    /// The rows of a statement whose rows have the fields of `fields`, going as arrays (all
    /// of which `inputs` [takes](Inputs::take)) or as JSON.
    pub(super) fn new(inputs: &Inputs, fields: &Fields<'_>, arrays: bool) -> Self {
        if !arrays {
            return Rows::Json { json: Vec::new(), count: 0 };
        }
        let cast = |input: &Input| match input {
            Input::Cast(_, ty) => Some(*ty),
            Input::Numeric => Some("numeric"),
            Input::Bigint | Input::Json => None,
        };
        let spec = fields.iter().zip(&inputs.0).map(|(&(name, suffix, _), input)| (name, suffix, cast(input)));
        let data = inputs.0.iter().map(|input| Array::of(matches!(input, Input::Bigint))).collect();
        Rows::Arrays(Arrays { spec: spec.collect(), data, count: 0 })
    }

    pub(super) fn push(&mut self, fields: &Fields<'_>) {
        match self {
            Rows::Json { json, count } => {
                json.push(if *count == 0 { b'[' } else { b',' });
                write_json(fields, json);
                *count += 1;
            }
            Rows::Arrays(a) => {
                for (array, &(.., field)) in a.data.iter_mut().zip(fields) {
                    array.push(field);
                }
                a.count += 1;
            }
        }
    }

    pub(super) fn count(&self) -> usize {
        match self {
            Rows::Json { count, .. } => *count,
            Rows::Arrays(a) => a.count,
        }
    }
}

/// A statement's rows as one array per field.
pub(super) struct Arrays {
    /// Per field: its column, its suffix, the type its text is cast to (`None`: `bigint`).
    pub(super) spec: Vec<(&'static str, &'static str, Option<&'static str>)>,
    pub(super) data: Vec<Array>,
    count: usize,
}

/// One-dimensional `text[]` or `bigint[]`, in PostgreSQL's binary format, built element by
/// element.
pub(super) struct Array {
    bigint: bool,
    nulls: bool,
    count: i32,
    /// The elements, each its length (-1: NULL) and its bytes.
    bytes: Vec<u8>,
}

impl Array {
    fn of(bigint: bool) -> Self {
        Array { bigint, nulls: false, count: 0, bytes: Vec::new() }
    }

    fn push(&mut self, field: Field<'_>) {
        self.count += 1;
        match field {
            Field::Version(Some(v)) => {
                self.bytes.extend_from_slice(&8_i32.to_be_bytes());
                self.bytes.extend_from_slice(&v.to_be_bytes());
            }
            Field::Key(None) | Field::Version(None) | Field::Value(Value::Null) => {
                self.bytes.extend_from_slice(&(-1_i32).to_be_bytes());
                self.nulls = true;
            }
            Field::Key(Some(s)) => self.text(|b| b.extend_from_slice(s.as_bytes())),
            Field::Value(Value::String(s)) => self.text(|b| b.extend_from_slice(s.as_bytes())),
            Field::Value(Value::Bool(b)) => self.text(|out| out.extend_from_slice(if *b { b"true" } else { b"false" })),
            Field::Value(Value::Number(n)) => match (n.as_i64(), n.as_u64()) {
                (Some(i), _) => self.text(|b| decimal(b, i.into())),
                (_, Some(u)) => self.text(|b| decimal(b, u.into())),
                _ => self.text(|b| write!(b, "{n}").expect("writing to a Vec")),
            },
            Field::Total(n) => self.text(|b| decimal(b, n.into())),
            Field::Sum(n) => self.text(|b| decimal(b, n)),
            // Never sent as arrays (see `as_arrays`).
            Field::Value(v @ (Value::Array(_) | Value::Object(_))) => {
                self.text(|b| serde_json::to_writer(b, v).expect("a JSON value always serialises"))
            }
            Field::Deltas(_) => unreachable!("a folded column's deltas go as JSON"),
        }
    }

    /// An element written by `write`, its length before it.
    fn text(&mut self, write: impl FnOnce(&mut Vec<u8>)) {
        let at = self.bytes.len();
        self.bytes.extend_from_slice(&[0; 4]);
        write(&mut self.bytes);
        let len = i32::try_from(self.bytes.len() - at - 4).expect("a value under 2 GiB");
        self.bytes[at..at + 4].copy_from_slice(&len.to_be_bytes());
    }

    /// The array type's and its element type's OIDs.
    fn oids(&self) -> (u32, u32) {
        if self.bigint {
            (1016, 20)
        } else {
            (1009, 25)
        }
    }
}

impl sqlx::Type<Postgres> for Array {
    fn type_info() -> PgTypeInfo {
        PgTypeInfo::with_oid(Oid(1009))
    }
}

impl sqlx::Encode<'_, Postgres> for Array {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        let (_, element) = self.oids();
        buf.extend_from_slice(&1_i32.to_be_bytes()); // dimensions
        buf.extend_from_slice(&i32::from(self.nulls).to_be_bytes());
        buf.extend_from_slice(&element.to_be_bytes());
        buf.extend_from_slice(&self.count.to_be_bytes()); // the dimension's length
        buf.extend_from_slice(&1_i32.to_be_bytes()); // its lower bound
        buf.extend_from_slice(&self.bytes);
        Ok(IsNull::No)
    }

    fn produces(&self) -> Option<PgTypeInfo> {
        Some(PgTypeInfo::with_oid(Oid(self.oids().0)))
    }

    fn size_hint(&self) -> usize {
        20 + self.bytes.len()
    }
}

/// `n` in decimal, as `{n}` writes it, without the formatting machinery (an integer field
/// of every row goes so).
fn decimal(out: &mut Vec<u8>, n: i128) {
    let Ok(mut rest) = u64::try_from(n.unsigned_abs()) else {
        return write!(out, "{n}").expect("writing to a Vec");
    };
    let mut digits = [0_u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b"0123456789"[(rest % 10) as usize];
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if n < 0 {
        out.push(b'-');
    }
    out.extend_from_slice(&digits[at..]);
}

/// A row's fields as the JSON object `jsonb_populate_record` reads: key, base values,
/// version, the version the row must still have, per folded column its deltas as
/// `{"c$d": [{"c": d}, …]}`, per summed column `c$lo`, `c$hi` and `c$sum` (as strings: JSON
/// numbers past `i64` would lose digits). An absent key or version is left out.
fn write_json(fields: &Fields<'_>, out: &mut Vec<u8>) {
    let mut doc = Doc::new(out);
    for &(name, suffix, field) in fields {
        match field {
            Field::Key(None) | Field::Version(None) => {}
            Field::Key(Some(key)) => doc.field(name, suffix, key),
            Field::Value(value) => doc.field(name, suffix, value),
            Field::Total(n) => doc.field(name, suffix, &n),
            Field::Version(Some(v)) => doc.field(name, suffix, &v),
            Field::Sum(n) => {
                doc.key(name, suffix);
                write!(doc.out, "\"{n}\"").expect("writing to a Vec");
            }
            Field::Deltas(deltas) => {
                doc.key(name, suffix);
                doc.out.push(b'[');
                for (i, d) in deltas.iter().enumerate() {
                    if i > 0 {
                        doc.out.push(b',');
                    }
                    let mut one = Doc::new(doc.out);
                    one.field(name, "", d);
                    one.end();
                }
                doc.out.push(b']');
            }
        }
    }
    doc.end();
}

/// A JSON object written field by field.
struct Doc<'a> {
    out: &'a mut Vec<u8>,
    first: bool,
}

impl<'a> Doc<'a> {
    fn new(out: &'a mut Vec<u8>) -> Self {
        out.push(b'{');
        Self { out, first: true }
    }

    /// Writes the key `name` followed by `suffix` (JSON-escaped), and the colon.
    fn key(&mut self, name: &str, suffix: &str) {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        serde_json::to_writer(&mut *self.out, name).expect("a string always serialises");
        if !suffix.is_empty() {
            // Inside the key's quotes: the suffixes are plain ASCII (`$d`, `$lo`, ...).
            self.out.pop();
            self.out.extend_from_slice(suffix.as_bytes());
            self.out.push(b'"');
        }
        self.out.push(b':');
    }

    fn field(&mut self, name: &str, suffix: &str, value: &(impl Serialize + ?Sized)) {
        self.key(name, suffix);
        serde_json::to_writer(&mut *self.out, value).expect("a JSON value always serialises");
    }

    fn end(self) {
        self.out.push(b'}');
    }
}

#[cfg(test)]
mod tests;
