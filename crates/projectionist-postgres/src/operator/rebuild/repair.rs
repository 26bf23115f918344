//! Repairing a few aggregates (`rebuild --aggregate`): their rows derived again in the shadow
//! from their events alone, then put in place of the live ones in one transaction, the live
//! writers held back meanwhile (see [`hold`](super::hold)).
//!
//! Only tables of one row per aggregate (upsert, transition) and child rows can be derived from
//! one aggregate's events. Fan-in rows are fed by many aggregates and custom tables by the
//! projection's own SQL: a projection with either is refused ([`prepare_repair`]), and its
//! cure is a whole `rebuild`.

use projectionist_core::Gate;
use sqlx::{PgConnection, PgPool};

use super::swap::{live_tables, Held};
use super::{problem, shadow_schema};
use crate::error::Result;
use crate::projection::PgProjection;
use crate::tables::ident::Ident;

/// What a repair put in place for one aggregate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repaired {
    /// The aggregate's type and id.
    pub aggregate: (String, String),
    /// The version its rows were derived to; `None` when the partitions read hold no event of it.
    pub version: Option<i64>,
    /// Live rows it removed.
    pub removed: u64,
    /// Rows derived from its events, written in place of the removed ones.
    pub written: u64,
}

/// How a repair's last step went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Repair {
    /// The aggregates' rows are in place.
    Done(Vec<Repaired>),
    /// The shadow is behind the live checkpoints on these partitions (topic, partition, the
    /// shadow's next offset, the live one): read on, then repair again.
    Behind(Vec<(String, i32, Option<i64>, i64)>),
}

/// The tables of `projection` a repair cannot derive from one aggregate's events: fan-in
/// tables and custom ones.
pub fn unrepairable(projection: &dyn PgProjection) -> Vec<&'static str> {
    let repairable = |t: &&projectionist_core::Table| matches!(t.gate(), Gate::Upsert | Gate::Transition | Gate::Child);
    projection.tables().iter().filter(|t| !repairable(t)).map(|t| t.name()).collect()
}

/// Creates the shadow a repair of `projection` derives its aggregates in (an unfinished
/// repair's is made again). Refuses a projection with tables it cannot repair (see
/// [`unrepairable`]), and while the shadow of an unfinished rebuild is kept.
pub async fn prepare_repair(pool: &PgPool, projection: &dyn PgProjection) -> Result<()> {
    let name = projection.name();
    let unrepairable = unrepairable(projection);
    if !unrepairable.is_empty() {
        let tables = unrepairable.join(", ");
        return Err(problem(
            name,
            format!(
                "{tables}: rows fed by many aggregates (fan-in) or by its own SQL (custom) cannot be derived from a \
                 few aggregates' events; rebuild the whole projection (`rebuild`) instead"
            ),
        ));
    }
    super::create_shadow(pool, projection, true).await?;
    Ok(())
}

