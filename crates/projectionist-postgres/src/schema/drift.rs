//! Whether each declared table is the table in the database.
//!
//! `CREATE TABLE IF NOT EXISTS` leaves an existing table as it is, so a column added to a
//! declaration after its table was created would be missing, and the first batch writing it
//! would fail. Before `migrate` creates anything and before `run` or a reset touches a
//! table, the engine compares each declared table with the database's and refuses on a
//! difference, naming the table, the difference and what to do.
//!
//! PostgreSQL itself reads the declaration: the declared columns are created as a probe
//! table (temporary, or in the live table's schema when a temporary table cannot take the
//! declaration), in a transaction that is rolled back, and the two are
//! compared in the catalog (each column's type as `format_type` spells it, `NOT NULL`, its
//! default, and the primary key). So `int8` and `bigint`, or `numeric(10, 2)` and
//! `numeric(10,2)`, are the same column. Columns the database has and the declaration does
//! not are allowed when a write can never fail for them (nullable, or with a default); a
//! custom table's own DDL is not compared.

use projectionist_core::Table;
use sqlx::{PgConnection, PgPool};

use crate::error::{Drift, Error, Result};
use crate::projection::{validate, PgProjection};
use crate::tables::ident::Ident;

/// One column as the catalog describes it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
struct Column {
    name: String,
    ty: String,
    not_null: bool,
    default: Option<String>,
}

/// The differences between `table`'s declaration and the table in the database; `None`
/// when the database has no such table (yet).
pub(crate) async fn table(pool: &PgPool, table: &Table) -> Result<Option<Vec<Drift>>> {
    let name = Ident::new(table.name())?;
    let schema: Option<String> = sqlx::query_scalar(
        "SELECT n.nspname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE c.oid = to_regclass($1)",
    )
    .bind(name.quoted())
    .fetch_optional(pool)
    .await?;
    let Some(schema) = schema else { return Ok(None) };
    let definitions = table.column_definitions();
    if definitions.is_empty() {
        return Ok(Some(Vec::new()));
    }
    let (declared, live) = read_both(pool, table, &name, &schema, &definitions).await?;
    let drift = |problem: String, fix: Option<String>| Drift { table: table.name().to_owned(), problem, fix };
    let mut found = Vec::new();
    for d in &declared.columns {
        match live.columns.iter().find(|l| l.name == d.name) {
            Some(l) => found.extend(column_differences(l, d).into_iter().map(|problem| drift(problem, None))),
            None => {
                let (_, definition) = definitions.iter().find(|(c, _)| *c == d.name).expect("declared");
                let safe = !d.not_null && d.default.is_none();
                let fix = safe.then(|| format!("ALTER TABLE {} ADD COLUMN \"{}\" {definition}", name.quoted(), d.name));
                found.push(drift(format!("column {} ({definition}) is declared but missing", d.name), fix));
            }
        }
    }
    for l in live.columns.iter().filter(|l| l.not_null && l.default.is_none()) {
        if !declared.columns.iter().any(|d| d.name == l.name) {
            let problem = format!(
                "column {} ({} NOT NULL, no default) is not declared, so every new row would fail",
                l.name, l.ty
            );
            found.push(drift(problem, None));
        }
    }
    if live.key != declared.key {
        let (live, declared) = (live.key.join(", "), declared.key.join(", "));
        found.push(drift(format!("the primary key is ({live}) in the database, declared ({declared})"), None));
    }
    Ok(Some(found))
}

/// A table's columns and primary key, as the catalog describes them.
struct Described {
    columns: Vec<Column>,
    key: Vec<String>,
}

