//! PostgreSQL's column types, as far as the engine needs to know them: what a column's
//! declaration says of the values PostgreSQL surely takes, for the planner and the fold
//! ([`PgTypes`], core's `TypeRules`); an integer type's names and range ([`IntType`], for
//! those and for the statements' exact sums); and which values `COPY` stores as the JSON
//! path does ([`CopyColumns`], for a bulk load).

mod input;
#[cfg(test)]
mod tests;

use projectionist_core::plan::{ColumnValues, IntRange, TypeRules};
use projectionist_core::Table;
use serde_json::Value;

use input::{surely_a_timestamptz, surely_a_uuid};

/// PostgreSQL's column types, as the planner and the fold ask them
/// ([`plan`](projectionist_core::plan::plan), [`Fold::absorb`](projectionist_core::fold::Fold::absorb)):
/// what a column's declaration says of the values PostgreSQL surely takes in it.
#[derive(Debug, Clone, Copy, Default)]
pub struct PgTypes;

impl TypeRules for PgTypes {
    fn column(&self, declared: &str) -> Box<dyn ColumnValues> {
        Box::new(ColumnType::of(declared))
    }
}

/// The columns of `table` its declarations make NOT NULL with no default: a row inserted
/// without them is refused, and the planner never completes such an insert with a later
/// event's values.
pub(crate) fn required_columns(table: &Table) -> Vec<&'static str> {
    let declared = table.column_declarations().iter();
    declared.filter(|(_, declared)| ColumnType::of(declared).required()).map(|(name, _)| *name).collect()
}

/// A table's columns as their types' text input takes values: for `COPY … FROM STDIN`
/// (a bulk load of new rows) and for the statements that send rows as arrays of text, cast
/// to each column's type (see `batch::rows`), where those store what the JSON path
/// (`jsonb_populate_record`) stores.
pub(crate) struct TextColumns(Vec<(&'static str, TextInput)>);

impl TextColumns {
    /// `table`'s columns, read from its declarations: its key (and a child table's key of
    /// the child), its declared columns and, when gated, its version.
    pub(crate) fn of(table: &Table) -> Self {
        let [first, second] = table.key_types();
        let mut columns = vec![(table.key(), first)];
        if !table.child_key().is_empty() {
            columns.push((table.child_key(), second));
        }
        columns.extend(table.column_declarations().iter().copied());
        if table.is_gated() {
            columns.push((table.version(), "bigint"));
        }
        let input = |declared| TextInput { known: ColumnType::of(declared).known, cast: cast_type(declared) };
        Self(columns.into_iter().map(|(name, declared)| (name, input(declared))).collect())
    }

    /// How `column` takes values as text (`None`: not a column of the table).
    pub(crate) fn input(&self, column: &str) -> Option<TextInput> {
        self.0.iter().find(|(name, _)| *name == column).map(|(_, input)| *input)
    }

    /// Whether `column` takes `value` as [`TextInput::takes`] says (`NULL` in any column).
    pub(crate) fn takes(&self, column: &str, value: &Value) -> bool {
        self.input(column).map_or(value.is_null(), |input| input.takes(value))
    }
}

/// How a column takes values as text.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TextInput {
    known: Option<Known>,
    cast: Option<&'static str>,
}

impl TextInput {
    /// Whether `value`, given as its text (a string's content, a number's or a boolean's JSON
    /// text, `NULL` for null), is stored as the JSON path stores it: the type's text input
    /// reads both. Not for `json` and `jsonb` columns (the JSON path stores the value, its text
    /// normalised), nor for numbers and booleans into text columns (a number's text there is
    /// PostgreSQL's rendering of it), nor for a number written with a fraction or an exponent
    /// into an integer column (the JSON path reads `1e2` as 100), nor for `-0.0` (the JSON path
    /// reads it as a `numeric`, which has no negative zero), nor for a string holding a NUL
    /// (refused either way, in other words), nor for types not known here.
    pub(crate) fn takes(&self, value: &Value) -> bool {
        match value {
            Value::Null => true,
            Value::String(s) => self.takes_str(s),
            Value::Number(n) if n.is_f64() && n.as_f64().is_some_and(|f| f == 0.0 && f.is_sign_negative()) => false,
            Value::Number(n) if matches!(self.known, Some(Known::Int(_))) => n.is_i64() || n.is_u64(),
            Value::Number(_) => matches!(self.known, Some(Known::Float | Known::Numeric { .. })),
            Value::Bool(_) => self.known == Some(Known::Bool),
            Value::Array(_) | Value::Object(_) => false,
        }
    }

    /// Whether the string `s` is taken as [`TextInput::takes`] says.
    pub(crate) fn takes_str(&self, s: &str) -> bool {
        matches!(self.known, Some(Known::Text | Known::Timestamptz | Known::Uuid)) && !s.as_bytes().contains(&0)
    }

    /// The type the column's text is cast to (`bigint`, `text`, …): for a declaration of one
    /// of the types whose cast from `text` is their text input, with no length or precision to
    /// apply (a cast would cut a `varchar(n)` where the input refuses it).
    pub(crate) fn cast(&self) -> Option<&'static str> {
        self.cast
    }
}

