//! Parking: aggregates waiting for a version that never arrived, and the events held for
//! them — the messages' exact bytes — in the engine's tables `projectionist_parked` and
//! `projectionist_held`, written in the batch's own transaction.

use std::collections::HashMap;

use projectionist_core::plan::Parked;
use sqlx::types::chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};

use crate::batch::ParkedMap;
use crate::Result;

/// Where a batch was read, and each of its messages as it arrived: what the events held for
/// a parked aggregate are stored as.
#[derive(Debug, Clone, Default)]
pub struct Source {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// One per envelope of the batch, in the same order.
    pub messages: Vec<SourceMessage>,
}

/// One message of a [`Source`].
#[derive(Debug, Clone, Default)]
pub struct SourceMessage {
    /// Its offset (`None`: not read from Kafka).
    pub offset: Option<i64>,
    /// Its key, as read.
    pub key: Option<Vec<u8>>,
    /// Its payload, as read.
    pub payload: Vec<u8>,
}

/// A parked aggregate, as `parked` lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ParkedAggregate {
    /// The projection it is parked for.
    pub projection: String,
    /// Its aggregate type.
    pub aggregate_type: String,
    /// Its aggregate id.
    pub aggregate_id: String,
    /// Where its events are read.
    pub topic: String,
    /// Where its events are read.
    pub partition: i32,
    /// The version whose arrival resumes it.
    pub waiting_for: i64,
    /// Why it is parked.
    pub reason: String,
    /// When it was parked.
    pub since: DateTime<Utc>,
    /// How many of its events are held.
    pub held: i64,
    /// The lowest and highest version held.
    pub held_versions: Option<(i64, i64)>,
}

/// Every parked aggregate (of `projection`, or of all), by projection and aggregate.
pub async fn list(pool: &PgPool, projection: Option<&str>) -> Result<Vec<ParkedAggregate>> {
    type Row = (String, String, String, String, i32, i64, String, DateTime<Utc>, i64, Option<i64>, Option<i64>);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT p.projection, p.aggregate_type, p.aggregate_id, p.topic, p.partition, p.waiting_for, p.reason, \
         p.since, count(h.id), min(h.version), max(h.version) \
         FROM projectionist_parked p LEFT JOIN projectionist_held h USING (projection, aggregate_type, aggregate_id) \
         WHERE $1::text IS NULL OR p.projection = $1 \
         GROUP BY p.projection, p.aggregate_type, p.aggregate_id \
         ORDER BY p.projection, p.aggregate_type, p.aggregate_id",
    )
    .bind(projection)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(projection, aggregate_type, aggregate_id, topic, partition, waiting_for, reason, since, held, lo, hi)| {
                ParkedAggregate {
                    projection,
                    aggregate_type,
                    aggregate_id,
                    topic,
                    partition,
                    waiting_for,
                    reason,
                    since,
                    held,
                    held_versions: lo.zip(hi),
                }
            },
        )
        .collect())
}

/// How many aggregates `projection` has parked, and how many events it holds for them.
pub async fn count(pool: &PgPool, projection: &str) -> Result<(i64, i64)> {
    let counts: (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM projectionist_parked WHERE projection = $1), \
         (SELECT count(*) FROM projectionist_held WHERE projection = $1)",
    )
    .bind(projection)
    .fetch_one(pool)
    .await?;
    Ok(counts)
}

/// The aggregates of `projection` parked on partition `topic`/`partition`, locked until the
/// transaction ends.
pub(crate) async fn read(conn: &mut PgConnection, projection: &str, topic: &str, partition: i32) -> Result<ParkedMap> {
    let rows: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT aggregate_type, aggregate_id, waiting_for FROM projectionist_parked \
         WHERE projection = $1 AND topic = $2 AND partition = $3 \
         ORDER BY aggregate_type, aggregate_id FOR UPDATE",
    )
    .bind(projection)
    .bind(topic)
    .bind(partition)
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().map(|(t, i, waiting_for)| ((t, i), Parked { waiting_for })).collect())
}

/// The events held for an aggregate of `projection`: id and payload, in version order, then
/// in the order they were held.
pub(crate) async fn held(
    conn: &mut PgConnection,
    projection: &str,
    (aggregate_type, aggregate_id): &(String, String),
) -> Result<Vec<(i64, Vec<u8>)>> {
    Ok(sqlx::query_as(
        "SELECT id, payload FROM projectionist_held \
         WHERE projection = $1 AND aggregate_type = $2 AND aggregate_id = $3 ORDER BY version, id",
    )
    .bind(projection)
    .bind(aggregate_type)
    .bind(aggregate_id)
    .fetch_all(conn)
    .await?)
}

