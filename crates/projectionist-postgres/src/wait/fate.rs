//! What became of an event whose offset a projection's checkpoint has passed: applied, or
//! (parked, dead-lettered, discarded) kept out of the read model, so that a waiter is never
//! told an event is there when it is not.

use std::collections::BTreeSet;

use sqlx::PgPool;

use super::Fate;
use crate::error::Result;

/// What became of the message at `offset` of `topic`/`partition`, read by `projection`, once
/// its checkpoint is past it: `None` when it is in the read model (applied, a duplicate, or a
/// dead letter an operator retried).
pub(crate) async fn of(
    pool: &PgPool,
    projection: &str,
    topic: &str,
    partition: i32,
    offset: i64,
) -> Result<Option<Fate>> {
    let letter: Option<(i64, Option<String>, String)> = sqlx::query_as(
        "SELECT id, resolution, error FROM projectionist_dead_letters \
         WHERE projection = $1 AND topic = $2 AND partition = $3 AND \"offset\" = $4",
    )
    .bind(projection)
    .bind(topic)
    .bind(partition)
    .bind(offset)
    .fetch_optional(pool)
    .await?;
    match letter {
        Some((id, None, error)) => return Ok(Some(Fate::DeadLettered { id, error })),
        Some((id, Some(resolution), _)) if resolution == "discarded" => return Ok(Some(Fate::Discarded { id })),
        Some(_) => return Ok(None),
        None => {}
    }
    let held: Option<(String, String, i64, Option<String>)> = sqlx::query_as(
        "SELECT h.aggregate_type, h.aggregate_id, h.version, p.reason FROM projectionist_held h \
         LEFT JOIN projectionist_parked p USING (projection, aggregate_type, aggregate_id) \
         WHERE h.projection = $1 AND h.topic = $2 AND h.partition = $3 AND h.\"offset\" = $4",
    )
    .bind(projection)
    .bind(topic)
    .bind(partition)
    .bind(offset)
    .fetch_optional(pool)
    .await?;
    Ok(held.map(|(aggregate_type, aggregate_id, version, reason)| Fate::Parked {
        aggregate_type,
        aggregate_id,
        version,
        reason: reason.unwrap_or_else(|| "resuming".to_owned()),
    }))
}

/// What became of `version` of `aggregate` (type, id), read by `projection`, once its rows
/// stand at that version or past it: `None` when it is in the read model; [`Fate::Discarded`]
/// when an operator skipped it on purpose (a discarded dead letter, or a skipped gap), so
/// that the gates stand past an event that never changed the read model.
pub(crate) async fn of_version(
    pool: &PgPool,
    projection: &str,
    (aggregate_type, aggregate_id): &(String, String),
    version: i64,
) -> Result<Option<Fate>> {
    let discarded: Option<i64> = sqlx::query_scalar(
        "SELECT id FROM projectionist_dead_letters WHERE projection = $1 AND aggregate_type = $2 \
         AND aggregate_id = $3 AND version = $4 AND resolution = 'discarded' ORDER BY id DESC LIMIT 1",
    )
    .bind(projection)
    .bind(aggregate_type)
    .bind(aggregate_id)
    .bind(version)
    .fetch_optional(pool)
    .await?;
    Ok(discarded.map(|id| Fate::Discarded { id }))
}

/// What one partition's waits know of the offsets its checkpoint passed, so that a wait asks
/// PostgreSQL once per range of offsets, not once per event: below `below`, every offset is
/// in the read model but those in `kept_out` (parked, dead-lettered or discarded when the
/// range was read; [`of`] tells what they are now). An applied event stays applied, so what
/// is known clean stays so.
#[derive(Default)]
pub(crate) struct KeptOut {
    below: i64,
    kept_out: BTreeSet<i64>,
}

impl KeptOut {
    /// Whether `offset`, which the checkpoint has passed (it stands at `next`), may have been
    /// kept out of the read model: reads the offsets kept out up to `next` when `offset` is
    /// not below what is known.
    pub(crate) async fn may_be_kept_out(
        &mut self,
        pool: &PgPool,
        (projection, topic, partition): (&str, &str, i32),
        offset: i64,
        next: i64,
    ) -> Result<bool> {
        if offset >= self.below && next > self.below {
            let kept_out: Vec<i64> = sqlx::query_scalar(
                "SELECT \"offset\" FROM projectionist_dead_letters \
                 WHERE projection = $1 AND topic = $2 AND partition = $3 AND \"offset\" >= $4 AND \"offset\" < $5 \
                 UNION ALL SELECT \"offset\" FROM projectionist_held \
                 WHERE projection = $1 AND topic = $2 AND partition = $3 AND \"offset\" >= $4 AND \"offset\" < $5",
            )
            .bind(projection)
            .bind(topic)
            .bind(partition)
            .bind(self.below)
            .bind(next)
            .fetch_all(pool)
            .await?;
            self.kept_out.extend(kept_out);
            self.below = next;
        }
        Ok(offset >= self.below || self.kept_out.contains(&offset))
    }

    /// The checkpoint passed the offsets from `from` to `next`, of which those in `kept_out`
    /// were kept out (as the batch that stored it told): known without a read when what is
    /// known ends at `from`.
    pub(crate) fn passed(&mut self, from: i64, next: i64, kept_out: &[i64]) {
        if self.below == from && next > from {
            self.kept_out.extend(kept_out.iter().filter(|&&o| o >= from && o < next));
            self.below = next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::KeptOut;

    #[test]
    fn a_notified_range_is_known_only_where_what_is_known_ends() {
        let mut known = KeptOut { below: 10, ..KeptOut::default() };
        // Not contiguous (a notification missed, or read meanwhile): nothing learned.
        known.passed(12, 20, &[13]);
        assert_eq!((known.below, known.kept_out.len()), (10, 0));
        // Contiguous: learned, keeping only the offsets within the range.
        known.passed(10, 20, &[3, 11, 15, 20]);
        assert_eq!(known.below, 20);
        assert_eq!(known.kept_out.iter().copied().collect::<Vec<_>>(), vec![11, 15]);
        // A range already known (or empty) changes nothing.
        known.passed(20, 20, &[20]);
        assert_eq!((known.below, known.kept_out.len()), (20, 2));
    }
}