/// The type a declaration such as `bigint NOT NULL DEFAULT 0` starts with, as a cast names
/// it, when it is one of those [`TextInput::cast`] takes.
fn cast_type(declared: &str) -> Option<&'static str> {
    // The integer types as `IntType` names them; the others here.
    const CASTS: [(&str, &str); 10] = [
        ("text", "text"),
        ("boolean", "boolean"),
        ("bool", "boolean"),
        ("double precision", "double precision"),
        ("float8", "double precision"),
        ("numeric", "numeric"),
        ("decimal", "numeric"),
        ("timestamptz", "timestamptz"),
        ("timestamp with time zone", "timestamptz"),
        ("uuid", "uuid"),
    ];
    const CONSTRAINTS: [&str; 10] =
        ["not", "null", "default", "unique", "collate", "generated", "primary", "references", "check", "constraint"];
    let words: Vec<&str> =
        declared.split_whitespace().take_while(|w| !CONSTRAINTS.iter().any(|c| w.eq_ignore_ascii_case(c))).collect();
    let named = |name: &str| {
        name.split(' ').count() == words.len() && name.split(' ').zip(&words).all(|(n, w)| w.eq_ignore_ascii_case(n))
    };
    if let [word] = words[..] {
        if let Some(int) = IntType::named(word) {
            return Some(int.name());
        }
    }
    CASTS.iter().find(|(name, _)| named(name)).map(|(_, cast)| *cast)
}

/// An integer column type: its names, its range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IntType {
    Small,
    Int,
    Big,
}

impl IntType {
    /// The integer type named `name` (one word, any case: `smallint`, `int2`, `integer`,
    /// `int`, `int4`, `bigint`, `int8`).
    pub(crate) fn named(name: &str) -> Option<Self> {
        let is = |names: &[&str]| names.iter().any(|n| name.eq_ignore_ascii_case(n));
        if is(&["smallint", "int2"]) {
            Some(Self::Small)
        } else if is(&["integer", "int", "int4"]) {
            Some(Self::Int)
        } else if is(&["bigint", "int8"]) {
            Some(Self::Big)
        } else {
            None
        }
    }

    /// The integer type a declaration such as `bigint NOT NULL DEFAULT 0` starts with.
    pub(crate) fn of(declared: &str) -> Option<Self> {
        declared.split_whitespace().next().and_then(Self::named)
    }

    /// The type's name in SQL.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Small => "smallint",
            Self::Int => "integer",
            Self::Big => "bigint",
        }
    }

    /// The values the type takes, from the least to the greatest.
    pub(crate) fn range(self) -> IntRange {
        let (min, max) = match self {
            Self::Small => (i16::MIN.into(), i16::MAX.into()),
            Self::Int => (i32::MIN.into(), i32::MAX.into()),
            Self::Big => (i64::MIN.into(), i64::MAX.into()),
        };
        IntRange { min, max }
    }
}

/// What a column's declaration says of the values it surely takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ColumnType {
    /// The type, when one of those whose input is known here.
    known: Option<Known>,
    /// `NOT NULL` or `PRIMARY KEY`.
    not_null: bool,
    /// A `DEFAULT`, or a value PostgreSQL makes (`GENERATED`, `IDENTITY`, a `serial` type).
    has_default: bool,
    /// A `CHECK` or `REFERENCES` of its own: no value but `NULL` surely fits.
    constrained: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Known {
    Text,
    Json,
    Int(IntType),
    Bool,
    Float,
    /// `numeric(p, s)`: numbers below 10^(p − s) − 1 in magnitude, whatever their rounding.
    Numeric {
        int_digits: u32,
    },
    Timestamptz,
    Uuid,
}

