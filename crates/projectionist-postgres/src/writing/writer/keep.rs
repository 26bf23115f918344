//! What a batch keeps out of the read model, stored in its transaction: events held behind
//! a parked aggregate, dead letters (the batch's poison events, held events found poison,
//! messages that are not an envelope), and the parking itself.

use projectionist_core::Outcome;
use sqlx::PgConnection;

use super::drain::Held;
use super::{Writer, Written};
use crate::error::Error;
use crate::error::EventErrorKind;
use crate::error::Result;
use crate::projection::prepared::Prepared;
use crate::projection::prepared::PreparedEvent;
use crate::source::Source;
use crate::writing::parking::{self, DeadLetter, Hold};

/// The indexes of the batch's poison events whose dead letters an operator discarded:
/// skipped again, as the discard skipped them.
pub(super) async fn discarded(
    conn: &mut PgConnection,
    projection: &str,
    prepared: &Prepared,
    source: &Source,
) -> Result<Vec<usize>> {
    let poisoned = prepared.events.iter().enumerate().filter(|(_, e)| e.poison().is_some());
    let offsets = poisoned.filter_map(|(i, _)| Some((i, source.messages.get(i)?.offset?)));
    parking::discarded(conn, projection, source, offsets.collect()).await
}

/// Stores what the batch (`events`, read from `source`) held and dead-lettered, the held
/// events it drained, and the aggregates it parked and resumed; counts them in `written`.
/// `discarded`: the indexes of events skipped as discarded dead letters.
pub(super) async fn save(
    conn: &mut PgConnection,
    writer: &Writer<'_>,
    source: &Source,
    events: &[&PreparedEvent],
    held: Held,
    discarded: &[usize],
    written: &mut Written,
) -> Result<()> {
    let mut hold = Vec::new();
    let mut dead = Vec::new();
    for (index, outcome) in written.outcomes.iter().enumerate() {
        if !matches!(outcome, Outcome::Parked | Outcome::DeadLettered) {
            continue;
        }
        let (e, message) = (events[index], source.messages.get(index));
        let message = message.ok_or_else(|| {
            let problem = "the batch's source holds no message for this event".into();
            Error::event(index, e.aggregate(), e.version, EventErrorKind::Invalid(problem))
        })?;
        let (aggregate_type, aggregate_id, version) = (&e.aggregate_type, &e.aggregate_id, e.version);
        if *outcome == Outcome::Parked {
            hold.push(Hold { aggregate_type, aggregate_id, version, message });
        } else {
            let error = e.poison().expect("a dead letter is poison");
            let aggregate = Some((aggregate_type.as_str(), aggregate_id.as_str(), version));
            dead.push(DeadLetter::of_message(source, message, aggregate, error.reason(), error.of_the_event()));
        }
    }
    let held_headers: Vec<crate::source::Headers> = held.dead.iter().map(|(h, ..)| held.rows[*h].0.headers()).collect();
    for ((h, error, reason), headers) in held.dead.into_iter().zip(&held_headers) {
        let (row, e) = &held.rows[h];
        dead.push(DeadLetter {
            aggregate: Some((&e.aggregate_type, &e.aggregate_id, e.version)),
            topic: &row.topic,
            partition: row.partition,
            offset: row.offset,
            key: row.key.as_deref(),
            payload: &row.payload,
            headers,
            reason,
            error,
            truncated: None,
        });
    }
    for u in &source.undecodable {
        dead.push(DeadLetter::of_message(source, &u.message, None, u.reason, u.error.clone()));
    }
    for d in &mut dead {
        *written.dead_letters.entry(d.reason).or_default() += 1;
        if let Some(max) = writer.prepared.dead_letter_payload_max {
            d.truncate(max);
        }
    }
    let changes = &writer.changes;
    written.parked = changes.values().filter(|c| c.is_some()).count() as u64;
    written.resumed = changes.values().filter(|c| c.is_none()).count() as u64;
    let name = writer.projection.name();
    written.dead_letter_ids = parking::save(conn, name, source, changes, &hold, &held.drained, &dead).await?;
    written.kept_out = kept_out(source, &hold, &dead, discarded);
    Ok(())
}

/// The offsets of `source`'s messages a batch kept out of the read model: those it held and
/// dead-lettered, and those skipped as discarded dead letters (`discarded`: their indexes).
fn kept_out(source: &Source, hold: &[Hold<'_>], dead: &[DeadLetter<'_>], discarded: &[usize]) -> Vec<i64> {
    let ours = |d: &&DeadLetter<'_>| d.topic == source.topic && d.partition == source.partition;
    let held = hold.iter().filter_map(|h| h.message.offset);
    let dead = dead.iter().filter(ours).filter_map(|d| d.offset);
    let skipped = discarded.iter().filter_map(|&i| source.messages.get(i)?.offset);
    held.chain(dead).chain(skipped).collect()
}
