//! Blue/green rebuilds, the PostgreSQL side: a projection's tables built again beside the
//! live ones, in a schema of its own (the *shadow*: `projectionist_rebuild_<projection>`,
//! with its own copies of the engine's tables), then swapped in by one short transaction.
//!
//! The shadow is written by the engine itself, through connections whose `search_path`
//! starts with the shadow schema ([`shadow_search_path`]): the same statements, names
//! resolved to the shadow's tables. The swap moves the live tables to
//! `projectionist_old_<projection>` (kept for [`rollback`], removed by [`drop_old`]), the
//! shadow's tables to the live schema, and the shadow's engine rows (checkpoints, aggregate
//! versions, parked aggregates, held events, dead letters) in place of the projection's.
//!
//! A rebuild holds an advisory lock ([`lock`]) for as long as it runs: a second rebuild of
//! the projection is refused, and a rebuild killed lets go of it (its shadow is resumed by
//! the next one).

use sqlx::{Connection, PgConnection, PgPool};

use crate::error::{Error, Result};
use crate::projection::{validate, PgProjection};
pub use crate::swap_lock::begin_sharing_swap_lock;
use crate::swap_lock::SWAP_LOCK;
use crate::Ident;

/// The engine tables a projection's rows are kept in.
const ENGINE_TABLES: [&str; 5] = [
    "projectionist_aggregate_versions",
    "projectionist_parked",
    "projectionist_held",
    "projectionist_dead_letters",
    "projectionist_checkpoints",
];

/// The schema a rebuild of `projection` builds its tables in.
pub fn shadow_schema(projection: &str) -> String {
    format!("projectionist_rebuild_{projection}")
}

/// The schema the live tables are kept in after a swap, until [`drop_old`].
pub fn old_schema(projection: &str) -> String {
    format!("projectionist_old_{projection}")
}

/// Refuses a projection with a schema-qualified table: its name does not follow the
/// `search_path` the shadow is written through.
fn unqualified(projection: &dyn PgProjection) -> Result<()> {
    match projection.tables().iter().find(|t| t.name().contains('.')) {
        Some(t) => Err(problem(
            projection.name(),
            format!("table {} is schema-qualified: a rebuild builds tables named on the search_path only", t.name()),
        )),
        None => Ok(()),
    }
}

fn problem(projection: &str, problem: impl Into<String>) -> Error {
    Error::rebuild(projection, problem)
}

/// A projection's rebuild lock, held for as long as this lives: a session lock on a
/// connection of its own, out of the pool, closed (and the lock let go) when this drops.
pub struct RebuildLock {
    conn: PgConnection,
}

impl RebuildLock {
    /// Lets go of the lock now (dropping it lets go too, as the server sees the connection
    /// close).
    pub async fn release(self) -> Result<()> {
        Ok(self.conn.close().await?)
    }
}

/// Takes `projection`'s rebuild lock, or refuses: another rebuild (or a swap, rollback or
/// drop) of it is running.
pub async fn lock(pool: &PgPool, projection: &str) -> Result<RebuildLock> {
    let mut conn = pool.acquire().await?.detach();
    let taken: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtext('projectionist.rebuild.' || $1))")
        .bind(projection)
        .fetch_one(&mut conn)
        .await?;
    if !taken {
        return Err(problem(
            projection,
            "another rebuild of it is running (a process holds its rebuild lock); wait for it, or stop it",
        ));
    }
    Ok(RebuildLock { conn })
}

/// What a rebuild finds where it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shadow {
    /// The shadow schema.
    pub schema: String,
    /// Whether it was there already: a rebuild stopped earlier, resumed.
    pub resumed: bool,
}

