//! A batch committed: one transaction holding what a rebuild's fold held, the batch, the
//! bounds on parking checked, and the checkpoint past it; then the waits told.

use projectionist_core::{OnGap, Outcome};
use sqlx::{PgConnection, PgPool};

use super::{write_knowing, Mode, Written};
use crate::error::Error;
use crate::error::EventErrorKind;
use crate::error::Result;
use crate::projection::prepared::Prepared;
use crate::projection::PgProjection;
use crate::writing::checkpoint::{self, Passed};
use crate::writing::folding;
use crate::writing::folding::Folding;
use crate::writing::known::KnownVersions;
use crate::writing::parking::{self, Bounds, NewLetter};

/// Where a batch was read and how it commits.
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    /// The topic the batch was read from.
    pub topic: &'a str,
    /// Its partition.
    pub partition: i32,
    /// The checkpoint the caller last stored or read (`None`: none is stored): the new one
    /// is stored only where it still stands, else [`Error::CheckpointMoved`] (a rebuild's
    /// swap or rollback, `run --reset`, another process moved it).
    pub expected: Option<i64>,
    /// The checkpoint past the batch.
    pub next_offset: i64,
    /// Each event's offset: a gap's checkpoint is its own.
    pub offsets: &'a [i64],
    /// What a gap does: parks its aggregate, or ends the batch.
    pub on_gap: OnGap,
    /// The bounds on parking the batch is refused past.
    pub bounds: Bounds,
    /// What a rebuild's fold holds: written first, as the batch builds on it.
    pub folding: Option<&'a Folding>,
    /// The versions the partition's batches committed, where it remembers them (a live
    /// partition): what this batch writes is taken in once it commits, and all of it
    /// forgotten when it does not.
    pub known: Option<&'a KnownVersions>,
}

/// A batch's committed transaction.
#[derive(Debug)]
pub struct Committed {
    /// What the batch wrote.
    pub written: Written,
    /// The checkpoint stored: past the batch, or at the gap that ended it.
    pub next_offset: i64,
    /// The gap that ended the batch, if one did: its index in the batch, and why.
    pub gap: Option<(usize, String)>,
}

/// Writes `prepared` in one transaction with its checkpoint and commits it: a gap ends the
/// batch (the events before it commit, with a checkpoint at its offset). The transaction
/// begins holding the projection's swap lock in the `BEGIN`'s own round trip, so
/// `prepared` is to be [`Prepared::set_swap_locked`]. Once committed, the waits for the
/// read model are told (a failure to tell is only logged: they read the checkpoints again
/// within a second).
pub async fn commit_batch(
    pool: &PgPool,
    projection: &dyn PgProjection,
    prepared: &Prepared,
    batch: Batch<'_>,
) -> Result<Committed> {
    let name = projection.name();
    let mut conn = pool.acquire().await?;
    let mut begun = false;
    if let Some(known) = batch.known {
        known.begin();
    }
    let done = write_in_transaction(&mut conn, projection, prepared, &batch, &mut begun).await;
    if done.is_err() && !begun {
        // Possibly left in a failed transaction the pool would not notice.
        conn.close_on_drop();
    }
    if let Some(known) = batch.known {
        match &done {
            Ok(_) => known.committed(),
            // Whatever the reason (a checkpoint moved by a swap, a commit whose outcome is
            // not known), nothing remembered is trusted.
            Err(_) => known.forget(),
        }
    }
    let committed = done?;
    let (topic, partition, next_offset) = (batch.topic, batch.partition, committed.next_offset);
    let passed = batch.expected.map(|from| Passed { from, kept_out: &committed.written.kept_out });
    if let Err(e) = checkpoint::notify(&mut conn, name, topic, partition, next_offset, passed).await {
        let message = "Could not notify the waits of a checkpoint; they read it again within a second.";
        tracing::debug!(projection = %name, %topic, partition, error = %e, "{message}");
    }
    Ok(committed)
}

