//! Parking: aggregates waiting for a version that never arrived or behind a dead letter of
//! their own, the events held for them and the dead letters — the messages' exact bytes — in
//! the engine's tables `projectionist_parked`, `projectionist_held` and
//! `projectionist_dead_letters`, written in the batch's own transaction.

use std::collections::HashMap;

use projectionist_core::plan::Parked;
use sqlx::types::chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};

use crate::error::Result;
use crate::writing::batch::ParkedMap;

mod bounds;
mod dead_letters;
pub use crate::source::{Headers, Source, SourceMessage, Undecodable};
pub use bounds::{bounds_in, Bounds};
pub(crate) use bounds::{dead_letters_in, NewLetter};
use dead_letters::Behind;
pub use dead_letters::{dead_letter, dead_letters, dead_letters_by_id, purge, Purged, StoredDeadLetter};
pub(crate) use dead_letters::{discarded, DEAD_LETTER_COLUMNS};

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
    /// The dead letter it is parked behind (`dead-letters show ID`), if it is.
    pub dead_letter: Option<i64>,
    /// When it was parked.
    pub since: DateTime<Utc>,
    /// How many of its events are held.
    pub held: i64,
    /// The lowest and highest version held.
    pub held_versions: Option<(i64, i64)>,
}

impl ParkedAggregate {
    /// What resumes it, as an operator would do it.
    pub fn to_resume(&self) -> String {
        match self.dead_letter {
            Some(id) => format!(
                "`dead-letters retry {id}` (a build that applies it), or `dead-letters discard {id} --reason …`"
            ),
            None => format!(
                "publish its version {}; or, if that is lost, `parked skip {} {} {} --reason …`",
                self.waiting_for, self.projection, self.aggregate_type, self.aggregate_id
            ),
        }
    }
}

/// Every parked aggregate (of `projection`, or of all), by projection and aggregate.
pub async fn list(pool: &PgPool, projection: Option<&str>) -> Result<Vec<ParkedAggregate>> {
    type Row =
        (String, String, String, String, i32, i64, String, Option<i64>, DateTime<Utc>, i64, Option<i64>, Option<i64>);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT p.projection, p.aggregate_type, p.aggregate_id, p.topic, p.partition, p.waiting_for, p.reason, \
         p.dead_letter, p.since, count(h.id), min(h.version), max(h.version) \
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
            |(
                projection,
                aggregate_type,
                aggregate_id,
                topic,
                partition,
                waiting_for,
                reason,
                dead_letter,
                since,
                held,
                lo,
                hi,
            )| {
                ParkedAggregate {
                    projection,
                    aggregate_type,
                    aggregate_id,
                    topic,
                    partition,
                    waiting_for,
                    reason,
                    dead_letter,
                    since,
                    held,
                    held_versions: lo.zip(hi),
                }
            },
        )
        .collect())
}

/// How many aggregates `projection` has parked, how many events it holds for them, how
/// many open dead letters it has, and their payloads' bytes as stored.
pub async fn count(pool: &PgPool, projection: &str) -> Result<(i64, i64, i64, i64)> {
    let counts: (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM projectionist_parked WHERE projection = $1), \
         (SELECT count(*) FROM projectionist_held WHERE projection = $1), \
         d.letters, d.bytes \
         FROM (SELECT count(*) AS letters, COALESCE(sum(octet_length(payload)), 0)::bigint AS bytes \
         FROM projectionist_dead_letters WHERE projection = $1 AND resolution IS NULL) AS d",
    )
    .bind(projection)
    .fetch_one(pool)
    .await?;
    Ok(counts)
}

/// The aggregates of `projection` parked on partition `topic`/`partition`, locked until the
/// transaction ends.
pub(crate) async fn read(conn: &mut PgConnection, projection: &str, topic: &str, partition: i32) -> Result<ParkedMap> {
    let rows: Vec<(String, String, i64, bool)> = sqlx::query_as(
        "SELECT aggregate_type, aggregate_id, waiting_for, dead_letter IS NOT NULL FROM projectionist_parked \
         WHERE projection = $1 AND topic = $2 AND partition = $3 \
         ORDER BY aggregate_type, aggregate_id FOR UPDATE",
    )
    .bind(projection)
    .bind(topic)
    .bind(partition)
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().map(|(t, i, waiting_for, dead_letter)| ((t, i), Parked { waiting_for, dead_letter })).collect())
}

/// An event held for a parked aggregate, as stored.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct HeldRow {
    pub id: i64,
    pub version: i64,
    pub topic: String,
    pub partition: i32,
    pub offset: Option<i64>,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
    /// Its headers, as stored (see [`headers_json`]).
    pub headers: sqlx::types::Json<Vec<(StoredName, Option<String>)>>,
}

/// A header name as `projectionist_held.headers` keeps it: its text, or, when it is not
/// UTF-8, its bytes as hex (`{"hex": "…"}`).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(untagged)]
pub(crate) enum StoredName {
    Text(String),
    Bytes { hex: String },
}