/// The table as declared (a probe created from the declaration, rolled back) and as it is
/// in the database (`name`, in `schema`).
async fn read_both(
    pool: &PgPool,
    table: &Table,
    name: &Ident,
    schema: &str,
    definitions: &[(&str, String)],
) -> Result<(Described, Described)> {
    let mut columns: Vec<String> = definitions.iter().map(|(c, def)| format!("\"{c}\" {def}")).collect();
    columns.extend(table.primary_key_clause());
    let columns = columns.join(", ");
    let mut tx = pool.begin().await?;
    // A temporary table needs no privilege on the table's schema (`run`'s role may only
    // read and write); a declaration a temporary table cannot take (a foreign key to a
    // table of the schema) is probed in the table's own schema instead. `query`, not
    // `raw_sql`: a future holding `raw_sql` on a borrowed connection is not `Send` for every
    // lifetime, and `Engine::run` awaits this in a spawned task.
    let mut probe = "pg_temp.projectionist_probe".to_owned();
    sqlx::query("SAVEPOINT probe").execute(&mut *tx).await?;
    if sqlx::query(&format!("CREATE TEMPORARY TABLE {probe} ({columns})")).execute(&mut *tx).await.is_err() {
        sqlx::query("ROLLBACK TO SAVEPOINT probe").execute(&mut *tx).await?;
        probe = format!("\"{}\".projectionist_probe", schema.replace('"', "\"\""));
        sqlx::query(&format!("CREATE TABLE {probe} ({columns})")).execute(&mut *tx).await?;
    }
    let declared = Described { columns: catalog(&mut tx, &probe).await?, key: primary_key(&mut tx, &probe).await? };
    let live =
        Described { columns: catalog(&mut tx, name.quoted()).await?, key: primary_key(&mut tx, name.quoted()).await? };
    tx.rollback().await?;
    Ok((declared, live))
}

/// How the column `l` in the database differs from its declaration `d`.
fn column_differences(l: &Column, d: &Column) -> Vec<String> {
    let mut found = Vec::new();
    if l.ty != d.ty {
        found.push(format!("column {} is {} in the database, declared {}", d.name, l.ty, d.ty));
    }
    if l.not_null != d.not_null {
        let null = |not_null| if not_null { "NOT NULL" } else { "nullable" };
        found.push(format!("column {} is {} in the database, declared {}", d.name, null(l.not_null), null(d.not_null)));
    }
    if !same_default(l.default.as_deref(), d.default.as_deref()) {
        let show = |d: Option<&str>| d.map_or_else(|| "no default".to_owned(), |d| format!("DEFAULT {d}"));
        let (live, declared) = (show(l.default.as_deref()), show(d.default.as_deref()));
        found.push(format!("column {} has {live} in the database, declared {declared}", d.name));
    }
    found
}

/// Serial columns' defaults name their table's own sequence; any two are the same kind.
fn same_default(live: Option<&str>, declared: Option<&str>) -> bool {
    match (live, declared) {
        (Some(l), Some(d)) => l == d || (l.starts_with("nextval(") && d.starts_with("nextval(")),
        (l, d) => l == d,
    }
}

async fn catalog(conn: &mut PgConnection, relation: &str) -> Result<Vec<Column>> {
    Ok(sqlx::query_as(
        "SELECT a.attname::text AS name, format_type(a.atttypid, a.atttypmod) AS ty, a.attnotnull AS not_null, \
                pg_get_expr(d.adbin, d.adrelid) AS default \
         FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum \
         WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
    )
    .bind(relation)
    .fetch_all(&mut *conn)
    .await?)
}

async fn primary_key(conn: &mut PgConnection, relation: &str) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT a.attname::text FROM pg_index i, unnest(i.indkey) WITH ORDINALITY AS k(attnum, n) \
         JOIN pg_attribute a ON a.attnum = k.attnum \
         WHERE i.indrelid = to_regclass($1) AND i.indisprimary AND a.attrelid = i.indrelid ORDER BY k.n",
    )
    .bind(relation)
    .fetch_all(&mut *conn)
    .await?)
}

/// Checks that each of the projection's tables exists and is as declared, as `run` does
/// before it reads a message and a reset before it empties anything: an
/// [`Error::Drift`](crate::error::Error::Drift) lists every difference and what to do.
pub async fn check_tables(pool: &PgPool, projection: &dyn PgProjection) -> Result<()> {
    validate(projection)?;
    let mut drift = Vec::new();
    for t in projection.tables() {
        match table(pool, t).await? {
            Some(found) => drift.extend(found),
            None => drift.push(Drift {
                table: t.name().to_owned(),
                problem: crate::error::MISSING_TABLE.to_owned(),
                fix: None,
            }),
        }
    }
    if drift.is_empty() {
        Ok(())
    } else {
        Err(Error::Drift { projection: projection.name().to_owned(), drift })
    }
}
