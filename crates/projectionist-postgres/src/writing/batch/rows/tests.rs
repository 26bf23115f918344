use projectionist_core::plan::{ColumnWrite, RowKind, RowWrite};
use projectionist_core::Table;
use serde_json::{json, Value};
use sqlx::{Connection, PgConnection, PgPool};

use super::super::shape::Shape;
use super::super::statements::write_rows;
use super::*;

const COLUMNS: &[(&str, &str)] = &[
    ("t", "text"),
    ("i", "integer"),
    ("b", "bigint"),
    ("s", "smallint"),
    ("f", "double precision"),
    ("n", "numeric"),
    ("ts", "timestamptz"),
    ("u", "uuid"),
    ("ok", "boolean"),
    ("d", "numeric(6,2)"),
    ("j", "jsonb"),
];
/// Integers in decimal as `{n}` writes them, at every length and both ends of each range.
#[test]
fn decimal_writes_integers_as_display_does() {
    let mut cases: Vec<i128> = vec![0, i128::MIN, i128::MAX, i64::MIN.into(), u64::MAX.into()];
    let mut ten: i128 = 1;
    for _ in 0..=38 {
        cases.extend([ten - 1, ten, ten + 1, -ten + 1, -ten, -ten - 1, ten.saturating_mul(7)]);
        ten = ten.saturating_mul(10);
    }
    for n in cases {
        let mut out = b"x".to_vec();
        decimal(&mut out, n);
        assert_eq!(String::from_utf8(out).unwrap(), format!("x{n}"));
    }
}

const BY_JSON: Table = Table::upsert("by_json", "id").columns(COLUMNS);
const BY_ARRAYS: Table = Table::upsert("by_arrays", "id").columns(COLUMNS);

/// Values chosen to find where a type's text input and the JSON path part ways.
fn values() -> Vec<Value> {
    let mut v = vec![
        Value::Null,
        json!(""),
        json!("plain"),
        json!("tab\there, \"quoted\", back\\slash, {braces}, (parens)"),
        json!("ünïcødé ✓ \u{1F600}"),
        json!("  padded  "),
        json!("NULL"),
        json!("true"),
        json!("7"),
        json!("2026-11-26T07:00:00Z"),
        json!("2026-11-26T07:00:00.123456789+05:30"),
        json!("2026-11-26 07:00:00"),
        json!("infinity"),
        json!("epoch"),
        json!("not a time"),
        json!("0e8f1f6c-7c36-4e8e-9d0e-5c1b2f0a9e11"),
        json!("{0E8F1F6C-7C36-4E8E-9D0E-5C1B2F0A9E11}"),
        json!("0e8f1f6c7c364e8e9d0e5c1b2f0a9e11"),
        json!(true),
        json!(false),
        json!({"a": [1, 2]}),
        json!([1]),
    ];
    let numbers = [
        json!(0),
        json!(-1),
        json!(32767),
        json!(32768),
        json!(-32769),
        json!(2147483648_i64),
        json!(i64::MAX),
        json!(i64::MIN),
        json!(u64::MAX),
        json!(0.1),
        json!(1e-7),
        json!(1.5),
        json!(-2.5e-3),
        json!(1e20),
        json!(1e300),
        json!(-0.0),
        json!(9999.995),
        json!(123_456_789.123_456_79),
    ];
    v.extend(numbers);
    v
}

async fn write(conn: &mut PgConnection, table: Table, shape: &Shape, rows: Rows) -> Result<(), String> {
    let mut tx = conn.begin().await.expect("a transaction");
    match write_rows(&mut tx, table, shape, rows).await {
        Ok(()) => {
            tx.commit().await.expect("a commit");
            Ok(())
        }
        Err(e) => Err(e.to_string()),
    }
}

/// Every row the arrays take, written both ways into tables alike: both refused or both
/// stored, and the stored rows the same (an insert, then an update adding to it).
#[sqlx::test(migrations = false)]
async fn rows_sent_as_arrays_are_stored_as_the_json_path_stores_them(pool: PgPool) {
    let mut conn = pool.acquire().await.expect("a connection");
    for table in [BY_JSON, BY_ARRAYS] {
        sqlx::query(&table.ddl()).execute(&mut *conn).await.expect("the table");
    }
    let values = values();
    let keys: Vec<String> = (0..COLUMNS.len() * values.len()).map(|n| format!("k{n}")).collect();
    let (mut as_arrays_count, mut key) = (0, keys.iter());
    for &(column, _) in COLUMNS {
        for value in &values {
            let key = key.next().expect("a key per value");
            for (kind, version, expected) in [(RowKind::Insert, 1, None), (RowKind::Update, 2, Some(1))] {
                let base = (kind == RowKind::Insert).then_some(value);
                let deltas = if kind == RowKind::Update { vec![value] } else { Vec::new() };
                let row = RowWrite {
                    table: BY_JSON,
                    key,
                    child: None,
                    kind,
                    expected,
                    version: Some(version),
                    columns: vec![ColumnWrite { column, base, deltas }],
                };
                let (mut f, mut shape) = (Vec::new(), Shape { kind, columns: Vec::new() });
                fields(&row, &mut f, &mut shape);
                let inputs = Inputs::of(&BY_JSON, &f);
                if !inputs.take(&f) {
                    continue;
                }
                as_arrays_count += 1;
                let (mut json, mut arrays) = (Rows::new(&inputs, &f, false), Rows::new(&inputs, &f, true));
                json.push(&f);
                arrays.push(&f);
                assert!(matches!(arrays, Rows::Arrays(_)));
                let by_json = write(&mut conn, BY_JSON, &shape, json).await;
                let by_arrays = write(&mut conn, BY_ARRAYS, &shape, arrays).await;
                assert_eq!(
                    by_json.is_ok(),
                    by_arrays.is_ok(),
                    "{kind:?} {column} = {value}: {by_json:?} {by_arrays:?}"
                );
            }
        }
    }
    assert!(as_arrays_count > 100, "the arrays took {as_arrays_count} rows");
    let differ: i64 = sqlx::query_scalar(
        "WITH a AS (SELECT x::text AS r FROM by_json x), b AS (SELECT x::text FROM by_arrays x) \
         SELECT count(*) FROM ((TABLE a EXCEPT TABLE b) UNION ALL (TABLE b EXCEPT TABLE a)) AS d",
    )
    .fetch_one(&mut *conn)
    .await
    .expect("the comparison");
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM by_arrays").fetch_one(&mut *conn).await.unwrap();
    assert_eq!(differ, 0, "rows stored differently");
    assert!(stored > 50, "{stored} rows stored");
}
