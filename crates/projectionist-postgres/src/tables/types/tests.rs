//! PostgreSQL's column types: what surely fits, an integer type, the rules the core's tests
//! spell out, what `COPY` takes.

use projectionist_core::plan::{ColumnValues, IntRange};
use projectionist_core::Table;
use serde_json::{json, Value};

use super::{required_columns, ColumnType, IntType, TextColumns};

#[test]
fn only_values_that_surely_fit_their_column_may_be_written_over_unseen() {
    let fits = |declared: &str, value: Value| ColumnType::of(declared).surely_fits(&value);
    assert!(fits("text", json!("ann")) && !fits("text", json!("nul\u{0}")));
    assert!(fits("text", Value::Null) && !fits("text NOT NULL", Value::Null));
    assert!(fits("bigint NOT NULL DEFAULT 0", json!(i64::MIN)) && !fits("bigint", json!(1.5)));
    assert!(fits("smallint", json!(-32768)) && !fits("smallint", json!(32768)) && !fits("integer", json!(1u64 << 31)));
    assert!(fits("numeric", json!(1e300)) && !fits("numeric(10,2)", json!(1e8)), "a precision may overflow");
    assert!(fits("numeric(10,2)", json!(99_999_998.999)) && fits("NUMERIC (12, 2) NOT NULL", json!(-0.125)));
    assert!(fits("decimal(4)", json!(9998)) && !fits("decimal(4)", json!(9999.5)) && !fits("numeric(2,3)", json!(0)));
    assert!(fits("double precision", json!(0.1)) && !fits("real", json!(0.1)), "real: not known to fit");
    assert!(fits("timestamptz", json!("2026-11-24T20:56:28Z")) && !fits("timestamptz", json!("yesterday")));
    assert!(fits("timestamp with time zone NOT NULL", json!("2026-11-24T20:56:28+01:00")));
    assert!(
        fits("timestamptz", json!("2024-02-29T23:59:59.123456789Z"))
            && fits("timestamptz", json!("0001-01-01T00:00:00-14:59"))
    );
    for refused in [
        "0000-01-01T00:00:00Z",
        "2023-02-29T00:00:00Z",
        "2026-04-31T00:00:00Z",
        "2026-11-24T24:00:00Z",
        "2026-11-24T20:56:60Z",
        "2026-11-24T20:56:28.Z",
        "2026-11-24T20:56:28.1234567890Z",
        "2026-11-24T20:56:28+15:00",
        "2026-11-24T20:56:28",
        "2026-11-24T20:56:28Zx",
        "2026-11-24 20:56:28Z",
    ] {
        assert!(!fits("timestamptz", json!(refused)), "{refused} might be refused");
    }
    assert!(!fits("timestamp", json!("2026-11-24T20:56:28Z")), "only the types known");
    assert!(!fits("varchar(3)", json!("four")) && fits("character varying", json!("four")));
    assert!(fits("jsonb", json!({"a": [1, "b"]})) && !fits("jsonb", json!({"a": "\u{0}"})));
    assert!(!fits("text CHECK (last <> 'x')", json!("y")), "a constraint of its own");
    assert!(fits("uuid", json!("67e55044-10b1-426f-9247-bb680e5fe0c8")) && !fits("uuid", json!("x")));
    // Forms a UUID parser takes and PostgreSQL's input does not, or that only some take.
    for other in [
        "urn:uuid:67e55044-10b1-426f-9247-bb680e5fe0c8",
        "67e5504410b1426f9247bb680e5fe0c8",
        "{67e55044-10b1-426f-9247-bb680e5fe0c8}",
    ] {
        assert!(!fits("uuid", json!(other)), "{other}");
    }
}

#[test]
fn an_integer_type_is_read_from_the_first_word_of_its_declaration() {
    assert_eq!(IntType::of("bigint NOT NULL DEFAULT 0"), Some(IntType::Big));
    assert_eq!(IntType::of("INT4"), Some(IntType::Int));
    assert_eq!(IntType::of("smallint"), Some(IntType::Small));
    assert_eq!(IntType::of("numeric(12,2)"), None);
    assert_eq!(IntType::of("bigserial"), None);
}

