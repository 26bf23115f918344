//! What a column's declaration says of the values PostgreSQL surely takes: the planner writes
//! over (coalesces away) only values that surely fit, and a bulk load copies only values
//! `COPY` stores as the JSON path does.

use super::*;

/// A table's columns as PostgreSQL takes their values, read from the declarations once per
/// plan (a value written over is checked against its column for each event).
pub(crate) struct Declared(Vec<(&'static str, ColumnType)>);

impl Declared {
    pub(crate) fn of(table: &Table) -> Self {
        Self(
            table
                .column_declarations()
                .iter()
                .map(|(name, declared)| (*name, ColumnType::of(Some(declared))))
                .collect(),
        )
    }

    pub(crate) fn column(&self, column: &str) -> ColumnType {
        self.0.iter().find(|(name, _)| *name == column).map_or(ColumnType::of(None), |(_, ty)| *ty)
    }

    /// The columns a row cannot be inserted without: `NOT NULL` with no default.
    pub(crate) fn required(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.0.iter().filter(|(_, ty)| ty.not_null && !ty.has_default).map(|(name, _)| *name)
    }
}

/// A table's columns as `COPY … FROM STDIN` takes their values: for a bulk load of new rows,
/// where `COPY` stores what the JSON path (`jsonb_populate_record`) stores.
pub struct CopyColumns(Declared);

impl CopyColumns {
    /// `table`'s columns, read from its declarations.
    pub fn of(table: &Table) -> Self {
        Self(Declared::of(table))
    }

    /// Whether `value`, given to `column` as its text (a string's content, a number's or a
    /// boolean's JSON text, `NULL` for null), is stored as the JSON path stores it: the type's
    /// text input reads both. Not for `json` and `jsonb` columns (the JSON path stores the
    /// value, its text normalised), nor for numbers and booleans into text columns (a number's
    /// text there is PostgreSQL's rendering of it), nor for `-0.0` (the JSON path reads it as
    /// a `numeric`, which has no negative zero), nor for types not known here.
    pub fn takes(&self, column: &str, value: &Value) -> bool {
        let known = self.0.column(column).known;
        match value {
            Value::Null => true,
            Value::String(_) => matches!(known, Some(Known::Text | Known::Timestamptz | Known::Uuid)),
            Value::Number(n) if n.as_f64().is_some_and(|f| f == 0.0 && f.is_sign_negative()) => false,
            Value::Number(_) => matches!(
                known,
                Some(Known::BigInt | Known::Int | Known::SmallInt | Known::Float | Known::Numeric { .. })
            ),
            Value::Bool(_) => known == Some(Known::Bool),
            Value::Array(_) | Value::Object(_) => false,
        }
    }
}

/// What a column's declaration says of the values it surely takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ColumnType {
    /// Declared at all (an undeclared column: nothing surely fits).
    declared: bool,
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
pub(super) enum Known {
    Text,
    Json,
    BigInt,
    Int,
    SmallInt,
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
    /// The declaration `declared` (`None`: not declared) classified.
    pub(super) fn of(declared: Option<&str>) -> Self {
        let Some(declared) = declared else {
            return Self { declared: false, known: None, not_null: false, has_default: false, constrained: false };
        };
        let has =
            |needle: &str| declared.as_bytes().windows(needle.len()).any(|w| w.eq_ignore_ascii_case(needle.as_bytes()));
        // The type: the words before the first of the column's constraints.
        const CONSTRAINTS: [&str; 6] = ["not", "null", "default", "unique", "collate", "generated"];
        const KNOWN: [(&str, Known); 22] = [
            ("text", Known::Text),
            ("varchar", Known::Text),
            ("character varying", Known::Text),
            ("citext", Known::Text),
            ("jsonb", Known::Json),
            ("json", Known::Json),
            ("bigint", Known::BigInt),
            ("int8", Known::BigInt),
            ("integer", Known::Int),
            ("int", Known::Int),
            ("int4", Known::Int),
            ("smallint", Known::SmallInt),
            ("int2", Known::SmallInt),
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
            declared: true,
            known: KNOWN.iter().find(|(name, _)| is(name)).map(|(_, known)| *known).or_else(numeric),
            not_null: has("not null") || has("primary key"),
            has_default: has("default") || has("generated") || has("serial"),
            constrained: has("check") || has("references"),
        }
    }

    /// The range of an integer column (`bigint`, `integer`, `smallint`), where every add is
    /// exact.
    pub(crate) fn int_range(self) -> Option<(i128, i128)> {
        match self.known? {
            Known::BigInt => Some((i64::MIN.into(), i64::MAX.into())),
            Known::Int => Some((i32::MIN.into(), i32::MAX.into())),
            Known::SmallInt => Some((i16::MIN.into(), i16::MAX.into())),
            _ => None,
        }
    }

    /// Whether adds to the column may be summed before PostgreSQL sees them: integers (the
    /// writer checks each step's range) and the types that add in order as the steps would
    /// (`double precision`, unconstrained `numeric`). Not `numeric(p, s)`, which rounds and
    /// checks each stored step, nor a type not known here.
    pub(crate) fn chains_exactly(self) -> bool {
        !self.constrained && matches!(self.known, Some(Known::BigInt | Known::Int | Known::SmallInt | Known::Float))
    }

    /// Whether `value` surely fits the column: what PostgreSQL's input of the type takes
    /// for certain. Anything else might be refused. Called for each value written over, so
    /// nothing here allocates but the JSON check.
    pub(crate) fn surely_fits(self, value: &Value) -> bool {
        if !self.declared {
            return false;
        }
        if value.is_null() {
            return !self.not_null;
        }
        if self.constrained {
            return false;
        }
        let no_nul = |s: &str| !s.contains('\0');
        match (self.known, value) {
            (Some(Known::Text), Value::String(s)) => no_nul(s),
            (Some(Known::Text), Value::Number(_) | Value::Bool(_)) => true,
            (Some(Known::Json), v) => !v.to_string().contains("\\u0000"),
            (Some(Known::BigInt), Value::Number(n)) => n.is_i64(),
            (Some(Known::Int), Value::Number(n)) => n.as_i64().is_some_and(|n| i32::try_from(n).is_ok()),
            (Some(Known::SmallInt), Value::Number(n)) => n.as_i64().is_some_and(|n| i16::try_from(n).is_ok()),
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
}

/// Whether PostgreSQL surely takes `s` as a `uuid`: the canonical form only, 32 hex digits in
/// groups of 8-4-4-4-12 (PostgreSQL refuses forms other parsers take, such as `urn:uuid:…`).
pub(super) fn surely_a_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter()
            .enumerate()
            .all(|(i, c)| if matches!(i, 8 | 13 | 18 | 23) { *c == b'-' } else { c.is_ascii_hexdigit() })
}

/// Whether PostgreSQL surely takes `s` as a `timestamptz`: an RFC 3339 timestamp of years 1
/// to 9999 (PostgreSQL refuses year 0, which RFC 3339 parsers take), a real date, seconds
/// below 60, an offset within ±14:59. Checked byte by byte: it runs for every such value
/// written over (a projection's `updated_at`, in each event).
pub(super) fn surely_a_timestamptz(s: &str) -> bool {
    let b = s.as_bytes();
    let number = |from: usize, len: usize| -> Option<u32> {
        let digits = b.get(from..from + len)?;
        digits.iter().try_fold(0_u32, |n, d| d.is_ascii_digit().then(|| n * 10 + u32::from(d - b'0')))
    };
    let at = |i: usize, c: u8| b.get(i) == Some(&c);
    let (Some(year), Some(month), Some(day)) = (number(0, 4), number(5, 2), number(8, 2)) else { return false };
    let (Some(hour), Some(minute), Some(second)) = (number(11, 2), number(14, 2), number(17, 2)) else { return false };
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days = match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    };
    let shape = at(4, b'-') && at(7, b'-') && at(10, b'T') && at(13, b':') && at(16, b':');
    if !shape || year == 0 || !(1..=12).contains(&month) || !(1..=days).contains(&day) {
        return false;
    }
    if hour > 23 || minute > 59 || second > 59 {
        return false;
    }
    // A fraction of up to nine digits, then the offset.
    let mut i = 19;
    if at(i, b'.') {
        let digits = b[i + 1..].iter().take_while(|d| d.is_ascii_digit()).count();
        if !(1..=9).contains(&digits) {
            return false;
        }
        i += 1 + digits;
    }
    match b.get(i) {
        Some(b'Z') => i + 1 == b.len(),
        Some(b'+' | b'-') => {
            let (Some(h), Some(m)) = (number(i + 1, 2), number(i + 4, 2)) else { return false };
            at(i + 3, b':') && i + 6 == b.len() && h <= 14 && m <= 59
        }
        _ => false,
    }
}
