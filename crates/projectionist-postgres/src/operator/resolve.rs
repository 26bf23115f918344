//! What resumes a parked aggregate besides the version it waits for: an operator retrying or
//! discarding the dead letter it waits behind, or declaring lost the version it waits for (a
//! gap that will never be filled), each recorded in `projectionist_dead_letters`; and a
//! parking gone stale (its version applied on another partition). Each in one transaction
//! with the events held behind it applied in version order.

use projectionist_core::format::{Message, SchemaError};
use projectionist_core::{OnGap, Outcome, OutcomeCounts, Table};
use sqlx::{PgConnection, PgPool};

use crate::error::Error;
use crate::error::Result;
use crate::projection::prepared::Prepared;
use crate::projection::PgProjection;
use crate::source::{Headers, Source, SourceMessage};
use crate::tables::ident::Ident;
use crate::writing::parking::{HeldRow, StoredDeadLetter, DEAD_LETTER_COLUMNS};
use crate::writing::writer::{self, Mode, Written};

/// What an operator does with a dead letter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolve {
    /// Decode and apply it again with this build of the projection (its upcasters
    /// included), then the events held behind it, in version order.
    Retry,
    /// Skip its version on purpose (a loss, accepted): the gates move past it without
    /// changing the read model, then the events held behind it are applied. The reason is
    /// recorded.
    Discard {
        /// Why, as recorded.
        reason: String,
    },
}

/// What resolving a dead letter did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The dead letter's event: [`Outcome::Applied`] (retried), [`Outcome::Ignored`]
    /// (discarded), [`Outcome::Duplicate`] or [`Outcome::Stale`] (the read model was past
    /// it already), [`Outcome::Parked`] (its predecessor is missing: now parked on that
    /// gap), [`Outcome::DeadLettered`] (still failing: `error`, the aggregate still parked).
    pub outcome: Outcome,
    /// The held events applied after it.
    pub drained: OutcomeCounts,
    /// Why it still fails, when it does.
    pub error: Option<String>,
}

/// Retries or discards dead letter `id` of `projection`, in one transaction: its aggregate
/// resumes when its version goes through, and the events held behind it are applied in
/// version order. The running engine may go on meanwhile: its batches wait on the rows this
/// locks. A dead letter with no aggregate can only be discarded.
pub async fn resolve(pool: &PgPool, projection: &dyn PgProjection, id: i64, action: Resolve) -> Result<Resolved> {
    let name = projection.name();
    let mut tx = pool.begin().await?;
    crate::swap_lock::share_swap_lock(&mut tx, name).await?;
    let letter: Option<StoredDeadLetter> = sqlx::query_as(&format!(
        "SELECT {DEAD_LETTER_COLUMNS} FROM projectionist_dead_letters WHERE id = $1 AND projection = $2 FOR UPDATE"
    ))
    .bind(id)
    .bind(name)
    .fetch_optional(&mut *tx)
    .await?;
    let problem = |problem: String| Error::DeadLetter { id, problem };
    let d = letter.ok_or_else(|| problem(format!("no such dead letter of projection {name}")))?;
    if let Some(resolution) = &d.resolution {
        return Err(problem(format!("already {resolution}")));
    }
    if let (Resolve::Retry, Some(bytes)) = (&action, d.payload_bytes) {
        return Err(problem(format!(
            "only the head of its payload is stored ({} of {bytes} bytes, past dead_letter_payload_max_bytes): it \
             cannot be applied; publish the event again and discard this one",
            d.payload.len()
        )));
    }
    let resolution = match &action {
        Resolve::Retry => "retried",
        Resolve::Discard { .. } => "discarded",
    };
    let note = match &action {
        Resolve::Retry => None,
        Resolve::Discard { reason } => Some(reason.as_str()),
    };
    let (Some(aggregate_type), Some(aggregate_id), Some(version)) = (&d.aggregate_type, &d.aggregate_id, d.version)
    else {
        if action == Resolve::Retry {
            return Err(problem(format!(
                "it has no usable aggregate ({}): nothing can apply it; fix its producer and discard it",
                d.reason
            )));
        }
        mark(&mut tx, id, resolution, note).await?;
        tx.commit().await?;
        let outcome = Outcome::Ignored;
        return Ok(Resolved { outcome, drained: OutcomeCounts::default(), error: None });
    };
    // The aggregate now waits for this version (the dead letter lifted): applying it, or its
    // skip, resumes the aggregate, and what is held behind it drains after it.
    let parked_on: Option<(String, i32)> = sqlx::query_as(
        "UPDATE projectionist_parked SET dead_letter = NULL, waiting_for = $4, reason = $5 \
         WHERE projection = $1 AND aggregate_type = $2 AND aggregate_id = $3 RETURNING topic, partition",
    )
    .bind(name)
    .bind(aggregate_type)
    .bind(aggregate_id)
    .bind(version)
    .bind(format!("dead letter {id} being {resolution}"))
    .fetch_optional(&mut *tx)
    .await?;
    let headers: Headers = d.header_names.iter().cloned().zip(d.header_values.iter().cloned()).collect();
    let mut prepared = match &action {
        Resolve::Retry => {
            let message = Message { key: d.key.as_deref(), value: &d.payload, headers: &headers };
            fetch_schemas(projection, &message).await.map_err(|e| problem(format!("nothing was retried: {e}")))?;
            match projection.formats().read(&d.topic, &message) {
                Ok(envelope) => projection.prepare_lazy(vec![envelope]),
                Err(e) => return Err(problem(format!("its payload is still not an envelope: {e}"))),
            }
        }
        Resolve::Discard { .. } => Prepared::skipping(aggregate_type, aggregate_id, version),
    };
    let message = SourceMessage { offset: d.offset, key: d.key.clone(), payload: d.payload.clone(), headers };
    let (topic, partition) = (d.topic.clone(), d.partition);
    prepared.set_source(Source { topic, partition, messages: vec![message], undecodable: Vec::new() });
    // Planned against the aggregate's parking, wherever it was parked (its events may be
    // read on more than one partition).
    prepared.parked_on = parked_on;
    let written = write_resolution(&mut tx, projection, &mut prepared).await?;
    let outcome = written.outcomes.first().copied().unwrap_or(Outcome::Duplicate);
    let error = prepared.poison_at(0).map(Error::of_the_event);
    if outcome != Outcome::DeadLettered {
        mark(&mut tx, id, resolution, note).await?;
    }
    tx.commit().await?;
    Ok(Resolved { outcome, drained: written.drained, error })
}

