//! The swap lock: shared by every transaction that writes a projection's rows, taken
//! exclusively by a rebuild's swap or rollback, so that no writer is mid-batch when the tables
//! change places. A leaf: what writes and what swaps both use it.

use sqlx::PgConnection;

use crate::error::Error;
use crate::error::Result;

/// The key of `$1`'s swap lock, a transaction-level advisory lock: shared by every transaction
/// that writes the projection's rows ([`share_swap_lock`]), exclusive to a swap or rollback
/// (`rebuild::hold_writers_back`). A rebuild's shadow writes under a lock of its own (its
/// sessions set `projectionist.swap_scope`, see [`SHADOW_SESSION`]): a rebuild holding the
/// live writers back for its last round must not hold back its own.
pub(crate) const SWAP_LOCK: &str =
    "hashtext('projectionist.swap.' || coalesce(current_setting('projectionist.swap_scope', true), '') || $1)";

/// What a session of a rebuild's shadow runs first, `$1` its `search_path` (the shadow's
/// schema first) and `$2` the shadow's schema: its names resolve to the shadow's tables, and
/// its writers share a swap lock of the shadow's (see [`SWAP_LOCK`]).
pub(crate) const SHADOW_SESSION: &str =
    "SELECT set_config('search_path', $1, false), set_config('projectionist.swap_scope', $2 || '.', false)";

/// Takes the shared side of `projection`'s swap lock for the caller's transaction, before it
/// locks anything else: a swap then waits for this transaction and holds the next ones back,
/// whatever this one locks later and in whichever order (a batch's tables, aggregate
/// versions, parked aggregates and checkpoints come in the order its events need them).
///
/// In the same statement, has PostgreSQL plan the transaction's statements for their values
/// (`plan_cache_mode`), not once for any: a batch's lookup of its keys (`= ANY($1)`, one
/// array of keys), planned for any array, compares every row it scans with every key, where
/// planned for the array at hand it hashes the keys or takes the index. Measured in the
/// bench's freshness arm (a read model starting empty, never analyzed): 1 to 2.7 s to lock
/// 500 to 2,400 rows of a 20,000-row table.
///
/// And has it cost a page reached by key as one read in order (`random_page_cost` =
/// `seq_page_cost`): the rows a batch writes are those its lookup has just read through the
/// key's index, so their pages are in shared buffers. At PostgreSQL's default (4 to 1) a
/// batch at the head, tens of rows, was joined to its table by a hash over a scan of the
/// whole table, three times slower than through the index (3.3 against 1.1 ms for 60 rows
/// of 7,700); a batch that is a large part of its table still takes the scan.
pub(crate) async fn share_swap_lock(conn: &mut PgConnection, projection: &str) -> Result<()> {
    sqlx::query(&format!("SELECT pg_advisory_xact_lock_shared({SWAP_LOCK}), {PLANNED_FOR_VALUES}"))
        .bind(projection)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// See [`share_swap_lock`].
const PLANNED_FOR_VALUES: &str = "set_config('plan_cache_mode', 'force_custom_plan', true), \
    set_config('random_page_cost', current_setting('seq_page_cost'), true)";

/// Begins a transaction on `conn` holding the shared side of `projection`'s swap lock (the
/// lock a swap or rollback takes exclusively), in the `BEGIN`'s round trip (a batch at the head pays
/// about ten round trips; this is one fewer). The projection's name, checked to be one,
/// is written into the statement. Where it fails, the connection may be left inside a
/// failed transaction the pool cannot see: the caller closes it (`close_on_drop`).
pub async fn begin_sharing_swap_lock<'c>(
    conn: &'c mut PgConnection,
    projection: &str,
) -> Result<sqlx::Transaction<'c, sqlx::Postgres>> {
    projectionist_core::validate_projection_name(projection)
        .map_err(|_| Error::Identifier { ident: projection.into(), reason: "not a valid projection name" })?;
    let key = SWAP_LOCK.replace("$1", &format!("'{projection}'"));
    let begin = format!("BEGIN; SELECT pg_advisory_xact_lock_shared({key}), {PLANNED_FOR_VALUES}");
    Ok(sqlx::Connection::begin_with(conn, begin).await?)
}
