//! Dead letters as stored: read for the commands that list, show, retry and discard them,
//! and the discarded ones a replay meets again.

use sqlx::types::chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};

use super::Source;
use crate::Result;

/// A dead letter, as stored.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct StoredDeadLetter {
    /// Its id (`dead-letters show ID`).
    pub id: i64,
    /// The projection it failed in.
    pub projection: String,
    /// Where it was read.
    pub topic: String,
    /// Where it was read.
    pub partition: i32,
    /// Where it was read (`None`: not read from Kafka).
    pub offset: Option<i64>,
    /// The message's key, as read.
    pub key: Option<Vec<u8>>,
    /// The message's payload, as read.
    pub payload: Vec<u8>,
    /// The message's header names, as read.
    pub header_names: Vec<String>,
    /// The message's header values, as read (`None`: a header without a value).
    pub header_values: Vec<Option<Vec<u8>>>,
    /// Its aggregate's type, when the envelope names it (parked behind it).
    pub aggregate_type: Option<String>,
    /// Its aggregate's id, when the envelope names it.
    pub aggregate_id: Option<String>,
    /// Its version, when the envelope names it.
    pub version: Option<i64>,
    /// What kind of failure: `envelope`, `key`, `tombstone`, `data`, `value`, `apply`, ….
    pub reason: String,
    /// The full error.
    pub error: String,
    /// How many times it was read and failed (a replay reads it again).
    pub attempts: i32,
    /// When it first failed.
    pub first_seen: DateTime<Utc>,
    /// When it last failed.
    pub last_seen: DateTime<Utc>,
    /// What an operator did with it: `retried` or `discarded` (`None`: open).
    pub resolution: Option<String>,
    /// When.
    pub resolved_at: Option<DateTime<Utc>>,
    /// Why (a discard's reason).
    pub resolution_note: Option<String>,
}

pub(crate) const DEAD_LETTER_COLUMNS: &str =
    "id, projection, topic, partition, \"offset\", key, payload, header_names, \
     header_values, aggregate_type, aggregate_id, version, reason, error, attempts, first_seen, last_seen, resolution, \
     resolved_at, resolution_note";

/// The open dead letters (of `projection`, or of all; with `resolved`, the retried and
/// discarded ones too), oldest first.
pub async fn dead_letters(pool: &PgPool, projection: Option<&str>, resolved: bool) -> Result<Vec<StoredDeadLetter>> {
    Ok(sqlx::query_as(&format!(
        "SELECT {DEAD_LETTER_COLUMNS} FROM projectionist_dead_letters WHERE ($1::text IS NULL OR projection = $1) \
         AND ($2 OR resolution IS NULL) ORDER BY id"
    ))
    .bind(projection)
    .bind(resolved)
    .fetch_all(pool)
    .await?)
}

/// The dead letters `ids`, by id.
pub async fn dead_letters_by_id(pool: &PgPool, ids: &[i64]) -> Result<Vec<StoredDeadLetter>> {
    Ok(sqlx::query_as(&format!(
        "SELECT {DEAD_LETTER_COLUMNS} FROM projectionist_dead_letters WHERE id = ANY($1) ORDER BY id"
    ))
    .bind(ids)
    .fetch_all(pool)
    .await?)
}

/// The dead letter `id`.
pub async fn dead_letter(pool: &PgPool, id: i64) -> Result<Option<StoredDeadLetter>> {
    Ok(sqlx::query_as(&format!("SELECT {DEAD_LETTER_COLUMNS} FROM projectionist_dead_letters WHERE id = $1"))
        .bind(id)
        .fetch_optional(pool)
        .await?)
}

/// Of the events at `offsets` (index in the batch, offset) of `source`'s partition, those
/// whose dead letter an operator discarded: their indexes.
pub(crate) async fn discarded(
    conn: &mut PgConnection,
    projection: &str,
    source: &Source,
    offsets: Vec<(usize, i64)>,
) -> Result<Vec<usize>> {
    if offsets.is_empty() {
        return Ok(Vec::new());
    }
    let (indexes, offsets): (Vec<usize>, Vec<i64>) = offsets.into_iter().unzip();
    let found: Vec<i64> = sqlx::query_scalar(
        "SELECT \"offset\" FROM projectionist_dead_letters WHERE projection = $1 AND topic = $2 AND partition = $3 \
         AND \"offset\" = ANY($4) AND resolution = 'discarded'",
    )
    .bind(projection)
    .bind(&source.topic)
    .bind(source.partition)
    .bind(&offsets)
    .fetch_all(&mut *conn)
    .await?;
    Ok(indexes.into_iter().zip(offsets).filter(|(_, o)| found.contains(o)).map(|(i, _)| i).collect())
}
