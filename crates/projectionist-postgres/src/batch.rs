//! A planned batch in PostgreSQL: the stored versions of every key the batch touches read
//! in bulk (locking the rows), the plan (`projectionist_core::plan`) made in memory, then a
//! few set-based statements per table, each one's row count checked against the plan.
//!
//! Rows travel as one JSON array per statement and are turned into typed rows by
//! `jsonb_populate_record(NULL::table, …)`, so PostgreSQL converts every value to its
//! column's declared type and the engine needs no type mapping of its own.

use std::collections::HashMap;

use projectionist_core::plan::{plan, Effect, EventRef, MarkWrite, RowWrite, Stored};
use projectionist_core::{Gate, Op, Outcome, Table};
use serde_json::{Map, Value};
use sqlx::types::Json;
use sqlx::{Connection, PgConnection};

use crate::{Error, Ident, Result};

/// How many times the per-event path re-plans one event whose rows a concurrent writer moved.
const PER_EVENT_TRIES: usize = 5;

/// Plans and writes `events` set-based in the caller's transaction. A statement that
/// changes another number of rows than planned (a concurrent writer moved a row, or
/// inserted one) is [`Error::Conflict`]: roll back and take the per-event path.
pub(crate) async fn apply(
    conn: &mut PgConnection,
    projection: &str,
    tables: &[Table],
    events: &[(EventRef<'_>, Effect<'_>)],
) -> Result<Vec<Outcome>> {
    if events.is_empty() {
        return Ok(Vec::new());
    }
    let stored = read_stored(conn, projection, tables, events).await?;
    let plan = plan(tables, &stored, events).map_err(|e| {
        let (aggregate_id, version) = (events[e.index].0.aggregate_id.to_owned(), events[e.index].0.version);
        if e.disagreement {
            Error::Conflict { detail: format!("{aggregate_id} v{version}: {}", e.problem) }
        } else {
            Error::Invalid { index: e.index, aggregate_id, version, problem: e.problem }
        }
    })?;
    write_marks(conn, projection, &plan.marks).await?;
    for (table, shape, rows) in group(&plan.rows) {
        write_rows(conn, table, &shape, &rows).await?;
    }
    Ok(plan.outcomes)
}

/// The per-event path: each event planned and written alone under a savepoint, re-planned
/// when a concurrent writer moved its rows (its statements then wait on that writer's row
/// locks and see its commit). Slower, and exact under any concurrency.
pub(crate) async fn apply_per_event(
    conn: &mut PgConnection,
    projection: &str,
    tables: &[Table],
    events: &[(EventRef<'_>, Effect<'_>)],
) -> Result<Vec<Outcome>> {
    let mut outcomes = Vec::with_capacity(events.len());
    for (index, event) in events.iter().enumerate() {
        let mut tries = 0;
        loop {
            let mut savepoint = conn.begin().await?;
            match apply(&mut savepoint, projection, tables, std::slice::from_ref(event)).await {
                Ok(outcome) => {
                    savepoint.commit().await?;
                    outcomes.extend(outcome);
                    break;
                }
                Err(Error::Conflict { detail }) => {
                    savepoint.rollback().await?;
                    tries += 1;
                    if tries == PER_EVENT_TRIES {
                        // Not a race any more: the tables disagree with each other for good.
                        let (e, _) = event;
                        return Err(Error::Invalid {
                            index,
                            aggregate_id: e.aggregate_id.to_owned(),
                            version: e.version,
                            problem: format!("{detail} (still after {tries} tries)"),
                        });
                    }
                }
                Err(Error::Invalid { problem, aggregate_id, version, .. }) => {
                    return Err(Error::Invalid { index, aggregate_id, version, problem })
                }
                Err(e) => return Err(e),
            }
        }
    }
    Ok(outcomes)
}