impl StoredName {
    fn of(name: &[u8]) -> serde_json::Value {
        match std::str::from_utf8(name) {
            Ok(text) => text.into(),
            Err(_) => serde_json::json!({ "hex": hex(name) }),
        }
    }

    fn bytes(&self) -> Vec<u8> {
        match self {
            StoredName::Text(text) => text.as_bytes().to_vec(),
            StoredName::Bytes { hex } => from_hex(hex),
        }
    }
}

impl HeldRow {
    /// Its headers, as read.
    pub fn headers(&self) -> Headers {
        self.headers.0.iter().map(|(name, hex)| (name.bytes(), hex.as_deref().map(from_hex))).collect()
    }

    /// The envelope it holds, read as its topic's format in `formats` says.
    pub(crate) fn envelope(
        &self,
        formats: &projectionist_core::format::Formats,
    ) -> std::result::Result<projectionist_core::LazyEnvelope, projectionist_core::DecodeError> {
        let headers = self.headers();
        let message =
            projectionist_core::format::Message { key: self.key.as_deref(), value: &self.payload, headers: &headers };
        formats.read(&self.topic, &message)
    }
}

/// Headers as `projectionist_held.headers` keeps them: `[[name, value as hex or null], …]`
/// (a name that is not UTF-8 as [`StoredName::Bytes`]).
fn headers_json(headers: &[(Vec<u8>, Option<Vec<u8>>)]) -> serde_json::Value {
    headers.iter().map(|(name, value)| serde_json::json!([StoredName::of(name), value.as_deref().map(hex)])).collect()
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(hex: &str) -> Vec<u8> {
    (0..hex.len() / 2).filter_map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()).collect()
}

/// The events held for an aggregate of `projection`, in version order, then in the order
/// they were held.
pub(crate) async fn held(
    conn: &mut PgConnection,
    projection: &str,
    (aggregate_type, aggregate_id): &(String, String),
) -> Result<Vec<HeldRow>> {
    Ok(sqlx::query_as(
        "SELECT id, version, topic, partition, \"offset\", key, payload, headers FROM projectionist_held \
         WHERE projection = $1 AND aggregate_type = $2 AND aggregate_id = $3 ORDER BY version, id",
    )
    .bind(projection)
    .bind(aggregate_type)
    .bind(aggregate_id)
    .fetch_all(conn)
    .await?)
}

/// A dead letter to keep.
pub(crate) struct DeadLetter<'a> {
    /// Its aggregate and version, when the envelope names them (the aggregate is parked
    /// behind it).
    pub aggregate: Option<(&'a str, &'a str, i64)>,
    pub topic: &'a str,
    pub partition: i32,
    pub offset: Option<i64>,
    pub key: Option<&'a [u8]>,
    pub payload: &'a [u8],
    pub headers: &'a [(Vec<u8>, Option<Vec<u8>>)],
    pub reason: &'static str,
    pub error: String,
    /// When `payload` is only the head of the message's: its full length and SHA-256.
    pub truncated: Option<(i64, Vec<u8>)>,
}

impl<'a> DeadLetter<'a> {
    /// Keeps only the first `max` bytes of its payload, when it is longer: its full length
    /// and SHA-256 are kept instead (`dead_letter_payload_max_bytes`).
    pub(crate) fn truncate(&mut self, max: usize) {
        let (head, truncated) = dead_letters::stored_payload(self.payload, max);
        if truncated.is_some() {
            (self.payload, self.truncated) = (head, truncated);
        }
    }

