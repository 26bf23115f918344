//! Dead letters as stored: a batch's stored (in one statement), read for the commands that
//! list, show, retry and discard them, and the discarded ones a replay meets again.

use std::collections::HashMap;

use sqlx::types::chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};

use super::{hex, DeadLetter, Source};
use crate::error::Result;

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
    /// The message's payload, as read; only its head when `payload_bytes` is set.
    pub payload: Vec<u8>,
    /// The payload's full length, when only its head is stored (it was longer than
    /// `dead_letter_payload_max_bytes`).
    pub payload_bytes: Option<i64>,
    /// The full payload's SHA-256, when only its head is stored.
    pub payload_sha256: Option<Vec<u8>>,
    /// The message's header names, as read (bytes: a name need not be UTF-8 on the wire).
    pub header_names: Vec<Vec<u8>>,
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

pub(crate) const DEAD_LETTER_COLUMNS: &str = "id, projection, topic, partition, \"offset\", key, payload, payload_bytes, \
     payload_sha256, COALESCE(header_name_bytes, ARRAY(SELECT convert_to(n, 'UTF8') FROM unnest(header_names) WITH ORDINALITY \
     AS u(n, o) ORDER BY o)) AS header_names, \
     header_values, aggregate_type, aggregate_id, version, reason, error, attempts, first_seen, last_seen, resolution, \
     resolved_at, resolution_note";

/// A payload as a dead letter stores it: whole when at most `max` bytes, else its first
/// `max` bytes, with its full length and SHA-256.
pub(crate) fn stored_payload(payload: &[u8], max: usize) -> (&[u8], Option<(i64, Vec<u8>)>) {
    use sha2::Digest;
    match payload.get(..max) {
        Some(head) if payload.len() > max => {
            (head, Some((payload.len() as i64, sha2::Sha256::digest(payload).to_vec())))
        }
        _ => (payload, None),
    }
}

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

/// What [`purge`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Purged {
    /// Resolved dead letters deleted: retried, or applied by a rebuild.
    pub deleted: u64,
    /// Discarded dead letters whose payload was dropped (their record stays).
    pub emptied: u64,
}

/// Purges the resolved dead letters (of `projection`, or of all; resolved before `before`,
/// or whenever), never an open one. A retried one, or one a rebuild applied, is deleted. A
/// discarded one keeps its record, by which replays and rebuilds skip its event again, but
/// not its payload: its length and SHA-256 are kept instead.
pub async fn purge(pool: &PgPool, projection: Option<&str>, before: Option<DateTime<Utc>>) -> Result<Purged> {
    const OF: &str = "($1::text IS NULL OR projection = $1) AND ($2::timestamptz IS NULL OR resolved_at < $2)";
    let mut tx = pool.begin().await?;
    let deleted = sqlx::query(&format!(
        "DELETE FROM projectionist_dead_letters WHERE resolution IS NOT NULL AND resolution <> 'discarded' AND {OF}"
    ))
    .bind(projection)
    .bind(before)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    let emptied = sqlx::query(&format!(
        "UPDATE projectionist_dead_letters SET payload_bytes = COALESCE(payload_bytes, octet_length(payload)), \
         payload_sha256 = COALESCE(payload_sha256, sha256(payload)), payload = '' \
         WHERE resolution = 'discarded' AND octet_length(payload) > 0 AND {OF}"
    ))
    .bind(projection)
    .bind(before)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    tx.commit().await?;
    Ok(Purged { deleted, emptied })
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

/// Each dead letter's id, and the dead letter each aggregate is parked behind (its id and
/// error), by aggregate.
pub(super) type Behind<'a> = HashMap<(&'a str, &'a str), (i64, &'a str)>;

/// Stores `dead` (a dead letter met again counts an attempt more): their ids, and which
/// aggregates they park.
pub(super) async fn insert<'a>(
    conn: &mut PgConnection,
    projection: &str,
    dead: &'a [DeadLetter<'a>],
) -> Result<(Vec<i64>, Behind<'a>)> {
    if dead.is_empty() {
        return Ok((Vec::new(), HashMap::new()));
    }
    let letter_ids = match insert_dead_letter_set(conn, projection, dead).await? {
        Some(ids) => ids,
        None => {
            let mut ids = Vec::with_capacity(dead.len());
            for d in dead {
                ids.push(insert_dead_letter(conn, projection, d).await?);
            }
            ids
        }
    };
    let mut behind: Behind<'a> = HashMap::new();
    for (d, &id) in dead.iter().zip(&letter_ids) {
        if let Some((t, i, _)) = d.aggregate {
            behind.insert((t, i), (id, d.error.as_str()));
        }
    }
    Ok((letter_ids, behind))
}

