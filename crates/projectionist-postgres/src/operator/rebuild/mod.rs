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
//! Instead of swapping, a rebuild can be compared with the live tables ([`verify`]).
//!
//! A rebuild holds an advisory lock ([`lock`]) for as long as it runs: a second rebuild of
//! the projection is refused, and a rebuild killed lets go of it (its shadow is resumed by
//! the next one).

use sqlx::{Connection, PgConnection, PgPool};

use crate::error::{Error, Result};
use crate::projection::{validate, PgProjection};
pub use crate::swap_lock::begin_sharing_swap_lock;
use crate::tables::ident::Ident;

mod repair;
mod swap;
mod verify;
pub use repair::{prepare_repair, repair_held, unrepairable, Repair, Repaired};
pub use swap::{hold, rollback, swap, swap_held, Held, Swap};
pub use verify::{verify, Difference, Verification, FIRST_DIFFERENCES};

/// The engine tables a projection's rows are kept in.
const ENGINE_TABLES: [&str; 6] = [
    "projectionist_built_for",
    "projectionist_aggregate_versions",
    "projectionist_parked",
    "projectionist_held",
    "projectionist_dead_letters",
    "projectionist_checkpoints",
];

/// The aggregate versions of the projection bound as `$1` in `schema`'s engine table, as a
/// parenthesised subquery (the swap and the verification compare the live and rebuilt ones).
fn versions_in(schema: &Ident) -> String {
    format!(
        "(SELECT aggregate_type, aggregate_id, version FROM {schema}.projectionist_aggregate_versions \
         WHERE projection = $1)"
    )
}

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
/// connection of the pool (counted in its size, so a rebuild keeps within its budget), closed
/// rather than given back (and the lock let go) when this drops.
pub struct RebuildLock {
    conn: sqlx::pool::PoolConnection<sqlx::Postgres>,
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
    let mut conn = pool.acquire().await?;
    conn.close_on_drop();
    let taken: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtext('projectionist.rebuild.' || $1))")
        .bind(projection)
        .fetch_one(&mut *conn)
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
    let name = projection.name();
    let old = old_schema(name);
    Ident::new(&old)?;
    if schema_exists(&mut *pool.acquire().await?, &old).await? {
        return Err(problem(
            name,
            format!(
                "the tables a previous rebuild replaced are kept in schema {old} for `rebuild --rollback`: remove them \
                 with `rebuild --drop-old` first"
            ),
        ));
    }
    prepare_to_verify(pool, projection).await
}

/// Creates `projection`'s shadow as [`prepare`] does, for a [`verify`], which swaps nothing
/// in: the tables an earlier rebuild replaced may be kept meanwhile.
pub async fn prepare_to_verify(pool: &PgPool, projection: &dyn PgProjection) -> Result<Shadow> {
    create_shadow(pool, projection, false).await
}

/// What the comment of a repair's shadow says: a rebuild never resumes one.
const REPAIR_SHADOW: &str = "projectionist repair";

/// Creates `projection`'s shadow (see [`prepare`]), or resumes it; a repair's (`repair`
/// given: marked as one) is never resumed, but dropped and made again.
async fn create_shadow(pool: &PgPool, projection: &dyn PgProjection, repair: bool) -> Result<Shadow> {
    validate(projection)?;
    let name = projection.name();
    unqualified(projection)?;
    let shadow = shadow_schema(name);
    let shadow_ident = Ident::new(&shadow)?;
    let mut conn = pool.acquire().await?;
    let comment: Option<Option<String>> =
        sqlx::query_scalar("SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = $1")
            .bind(&shadow)
            .fetch_optional(&mut *conn)
            .await?;
    if comment.as_ref().is_some_and(|c| c.as_deref() == Some(REPAIR_SHADOW)) {
        // A repair that did not finish: its few aggregates are no start for anything.
        sqlx::raw_sql(&format!("DROP SCHEMA {shadow_ident} CASCADE")).execute(&mut *conn).await?;
    } else if comment.is_some() && repair {
        return Err(problem(
            name,
            "the shadow of an unfinished rebuild is kept: finish it (`rebuild`) or drop it (`rebuild --abandon`) first",
        ));
    }
    let resumed = schema_exists(&mut conn, &shadow).await?;
    let engine = live_schema(&mut conn, "projectionist_checkpoints")
        .await?
        .ok_or_else(|| problem(name, "the engine's tables are not in this database: run `migrate` first"))?;
    let path = shadow_search_path(&mut conn, name).await?;
    let mut tx = conn.begin().await?;
    sqlx::raw_sql(&format!("CREATE SCHEMA IF NOT EXISTS {shadow_ident}")).execute(&mut *tx).await?;
    if repair {
        sqlx::raw_sql(&format!("COMMENT ON SCHEMA {shadow_ident} IS '{REPAIR_SHADOW}'")).execute(&mut *tx).await?;
    }
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

/// Makes `conn` a session of `projection`'s shadow: `path` (from [`shadow_search_path`]) its
/// `search_path`, and its writers under the shadow's own swap lock, which a rebuild holding
/// the live writers back for its last round does not hold.
pub async fn enter_shadow(conn: &mut PgConnection, path: &str, projection: &str) -> Result<()> {
    sqlx::query(crate::swap_lock::SHADOW_SESSION)
        .bind(path)
        .bind(shadow_schema(projection))
        .execute(&mut *conn)
        .await?;
    Ok(())
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
        crate::operator::resolve::resolve(
            shadow_pool,
            projection,
            id,
            crate::operator::resolve::Resolve::Discard { reason },
        )
        .await?;
        carried += 1;
    }
    Ok(carried)
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