/// Records what was done with dead letter `id`.
async fn mark(conn: &mut PgConnection, id: i64, resolution: &str, note: Option<&str>) -> Result<()> {
    sqlx::query(
        "UPDATE projectionist_dead_letters SET resolution = $2, resolved_at = now(), resolution_note = $3 \
         WHERE id = $1",
    )
    .bind(id)
    .bind(resolution)
    .bind(note)
    .execute(conn)
    .await?;
    Ok(())
}

/// Writes `prepared` (one event: a dead letter's, or a version skipped) with parking on, in
/// `tx`: the aggregate resumes and what is held behind it drains. An event still refused is
/// dead-lettered again.
async fn write_resolution(
    tx: &mut PgConnection,
    projection: &dyn PgProjection,
    prepared: &mut Prepared,
) -> Result<Written> {
    loop {
        let mut attempt = sqlx::Connection::begin(&mut *tx).await?;
        match writer::write(&mut attempt, projection, prepared, Mode::Batch, OnGap::Park).await {
            Ok(written) => {
                attempt.commit().await?;
                return Ok(written);
            }
            Err(e) => {
                attempt.rollback().await?;
                match e.event_index() {
                    // Still refused: dead-lettered again, its aggregate parked behind it.
                    Some(0) if !e.is_retryable() => prepared.poison(0, e)?,
                    _ => return Err(e),
                }
            }
        }
    }
}

/// Declares lost the version parked aggregate `aggregate_type`/`aggregate_id` of `projection`
/// waits for (a gap that will never be filled: its event was never published, or only as a
/// message that is no envelope), for `reason`: the gates move past it without changing the
/// read model, as a discard does, and the events held behind it are applied in version
/// order, in one transaction. Recorded as a discarded dead letter (reason `gap`, no
/// message), so that `dead-letters list --all` shows it. An aggregate parked behind a dead
/// letter of its own is resolved through that dead letter instead ([`resolve`]).
pub async fn skip_gap(
    pool: &PgPool,
    projection: &dyn PgProjection,
    aggregate_type: &str,
    aggregate_id: &str,
    reason: &str,
) -> Result<Resolved> {
    let name = projection.name();
    let mut tx = pool.begin().await?;
    crate::swap_lock::share_swap_lock(&mut tx, name).await?;
    let parked: Option<(i64, Option<i64>, String, i32)> = sqlx::query_as(
        "SELECT waiting_for, dead_letter, topic, partition FROM projectionist_parked \
         WHERE projection = $1 AND aggregate_type = $2 AND aggregate_id = $3 FOR UPDATE",
    )
    .bind(name)
    .bind(aggregate_type)
    .bind(aggregate_id)
    .fetch_optional(&mut *tx)
    .await?;
    let problem = |problem: String| Error::Parking { aggregate: format!("{aggregate_type}/{aggregate_id}"), problem };
    let (version, letter, topic, partition) =
        parked.ok_or_else(|| problem(format!("it is not parked by projection {name} (`parked` lists them)")))?;
    if let Some(id) = letter {
        return Err(problem(format!(
            "it waits behind dead letter {id}: `dead-letters retry {id}`, or `dead-letters discard {id} --reason …`"
        )));
    }
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO projectionist_dead_letters (projection, topic, partition, payload, aggregate_type, \
         aggregate_id, version, reason, error, resolution, resolved_at, resolution_note) \
         VALUES ($1, $2, $3, '', $4, $5, $6, 'gap', $7, 'discarded', now(), $8) RETURNING id",
    )
    .bind(name)
    .bind(&topic)
    .bind(partition)
    .bind(aggregate_type)
    .bind(aggregate_id)
    .bind(version)
    .bind(format!("version {version} never arrived: declared lost"))
    .bind(reason)
    .fetch_one(&mut *tx)
    .await?;
    let mut prepared = Prepared::skipping(aggregate_type, aggregate_id, version);
    let message = SourceMessage::default();
    prepared.set_source(Source { topic, partition, messages: vec![message], undecodable: Vec::new() });
    let written = write_resolution(&mut tx, projection, &mut prepared).await?;
    tx.commit().await?;
    tracing::info!(projection = name, aggregate_type, aggregate_id, version, record = id, "A lost version skipped.");
    let outcome = written.outcomes.first().copied().unwrap_or(Outcome::Duplicate);
    Ok(Resolved { outcome, drained: written.drained, error: None })
}