/// The transaction of [`commit_batch`], committed. `begun`: whether it began (else the
/// connection is not to be trusted).
async fn write_in_transaction(
    conn: &mut PgConnection,
    projection: &dyn PgProjection,
    prepared: &Prepared,
    batch: &Batch<'_>,
    begun: &mut bool,
) -> Result<Committed> {
    let name = projection.name();
    let mut tx = crate::swap_lock::begin_sharing_swap_lock(conn, name).await?;
    *begun = true;
    if let Some(folding) = batch.folding {
        folding::write_folded(&mut tx, projection, folding, Some(prepared)).await?;
    }
    let written = write_knowing(&mut tx, projection, prepared, Mode::Batch, batch.on_gap, batch.known).await?;
    check_bounds(&mut tx, name, prepared, &written.outcomes, batch.bounds).await?;
    check_dead_letter_bounds(&mut tx, name, prepared, &written.dead_letter_ids, batch.bounds).await?;
    let gap = match written.outcomes.last() {
        Some(gap @ Outcome::Gap { .. }) => {
            Some((written.outcomes.len() - 1, format!("{gap}: the event's predecessor was never applied")))
        }
        _ => None,
    };
    let next_offset = gap.as_ref().map_or(batch.next_offset, |(index, _)| batch.offsets[*index]);
    checkpoint::store(&mut tx, name, batch.topic, batch.partition, batch.expected, next_offset).await?;
    crate::fault::point("before-postgres-commit");
    tx.commit().await?;
    crate::fault::point("after-postgres-commit");
    Ok(Committed { written, next_offset, gap })
}

/// Refuses a batch whose parking passes a bound: too many aggregates parked, or too many
/// events held for one (checked for each aggregate the batch held events of).
async fn check_bounds(
    tx: &mut PgConnection,
    projection: &str,
    prepared: &Prepared,
    outcomes: &[Outcome],
    bounds: Bounds,
) -> Result<()> {
    // Each aggregate the batch parked or held events of, at its first such event.
    let mut checked = std::collections::HashSet::new();
    let mut aggregates = Vec::new();
    for (index, _) in outcomes.iter().enumerate().filter(|(_, o)| matches!(o, Outcome::Parked | Outcome::DeadLettered))
    {
        let Some((aggregate_type, aggregate_id, _)) = prepared.aggregate(index) else { continue };
        if checked.insert((aggregate_type, aggregate_id)) {
            aggregates.push((index, (aggregate_type, aggregate_id)));
        }
    }
    if aggregates.is_empty() {
        return Ok(());
    }
    let keys: Vec<(&str, &str)> = aggregates.iter().map(|(_, a)| *a).collect();
    let (parked, held) = parking::bounds_in(tx, projection, &keys).await?;
    let bound = |(index, aggregate): (usize, (&str, &str)), problem: String| {
        let version = prepared.aggregate(index).map_or(0, |(_, _, version)| version);
        Error::event(index, aggregate, version, EventErrorKind::Bound(problem))
    };
    if parked as u64 > bounds.parked_aggregates {
        return Err(bound(
            aggregates[0],
            format!(
                "{parked} aggregates would be parked, over max_parked_aggregates ({}): resolve them (`parked`, \
                 `dead-letters list`) or raise it (--max-parked-aggregates)",
                bounds.parked_aggregates
            ),
        ));
    }
    if let Some((&at, held)) = aggregates.iter().zip(held).find(|(_, held)| *held as u64 > bounds.held_per_aggregate) {
        return Err(bound(
            at,
            format!(
                "{held} events would be held for it, over max_held_per_aggregate ({}): resolve what it waits for \
                 (`parked`) or raise it (--max-held-per-aggregate)",
                bounds.held_per_aggregate
            ),
        ));
    }
    Ok(())
}

