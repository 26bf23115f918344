//! The events held for a parked aggregate, applied when the batch resumes it: in version
//! order with the batch's own events of that aggregate parked before it resumed, as one
//! event at a time would.

use projectionist_core::Outcome;
use sqlx::types::chrono::Utc;
use sqlx::PgConnection;

use super::{Writer, Written};
use crate::error::Error;
use crate::error::EventError;
use crate::error::EventErrorKind;
use crate::error::Result;
use crate::projection::prepared::{PreparedEvent, Step};
use crate::writing::parking::{self, HeldRow};
use crate::writing::shared_rows::SharedRows;

/// What a batch drained of the events earlier batches held.
#[derive(Default)]
pub(super) struct Held {
    /// Each held event read, prepared.
    pub rows: Vec<(HeldRow, PreparedEvent)>,
    /// The ids of those applied (or dead-lettered): removed from `projectionist_held`.
    pub drained: Vec<i64>,
    /// Those dead-lettered: their index in `rows`, the error and its reason.
    pub dead: Vec<(usize, String, &'static str)>,
}

/// Where a resumed aggregate's events come from: held by an earlier batch (index in
/// [`Held::rows`]), or this batch's own, parked before it resumed (`Err`: its index).
type Origin = Result<usize, usize>;

impl Writer<'_> {
    /// Applies the events held for `aggregate`, which the last of `written`'s outcomes
    /// resumed (or, for a stale parking, the one before which it resumed: see
    /// `Plan::unparked`), with the batch's own events of it parked so far; their outcomes
    /// go into `written` and `held`.
    pub(super) async fn resume(
        &mut self,
        conn: &mut PgConnection,
        aggregate: &(String, String),
        events: &[&PreparedEvent],
        shared: &SharedRows,
        written: &mut Written,
        held: &mut Held,
    ) -> Result<()> {
        let resumed_at = written.outcomes.len().saturating_sub(1);
        let first_held = held.rows.len();
        for row in parking::held(conn, self.projection.name(), aggregate).await? {
            let event = self.prepare_held(&row, aggregate, resumed_at);
            held.rows.push((row, event));
        }
        let mut drain: Vec<(Origin, &PreparedEvent)> = (first_held..held.rows.len())
            .map(|h| (Ok(h), &held.rows[h].1))
            .chain(
                (0..written.outcomes.len())
                    .filter(|&i| {
                        written.outcomes[i] == Outcome::Parked
                            && events[i].aggregate() == (aggregate.0.as_str(), aggregate.1.as_str())
                    })
                    .map(|i| (Err(i), events[i])),
            )
            .collect();
        drain.sort_by_key(|(_, e)| e.version);
        let drain_events: Vec<&PreparedEvent> = drain.iter().map(|(_, e)| *e).collect();
        // Held events' fan-in rows, locked with the batch's own, some maybe after them
        // (a rare path: a deadlock with another batch is then possible, and retried).
        let shared = shared.with(SharedRows::of(drain_events.iter().map(|e| e.effect())));
        let (outcomes, per_event, _) = self.write_events(conn, &drain_events, &shared).await.map_err(|e| {
            match e.event_index().and_then(|i| drain.get(i)).map(|(origin, _)| *origin) {
                // A held event: named, so that the next attempt dead-letters it.
                Some(Ok(h)) => match e {
                    Error::Event(source) => {
                        let (aggregate, version) = (source.aggregate.clone(), source.version);
                        let kind = EventErrorKind::Held { held: held.rows[h].0.id, source: Box::new(source) };
                        Error::Event(EventError { index: resumed_at, aggregate, version, kind })
                    }
                    other => other,
                },
                // An event of this batch parked before its aggregate resumed.
                Some(Err(index)) => e.at(index),
                None => e.at(resumed_at),
            }
        })?;
        written.per_event |= per_event;
        for ((origin, event), outcome) in drain.iter().zip(outcomes) {
            match origin {
                Err(index) => written.outcomes[*index] = outcome,
                Ok(_) if outcome == Outcome::Parked => {}
                Ok(h) => {
                    held.drained.push(held.rows[*h].0.id);
                    written.drained.add(&outcome);
                    if outcome == Outcome::DeadLettered {
                        // As found when it was refused, where an earlier attempt found it.
                        let found = self.prepared.held_poison.get(&held.rows[*h].0.id);
                        let error = found.or(event.poison()).expect("a dead letter is poison");
                        held.dead.push((*h, error.of_the_event(), error.reason()));
                    }
                }
            }
        }
        Ok(())
    }

    /// A held event decoded and projected, its errors blamed on the batch's event at
    /// `resumed_at`; poison as an earlier attempt at the batch found it, if one did.
    fn prepare_held(&self, row: &HeldRow, aggregate: &(String, String), resumed_at: usize) -> PreparedEvent {
        let poison = |aggregate_type: String, aggregate_id: String, version: i64, error: Error| PreparedEvent {
            aggregate_type,
            aggregate_id,
            version,
            occurred_at: Utc::now(),
            step: Step::Poison(error),
        };
        match row.envelope(self.projection.formats()) {
            Ok(raw) => match self.prepared.held_poison.get(&row.id) {
                Some(found) => poison(raw.aggregate_type, raw.aggregate_id, raw.version, found.clone_of_batch()),
                None => {
                    let version = raw.version;
                    let of = (raw.aggregate_type.clone(), raw.aggregate_id.clone());
                    self.projection.prepare_lazy(vec![raw]).into_held(resumed_at, (&of.0, &of.1), version)
                }
            },
            Err(source) => {
                let of = (aggregate.0.as_str(), aggregate.1.as_str());
                let error = Error::event(resumed_at, of, row.version, EventErrorKind::Decode(source));
                poison(aggregate.0.clone(), aggregate.1.clone(), row.version, error)
            }
        }
    }
}
