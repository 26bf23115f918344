//! The swap: a rebuilt projection's tables and engine rows moved in place of the live ones in
//! one short transaction, the live ones kept beside for [`rollback`]; and the rollback.

use sqlx::{Connection, PgConnection, PgPool};

use super::{live_schema, old_schema, problem, schema_exists, shadow_schema, unqualified, versions_in, ENGINE_TABLES};
use crate::error::Result;
use crate::projection::PgProjection;
use crate::swap_lock::SWAP_LOCK;
use crate::tables::ident::Ident;

/// How a swap went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Swap {
    /// The shadow is live; the tables it replaced are kept in the old schema.
    Done,
    /// The shadow is behind the live checkpoints on these partitions (topic, partition,
    /// the shadow's next offset, the live one): catch it up, then swap again.
    Behind(Vec<(String, i32, Option<i64>, i64)>),
    /// An operator discarded these live dead letters (ids) since their discards were carried
    /// over ([`carry_discards`](super::carry_discards)): the shadow still holds them open. Carry them, then swap again
    /// (swapped now, the discards would be undone).
    Undiscarded(Vec<i64>),
}

/// Swaps `projection`'s shadow in, in one transaction, once the shadow has read every
/// partition as far as the live checkpoints: it waits for the live batches in flight,
/// holds new ones back meanwhile (every writer takes its swap lock first, shared; the swap
/// takes it exclusively), moves the live tables to the old schema and the shadow's in their
/// place, and puts the shadow's engine rows in place of the projection's (keeping those it
/// replaces in the old schema, for
/// [`rollback`]). The projection's open dead letters are marked resolved as `rebuilt`: the
/// rebuild met their events again, and dead-lettered anew those still poison.
///
/// `run` processes of the projection go on by themselves: their next batch writes the new
/// tables, from their own position, which is not past the shadow's (the events between are
/// duplicates to the new tables).
///
/// Only the checkpoints of `topics`, those the rebuild read, are compared (the projection
/// may have checkpoints of topics it no longer reads); all of the projection's are replaced.
pub async fn swap(pool: &PgPool, projection: &dyn PgProjection, topics: &[String]) -> Result<Swap> {
    swap_held(hold(pool, projection.name()).await?, projection, topics).await
}