impl ColumnType {
    /// The declaration `declared` (its SQL type with its constraints) classified.
    pub(crate) fn of(declared: &str) -> Self {
        let has =
            |needle: &str| declared.as_bytes().windows(needle.len()).any(|w| w.eq_ignore_ascii_case(needle.as_bytes()));
        // The type: the words before the first of the column's constraints.
        const CONSTRAINTS: [&str; 6] = ["not", "null", "default", "unique", "collate", "generated"];
        // The types known here but integers (one word, each: see `IntType::named`).
        const KNOWN: [(&str, Known); 15] = [
            ("text", Known::Text),
            ("varchar", Known::Text),
            ("character varying", Known::Text),
            ("citext", Known::Text),
            ("jsonb", Known::Json),
            ("json", Known::Json),
            ("boolean", Known::Bool),
            ("bool", Known::Bool),
            ("double precision", Known::Float),
            ("float8", Known::Float),
            ("numeric", Known::Float),
            ("decimal", Known::Float),
            ("timestamptz", Known::Timestamptz),
            ("timestamp with time zone", Known::Timestamptz),
            ("uuid", Known::Uuid),
        ];
        let words = declared.split_whitespace().take_while(|w| !CONSTRAINTS.iter().any(|c| w.eq_ignore_ascii_case(c)));
        let is = |name: &str| {
            let mut words = words.clone();
            name.split(' ').all(|n| words.next().is_some_and(|w| w.eq_ignore_ascii_case(n))) && words.next().is_none()
        };
        let integer = || {
            let mut words = words.clone();
            words.next().and_then(IntType::named).filter(|_| words.next().is_none()).map(Known::Int)
        };
        // `numeric(p, s)` / `decimal(p, s)`: its digits before the point.
        let numeric = || {
            let ty: String = words.clone().collect();
            let lower = ty.to_ascii_lowercase();
            let args = lower.strip_prefix("numeric").or_else(|| lower.strip_prefix("decimal"))?;
            let args = args.strip_prefix('(')?.strip_suffix(')')?;
            let mut args = args.split(',').map(|a| a.trim().parse::<u32>().ok());
            let (precision, scale) = (args.next()??, args.next().unwrap_or(Some(0))?);
            Some(Known::Numeric { int_digits: precision.checked_sub(scale)? })
        };
        Self {
            known: KNOWN.iter().find(|(name, _)| is(name)).map(|(_, known)| *known).or_else(integer).or_else(numeric),
            not_null: has("not null") || has("primary key"),
            has_default: has("default") || has("generated") || has("serial"),
            constrained: has("check") || has("references"),
        }
    }
}

impl ColumnValues for ColumnType {
    /// What PostgreSQL's input of the type takes for certain. Nothing here allocates but the
    /// JSON check.
    fn surely_fits(&self, value: &Value) -> bool {
        if value.is_null() {
            return !self.not_null;
        }
        if self.constrained {
            return false;
        }
        let no_nul = |s: &str| !s.as_bytes().contains(&0);
        match (self.known, value) {
            (Some(Known::Text), Value::String(s)) => no_nul(s),
            (Some(Known::Text), Value::Number(_) | Value::Bool(_)) => true,
            (Some(Known::Json), v) => !v.to_string().contains("\\u0000"),
            (Some(Known::Int(ty)), Value::Number(n)) => n.as_i64().is_some_and(|n| ty.range().contains(n.into())),
            (Some(Known::Bool), Value::Bool(_)) => true,
            (Some(Known::Float), Value::Number(_)) => true,
            (Some(Known::Numeric { int_digits }), Value::Number(n)) => {
                n.as_f64().is_some_and(|v| v.abs() < 10_f64.powi(int_digits.min(300) as i32) - 1.0)
            }
            (Some(Known::Timestamptz), Value::String(s)) => surely_a_timestamptz(s),
            (Some(Known::Uuid), Value::String(s)) => surely_a_uuid(s),
            _ => false,
        }
    }

    /// `bigint`, `integer`, `smallint`.
    fn int_range(&self) -> Option<IntRange> {
        match self.known? {
            Known::Int(ty) => Some(ty.range()),
            _ => None,
        }
    }

    /// Integers (the writer checks each step's range) and the types that add in order as the
    /// steps would (`double precision`, unconstrained `numeric`). Not `numeric(p, s)`, which
    /// rounds and checks each stored step, nor a type not known here.
    fn chains_exactly(&self) -> bool {
        !self.constrained && matches!(self.known, Some(Known::Int(_) | Known::Float))
    }

    fn required(&self) -> bool {
        self.not_null && !self.has_default
    }
}