/// Refuses a batch whose dead letters pass a bound: too many open, or too many of their
/// payloads' bytes. It names the first of its messages past the bound (`letters`: the ids
/// the batch stored), so that its partition halts there and what precedes it commits. A
/// held event dead-lettered as its aggregate resumes counts, but halts nothing: it was
/// kept already.
async fn check_dead_letter_bounds(
    tx: &mut PgConnection,
    projection: &str,
    prepared: &Prepared,
    letters: &[i64],
    bounds: Bounds,
) -> Result<()> {
    let Some(source) = prepared.source.as_ref().filter(|_| !letters.is_empty()) else { return Ok(()) };
    let (before, new) = parking::dead_letters_in(tx, projection, letters).await?;
    let batch: std::collections::HashSet<i64> =
        source.messages.iter().chain(source.undecodable.iter().map(|u| &u.message)).filter_map(|m| m.offset).collect();
    let ours = |l: &NewLetter| {
        l.topic == source.topic && l.partition == source.partition && l.offset.is_some_and(|o| batch.contains(&o))
    };
    let (mine, kept): (Vec<NewLetter>, Vec<NewLetter>) = new.into_iter().partition(ours);
    let before = (before.0 + kept.len() as i64, before.1 + kept.iter().map(|l| l.bytes).sum::<i64>());
    let bytes: Vec<i64> = mine.iter().map(|l| l.bytes).collect();
    let max = (bounds.dead_letters, bounds.dead_letter_bytes);
    let Some((at, count, total)) = first_past(before, &bytes, max) else { return Ok(()) };
    let offset = mine[at].offset;
    // The batch's events before the message: they commit without it.
    let index = source.messages.iter().take_while(|m| m.offset < offset).count();
    let own = source.messages.get(index).is_some_and(|m| m.offset == offset);
    let aggregate = prepared.aggregate(index).filter(|_| own).map(|(t, i, _)| format!("{t}/{i}"));
    let problem = if count as u64 > bounds.dead_letters {
        format!(
            "keeping it would make {count} open dead letters, over max_dead_letters ({}): resolve them \
             (`dead-letters list`, then `retry` or `discard`; `dead-letters purge` deletes resolved ones) or raise it \
             (--max-dead-letters)",
            bounds.dead_letters
        )
    } else {
        format!(
            "keeping it would make {total} bytes of open dead letters, over max_dead_letter_bytes ({}): resolve them \
             (`dead-letters list`, then `retry` or `discard`; `dead-letters purge` deletes resolved ones) or raise it \
             (--max-dead-letter-bytes), or store less of each (--dead-letter-payload-max-bytes)",
            bounds.dead_letter_bytes
        )
    };
    Err(Error::DeadLetterBound { index, offset, aggregate, problem })
}

/// Of the dead letters `bytes` (each one's payload bytes, in offset order) kept after
/// `before` (how many open, and their bytes), the first that passes `max` (letters,
/// bytes): its position, and the letters and bytes it makes.
fn first_past(before: (i64, i64), bytes: &[i64], max: (u64, u64)) -> Option<(usize, i64, i64)> {
    let (mut count, mut total) = before;
    for (at, n) in bytes.iter().enumerate() {
        (count, total) = (count + 1, total + n);
        if count as u64 > max.0 || total as u64 > max.1 {
            return Some((at, count, total));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::first_past;

    #[test]
    fn the_first_letter_past_a_bound_is_named() {
        assert_eq!(first_past((0, 0), &[10, 10], (2, 100)), None, "at the bounds");
        assert_eq!(first_past((1, 0), &[10, 10, 10], (2, 100)), Some((1, 3, 20)), "the count");
        assert_eq!(first_past((0, 50), &[10, 50, 1], (9, 100)), Some((1, 2, 110)), "the bytes");
        assert_eq!(first_past((5, 0), &[1], (2, 100)), Some((0, 6, 1)), "past it already");
        assert_eq!(first_past((5, 0), &[], (2, 100)), None, "nothing new");
    }
}