/// A header list for the set-based insert: each name as text (a name that is not UTF-8 made
/// readable, for SQL), as its bytes, and its value (hex, or null).
fn headers_json(headers: &[(Vec<u8>, Option<Vec<u8>>)]) -> serde_json::Value {
    let row = |(name, value): &(Vec<u8>, Option<Vec<u8>>)| {
        serde_json::json!([String::from_utf8_lossy(name), hex(name), value.as_deref().map(hex)])
    };
    headers.iter().map(row).collect()
}

const DEAD_LETTER_INSERT: &str = "INSERT INTO projectionist_dead_letters (projection, topic, partition, \"offset\", \
     key, payload, payload_bytes, payload_sha256, header_names, header_name_bytes, header_values, aggregate_type, aggregate_id, version, reason, \
     error)";

const DEAD_LETTER_CONFLICT: &str = "ON CONFLICT (projection, topic, partition, \"offset\") DO UPDATE \
     SET attempts = projectionist_dead_letters.attempts + 1, last_seen = now(), error = EXCLUDED.error";

/// Stores one dead letter: its id.
async fn insert_dead_letter(conn: &mut PgConnection, projection: &str, d: &DeadLetter<'_>) -> Result<i64> {
    let texts: Vec<String> = d.headers.iter().map(|(n, _)| String::from_utf8_lossy(n).into_owned()).collect();
    let (names, values): (Vec<&[u8]>, Vec<Option<&[u8]>>) =
        d.headers.iter().map(|(n, v)| (n.as_slice(), v.as_deref())).unzip();
    let (aggregate_type, aggregate_id, version) =
        d.aggregate.map_or((None, None, None), |(t, i, v)| (Some(t), Some(i), Some(v)));
    Ok(sqlx::query_scalar(&format!(
        "{DEAD_LETTER_INSERT} VALUES ($1, $2, $3, $4, $5, $6, $15, $16, $7, $8, $9, $10, $11, $12, $13, $14) \
         {DEAD_LETTER_CONFLICT} RETURNING id"
    ))
    .bind(projection)
    .bind(d.topic)
    .bind(d.partition)
    .bind(d.offset)
    .bind(d.key)
    .bind(d.payload)
    .bind(&texts)
    .bind(&names)
    .bind(&values)
    .bind(aggregate_type)
    .bind(aggregate_id)
    .bind(version)
    .bind(d.reason)
    .bind(&d.error)
    .bind(d.truncated.as_ref().map(|(bytes, _)| *bytes))
    .bind(d.truncated.as_ref().map(|(_, sha256)| sha256))
    .fetch_one(&mut *conn)
    .await?)
}

