//! The engine's own migrations, with their history in the engine's own table.
//!
//! The database a projector writes to is often the application's own, and the application
//! may keep its migration history in sqlx's `_sqlx_migrations`. The engine never writes
//! there: its history is `projectionist_migrations`, beside its other tables, and one
//! transaction (under an advisory lock, so concurrent `migrate`s wait for each other)
//! applies what is missing and records it.
//!
//! And what is done with a projection's tables as a whole: creating them ([`create_schema`]) and
//! emptying them for a replay ([`reset`]).

use std::collections::BTreeMap;

use sqlx::migrate::Migrator;
use sqlx::{Connection, PgConnection, PgPool};

use crate::error::Drift;
use crate::error::{Error, MigrateError, Result};
use crate::projection::{validate, PgProjection};
use crate::schema::drift;
use crate::tables::ident::Ident;

/// What `migrate` may change besides creating what does not exist.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MigrateOptions {
    /// Add the columns a declaration has and its table lacks, where that is safe: nullable
    /// and without a default (the rows already there get NULL in them, as if no event had
    /// set them yet). Off: such a table is refused like any other difference.
    pub add_columns: bool,
}

impl MigrateOptions {
    /// Adds missing nullable columns in place (see [`MigrateOptions::add_columns`]).
    pub fn add_columns(mut self) -> Self {
        self.add_columns = true;
        self
    }
}

/// Applies the engine's migrations (its checkpoints and aggregate versions, recorded in its
/// own [`HISTORY_TABLE`], never in sqlx's `_sqlx_migrations`), then creates each
/// projection's tables that do not exist yet, after checking that those that do exist are
/// as declared: a difference is refused ([`Error::Drift`]) before anything is created.
///
/// In tests, `#[sqlx::test(migrations = false)]` gives a fresh database; call this first.
pub async fn migrate(pool: &PgPool, projections: &[&dyn PgProjection]) -> Result<()> {
    migrate_with(pool, projections, MigrateOptions::default()).await
}

/// As [`migrate`], also making the changes `options` allows.
pub async fn migrate_with(pool: &PgPool, projections: &[&dyn PgProjection], options: MigrateOptions) -> Result<()> {
    engine(pool).await?;
    let mut fixes = Vec::new();
    for projection in projections {
        validate(*projection)?;
        let mut drift: Vec<Drift> = Vec::new();
        for table in projection.tables() {
            drift.extend(drift::table(pool, table).await?.unwrap_or_default());
        }
        if drift.iter().any(|d| d.fix.is_none() || !options.add_columns) {
            return Err(Error::Drift { projection: projection.name().to_owned(), drift });
        }
        fixes.push(drift);
    }
    for (projection, drift) in projections.iter().zip(fixes) {
        let mut tx = pool.begin().await?;
        for d in &drift {
            let fix = d.fix.as_deref().expect("only fixable drift is left");
            sqlx::raw_sql(fix).execute(&mut *tx).await?;
            tracing::info!(projection = %projection.name(), table = %d.table, statement = %fix, "Column added.");
        }
        tx.commit().await?;
        create_schema(pool, *projection).await?;
    }
    Ok(())
}

/// The engine's migrations (its tables and functions), embedded from `migrations/`.
static ENGINE: Migrator = sqlx::migrate!("../../migrations");

pub use crate::error::HISTORY_TABLE;

/// Key of the advisory lock concurrent `migrate`s take (the bytes of "projmigr").
const LOCK: i64 = 0x7072_6f6a_6d69_6772;

/// Applies the engine's migrations the database does not have yet, in one transaction,
/// recording them in [`HISTORY_TABLE`]. A database migrated by an older release, whose
/// history went to sqlx's `_sqlx_migrations`, has those rows moved into the engine's
/// history (the application's own rows there are left as they are).
pub async fn engine(pool: &PgPool) -> Result<()> {
    let mut conn = pool.acquire().await?;
    let mut tx = conn.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(LOCK).execute(&mut *tx).await?;
    sqlx::raw_sql(&format!(
        "CREATE TABLE IF NOT EXISTS {HISTORY_TABLE} (
            version     bigint      PRIMARY KEY,
            description text        NOT NULL,
            checksum    bytea       NOT NULL,
            applied_at  timestamptz NOT NULL DEFAULT now()
        )"
    ))
    .execute(&mut *tx)
    .await?;
    let mut applied = history(&mut tx).await?;
    if applied.is_empty() {
        adopt_sqlx_history(&mut tx).await?;
        applied = history(&mut tx).await?;
    }
    for (version, checksum) in &applied {
        match up().find(|m| m.version == *version) {
            None => return Err(MigrateError::Unknown { version: *version }.into()),
            Some(m) if *m.checksum != checksum[..] => {
                return Err(MigrateError::Modified { version: *version, description: m.description.to_string() }.into())
            }
            Some(_) => {}
        }
    }
    for m in up().filter(|m| !applied.contains_key(&m.version)) {
        sqlx::raw_sql(&m.sql).execute(&mut *tx).await.map_err(|source| MigrateError::Failed {
            version: m.version,
            description: m.description.to_string(),
            source,
        })?;
        sqlx::query(&format!("INSERT INTO {HISTORY_TABLE} (version, description, checksum) VALUES ($1, $2, $3)"))
            .bind(m.version)
            .bind(&*m.description)
            .bind(&*m.checksum)
            .execute(&mut *tx)
            .await?;
        tracing::info!(version = m.version, description = %m.description, "Engine migration applied.");
    }
    tx.commit().await?;
    Ok(())
}