/// Creates `projection`'s shadow, unless it is there (a rebuild stopped earlier: resumed):
/// the schema, the engine's tables as the live ones are, and the projection's tables and
/// extra statements from its declarations — but its secondary indexes, which
/// [`create_indexes`] adds after the bulk load (an index built once over the loaded rows
/// costs far less than one kept up to date through every write of the load). Refuses while
/// an earlier rebuild's old tables are kept (`rebuild --drop-old` first).
pub async fn prepare(pool: &PgPool, projection: &dyn PgProjection) -> Result<Shadow> {
    validate(projection)?;
    let name = projection.name();
    unqualified(projection)?;
    let (shadow, old) = (shadow_schema(name), old_schema(name));
    let (shadow_ident, _) = (Ident::new(&shadow)?, Ident::new(&old)?);
    let mut conn = pool.acquire().await?;
    if schema_exists(&mut conn, &old).await? {
        return Err(problem(
            name,
            format!(
                "the tables a previous rebuild replaced are kept in schema {old} for `rebuild --rollback`: remove them \
                 with `rebuild --drop-old` first"
            ),
        ));
    }
    let resumed = schema_exists(&mut conn, &shadow).await?;
    let engine = live_schema(&mut conn, "projectionist_checkpoints")
        .await?
        .ok_or_else(|| problem(name, "the engine's tables are not in this database: run `migrate` first"))?;
    let path = shadow_search_path(&mut conn, name).await?;
    let mut tx = conn.begin().await?;
    sqlx::raw_sql(&format!("CREATE SCHEMA IF NOT EXISTS {shadow_ident}")).execute(&mut *tx).await?;
    for table in ENGINE_TABLES {
        sqlx::raw_sql(&format!(
            "CREATE TABLE IF NOT EXISTS {shadow_ident}.{table} (LIKE {}.{table} INCLUDING ALL)",
            Ident::new(&engine)?
        ))
        .execute(&mut *tx)
        .await?;
    }
    // The projection's own DDL, its names resolved in the shadow first.
    sqlx::query("SELECT set_config('search_path', $1, true)").bind(&path).execute(&mut *tx).await?;
    for table in projection.tables() {
        sqlx::raw_sql(&table.ddl()).execute(&mut *tx).await?;
    }
    for statement in projection.schema().iter().filter(|s| !is_secondary_index(s)) {
        sqlx::raw_sql(statement).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(Shadow { schema: shadow, resumed })
}

/// Creates the secondary indexes of `projection`'s extra statements (its non-unique
/// `CREATE INDEX`es, left out of [`prepare`]) in its shadow: after the bulk load, before the
/// catch-up and the swap. The statements are idempotent (see `Projection::schema`), so a
/// resumed rebuild runs them again harmlessly.
pub async fn create_indexes(pool: &PgPool, projection: &dyn PgProjection) -> Result<usize> {
    let statements: Vec<&str> = projection.schema().iter().copied().filter(|s| is_secondary_index(s)).collect();
    if statements.is_empty() {
        return Ok(0);
    }
    let mut conn = pool.acquire().await?;
    let path = shadow_search_path(&mut conn, projection.name()).await?;
    let mut tx = conn.begin().await?;
    sqlx::query("SELECT set_config('search_path', $1, true)").bind(&path).execute(&mut *tx).await?;
    for statement in &statements {
        sqlx::raw_sql(statement).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(statements.len())
}

/// Whether `statement` creates a non-unique index: one a bulk load may go without (a unique
/// index is kept from the start, so that what it refuses is refused event by event).
fn is_secondary_index(statement: &str) -> bool {
    let mut words = statement.split_whitespace().map(str::to_ascii_lowercase);
    words.next().as_deref() == Some("create") && words.next().as_deref() == Some("index")
}

/// The `search_path` of connections that write `projection`'s shadow: the shadow schema,
/// then the path connections of `conn`'s kind have (so that the engine's functions and
/// anything else the projection uses are found as before).
pub async fn shadow_search_path(conn: &mut PgConnection, projection: &str) -> Result<String> {
    let path: String = sqlx::query_scalar("SELECT current_setting('search_path')").fetch_one(&mut *conn).await?;
    Ok(format!("{}, {path}", Ident::new(&shadow_schema(projection))?))
}

/// Where `projection`'s rebuild has read each partition up to (its shadow's checkpoints:
/// topic, partition, next offset); `None` when no rebuild of it is under way.
pub async fn shadow_checkpoints(pool: &PgPool, projection: &str) -> Result<Option<Vec<(String, i32, i64)>>> {
    let shadow = shadow_schema(projection);
    let mut conn = pool.acquire().await?;
    if !schema_exists(&mut conn, &shadow).await? {
        return Ok(None);
    }
    let rows = sqlx::query_as(&format!(
        "SELECT topic, partition, next_offset FROM {}.projectionist_checkpoints WHERE projection = $1 ORDER BY 1, 2",
        Ident::new(&shadow)?
    ))
    .bind(projection)
    .fetch_all(&mut *conn)
    .await;
    // The shadow may be swapped in (and dropped) between the two statements.
    match rows {
        Ok(rows) => Ok(Some(rows)),
        Err(_) if !schema_exists(&mut conn, &shadow).await? => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// How a swap went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Swap {
    /// The shadow is live; the tables it replaced are kept in the old schema.
    Done,
    /// The shadow is behind the live checkpoints on these partitions (topic, partition,
    /// the shadow's next offset, the live one): catch it up, then swap again.
    Behind(Vec<(String, i32, Option<i64>, i64)>),
    /// An operator discarded these live dead letters (ids) since their discards were carried
    /// over ([`carry_discards`]): the shadow still holds them open. Carry them, then swap again
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
    let name = projection.name();
    let (shadow, old) = (Ident::new(&shadow_schema(name))?, Ident::new(&old_schema(name))?);
    unqualified(projection)?;
    let mut conn = pool.acquire().await?;
    if !schema_exists(&mut conn, &shadow_schema(name)).await? {
        return Err(problem(name, "there is no rebuild of it to swap in (`rebuild` builds one)"));
    }
    if schema_exists(&mut conn, &old_schema(name)).await? {
        return Err(problem(
            name,
            format!("schema {} is kept from a previous swap: `rebuild --drop-old`", old_schema(name)),
        ));
    }
    let (engine, live) = live_tables(&mut conn, projection).await?;
    let mut tx = conn.begin().await?;
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
    let dependents = crate::dependents::read(&mut tx, name, &live).await?;
    sqlx::raw_sql(&format!("CREATE SCHEMA {old}")).execute(&mut *tx).await?;
    for (schema, table) in &live {
        sqlx::raw_sql(&format!(
            "ALTER TABLE {schema}.{table} SET SCHEMA {old}; ALTER TABLE {shadow}.{table} SET SCHEMA {schema}"
        ))
        .execute(&mut *tx)
        .await?;
    }
    dependents.carry(&mut tx).await?;
    for table in ENGINE_TABLES {
        sqlx::raw_sql(&format!("CREATE TABLE {old}.{table} (LIKE {engine}.{table})")).execute(&mut *tx).await?;
        sqlx::query(&format!("INSERT INTO {old}.{table} SELECT * FROM {engine}.{table} WHERE projection = $1"))
            .bind(name)
            .execute(&mut *tx)
            .await?;
    }
    move_rows(&mut tx, name, &shadow, &engine).await?;
    sqlx::raw_sql(&format!("DROP SCHEMA {shadow} CASCADE")).execute(&mut *tx).await?;
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
    let dependents = crate::dependents::read(&mut tx, name, &live).await?;
    let swapped_in = live.iter().map(|(schema, table)| format!("{schema}.{table}")).collect::<Vec<_>>().join(", ");
    // The views go first: they hold on to the swapped-in tables, which are dropped.
    dependents.drop_views(&mut tx).await?;
    sqlx::raw_sql(&format!("DROP TABLE IF EXISTS {swapped_in}")).execute(&mut *tx).await?;
    for (schema, table) in &live {
        sqlx::raw_sql(&format!("ALTER TABLE {old}.{table} SET SCHEMA {schema}")).execute(&mut *tx).await?;
    }
    dependents.carry(&mut tx).await?;
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

/// Carries the live side's discards over to `projection`'s shadow (written through
/// `shadow_pool`): each dead letter an operator discarded, met again by the rebuild as an open
/// dead letter of the same message, is discarded there too, with the same reason (the
/// version skipped, the events held behind it applied). How many.
pub async fn carry_discards(pool: &PgPool, shadow_pool: &PgPool, projection: &dyn PgProjection) -> Result<u64> {
    let name = projection.name();
    let discarded: Vec<(i64, String, i32, i64, Option<String>)> = sqlx::query_as(
        "SELECT id, topic, partition, \"offset\", resolution_note FROM projectionist_dead_letters \
         WHERE projection = $1 AND resolution = 'discarded' AND \"offset\" IS NOT NULL ORDER BY id",
    )
    .bind(name)
    .fetch_all(pool)
    .await?;
    let mut carried = 0;
    for (live_id, topic, partition, offset, note) in discarded {
        let open: Option<i64> = sqlx::query_scalar(
            "SELECT id FROM projectionist_dead_letters WHERE projection = $1 AND topic = $2 AND partition = $3 \
             AND \"offset\" = $4 AND resolution IS NULL",
        )
        .bind(name)
        .bind(&topic)
        .bind(partition)
        .bind(offset)
        .fetch_optional(shadow_pool)
        .await?;
        let Some(id) = open else { continue };
        let reason = format!("{} (carried over from dead letter {live_id})", note.unwrap_or_default());
        crate::park::resolve(shadow_pool, projection, id, crate::park::Resolve::Discard { reason }).await?;
        carried += 1;
    }
    Ok(carried)
}

/// The schema of the engine's tables, and each of `projection`'s live tables with its schema
/// (as `conn`'s `search_path` finds them).
async fn live_tables(conn: &mut PgConnection, projection: &dyn PgProjection) -> Result<(Ident, Vec<(Ident, Ident)>)> {
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

/// Removes the tables the last swap of `projection` replaced (no rollback after this).
pub async fn drop_old(pool: &PgPool, projection: &str) -> Result<bool> {
    let old = old_schema(projection);
    let outside: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT format('view %s', r.ev_class::regclass) FROM pg_depend d \
         JOIN pg_rewrite r ON r.oid = d.objid JOIN pg_class t ON t.oid = d.refobjid \
         JOIN pg_class v ON v.oid = r.ev_class \
         WHERE d.classid = 'pg_rewrite'::regclass AND t.relnamespace = to_regnamespace($1) \
           AND v.relnamespace <> t.relnamespace \
         UNION SELECT format('foreign key %I of table %s', c.conname, c.conrelid::regclass) FROM pg_constraint c \
         JOIN pg_class t ON t.oid = c.confrelid JOIN pg_class f ON f.oid = c.conrelid \
         WHERE c.contype = 'f' AND t.relnamespace = to_regnamespace($1) AND f.relnamespace <> t.relnamespace",
    )
    .bind(Ident::new(&old)?.to_string())
    .fetch_all(pool)
    .await?;
    if !outside.is_empty() {
        let names = outside.join(", ");
        return Err(problem(
            projection,
            format!("{names} still depend on the replaced tables in {old}: drop it first"),
        ));
    }
    drop_schema(pool, &old).await
}

/// Removes `projection`'s shadow: a rebuild abandoned (the next one starts over).
pub async fn abandon(pool: &PgPool, projection: &str) -> Result<bool> {
    drop_schema(pool, &shadow_schema(projection)).await
}

async fn drop_schema(pool: &PgPool, schema: &str) -> Result<bool> {
    let mut conn = pool.acquire().await?;
    if !schema_exists(&mut conn, schema).await? {
        return Ok(false);
    }
    sqlx::raw_sql(&format!("DROP SCHEMA {} CASCADE", Ident::new(schema)?)).execute(&mut *conn).await?;
    Ok(true)
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

/// Puts the shadow's engine rows of `projection` in place of the live ones. A dead letter
/// of a message the live side has one of keeps that one's id and first sighting and takes the
/// rebuild's state; the others come under new ids; the live open ones the rebuild did not
/// meet again (an upcaster fixes them now) are resolved as `rebuilt`. The parked aggregates
/// name their dead letters' ids; held events come under new ids.
async fn move_rows(conn: &mut PgConnection, projection: &str, shadow: &Ident, engine: &Ident) -> Result<()> {
    for table in
        ["projectionist_checkpoints", "projectionist_aggregate_versions", "projectionist_parked", "projectionist_held"]
    {
        sqlx::query(&format!("DELETE FROM {engine}.{table} WHERE projection = $1"))
            .bind(projection)
            .execute(&mut *conn)
            .await?;
    }
    for table in ["projectionist_checkpoints", "projectionist_aggregate_versions"] {
        sqlx::query(&format!("INSERT INTO {engine}.{table} SELECT * FROM {shadow}.{table} WHERE projection = $1"))
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

async fn schema_exists(conn: &mut PgConnection, schema: &str) -> Result<bool> {
    Ok(sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
        .bind(schema)
        .fetch_one(&mut *conn)
        .await?)
}

/// The schema `table` resolves to on `conn`'s `search_path`, if it exists.
async fn live_schema(conn: &mut PgConnection, table: &str) -> Result<Option<String>> {
    Ok(sqlx::query_scalar(
        "SELECT n.nspname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE c.oid = to_regclass($1)",
    )
    .bind(Ident::new(table)?.to_string())
    .fetch_optional(&mut *conn)
    .await?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_non_unique_indexes_wait_for_the_bulk_load() {
        use super::is_secondary_index as deferred;
        assert!(deferred("CREATE INDEX IF NOT EXISTS by_owner ON accounts (owner)"));
        assert!(deferred("  create\n index by_owner ON accounts (owner)"));
        assert!(!deferred("CREATE UNIQUE INDEX IF NOT EXISTS one_owner ON accounts (owner)"));
        assert!(!deferred("CREATE VIEW open_accounts AS SELECT * FROM accounts"));
        assert!(!deferred("CREATE INDEXED_THING"));
    }
}
