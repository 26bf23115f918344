//! Checkpoints: the next offset per (projection, topic, partition), kept in PostgreSQL in
//! the same transaction as the batch they cover. Postgres is the source of truth for
//! position; Kafka's committed offset follows it for lag tools.

use sqlx::{PgConnection, PgPool};
use std::collections::HashMap;

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

/// Records the next offset in the caller's transaction, and notifies
/// [`crate::wait::CHANNEL`] of it (delivered when the transaction commits: to waits for the
/// read model, see [`crate::wait::Waiter`]).
pub async fn store(
    conn: &mut PgConnection,
    projection: &str,
    topic: &str,
    partition: i32,
    next_offset: i64,
) -> sqlx::Result<()> {
    sqlx::query(
        "WITH stored AS (INSERT INTO projectionist_checkpoints (projection, topic, partition, next_offset, \
         updated_at) VALUES ($1, $2, $3, $4, now()) \
         ON CONFLICT (projection, topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset, updated_at = \
         now() RETURNING next_offset) \
         SELECT pg_notify('projectionist_checkpoint', json_build_object('schema', current_schema(), 'projection', \
         $1::text, 'topic', $2::text, 'partition', $3::int, 'next_offset', next_offset)::text) FROM stored",
    )
    .bind(projection)
    .bind(topic)
    .bind(partition)
    .bind(next_offset)
    .execute(conn)
    .await?;
    Ok(())
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
    let topics: Vec<&str> = partitions.iter().map(|(t, _)| t.as_str()).collect();
    let parts: Vec<i32> = partitions.iter().map(|(_, p)| *p).collect();
    let rows: Vec<(String, i32, i64)> = sqlx::query_as(
        "SELECT c.topic, c.partition, c.next_offset FROM projectionist_checkpoints c \
         JOIN unnest($2::text[], $3::int[]) AS a(topic, partition) USING (topic, partition) WHERE c.projection = $1",
    )
    .bind(projection)
    .bind(&topics)
    .bind(&parts)
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|(t, p, o)| ((t, p), o)).collect())
}