/// The engine's migrations that move forward (a `.down.sql` one, should one be added, is
/// for undoing by hand, never run here).
fn up() -> impl Iterator<Item = &'static sqlx::migrate::Migration> {
    ENGINE.iter().filter(|m| !m.migration_type.is_down_migration())
}

async fn history(conn: &mut PgConnection) -> Result<BTreeMap<i64, Vec<u8>>> {
    let rows: Vec<(i64, Vec<u8>)> =
        sqlx::query_as(&format!("SELECT version, checksum FROM {HISTORY_TABLE}")).fetch_all(&mut *conn).await?;
    Ok(rows.into_iter().collect())
}

/// Moves the engine's rows out of sqlx's `_sqlx_migrations` (where builds of 0.1.0 recorded
/// them) into the engine's history: only rows whose version and checksum are one
/// of the engine's migrations, so that the application's own migrations, if it keeps them
/// there, stay untouched and its migrator no longer finds versions it does not know.
async fn adopt_sqlx_history(conn: &mut PgConnection) -> Result<()> {
    let exists: bool =
        sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL").fetch_one(&mut *conn).await?;
    if !exists {
        return Ok(());
    }
    for m in up() {
        let moved = sqlx::query(&format!(
            "WITH ours AS (DELETE FROM _sqlx_migrations WHERE version = $1 AND checksum = $2 AND success \
             RETURNING version, description) \
             INSERT INTO {HISTORY_TABLE} (version, description, checksum) SELECT version, description, $2 FROM ours"
        ))
        .bind(m.version)
        .bind(&*m.checksum)
        .execute(&mut *conn)
        .await?;
        if moved.rows_affected() > 0 {
            tracing::info!(
                version = m.version,
                "Engine migration's record moved from _sqlx_migrations to {HISTORY_TABLE}."
            );
        }
    }
    Ok(())
}

/// Creates the projection's tables from their declarations, then runs its extra
/// [`Projection::schema`](projectionist_core::Projection::schema) statements, and records the event types this release of it
/// handles as those its tables are built for.
pub async fn create_schema(pool: &PgPool, projection: &dyn PgProjection) -> Result<()> {
    validate(projection)?;
    let mut tx = pool.begin().await?;
    for table in projection.tables() {
        sqlx::raw_sql(&table.ddl()).execute(&mut *tx).await?;
    }
    for statement in projection.schema() {
        sqlx::raw_sql(statement).execute(&mut *tx).await?;
    }
    crate::writing::built_for::record(&mut tx, projection).await?;
    tx.commit().await?;
    Ok(())
}

/// Empties the projection's tables and forgets its aggregate versions, checkpoints and what
/// it parked and held, in one transaction, so the next run rebuilds it from the start of its
/// topics. Its dead letters stay, with what an operator did with them: one discarded is
/// skipped again when the replay meets it.
///
/// Refuses ([`Error::Drift`]) before emptying anything when a table does not exist or is not
/// as declared: the replay would halt on it, leaving the read model empty.
pub async fn reset(pool: &PgPool, projection: &dyn PgProjection) -> Result<()> {
    crate::schema::drift::check_tables(pool, projection).await?;
    let mut tx = pool.begin().await?;
    if !projection.tables().is_empty() {
        let tables = projection
            .tables()
            .iter()
            .map(|t| Ident::new(t.name()).map(|i| i.to_string()))
            .collect::<Result<Vec<_>>>()?;
        sqlx::raw_sql(&format!("TRUNCATE {}", tables.join(", "))).execute(&mut *tx).await?;
    }
    // Parking is re-derived as the stream is read again; dead letters stay, with what an
    // operator did with them (a discarded one is skipped again when met).
    for table in
        ["projectionist_aggregate_versions", "projectionist_checkpoints", "projectionist_parked", "projectionist_held"]
    {
        sqlx::query(&format!("DELETE FROM {table} WHERE projection = $1"))
            .bind(projection.name())
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(())
}