async fn read_stored(
    conn: &mut PgConnection,
    projection: &str,
    tables: &[Table],
    events: &[(EventRef<'_>, Effect<'_>)],
) -> Result<Stored> {
    let mut stored = Stored::default();
    let mut ids: Vec<&str> = events.iter().map(|(e, _)| e.aggregate_id).collect();
    ids.sort_unstable();
    ids.dedup();
    for table in tables.iter().filter(|t| t.is_gated()) {
        let (name, key, version) = (Ident::new(table.name())?, Ident::new(table.key())?, Ident::new(table.version())?);
        // Sorted, so two writers lock overlapping rows in the same order.
        let sql = format!("SELECT {key}, {version} FROM {name} WHERE {key} = ANY($1) ORDER BY {key} FOR UPDATE");
        let found: Vec<(String, i64)> = sqlx::query_as(&sql).bind(&ids).fetch_all(&mut *conn).await?;
        stored.rows.insert(table.name(), found.into_iter().collect());
    }
    if tables.iter().any(|t| t.gate() == Gate::FanIn) {
        let mut aggregates: Vec<(&str, &str)> =
            events.iter().map(|(e, _)| (e.aggregate_type, e.aggregate_id)).collect();
        aggregates.sort_unstable();
        aggregates.dedup();
        let (types, ids): (Vec<&str>, Vec<&str>) = aggregates.into_iter().unzip();
        let found: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT aggregate_type, aggregate_id, version FROM projectionist_watermarks \
             WHERE projection = $1 AND (aggregate_type, aggregate_id) IN (SELECT * FROM unnest($2::text[], $3::text[])) \
             ORDER BY aggregate_type, aggregate_id FOR UPDATE",
        )
        .bind(projection)
        .bind(&types)
        .bind(&ids)
        .fetch_all(&mut *conn)
        .await?;
        stored.marks = found.into_iter().map(|(t, i, v)| ((t, i), v)).collect::<HashMap<_, _>>();
    }
    Ok(stored)
}

async fn write_marks(conn: &mut PgConnection, projection: &str, marks: &[MarkWrite]) -> Result<()> {
    let (inserts, updates): (Vec<&MarkWrite>, Vec<&MarkWrite>) = marks.iter().partition(|m| m.expected.is_none());
    if !inserts.is_empty() {
        let result = sqlx::query(
            "INSERT INTO projectionist_watermarks (projection, aggregate_type, aggregate_id, version) \
             SELECT $1, * FROM unnest($2::text[], $3::text[], $4::bigint[]) ON CONFLICT DO NOTHING",
        )
        .bind(projection)
        .bind(inserts.iter().map(|m| m.aggregate_type.as_str()).collect::<Vec<_>>())
        .bind(inserts.iter().map(|m| m.aggregate_id.as_str()).collect::<Vec<_>>())
        .bind(inserts.iter().map(|m| m.version).collect::<Vec<_>>())
        .execute(&mut *conn)
        .await?;
        expect_rows("projectionist_watermarks", inserts.len(), result.rows_affected())?;
    }
    if !updates.is_empty() {
        let result = sqlx::query(
            "UPDATE projectionist_watermarks w SET version = u.version \
             FROM unnest($2::text[], $3::text[], $4::bigint[], $5::bigint[]) AS u(aggregate_type, aggregate_id, version, expected) \
             WHERE w.projection = $1 AND w.aggregate_type = u.aggregate_type AND w.aggregate_id = u.aggregate_id AND w.version = u.expected",
        )
        .bind(projection)
        .bind(updates.iter().map(|m| m.aggregate_type.as_str()).collect::<Vec<_>>())
        .bind(updates.iter().map(|m| m.aggregate_id.as_str()).collect::<Vec<_>>())
        .bind(updates.iter().map(|m| m.version).collect::<Vec<_>>())
        .bind(updates.iter().map(|m| m.expected.unwrap_or_default()).collect::<Vec<_>>())
        .execute(&mut *conn)
        .await?;
        expect_rows("projectionist_watermarks", updates.len(), result.rows_affected())?;
    }
    Ok(())
}

/// What one statement does: insert or update a gated row, or merge a fan-in row, touching
/// these columns in these ways.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Shape {
    insert: bool,
    columns: Vec<(&'static str, Op)>,
}

/// Row writes grouped by table and shape, one statement each, in plan order.
fn group(rows: &[RowWrite]) -> Vec<(Table, Shape, Vec<&RowWrite>)> {
    let mut groups: Vec<(Table, Shape, Vec<&RowWrite>)> = Vec::new();
    for row in rows {
        let shape = Shape {
            insert: row.table.is_gated() && row.expected.is_none(),
            columns: row.changes.iter().map(|c| (c.column, c.op)).collect(),
        };
        match groups.iter_mut().find(|(t, s, _)| *t == row.table && *s == shape) {
            Some((_, _, members)) => members.push(row),
            None => groups.push((row.table, shape, vec![row])),
        }
    }
    groups
}

