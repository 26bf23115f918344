//! Checkpoints: the next offset per (projection, topic, partition), kept in PostgreSQL in
//! the same transaction as the batch they cover. Postgres is the source of truth for
//! position; Kafka's committed offset follows it for lag tools.

use sqlx::{PgConnection, PgPool};
use std::collections::HashMap;

use crate::error::Error;
use crate::error::Result;

/// One stored checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// Projection name.
    pub projection: String,
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Next offset to consume.
    pub next_offset: i64,
}

/// Records the next offset in the caller's transaction, where the stored checkpoint is still
/// `expected` (`None`: none stored), the position the caller read or last stored. A
/// checkpoint moved meanwhile by anyone else — a rebuild's swap or rollback, `run --reset`,
/// another process given the partition — is never written past: [`Error::CheckpointMoved`]
/// says where it stands, and the caller reads on from there (rolling back what it wrote with
/// it, which was built on tables that are no longer the ones it read). Once it commits,
/// [`notify`] tells the waits for the read model (see [`crate::wait::Waiter`]).
pub async fn store(
    conn: &mut PgConnection,
    projection: &str,
    topic: &str,
    partition: i32,
    expected: Option<i64>,
    next_offset: i64,
) -> Result<()> {
    let sql = match expected {
        None => {
            "INSERT INTO projectionist_checkpoints (projection, topic, partition, next_offset, updated_at) \
             VALUES ($1, $2, $3, $4, now()) ON CONFLICT (projection, topic, partition) DO NOTHING"
        }
        Some(_) => {
            "UPDATE projectionist_checkpoints SET next_offset = $4, updated_at = now() \
             WHERE projection = $1 AND topic = $2 AND partition = $3 AND next_offset = $5"
        }
    };
    let query = bound(sqlx::query(sql), projection, topic, partition, next_offset);
    let query = match expected {
        Some(expected) => query.bind(expected),
        None => query,
    };
    let stored = query.execute(&mut *conn).await?.rows_affected();
    if stored == 1 {
        return Ok(());
    }
    let partitions = [(topic.to_owned(), partition)];
    let now = read_in(conn, projection, &partitions).await?.get(&partitions[0]).copied();
    Err(Error::CheckpointMoved { expected, stored: now })
}

/// Tells the waits for the read model (see [`crate::wait::Waiter`]) that a checkpoint was
/// stored and committed: a notification on [`crate::wait::CHANNEL`], sent on `conn` outside
/// any transaction, once the transaction that stored it has committed. Not inside that
/// transaction: PostgreSQL makes every transaction that notifies commit one after the other
/// (it holds a lock on its notification queue through the commit's WAL flush), which would
/// line up the commits of every partition of every projection in the database. Alone, the
/// notification writes no WAL and holds that lock for no flush. A notification lost (the
/// process stopped in between) delays a wait until its next read of the checkpoints
/// ([`crate::wait::POLL`]).
pub async fn notify(
    conn: &mut PgConnection,
    projection: &str,
    topic: &str,
    partition: i32,
    next_offset: i64,
    passed: Option<Passed<'_>>,
) -> sqlx::Result<()> {
    let sql = "SELECT pg_notify($5, json_build_object('schema', current_schema(), 'projection', $1::text, \
        'topic', $2::text, 'partition', $3::int, 'next_offset', $4::bigint, 'from', $6::bigint, \
        'kept_out', $7::bigint[])::text)";
    bound(sqlx::query(sql), projection, topic, partition, next_offset)
        .bind(crate::wait::CHANNEL)
        .bind(passed.as_ref().map(|p| p.from))
        .bind(passed.as_ref().map(|p| p.kept_out))
        .execute(conn)
        .await?;
    Ok(())
}

/// What a stored checkpoint passed, told with it to the waits so that they need not ask:
/// the offsets from `from` (the checkpoint it replaced) up to the new one, of which those in
/// `kept_out` were not applied (held behind a parked aggregate, dead-lettered, or skipped as
/// a discarded dead letter) and every other one is in the read model.
#[derive(Debug, Clone, Copy)]
pub struct Passed<'a> {
    /// The checkpoint replaced.
    pub from: i64,
    /// The offsets in the range kept out of the read model (offsets outside it are ignored).
    pub kept_out: &'a [i64],
}

/// `query` with a checkpoint's partition and offset bound as `$1` to `$4`.
fn bound<'q>(
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    projection: &'q str,
    topic: &'q str,
    partition: i32,
    next_offset: i64,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    query.bind(projection).bind(topic).bind(partition).bind(next_offset)
}

/// Every stored checkpoint, ordered.
pub async fn all(pool: &PgPool) -> sqlx::Result<Vec<Checkpoint>> {
    let rows: Vec<(String, String, i32, i64)> = sqlx::query_as(
        "SELECT projection, topic, partition, next_offset FROM projectionist_checkpoints ORDER BY projection, topic, \
        partition",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(projection, topic, partition, next_offset)| Checkpoint { projection, topic, partition, next_offset })
        .collect())
}

/// The stored next offsets of `partitions` for `projection` (absent: never checkpointed).
pub async fn read(
    pool: &PgPool,
    projection: &str,
    partitions: &[(String, i32)],
) -> sqlx::Result<HashMap<(String, i32), i64>> {
    read_in(&mut *pool.acquire().await?, projection, partitions).await
}

async fn read_in(
    conn: &mut PgConnection,
    projection: &str,
    partitions: &[(String, i32)],
) -> sqlx::Result<HashMap<(String, i32), i64>> {
    let topics: Vec<&str> = partitions.iter().map(|(t, _)| t.as_str()).collect();
    let parts: Vec<i32> = partitions.iter().map(|(_, p)| *p).collect();
    let rows: Vec<(String, i32, i64)> = sqlx::query_as(
        "SELECT c.topic, c.partition, c.next_offset FROM projectionist_checkpoints c \
         JOIN unnest($2::text[], $3::int[]) AS a(topic, partition) USING (topic, partition) WHERE c.projection = $1",
    )
    .bind(projection)
    .bind(&topics)
    .bind(&parts)
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().map(|(t, p, o)| ((t, p), o)).collect())
}