/// Resumes the aggregates `projection` parked on `topic`/`partition` that can go on: the
/// version each waits for has been applied since, or one of its held events is the next
/// version after its gate — as happens when an aggregate's events arrive on more than one
/// partition (a topic whose partitions were increased, another producer's partitioner), each
/// partition parking what it reads out of order. Its own partition may never read another
/// event of it, so each such aggregate's lowest held event is written again: the planner
/// resumes the aggregate (its parking stale, or the event the one it waits for) and applies
/// what is held in version order. How many resumed. One query when none can go on; run at a
/// partition's idle moments.
pub async fn resume_stale(pool: &PgPool, projection: &dyn PgProjection, topic: &str, partition: i32) -> Result<usize> {
    // Where the aggregate's gates stand: its aggregate version, or its rows' (0: none yet).
    let mut gates =
        vec!["(SELECT v.version FROM projectionist_aggregate_versions v WHERE v.projection = p.projection \
         AND v.aggregate_type = p.aggregate_type AND v.aggregate_id = p.aggregate_id)"
            .to_owned()];
    let gated: Vec<&Table> = projection.tables().iter().filter(|t| t.is_gated()).collect();
    for (n, t) in gated.iter().enumerate() {
        let (table, key, version) = (Ident::new(t.name())?, Ident::new(t.key())?, Ident::new(t.version())?);
        gates.push(format!(
            "(SELECT t.{version} FROM {table} t WHERE p.aggregate_type = ANY(${}) AND t.{key} = p.aggregate_id)",
            n + 4
        ));
    }
    let sql = format!(
        "SELECT DISTINCT ON (h.aggregate_type, h.aggregate_id) h.id, h.version, h.topic, h.partition, h.\"offset\", \
         h.key, h.payload, h.headers FROM projectionist_parked p \
         CROSS JOIN LATERAL (SELECT GREATEST(0, {}) AS at) g \
         JOIN projectionist_held h USING (projection, aggregate_type, aggregate_id) \
         WHERE p.projection = $1 AND p.topic = $2 AND p.partition = $3 \
           AND (g.at >= p.waiting_for OR (p.dead_letter IS NULL AND h.version <= g.at + 1)) \
         ORDER BY h.aggregate_type, h.aggregate_id, h.version, h.id",
        gates.join(", ")
    );
    let mut query = sqlx::query_as::<_, HeldRow>(&sql).bind(projection.name()).bind(topic).bind(partition);
    for t in &gated {
        query = query.bind(t.aggregate_types_declared().to_vec());
    }
    let stale = query.fetch_all(pool).await?;
    for row in &stale {
        // Not an envelope: left to the drain (which dead-letters it) when the aggregate resumes.
        let Ok(envelope) = row.envelope(projection.formats()) else { continue };
        let mut prepared = projection.prepare_lazy(vec![envelope]);
        let message = SourceMessage {
            offset: row.offset,
            key: row.key.clone(),
            payload: row.payload.clone(),
            headers: row.headers(),
        };
        let read_on = (row.topic.clone(), row.partition);
        prepared.set_source(Source {
            topic: read_on.0,
            partition: read_on.1,
            messages: vec![message],
            undecodable: Vec::new(),
        });
        // Read on another partition, maybe: planned against this partition's parking of it.
        prepared.parked_on = Some((topic.to_owned(), partition));
        let mut tx = pool.begin().await?;
        write_resolution(&mut tx, projection, &mut prepared).await?;
        tx.commit().await?;
    }
    Ok(stale.len())
}

/// Fetches the schemas `message`'s key and value name in Confluent's wire format, if a
/// registry is configured: a letter kept in the wire format (its schema unknown when it was
/// read) is read again with the registry as it is now.
async fn fetch_schemas(projection: &dyn PgProjection, message: &Message<'_>) -> Result<(), SchemaError> {
    let ids: Vec<u32> = projectionist_core::format::schemas::schema_ids(message).collect();
    match projection.formats().schemas() {
        Some(schemas) if !ids.is_empty() => schemas.fetch(&ids).await,
        _ => Ok(()),
    }
}