async fn write_rows(conn: &mut PgConnection, table: Table, shape: &Shape, rows: &[&RowWrite]) -> Result<()> {
    let name = Ident::new(table.name())?;
    let key = Ident::new(table.key())?;
    let columns = shape.columns.iter().map(|(c, op)| Ok((Ident::new(c)?, *op))).collect::<Result<Vec<_>>>()?;
    let docs: Vec<Value> = rows.iter().map(|r| doc(&table, r)).collect();
    // Inserted columns: the key, the changed columns, and the version of gated tables.
    let mut inserted = vec![key.to_string()];
    inserted.extend(columns.iter().map(|(c, _)| c.to_string()));
    let (sql, check) = if !table.is_gated() {
        let merge = if columns.is_empty() {
            "DO NOTHING".to_owned()
        } else {
            let sets = columns.iter().map(|(c, op)| match op {
                Op::Set => format!("{c} = EXCLUDED.{c}"),
                Op::Add => format!("{c} = t.{c} + EXCLUDED.{c}"),
            });
            format!("DO UPDATE SET {}", sets.collect::<Vec<_>>().join(", "))
        };
        (format!("{} ON CONFLICT ({key}) {merge}", insert_from_json(&name, &inserted)), !columns.is_empty())
    } else if shape.insert {
        inserted.push(Ident::new(table.version())?.to_string());
        (format!("{} ON CONFLICT ({key}) DO NOTHING", insert_from_json(&name, &inserted)), true)
    } else {
        let version = Ident::new(table.version())?;
        let mut sets: Vec<String> = columns
            .iter()
            .map(|(c, op)| match op {
                Op::Set => format!("{c} = s.{c}"),
                Op::Add => format!("{c} = t.{c} + s.{c}"),
            })
            .collect();
        sets.push(format!("{version} = s.{version}"));
        let sql = format!(
            "UPDATE {name} AS t SET {} FROM (SELECT r.*, (x.doc->>'$expected')::bigint AS \"$expected\" \
             FROM jsonb_array_elements($1) AS x(doc), LATERAL jsonb_populate_record(NULL::{name}, x.doc) AS r) AS s \
             WHERE t.{key} = s.{key} AND t.{version} = s.\"$expected\"",
            sets.join(", ")
        );
        (sql, true)
    };
    let result = sqlx::query(&sql).bind(Json(Value::Array(docs))).execute(&mut *conn).await?;
    if check {
        expect_rows(table.name(), rows.len(), result.rows_affected())?;
    }
    Ok(())
}

/// `INSERT INTO name AS t (cols) SELECT r.cols FROM` the JSON array `$1` read as rows of `name`.
fn insert_from_json(name: &Ident, cols: &[String]) -> String {
    let selected = cols.iter().map(|c| format!("r.{c}")).collect::<Vec<_>>().join(", ");
    format!(
        "INSERT INTO {name} AS t ({}) SELECT {selected} FROM jsonb_populate_recordset(NULL::{name}, $1) AS r",
        cols.join(", ")
    )
}

/// One row as the JSON object `jsonb_populate_record` reads: key, changed columns, version,
/// and the version the row must still have.
fn doc(table: &Table, row: &RowWrite) -> Value {
    let mut doc = Map::with_capacity(row.changes.len() + 3);
    doc.insert(table.key().to_owned(), Value::String(row.key.clone()));
    for change in &row.changes {
        doc.insert(change.column.to_owned(), change.value.clone());
    }
    if let Some(version) = row.version {
        doc.insert(table.version().to_owned(), Value::from(version));
    }
    if let Some(expected) = row.expected {
        doc.insert("$expected".to_owned(), Value::from(expected));
    }
    Value::Object(doc)
}

fn expect_rows(table: &str, planned: usize, changed: u64) -> Result<()> {
    if changed == planned as u64 {
        Ok(())
    } else {
        Err(Error::Conflict { detail: format!("{table}: planned {planned} row(s), changed {changed}") })
    }
}