/// An event of the batch to hold: its aggregate, its version and its message.
pub(crate) struct Hold<'a> {
    pub aggregate_type: &'a str,
    pub aggregate_id: &'a str,
    pub version: i64,
    pub message: &'a SourceMessage,
}

/// Stores what a batch did to the parking: the aggregates parked (or moved to wait for
/// another version) and resumed, the batch's events now held, and the held events applied
/// (`drained`, removed).
pub(crate) async fn save(
    conn: &mut PgConnection,
    projection: &str,
    source: &Source,
    parks: &HashMap<(String, String), Option<Parked>>,
    hold: &[Hold<'_>],
    drained: &[i64],
) -> Result<()> {
    let (mut types, mut ids, mut waits, mut reasons) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut resumed_types, mut resumed_ids) = (Vec::new(), Vec::new());
    for ((aggregate_type, aggregate_id), state) in parks {
        match state {
            Some(Parked { waiting_for }) => {
                types.push(aggregate_type.as_str());
                ids.push(aggregate_id.as_str());
                waits.push(*waiting_for);
                reasons.push(format!("gap: version {waiting_for} never arrived"));
            }
            None => {
                resumed_types.push(aggregate_type.as_str());
                resumed_ids.push(aggregate_id.as_str());
            }
        }
    }
    if !types.is_empty() {
        sqlx::query(
            "INSERT INTO projectionist_parked (projection, aggregate_type, aggregate_id, topic, partition, \
             waiting_for, reason) \
             SELECT $1, t, i, $2, $3, w, r FROM unnest($4::text[], $5::text[], $6::bigint[], $7::text[]) AS a(t, i, w, r) \
             ON CONFLICT (projection, aggregate_type, aggregate_id) DO UPDATE \
             SET waiting_for = EXCLUDED.waiting_for, reason = EXCLUDED.reason",
        )
        .bind(projection)
        .bind(&source.topic)
        .bind(source.partition)
        .bind(&types)
        .bind(&ids)
        .bind(&waits)
        .bind(&reasons)
        .execute(&mut *conn)
        .await?;
    }
    if !resumed_types.is_empty() {
        sqlx::query(
            "DELETE FROM projectionist_parked WHERE projection = $1 \
             AND (aggregate_type, aggregate_id) IN (SELECT * FROM unnest($2::text[], $3::text[]))",
        )
        .bind(projection)
        .bind(&resumed_types)
        .bind(&resumed_ids)
        .execute(&mut *conn)
        .await?;
    }
    if !hold.is_empty() {
        let types: Vec<&str> = hold.iter().map(|h| h.aggregate_type).collect();
        let ids: Vec<&str> = hold.iter().map(|h| h.aggregate_id).collect();
        let versions: Vec<i64> = hold.iter().map(|h| h.version).collect();
        let offsets: Vec<Option<i64>> = hold.iter().map(|h| h.message.offset).collect();
        let keys: Vec<Option<&[u8]>> = hold.iter().map(|h| h.message.key.as_deref()).collect();
        let payloads: Vec<&[u8]> = hold.iter().map(|h| h.message.payload.as_slice()).collect();
        sqlx::query(
            "INSERT INTO projectionist_held (projection, aggregate_type, aggregate_id, version, topic, partition, \
             \"offset\", key, payload) \
             SELECT $1, t, i, v, $2, $3, o, k, p \
             FROM unnest($4::text[], $5::text[], $6::bigint[], $7::bigint[], $8::bytea[], $9::bytea[]) \
             AS a(t, i, v, o, k, p) \
             ON CONFLICT (projection, topic, partition, \"offset\") DO NOTHING",
        )
        .bind(projection)
        .bind(&source.topic)
        .bind(source.partition)
        .bind(&types)
        .bind(&ids)
        .bind(&versions)
        .bind(&offsets)
        .bind(&keys)
        .bind(&payloads)
        .execute(&mut *conn)
        .await?;
    }
    if !drained.is_empty() {
        sqlx::query("DELETE FROM projectionist_held WHERE id = ANY($1)").bind(drained).execute(&mut *conn).await?;
    }
    Ok(())
}