/// Puts the rows the shadow derived for `aggregates` in place of the live ones, the live
/// writers `held` back, once the shadow has read each of `partitions` as far as the live run:
/// for each aggregate, its rows in every table of its type and its aggregate version are
/// replaced, and the shadow dropped, in one transaction. Refuses an aggregate the live run has
/// applied a later version of than the partitions read hold (its events are elsewhere).
pub async fn repair_held(
    held: Held,
    projection: &dyn PgProjection,
    partitions: &[(String, i32)],
    aggregates: &[(String, String)],
) -> Result<Repair> {
    let name = projection.name();
    let Held(mut tx) = held;
    let shadow = Ident::new(&shadow_schema(name))?;
    let (engine, live) = live_tables(&mut tx, projection).await?;
    let (topics, numbers): (Vec<&str>, Vec<i32>) = partitions.iter().map(|(t, p)| (t.as_str(), *p)).unzip();
    let behind: Vec<(String, i32, Option<i64>, i64)> = sqlx::query_as(&format!(
        "SELECT l.topic, l.partition, s.next_offset, l.next_offset FROM {engine}.projectionist_checkpoints l \
         LEFT JOIN {shadow}.projectionist_checkpoints s USING (projection, topic, partition) \
         WHERE l.projection = $1 AND (l.topic, l.partition) IN (SELECT * FROM unnest($2::text[], $3::int[])) \
         AND (s.next_offset IS NULL OR s.next_offset < l.next_offset) ORDER BY 1, 2"
    ))
    .bind(name)
    .bind(&topics)
    .bind(&numbers)
    .fetch_all(&mut *tx)
    .await?;
    if !behind.is_empty() {
        tx.rollback().await?;
        return Ok(Repair::Behind(behind));
    }
    // Each table's columns, as the shadow has them, read once for every aggregate.
    let mut columns = Vec::new();
    for table in projection.tables() {
        columns.push(columns_of(&mut tx, &shadow_schema(name), table.name()).await?);
    }
    let mut done = Vec::new();
    for (aggregate_type, id) in aggregates {
        let tables: Vec<Rows<'_>> = projection
            .tables()
            .iter()
            .zip(live.iter().zip(&columns))
            .filter(|(t, _)| t.owns(aggregate_type))
            .map(|(t, ((schema, ident), columns))| {
                (t, format!("{schema}.{ident}"), format!("{shadow}.{ident}"), columns)
            })
            .collect();
        let (live_version, version) = (
            version_of(&mut tx, name, &engine, &tables, true, (aggregate_type, id)).await?,
            version_of(&mut tx, name, &shadow, &tables, false, (aggregate_type, id)).await?,
        );
        if live_version > version {
            let parked: Option<(i64, String)> = sqlx::query_as(&format!(
                "SELECT waiting_for, reason FROM {shadow}.projectionist_parked \
                 WHERE projection = $1 AND aggregate_type = $2 AND aggregate_id = $3"
            ))
            .bind(name)
            .bind(aggregate_type)
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
            if let Some((waiting_for, reason)) = parked {
                return Err(problem(
                    name,
                    format!(
                        "{aggregate_type}/{id} stands at version {} live, but its events read again stop before \
                         version {waiting_for} ({reason}): resolve that as the live run did (`parked`, \
                         `dead-letters`), then repair it again",
                        live_version.unwrap_or(0)
                    ),
                ));
            }
            let read = partitions.iter().map(|(t, p)| format!("{t}/{p}")).collect::<Vec<_>>().join(", ");
            return Err(problem(
                name,
                format!(
                    "{aggregate_type}/{id} stands at version {} live, but the partitions read ({read}) hold its events \
                     only to version {}: some of its events are on other partitions (the topic was repartitioned, or \
                     written with another partitioner); repair it again with --all-partitions",
                    live_version.unwrap_or(0),
                    version.unwrap_or(0)
                ),
            ));
        }
        let (mut removed, mut written) = (0, 0);
        for (table, live_rows, shadow_rows, columns) in &tables {
            let key = Ident::new(table.key())?;
            removed += sqlx::query(&format!("DELETE FROM {live_rows} WHERE {key} = $1"))
                .bind(id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            written += sqlx::query(&format!(
                "INSERT INTO {live_rows} ({columns}) SELECT {columns} FROM {shadow_rows} WHERE {key} = $1"
            ))
            .bind(id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        }
        let versions = "projectionist_aggregate_versions";
        let this = "projection = $1 AND aggregate_type = $2 AND aggregate_id = $3";
        for statement in [
            format!("DELETE FROM {engine}.{versions} WHERE {this}"),
            format!("INSERT INTO {engine}.{versions} SELECT * FROM {shadow}.{versions} WHERE {this}"),
        ] {
            sqlx::query(&statement).bind(name).bind(aggregate_type).bind(id).execute(&mut *tx).await?;
        }
        done.push(Repaired { aggregate: (aggregate_type.clone(), id.clone()), version, removed, written });
    }
    sqlx::raw_sql(&format!("DROP SCHEMA {shadow} CASCADE")).execute(&mut *tx).await?;
    crate::fault::point("before-repair-commit");
    tx.commit().await?;
    Ok(Repair::Done(done))
}

/// A table an aggregate is repaired in: its declaration, its live and shadow rows, and its
/// columns (as the shadow has them).
type Rows<'a> = (&'a projectionist_core::Table, String, String, &'a String);

/// The version `aggregate` stands at in `schema`: its aggregate version there, or else the
/// newest version of its rows in `tables` (their live or shadow side).
async fn version_of(
    conn: &mut PgConnection,
    projection: &str,
    schema: &Ident,
    tables: &[Rows<'_>],
    live: bool,
    (aggregate_type, id): (&str, &str),
) -> Result<Option<i64>> {
    let mut found: Option<i64> = sqlx::query_scalar(&format!(
        "SELECT version FROM {schema}.projectionist_aggregate_versions \
         WHERE projection = $1 AND aggregate_type = $2 AND aggregate_id = $3"
    ))
    .bind(projection)
    .bind(aggregate_type)
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?;
    if found.is_some() {
        return Ok(found);
    }
    for (table, live_rows, shadow_rows, _) in tables.iter().filter(|(t, ..)| t.gate() != Gate::Child) {
        let (key, version) = (Ident::new(table.key())?, Ident::new(table.version())?);
        let rows = if live { live_rows } else { shadow_rows };
        let row: Option<i64> =
            sqlx::query_scalar(&format!("SELECT max({version})::bigint FROM {rows} WHERE {key} = $1"))
                .bind(id)
                .fetch_one(&mut *conn)
                .await?;
        found = found.max(row);
    }
    Ok(found)
}

/// The columns of `schema`.`table`, quoted and comma-separated, in their order.
async fn columns_of(conn: &mut PgConnection, schema: &str, table: &str) -> Result<String> {
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT quote_ident(attname) FROM pg_attribute WHERE attrelid = format('%I.%I', $1::text, $2::text)::regclass \
         AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
    )
    .bind(schema)
    .bind(table)
    .fetch_all(&mut *conn)
    .await?;
    Ok(names.join(", "))
}