/// The live writers of a projection held back (its swap lock taken exclusively, as a swap
/// takes it) for as long as this lives, or until [`swap_held`] swaps in its transaction.
pub struct Held(pub(super) sqlx::Transaction<'static, sqlx::Postgres>);

/// Holds back every writer of `projection` (see [`Held`]): waits for the batches in flight
/// (up to 30 s), then holds the next ones back. A rebuild takes it before its last round
/// when the live run keeps moving ahead of its shadow: the live checkpoints stand still, the
/// round reads past them, and the swap follows in the same transaction.
pub async fn hold(pool: &PgPool, projection: &str) -> Result<Held> {
    let mut tx = pool.begin().await?;
    sqlx::raw_sql("SET LOCAL lock_timeout = '30s'").execute(&mut *tx).await?;
    sqlx::query(&format!("SELECT pg_advisory_xact_lock({SWAP_LOCK})")).bind(projection).execute(&mut *tx).await?;
    Ok(Held(tx))
}

/// [`swap`], its writers already held back by `held`.
pub async fn swap_held(held: Held, projection: &dyn PgProjection, topics: &[String]) -> Result<Swap> {
    let name = projection.name();
    let (shadow, old) = (Ident::new(&shadow_schema(name))?, Ident::new(&old_schema(name))?);
    unqualified(projection)?;
    let Held(mut tx) = held;
    if !schema_exists(&mut tx, &shadow_schema(name)).await? {
        return Err(problem(name, "there is no rebuild of it to swap in (`rebuild` builds one)"));
    }
    if schema_exists(&mut tx, &old_schema(name)).await? {
        return Err(problem(
            name,
            format!("schema {} is kept from a previous swap: `rebuild --drop-old`", old_schema(name)),
        ));
    }
    let (engine, live) = live_tables(&mut tx, projection).await?;
    hold_writers_back(&mut tx, name, &live).await?;
    let behind: Vec<(String, i32, Option<i64>, i64)> = sqlx::query_as(&format!(
        "SELECT l.topic, l.partition, s.next_offset, l.next_offset FROM {engine}.projectionist_checkpoints l \
         LEFT JOIN {shadow}.projectionist_checkpoints s USING (projection, topic, partition) \
         WHERE l.projection = $1 AND l.topic = ANY($2) AND (s.next_offset IS NULL OR s.next_offset < l.next_offset) \
         ORDER BY 1, 2"
    ))
    .bind(name)
    .bind(topics)
    .fetch_all(&mut *tx)
    .await?;
    if !behind.is_empty() {
        tx.rollback().await?;
        return Ok(Swap::Behind(behind));
    }
    // Under the swap lock no discard can land any more (it takes the lock too).
    let undiscarded: Vec<i64> = sqlx::query_scalar(&format!(
        "SELECT l.id FROM {engine}.projectionist_dead_letters l JOIN {shadow}.projectionist_dead_letters s \
         USING (projection, topic, partition, \"offset\") \
         WHERE l.projection = $1 AND l.resolution = 'discarded' AND s.resolution IS NULL ORDER BY 1"
    ))
    .bind(name)
    .fetch_all(&mut *tx)
    .await?;
    if !undiscarded.is_empty() {
        tx.rollback().await?;
        return Ok(Swap::Undiscarded(undiscarded));
    }
    // The views over the live tables, and the grants, go over to the new ones.
    let dependents = crate::operator::dependents::read(&mut tx, name, &live).await?;
    sqlx::raw_sql(&format!("CREATE SCHEMA {old}")).execute(&mut *tx).await?;
    for (schema, table) in &live {
        sqlx::raw_sql(&format!(
            "ALTER TABLE {schema}.{table} SET SCHEMA {old}; ALTER TABLE {shadow}.{table} SET SCHEMA {schema}"
        ))
        .execute(&mut *tx)
        .await?;
    }
    // The views the new release's schema() made over the shadow go over with its tables.
    let live_schema = live.first().map_or(&engine, |(schema, _)| schema);
    dependents.carry(&mut tx, Some((&shadow, live_schema))).await?;
    for table in ENGINE_TABLES {
        sqlx::raw_sql(&format!("CREATE TABLE {old}.{table} (LIKE {engine}.{table})")).execute(&mut *tx).await?;
        sqlx::query(&format!("INSERT INTO {old}.{table} SELECT * FROM {engine}.{table} WHERE projection = $1"))
            .bind(name)
            .execute(&mut *tx)
            .await?;
    }
    move_rows(&mut tx, name, &shadow, &engine).await?;
    move_parking(&mut tx, name, &shadow, &engine).await?;
    crate::writing::built_for::record(&mut tx, projection).await?;
    sqlx::raw_sql(&format!("DROP SCHEMA {shadow} CASCADE")).execute(&mut *tx).await?;
    crate::fault::point("before-swap-commit");
    tx.commit().await?;
    Ok(Swap::Done)
}

/// Swaps back the tables the last swap of `projection` replaced, while they are kept: the
/// rebuilt tables are dropped, and the engine rows of the projection are again those the
/// swap replaced (dead letters included, as they were).
pub async fn rollback(pool: &PgPool, projection: &dyn PgProjection) -> Result<()> {
    let name = projection.name();
    let old = Ident::new(&old_schema(name))?;
    let mut conn = pool.acquire().await?;
    if !schema_exists(&mut conn, &old_schema(name)).await? {
        return Err(problem(name, "no tables of an earlier rebuild are kept to roll back to"));
    }
    let (engine, live) = live_tables(&mut conn, projection).await?;
    let mut tx = conn.begin().await?;
    hold_writers_back(&mut tx, name, &live).await?;
    let dependents = crate::operator::dependents::read(&mut tx, name, &live).await?;
    let swapped_in = live.iter().map(|(schema, table)| format!("{schema}.{table}")).collect::<Vec<_>>().join(", ");
    // The views go first: they hold on to the swapped-in tables, which are dropped.
    dependents.drop_views(&mut tx).await?;
    sqlx::raw_sql(&format!("DROP TABLE IF EXISTS {swapped_in}")).execute(&mut *tx).await?;
    for (schema, table) in &live {
        sqlx::raw_sql(&format!("ALTER TABLE {old}.{table} SET SCHEMA {schema}")).execute(&mut *tx).await?;
    }
    dependents.carry(&mut tx, None).await?;
    for table in ENGINE_TABLES {
        sqlx::query(&format!("DELETE FROM {engine}.{table} WHERE projection = $1"))
            .bind(name)
            .execute(&mut *tx)
            .await?;
        let identity = if matches!(table, "projectionist_held" | "projectionist_dead_letters") {
            "OVERRIDING SYSTEM VALUE "
        } else {
            ""
        };
        sqlx::raw_sql(&format!("INSERT INTO {engine}.{table} {identity}SELECT * FROM {old}.{table}"))
            .execute(&mut *tx)
            .await?;
    }
    sqlx::raw_sql(&format!("DROP SCHEMA {old} CASCADE")).execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(())
}

/// The schema of the engine's tables, and each of `projection`'s live tables with its schema
/// (as `conn`'s `search_path` finds them).
pub(super) async fn live_tables(
    conn: &mut PgConnection,
    projection: &dyn PgProjection,
) -> Result<(Ident, Vec<(Ident, Ident)>)> {
    let missing = |table: &str| problem(projection.name(), format!("table {table} does not exist: run `migrate`"));
    let engine =
        live_schema(conn, "projectionist_checkpoints").await?.ok_or_else(|| missing("projectionist_checkpoints"))?;
    let mut live = Vec::new();
    for table in projection.tables() {
        let schema = live_schema(conn, table.name()).await?.ok_or_else(|| missing(table.name()))?;
        live.push((Ident::new(&schema)?, Ident::new(table.name())?));
    }
    Ok((Ident::new(&engine)?, live))
}

/// Holds back every writer of `projection` for the rest of the caller's transaction: takes
/// its swap lock exclusively (so the batches in flight finish first, and the next wait), then
/// the live tables (so their readers finish first; the next wait only while the swap's own
/// short transaction runs). Taken first by every writer, the swap lock leaves no lock order
/// in which a batch could deadlock with the swap. The projection's rows in the engine tables
/// (shared by every projection) are reached by row, so the other projections go on.
async fn hold_writers_back(conn: &mut PgConnection, projection: &str, live: &[(Ident, Ident)]) -> Result<()> {
    sqlx::raw_sql("SET LOCAL lock_timeout = '30s'").execute(&mut *conn).await?;
    sqlx::query(&format!("SELECT pg_advisory_xact_lock({SWAP_LOCK})")).bind(projection).execute(&mut *conn).await?;
    for (schema, table) in live {
        sqlx::raw_sql(&format!("LOCK TABLE {schema}.{table} IN ACCESS EXCLUSIVE MODE")).execute(&mut *conn).await?;
    }
    Ok(())
}

/// Puts the shadow's checkpoints and aggregate versions of `projection` in place of the
/// live ones.
async fn move_rows(conn: &mut PgConnection, projection: &str, shadow: &Ident, engine: &Ident) -> Result<()> {
    sqlx::query(&format!("DELETE FROM {engine}.projectionist_checkpoints WHERE projection = $1"))
        .bind(projection)
        .execute(&mut *conn)
        .await?;
    sqlx::query(&format!(
        "INSERT INTO {engine}.projectionist_checkpoints SELECT * FROM {shadow}.projectionist_checkpoints \
         WHERE projection = $1"
    ))
    .bind(projection)
    .execute(&mut *conn)
    .await?;
    replace_versions(conn, projection, shadow, engine).await
}

/// The aggregate versions of `projection` become the shadow's. They are as many as the
/// aggregates and mostly the same on both sides (the shadow read what the live tables did):
/// the two sides are compared once (one join) and only those that differ are written, so that
/// the swap (which holds the writers back) neither rewrites every one of them nor joins them
/// three times (55 against 33 ms for 27k versions). No writer runs meanwhile: the swap holds
/// them back.
async fn replace_versions(conn: &mut PgConnection, projection: &str, shadow: &Ident, engine: &Ident) -> Result<()> {
    let (live, rebuilt) = (versions_in(engine), versions_in(shadow));
    let row = "v.projection = $1 AND v.aggregate_type = d.aggregate_type AND v.aggregate_id = d.aggregate_id";
    sqlx::query(&format!(
        "WITH diff AS MATERIALIZED (\
           SELECT coalesce(l.aggregate_type, s.aggregate_type) AS aggregate_type, \
             coalesce(l.aggregate_id, s.aggregate_id) AS aggregate_id, l.version AS live, s.version AS rebuilt \
           FROM {live} l FULL JOIN {rebuilt} s \
             ON l.aggregate_type = s.aggregate_type AND l.aggregate_id = s.aggregate_id \
           WHERE l.version IS DISTINCT FROM s.version), \
         gone AS (DELETE FROM {engine}.projectionist_aggregate_versions v USING diff d \
           WHERE d.rebuilt IS NULL AND {row}), \
         moved AS (UPDATE {engine}.projectionist_aggregate_versions v SET version = d.rebuilt FROM diff d \
           WHERE d.live IS NOT NULL AND d.rebuilt IS NOT NULL AND {row}) \
         INSERT INTO {engine}.projectionist_aggregate_versions (projection, aggregate_type, aggregate_id, version) \
         SELECT $1, aggregate_type, aggregate_id, rebuilt FROM diff WHERE live IS NULL"
    ))
    .bind(projection)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Puts the shadow's dead letters, parked aggregates and held events of `projection` in
/// place of the live ones. A dead letter of a message the live side has one of keeps that
/// one's id and first sighting and takes the rebuild's state; the others come under new ids;
/// the live open ones the rebuild did not meet again (an upcaster fixes them now) are resolved
/// as `rebuilt`. The parked aggregates name their dead letters' ids; held events come under
/// new ids.
async fn move_parking(conn: &mut PgConnection, projection: &str, shadow: &Ident, engine: &Ident) -> Result<()> {
    for table in ["projectionist_parked", "projectionist_held"] {
        sqlx::query(&format!("DELETE FROM {engine}.{table} WHERE projection = $1"))
            .bind(projection)
            .execute(&mut *conn)
            .await?;
    }
    // Dead letters: the live one of the same message, or a new id from the live table's.
    sqlx::query(&format!(
        "CREATE TEMP TABLE projectionist_letter_ids ON COMMIT DROP AS \
         SELECT d.id AS shadow_id, l.id IS NOT NULL AS kept, CASE WHEN l.id IS NOT NULL THEN l.id \
         ELSE nextval(pg_get_serial_sequence('{engine}.projectionist_dead_letters', 'id')) END AS id \
         FROM {shadow}.projectionist_dead_letters d LEFT JOIN {engine}.projectionist_dead_letters l \
         ON l.projection = d.projection AND l.topic = d.topic AND l.partition = d.partition \
         AND l.\"offset\" = d.\"offset\" \
         WHERE d.projection = $1"
    ))
    .bind(projection)
    .execute(&mut *conn)
    .await?;
    sqlx::query(&format!(
        "UPDATE {engine}.projectionist_dead_letters SET resolution = 'rebuilt', resolved_at = now(), \
         resolution_note = 'not poison to the rebuild swapped in' \
         WHERE projection = $1 AND resolution IS NULL \
         AND id NOT IN (SELECT id FROM projectionist_letter_ids WHERE kept)"
    ))
    .bind(projection)
    .execute(&mut *conn)
    .await?;
    sqlx::raw_sql(&format!(
        "UPDATE {engine}.projectionist_dead_letters l SET reason = d.reason, error = d.error, last_seen = d.last_seen, \
         attempts = l.attempts + d.attempts, resolution = d.resolution, resolved_at = d.resolved_at, \
         resolution_note = d.resolution_note \
         FROM projectionist_letter_ids m JOIN {shadow}.projectionist_dead_letters d ON d.id = m.shadow_id \
         WHERE m.kept AND l.id = m.id"
    ))
    .execute(&mut *conn)
    .await?;
    let letters = columns(conn, engine, "projectionist_dead_letters").await?;
    sqlx::query(&format!(
        "INSERT INTO {engine}.projectionist_dead_letters (id, {cols}) OVERRIDING SYSTEM VALUE \
         SELECT m.id, {d_cols} FROM {shadow}.projectionist_dead_letters d \
         JOIN projectionist_letter_ids m ON m.shadow_id = d.id WHERE NOT m.kept AND d.projection = $1",
        cols = letters.join(", "),
        d_cols = letters.iter().map(|c| format!("d.{c}")).collect::<Vec<_>>().join(", ")
    ))
    .bind(projection)
    .execute(&mut *conn)
    .await?;
    let parked = columns(conn, engine, "projectionist_parked").await?;
    let p_cols = parked.iter().map(|c| if c == "dead_letter" { "m.id".to_owned() } else { format!("p.{c}") });
    sqlx::query(&format!(
        "INSERT INTO {engine}.projectionist_parked ({cols}) SELECT {p_cols} FROM {shadow}.projectionist_parked p \
         LEFT JOIN projectionist_letter_ids m ON m.shadow_id = p.dead_letter WHERE p.projection = $1",
        cols = parked.join(", "),
        p_cols = p_cols.collect::<Vec<_>>().join(", ")
    ))
    .bind(projection)
    .execute(&mut *conn)
    .await?;
    let held = columns(conn, engine, "projectionist_held").await?;
    sqlx::query(&format!(
        "INSERT INTO {engine}.projectionist_held ({cols}) SELECT {cols} FROM {shadow}.projectionist_held \
         WHERE projection = $1 ORDER BY id",
        cols = held.join(", ")
    ))
    .bind(projection)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The columns of `schema.table` but its `id`, quoted, in order.
async fn columns(conn: &mut PgConnection, schema: &Ident, table: &str) -> Result<Vec<String>> {
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT attname::text FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped \
         AND attname <> 'id' ORDER BY attnum",
    )
    .bind(format!("{schema}.{table}"))
    .fetch_all(&mut *conn)
    .await?;
    names.iter().map(|n| Ident::new(n).map(|i| i.to_string())).collect()
}