    /// A dead letter of `message`, read from `source`.
    pub(crate) fn of_message(
        source: &'a Source,
        message: &'a SourceMessage,
        aggregate: Option<(&'a str, &'a str, i64)>,
        reason: &'static str,
        error: String,
    ) -> Self {
        DeadLetter {
            aggregate,
            topic: &source.topic,
            partition: source.partition,
            offset: message.offset,
            key: message.key.as_deref(),
            payload: &message.payload,
            headers: &message.headers,
            reason,
            error,
            truncated: None,
        }
    }
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
    dead: &[DeadLetter<'_>],
) -> Result<Vec<i64>> {
    // The dead letters first: the aggregates parked behind them name them.
    let (letter_ids, behind) = dead_letters::insert(conn, projection, dead).await?;
    save_parked(conn, projection, source, parks, &behind).await?;
    insert_held(conn, projection, source, hold).await?;
    if !drained.is_empty() {
        sqlx::query("DELETE FROM projectionist_held WHERE id = ANY($1)").bind(drained).execute(&mut *conn).await?;
    }
    Ok(letter_ids)
}

/// Stores the aggregates `parks` parked (with why: a gap, or the dead letter in `behind`)
/// and forgets those it resumed. A parking another partition made of the same aggregate (its
/// events on two partitions), which this one never read, is not written over but by a dead
/// letter: each partition plans against its own parkings only, and the other's may be
/// uncommitted when it plans; what this one holds waits behind it, and the idle sweep (or,
/// for a one-shot run or a rebuild, the one before it stops) resumes it once applicable.
async fn save_parked(
    conn: &mut PgConnection,
    projection: &str,
    source: &Source,
    parks: &HashMap<(String, String), Option<Parked>>,
    behind: &Behind<'_>,
) -> Result<()> {
    let (mut types, mut ids, mut waits, mut reasons) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut letters: Vec<Option<i64>> = Vec::new();
    let (mut resumed_types, mut resumed_ids) = (Vec::new(), Vec::new());
    for ((aggregate_type, aggregate_id), state) in parks {
        match state {
            Some(Parked { waiting_for, dead_letter }) => {
                types.push(aggregate_type.as_str());
                ids.push(aggregate_id.as_str());
                waits.push(*waiting_for);
                let letter = behind.get(&(aggregate_type.as_str(), aggregate_id.as_str())).filter(|_| *dead_letter);
                letters.push(letter.map(|(id, _)| *id));
                reasons.push(match letter {
                    Some((id, error)) => format!("dead letter {id} (version {waiting_for}): {error}"),
                    None => format!("gap: version {waiting_for} never arrived"),
                });
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
             waiting_for, reason, dead_letter) \
             SELECT $1, t, i, $2, $3, w, r, d \
             FROM unnest($4::text[], $5::text[], $6::bigint[], $7::text[], $8::bigint[]) AS a(t, i, w, r, d) \
             ON CONFLICT (projection, aggregate_type, aggregate_id) DO UPDATE \
             SET waiting_for = EXCLUDED.waiting_for, reason = EXCLUDED.reason, dead_letter = EXCLUDED.dead_letter \
             WHERE (projectionist_parked.topic, projectionist_parked.partition) = (EXCLUDED.topic, EXCLUDED.partition) \
                OR (EXCLUDED.dead_letter IS NOT NULL AND projectionist_parked.dead_letter IS NULL)",
        )
        .bind(projection)
        .bind(&source.topic)
        .bind(source.partition)
        .bind(&types)
        .bind(&ids)
        .bind(&waits)
        .bind(&reasons)
        .bind(&letters)
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
    Ok(())
}

/// Stores the events `hold` holds behind their parked aggregates, as read.
async fn insert_held(conn: &mut PgConnection, projection: &str, source: &Source, hold: &[Hold<'_>]) -> Result<()> {
    if !hold.is_empty() {
        let types: Vec<&str> = hold.iter().map(|h| h.aggregate_type).collect();
        let ids: Vec<&str> = hold.iter().map(|h| h.aggregate_id).collect();
        let versions: Vec<i64> = hold.iter().map(|h| h.version).collect();
        let offsets: Vec<Option<i64>> = hold.iter().map(|h| h.message.offset).collect();
        let keys: Vec<Option<&[u8]>> = hold.iter().map(|h| h.message.key.as_deref()).collect();
        let payloads: Vec<&[u8]> = hold.iter().map(|h| h.message.payload.as_slice()).collect();
        let headers: Vec<serde_json::Value> = hold.iter().map(|h| headers_json(&h.message.headers)).collect();
        sqlx::query(
            "INSERT INTO projectionist_held (projection, aggregate_type, aggregate_id, version, topic, partition, \
             \"offset\", key, payload, headers) \
             SELECT $1, t, i, v, $2, $3, o, k, p, h \
             FROM unnest($4::text[], $5::text[], $6::bigint[], $7::bigint[], $8::bytea[], $9::bytea[], $10::jsonb[]) \
             AS a(t, i, v, o, k, p, h) \
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
        .bind(&headers)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn held_headers_keep_their_bytes() {
        let headers = vec![
            (b"trace".to_vec(), Some(vec![0, 255, 16, b'a'])),
            (b"empty".to_vec(), Some(vec![])),
            (b"null".to_vec(), None),
            (vec![0xff, 0xfe, b'n'], Some(b"not UTF-8".to_vec())),
        ];
        let stored: Vec<(super::StoredName, Option<String>)> =
            serde_json::from_value(super::headers_json(&headers)).unwrap();
        let read: super::Headers = stored.iter().map(|(n, h)| (n.bytes(), h.as_deref().map(super::from_hex))).collect();
        assert_eq!(read, headers);
    }

    #[test]
    fn held_headers_stored_before_names_were_bytes_read_the_same() {
        let stored: Vec<(super::StoredName, Option<String>)> =
            serde_json::from_value(serde_json::json!([["trace", "00ff"], ["null", null]])).unwrap();
        let names: Vec<Vec<u8>> = stored.iter().map(|(n, _)| n.bytes()).collect();
        assert_eq!(names, [b"trace".to_vec(), b"null".to_vec()]);
    }
}