/// Stores a batch's dead letters in one statement: their ids, in their order. `None` (nothing
/// stored) where their places do not tell them apart: an offset missing or met twice.
async fn insert_dead_letter_set(
    conn: &mut PgConnection,
    projection: &str,
    dead: &[DeadLetter<'_>],
) -> Result<Option<Vec<i64>>> {
    let place = |d: &DeadLetter<'_>| Some((d.topic.to_owned(), d.partition, d.offset?));
    let Some(places) = dead.iter().map(place).collect::<Option<Vec<_>>>() else { return Ok(None) };
    let mut distinct = places.clone();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() < places.len() {
        return Ok(None);
    }
    let types: Vec<Option<&str>> = dead.iter().map(|d| d.aggregate.map(|a| a.0)).collect();
    let ids: Vec<Option<&str>> = dead.iter().map(|d| d.aggregate.map(|a| a.1)).collect();
    let topics: Vec<&str> = dead.iter().map(|d| d.topic).collect();
    let reasons: Vec<&str> = dead.iter().map(|d| d.reason).collect();
    let errors: Vec<&str> = dead.iter().map(|d| d.error.as_str()).collect();
    let partitions: Vec<i32> = dead.iter().map(|d| d.partition).collect();
    let offsets: Vec<Option<i64>> = dead.iter().map(|d| d.offset).collect();
    let versions: Vec<Option<i64>> = dead.iter().map(|d| d.aggregate.map(|a| a.2)).collect();
    let keys: Vec<Option<&[u8]>> = dead.iter().map(|d| d.key).collect();
    let payloads: Vec<&[u8]> = dead.iter().map(|d| d.payload).collect();
    let full_bytes: Vec<Option<i64>> = dead.iter().map(|d| d.truncated.as_ref().map(|(n, _)| *n)).collect();
    let sha256s: Vec<Option<&[u8]>> = dead.iter().map(|d| d.truncated.as_ref().map(|(_, h)| h.as_slice())).collect();
    let headers: Vec<serde_json::Value> = dead.iter().map(|d| headers_json(d.headers)).collect();
    // Each header list as its JSON (`[[name as text, name as hex, value as hex or null], …]`),
    // read back in order.
    let header =
        |part: &str| format!("ARRAY(SELECT {part} FROM jsonb_array_elements(h) WITH ORDINALITY AS e(x, n) ORDER BY n)");
    let stored: Vec<(i64, String, i32, i64)> = sqlx::query_as(&format!(
        "{DEAD_LETTER_INSERT} SELECT $1, tp, pa, o, k, p, pb, ps, {}::text[], {}::bytea[], {}::bytea[], t, i, v, r, e \
         FROM unnest($2::text[], $3::int[], $4::bigint[], $5::bytea[], $6::bytea[], $7::jsonb[], $8::text[], \
         $9::text[], $10::bigint[], $11::text[], $12::text[], $13::bigint[], $14::bytea[]) \
         AS a(tp, pa, o, k, p, h, t, i, v, r, e, pb, ps) \
         {DEAD_LETTER_CONFLICT} RETURNING id, topic, partition, \"offset\"",
        header("x->>0"),
        header("decode(x->>1, 'hex')"),
        header("decode(x->>2, 'hex')"),
    ))
    .bind(projection)
    .bind(&topics)
    .bind(&partitions)
    .bind(&offsets)
    .bind(&keys)
    .bind(&payloads)
    .bind(&headers)
    .bind(&types)
    .bind(&ids)
    .bind(&versions)
    .bind(&reasons)
    .bind(&errors)
    .bind(&full_bytes)
    .bind(&sha256s)
    .fetch_all(&mut *conn)
    .await?;
    let by_place: HashMap<(String, i32, i64), i64> = stored.into_iter().map(|(id, t, p, o)| ((t, p, o), id)).collect();
    let letter_ids = places.iter().map(|place| by_place.get(place).copied()).collect::<Option<Vec<i64>>>();
    Ok(Some(letter_ids.expect("a dead letter stored at each place")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::Headers;

    /// A payload past the bound is stored as its head, with its full length and SHA-256;
    /// one at the bound or under it, whole.
    #[test]
    fn a_payload_past_the_bound_is_stored_as_its_head() {
        let payload = b"0123456789";
        assert_eq!(stored_payload(payload, 10), (payload.as_slice(), None));
        assert_eq!(stored_payload(payload, 11), (payload.as_slice(), None));
        let (head, truncated) = stored_payload(payload, 4);
        assert_eq!(head, b"0123");
        let (bytes, sha256) = truncated.expect("truncated");
        assert_eq!(bytes, 10);
        assert_eq!(hex(&sha256), "84d89877f0d4041efb6bf91a16f0248f2fd573e6af05c19f96bedb9f882f7882");
        assert_eq!(stored_payload(b"", 0), (b"".as_slice(), None));
    }

    /// A purge deletes the retried letters and empties the discarded ones' payloads (their
    /// length and hash kept), of the projection asked and resolved before the time asked;
    /// an open letter is never touched.
    #[sqlx::test(migrations = false)]
    async fn a_purge_touches_resolved_dead_letters_only(pool: PgPool) {
        crate::schema::migrate::engine(&pool).await.expect("the engine's tables");
        let letter = |offset: i64| DeadLetter {
            aggregate: None,
            topic: "t",
            partition: 0,
            offset: Some(offset),
            key: None,
            payload: b"payload",
            headers: &[],
            reason: "envelope",
            error: "not an envelope".into(),
            truncated: None,
        };
        let mut conn = pool.acquire().await.expect("a connection");
        for (projection, resolution, offset) in
            [("p", None, 0), ("p", Some("retried"), 1), ("p", Some("discarded"), 2), ("q", Some("retried"), 3)]
        {
            let id = insert_dead_letter(&mut conn, projection, &letter(offset)).await.unwrap();
            sqlx::query("UPDATE projectionist_dead_letters SET resolution = $2, resolved_at = now() - interval '2 days' WHERE id = $1")
                .bind(id)
                .bind(resolution)
                .execute(&mut *conn)
                .await
                .unwrap();
        }
        let ago = |days: i64| DateTime::from_timestamp(Utc::now().timestamp() - days * 86_400, 0);
        let (day_ago, week_ago) = (ago(1), ago(7));
        assert_eq!(purge(&pool, Some("p"), week_ago).await.unwrap(), Purged::default(), "none that old");
        assert_eq!(purge(&pool, Some("p"), day_ago).await.unwrap(), Purged { deleted: 1, emptied: 1 });
        let left = dead_letters(&pool, None, true).await.unwrap();
        let shown: Vec<_> =
            left.iter().map(|d| (d.projection.as_str(), d.offset, d.payload.len(), d.payload_bytes)).collect();
        assert_eq!(shown, [("p", Some(0), 7, None), ("p", Some(2), 0, Some(7)), ("q", Some(3), 7, None)]);
        assert_eq!(purge(&pool, None, None).await.unwrap(), Purged { deleted: 1, emptied: 0 }, "q's, not p's open one");
        assert_eq!(dead_letters(&pool, None, false).await.unwrap().len(), 1, "the open one stays");
    }

    /// A batch's dead letters stored in one statement are stored as one at a time stores
    /// them (headers' bytes, empty and absent values, with an aggregate and without), each
    /// given its own id in order; met again, they count an attempt more under the same ids.
    #[sqlx::test(migrations = false)]
    async fn dead_letters_stored_together_are_stored_as_one_by_one(pool: PgPool) {
        crate::schema::migrate::engine(&pool).await.expect("the engine's tables");
        let headers: Vec<Headers> = vec![
            vec![("trace".into(), Some(vec![0, 255, 16, b'a'])), ("empty".into(), Some(vec![])), ("none".into(), None)],
            vec![],
            vec![("b".into(), Some(b"2".to_vec())), ("a".into(), Some(b"1".to_vec()))],
        ];
        let letters = |topic: &'static str| -> Vec<DeadLetter<'_>> {
            headers
                .iter()
                .enumerate()
                .map(|(n, h)| DeadLetter {
                    aggregate: (n != 1).then_some(("account", if n == 0 { "a" } else { "c" }, n as i64 + 1)),
                    topic,
                    partition: 2,
                    offset: Some(10 - n as i64),
                    key: (n != 2).then_some(b"k".as_slice()),
                    payload: if n == 1 { b"" } else { b"{\"x\": 1}" },
                    headers: h,
                    reason: "data",
                    error: format!("error {n}"),
                    truncated: (n == 2).then(|| (100, vec![7; 32])),
                })
                .collect()
        };
        let mut conn = pool.acquire().await.expect("a connection");
        let (together, apart) = (letters("together"), letters("apart"));
        let ids = insert_dead_letter_set(&mut conn, "p", &together).await.unwrap().expect("distinct places");
        let mut one_by_one = Vec::new();
        for d in &apart {
            one_by_one.push(insert_dead_letter(&mut conn, "p", d).await.unwrap());
        }
        let stored = dead_letters(&pool, Some("p"), false).await.unwrap();
        let of = |topic: &str, ids: &[i64]| -> Vec<StoredDeadLetter> {
            let by_id = |id: &i64| stored.iter().find(|d| d.id == *id && d.topic == topic).cloned().unwrap();
            // What may differ: where and when each was stored.
            let at = DateTime::<Utc>::UNIX_EPOCH;
            let unplaced = |d| StoredDeadLetter { id: 0, topic: String::new(), first_seen: at, last_seen: at, ..d };
            ids.iter().map(by_id).map(unplaced).collect()
        };
        let (together_rows, apart_rows) = (of("together", &ids), of("apart", &one_by_one));
        assert_eq!(together_rows, apart_rows);
        assert_eq!(together_rows[0].header_values, vec![Some(vec![0, 255, 16, b'a']), Some(vec![]), None]);
        assert_eq!(together_rows[2].header_names, vec![b"b".to_vec(), b"a".to_vec()]);
        assert_eq!(together_rows.iter().map(|d| d.offset).collect::<Vec<_>>(), vec![Some(10), Some(9), Some(8)]);
        let again = insert_dead_letter_set(&mut conn, "p", &together).await.unwrap().expect("distinct places");
        assert_eq!(again, ids);
        let stored = dead_letters(&pool, Some("p"), false).await.unwrap();
        assert!(stored.iter().filter(|d| d.topic == "together").all(|d| d.attempts == 2));
        let mut twice = letters("twice");
        twice[1].offset = Some(10);
        assert_eq!(insert_dead_letter_set(&mut conn, "p", &twice).await.unwrap(), None, "an offset met twice");
        twice[1].offset = None;
        assert_eq!(insert_dead_letter_set(&mut conn, "p", &twice).await.unwrap(), None, "an offset missing");
    }
}
