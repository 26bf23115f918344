//! Halted partitions as the process that halted them reports them (`projectionist_halts`),
//! so that `status`, in another process, can show them. A row goes when its partition gets
//! past the halt, or is assigned again (to this process or another); one reported by a
//! process that has stopped stays until then, its `reported_at` telling how old it is.

use sqlx::types::chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::error::Result;

/// One halted partition.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct StoredHalt {
    /// The projection.
    pub projection: String,
    /// The topic.
    pub topic: String,
    /// The partition of the topic.
    pub partition: i32,
    /// The offset it stopped at: nothing at or after it is applied.
    pub halted_at: i64,
    /// Why, and what to do.
    pub reason: String,
    /// Whether it is retried from its checkpoint until it gets past.
    pub heals: bool,
    /// Since when it is halted there.
    pub since: DateTime<Utc>,
    /// When it is next retried, when it heals.
    pub retry_at: Option<DateTime<Utc>>,
    /// When its process reported it.
    pub reported_at: DateTime<Utc>,
}

/// Records `halt` (in place of what its partition had).
pub async fn record(pool: &PgPool, halt: &StoredHalt) -> Result<()> {
    sqlx::query(
        "INSERT INTO projectionist_halts \
           (projection, topic, partition, halted_at, reason, heals, since, retry_at, reported_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
         ON CONFLICT (projection, topic, partition) DO UPDATE SET halted_at = EXCLUDED.halted_at, \
           reason = EXCLUDED.reason, heals = EXCLUDED.heals, since = EXCLUDED.since, \
           retry_at = EXCLUDED.retry_at, reported_at = EXCLUDED.reported_at",
    )
    .bind(&halt.projection)
    .bind(&halt.topic)
    .bind(halt.partition)
    .bind(halt.halted_at)
    .bind(&halt.reason)
    .bind(halt.heals)
    .bind(halt.since)
    .bind(halt.retry_at)
    .bind(halt.reported_at)
    .execute(pool)
    .await?;
    Ok(())
}

/// Forgets the halts of `projection`'s `partitions` of `topic` reported before `before`
/// (the time its process decided they are over, so that a later report stays).
pub async fn clear(
    pool: &PgPool,
    projection: &str,
    topic: &str,
    partitions: &[i32],
    before: DateTime<Utc>,
) -> Result<()> {
    sqlx::query(
        "DELETE FROM projectionist_halts \
         WHERE projection = $1 AND topic = $2 AND partition = ANY($3) AND reported_at < $4",
    )
    .bind(projection)
    .bind(topic)
    .bind(partitions)
    .bind(before)
    .execute(pool)
    .await?;
    Ok(())
}

/// The halts reported, of `projection` or of all, in order of projection, topic, partition.
pub async fn list(pool: &PgPool, projection: Option<&str>) -> Result<Vec<StoredHalt>> {
    Ok(sqlx::query_as(
        "SELECT projection, topic, partition, halted_at, reason, heals, since, retry_at, reported_at \
         FROM projectionist_halts WHERE $1::text IS NULL OR projection = $1 \
         ORDER BY projection, topic, partition",
    )
    .bind(projection)
    .fetch_all(pool)
    .await?)
}