#[test]
fn integer_columns_take_their_type_s_range_and_sum_exactly() {
    let column = |declared: &str| ColumnType::of(declared);
    let range = |min: i128, max: i128| Some(IntRange { min, max });
    let big = range(i64::MIN.into(), i64::MAX.into());
    assert_eq!(column("bigint").int_range(), big);
    assert_eq!(column("INT8 NOT NULL").int_range(), big);
    assert_eq!(column("integer").int_range(), range(i32::MIN.into(), i32::MAX.into()));
    assert_eq!(column("int2 DEFAULT 0").int_range(), range(i16::MIN.into(), i16::MAX.into()));
    assert_eq!(column("bigint PRIMARY KEY").int_range(), None, "the type is the words before NOT, DEFAULT, …");
    assert_eq!(column("numeric").int_range(), None);
    assert!(column("bigint").chains_exactly() && column("double precision").chains_exactly());
    assert!(column("numeric").chains_exactly(), "unconstrained numeric adds as the steps would");
    assert!(!column("numeric(10,2)").chains_exactly(), "numeric(p, s) rounds and checks each step");
    assert!(!column("bigint CHECK (n > 0)").chains_exactly() && !column("real").chains_exactly());
}

/// The core's tests plan against rules spelled out by declaration (core's `test_types.rs`):
/// PostgreSQL's say the same of those declarations.
#[test]
fn the_rules_the_core_tests_spell_out_are_postgres_own() {
    let big = Some(IntRange { min: i64::MIN.into(), max: i64::MAX.into() });
    let small = Some(IntRange { min: i16::MIN.into(), max: i16::MAX.into() });
    // Declaration, integer range, adds summed, required (NOT NULL without a default), null fits.
    let spelled_out = [
        ("bigint", big, true, false, true),
        ("bigint NOT NULL DEFAULT 0", big, true, false, false),
        ("smallint", small, true, false, true),
        ("text", None, false, false, true),
        ("text NOT NULL", None, false, true, false),
        ("double precision", None, true, false, true),
        ("numeric(4,2) NOT NULL DEFAULT 0", None, false, false, false),
    ];
    for (declared, int_range, chains, required, null) in spelled_out {
        let column = ColumnType::of(declared);
        let said = (column.int_range(), column.chains_exactly(), column.required(), column.surely_fits(&Value::Null));
        assert_eq!(said, (int_range, chains, required, null), "{declared}");
    }
    // What surely fits: integers in range; strings without a NUL, numbers and booleans in
    // text; any number in a float; below 10^(p − s) − 1 in numeric(p, s).
    let fits = |declared: &str, value: Value| ColumnType::of(declared).surely_fits(&value);
    assert!(fits("smallint", json!(32767)) && !fits("smallint", json!(32768)) && !fits("bigint", json!(0.5)));
    assert!(fits("bigint", json!(i64::MIN)) && !fits("bigint", json!(u64::MAX)) && !fits("bigint", json!("1")));
    assert!(fits("text", json!(1.5)) && fits("text", json!(true)) && !fits("text", json!("nul\u{0}")));
    assert!(!fits("text", json!([1])) && fits("double precision", json!(1e300)));
    let numeric = "numeric(4,2) NOT NULL DEFAULT 0";
    assert!(fits(numeric, json!(98.99)) && !fits(numeric, json!(99)) && !fits(numeric, json!("1")));
}

#[test]
fn required_columns_are_not_null_without_a_default() {
    const T: Table = Table::upsert("t", "id").columns(&[
        ("a", "text NOT NULL"),
        ("b", "bigint NOT NULL DEFAULT 0"),
        ("c", "text"),
        ("d", "uuid PRIMARY KEY"),
        ("e", "bigserial NOT NULL"),
        ("f", "timestamptz NOT NULL GENERATED ALWAYS AS (x) STORED"),
    ]);
    assert_eq!(required_columns(&T), ["a", "d"]);
}

#[test]
fn copy_takes_only_values_whose_text_is_stored_as_the_json_path_stores_it() {
    const T: Table = Table::upsert("t", "id").columns(&[
        ("name", "text"),
        ("at", "timestamptz NOT NULL"),
        ("n", "bigint"),
        ("f", "double precision"),
        ("d", "numeric(10,2)"),
        ("ok", "boolean"),
        ("doc", "jsonb"),
        ("other", "inet"),
    ]);
    let copy = TextColumns::of(&T);
    for (column, value) in [
        ("name", json!("tab\there")),
        ("name", Value::Null),
        ("at", json!("2026-11-26T07:00:00Z")),
        ("n", json!(-12)),
        ("f", json!(0.1)),
        ("f", json!(0.0)),
        ("d", json!(1.25)),
        ("ok", json!(true)),
    ] {
        assert!(copy.takes(column, &value), "{column} takes {value}");
    }
    for (column, value) in [
        ("name", json!(1.5)),
        ("name", json!(false)),
        ("f", json!(-0.0)),
        ("doc", json!({"a": 1})),
        ("doc", json!("text")),
        ("other", json!("10.0.0.1")),
        ("missing", json!("x")),
        ("n", json!([1])),
    ] {
        assert!(!copy.takes(column, &value), "{column} does not take {value}");
    }
}
