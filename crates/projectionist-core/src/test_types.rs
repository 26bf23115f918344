//! Column types for the core's unit tests. The planner and the fold ask what a column takes
//! of the database's crate ([`TypeRules`]), which the core does not build on; these spell out,
//! for each declaration the tests use, what PostgreSQL's (`projectionist_postgres::PgTypes`)
//! says of it. That crate's tests check that it says so
//! (`types::tests::the_rules_the_core_tests_spell_out_are_postgres_own`).

use serde_json::Value;

use crate::plan::{ColumnValues, IntRange, TypeRules};

/// The column types of the core's tests (see the module).
pub(crate) struct TestTypes;

/// The declarations the tests use, and their rules.
const DECLARED: [(&str, Rules); 7] = [
    ("bigint", Rules::of(BIGINT)),
    ("bigint NOT NULL DEFAULT 0", Rules { not_null: true, default: true, ..Rules::of(BIGINT) }),
    ("smallint", Rules::of(Values::Int(IntRange { min: i16::MIN as i128, max: i16::MAX as i128 }))),
    ("text", Rules::of(Values::Text)),
    ("text NOT NULL", Rules { not_null: true, ..Rules::of(Values::Text) }),
    ("double precision", Rules::of(Values::Float)),
    ("numeric(4,2) NOT NULL DEFAULT 0", Rules { not_null: true, default: true, ..Rules::of(Values::Numeric(2)) }),
];

const BIGINT: Values = Values::Int(IntRange { min: i64::MIN as i128, max: i64::MAX as i128 });

impl TypeRules for TestTypes {
    fn column(&self, declared: &str) -> Box<dyn ColumnValues> {
        let rules = DECLARED.iter().find(|(d, _)| *d == declared).map(|(_, rules)| *rules);
        Box::new(rules.unwrap_or_else(|| panic!("no rules spelled out for {declared:?}: add them to DECLARED")))
    }
}

/// A declaration's rules: the values its type takes, `NOT NULL`, a `DEFAULT`.
#[derive(Debug, Clone, Copy)]
struct Rules {
    values: Values,
    not_null: bool,
    default: bool,
}

impl Rules {
    const fn of(values: Values) -> Self {
        Self { values, not_null: false, default: false }
    }
}

/// The values a type surely takes.
#[derive(Debug, Clone, Copy)]
enum Values {
    /// Integers from the least to the greatest: adds are summed, each step's range checked.
    Int(IntRange),
    /// Strings without a NUL, numbers and booleans (`text`).
    Text,
    /// Any number; adds are summed in order, as the steps would be (`double precision`).
    Float,
    /// Numbers below 10^digits − 1 in magnitude; adds are not summed (`numeric(p, s)`
    /// rounds and checks each stored step).
    Numeric(i32),
}

impl ColumnValues for Rules {
    fn surely_fits(&self, value: &Value) -> bool {
        match (self.values, value) {
            (_, Value::Null) => !self.not_null,
            (Values::Int(range), Value::Number(n)) => n.as_i64().is_some_and(|n| range.contains(n.into())),
            (Values::Text, Value::String(s)) => !s.contains('\0'),
            (Values::Text, Value::Number(_) | Value::Bool(_)) => true,
            (Values::Float, Value::Number(_)) => true,
            (Values::Numeric(digits), Value::Number(n)) => {
                n.as_f64().is_some_and(|v| v.abs() < 10_f64.powi(digits) - 1.0)
            }
            _ => false,
        }
    }

    fn int_range(&self) -> Option<IntRange> {
        match self.values {
            Values::Int(range) => Some(range),
            _ => None,
        }
    }

    fn chains_exactly(&self) -> bool {
        matches!(self.values, Values::Int(..) | Values::Float)
    }

    fn required(&self) -> bool {
        self.not_null && !self.default
    }
}
