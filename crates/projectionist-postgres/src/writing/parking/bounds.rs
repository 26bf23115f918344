//! The bounds on parking and dead letters: what a batch's transaction counts before it
//! commits, so that a batch past one is refused and its partition halts, naming it.

use sqlx::PgConnection;

use crate::error::Result;

/// The bounds on parking and dead letters (`EngineConfig::max_parked_aggregates`,
/// `max_held_per_aggregate`, `max_dead_letters`, `max_dead_letter_bytes`): a batch that would
/// pass one is refused ([`EventErrorKind::Bound`](crate::error::EventErrorKind::Bound)).
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Aggregates parked at once, per projection.
    pub parked_aggregates: u64,
    /// Events held for one aggregate.
    pub held_per_aggregate: u64,
    /// Open dead letters, per projection.
    pub dead_letters: u64,
    /// Payload bytes of the open dead letters, as stored, per projection.
    pub dead_letter_bytes: u64,
    /// Most bytes of one dead letter's payload stored (see [`crate::projection::prepared::Prepared::set_dead_letter_payload_max`]).
    pub dead_letter_payload: usize,
}

/// How many aggregates `projection` has parked, and how many events it holds for each of
/// `aggregates` (in their order): for the bounds on parking, in the batch's transaction, in
/// one round trip whatever the batch held.
pub async fn bounds_in(
    conn: &mut PgConnection,
    projection: &str,
    aggregates: &[(&str, &str)],
) -> Result<(i64, Vec<i64>)> {
    let (types, ids): (Vec<&str>, Vec<&str>) = aggregates.iter().copied().unzip();
    let rows: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT (SELECT count(*) FROM projectionist_parked WHERE projection = $1), \
         (SELECT count(*) FROM projectionist_held h WHERE h.projection = $1 AND h.aggregate_type = a.t \
         AND h.aggregate_id = a.i) \
         FROM unnest($2::text[], $3::text[]) WITH ORDINALITY AS a(t, i, n) ORDER BY a.n",
    )
    .bind(projection)
    .bind(types)
    .bind(ids)
    .fetch_all(conn)
    .await?;
    let parked = rows.first().map_or(0, |(parked, _)| *parked);
    Ok((parked, rows.into_iter().map(|(_, held)| held).collect()))
}

/// A dead letter a batch stored, as the bounds on dead letters count it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct NewLetter {
    pub topic: String,
    pub partition: i32,
    pub offset: Option<i64>,
    /// Its payload's bytes, as stored.
    pub bytes: i64,
}

/// How many open dead letters `projection` keeps and their payloads' bytes, leaving out
/// those of `ids` stored for the first time (in the batch's transaction); and those, as
/// the bounds on dead letters count them.
pub(crate) async fn dead_letters_in(
    conn: &mut PgConnection,
    projection: &str,
    ids: &[i64],
) -> Result<((i64, i64), Vec<NewLetter>)> {
    let before: (i64, i64) = sqlx::query_as(
        "SELECT count(*), COALESCE(sum(octet_length(payload)), 0)::bigint FROM projectionist_dead_letters \
         WHERE projection = $1 AND resolution IS NULL AND NOT (id = ANY($2) AND attempts = 1)",
    )
    .bind(projection)
    .bind(ids)
    .fetch_one(&mut *conn)
    .await?;
    let new = sqlx::query_as(
        "SELECT topic, partition, \"offset\", octet_length(payload)::bigint AS bytes FROM projectionist_dead_letters \
         WHERE id = ANY($1) AND attempts = 1 AND resolution IS NULL ORDER BY \"offset\"",
    )
    .bind(ids)
    .fetch_all(&mut *conn)
    .await?;
    Ok((before, new))
}
