//! Writing a prepared batch in the caller's transaction: runs of planned events set-based
//! (the planner in `batch`), custom events through the projection's `apply`, held events of
//! an aggregate the batch resumes (`drain`), and what it kept out stored (`keep`). The same
//! code for every projection: it sees one only through [`PgProjection`].

mod commit;
mod drain;
mod keep;

use std::collections::HashMap;
use std::sync::Arc;

use projectionist_core::plan::{Effect, EventRef, Parked};
use projectionist_core::{OnGap, Outcome};
use sqlx::PgConnection;

use crate::error::Error;
use crate::error::EventErrorKind;
use crate::error::Result;
use crate::projection::prepared::Prepared;
use crate::projection::prepared::{PreparedEvent, Step};
use crate::projection::PgProjection;
use crate::tables::checks::Checks;
use crate::writing::batch::{self, ParkedMap, RunContext};
use crate::writing::known::KnownVersions;
use crate::writing::parking;
use crate::writing::shared_rows::SharedRows;

pub use crate::writing::batch::{Mode, Written};
pub use commit::{commit_batch, Batch, Committed};

/// Aggregates a batch parked (their state) or resumed (`None`).
type Changes = HashMap<(String, String), Option<Parked>>;

/// Writes a prepared batch in offset order in the caller's transaction, up to its first
/// [`Outcome::Gap`] (with [`OnGap::Halt`], or without a source): the outcomes then end with
/// it, and nothing at or after it is written, so what precedes it can commit. With
/// [`OnGap::Park`] and a source ([`Prepared::set_source`]) a gap parks its aggregate
/// instead, and the parking is stored in the same transaction. An error about one event
/// names it ([`Error::event_index`]): a write the declarations forbid, a value the
/// database refuses, a failing `apply`; nothing of the batch is to be committed then.
pub async fn write(
    conn: &mut PgConnection,
    projection: &dyn PgProjection,
    prepared: &Prepared,
    mode: Mode,
    on_gap: OnGap,
) -> Result<Written> {
    write_knowing(conn, projection, prepared, mode, on_gap, None).await
}

/// As [`write()`], where `known` remembers the versions the caller's earlier transactions
/// committed to the tables (see [`KnownVersions`]): only those it does not know are read,
/// and what this one writes is taken in once the transaction commits.
pub(crate) async fn write_knowing(
    conn: &mut PgConnection,
    projection: &dyn PgProjection,
    prepared: &Prepared,
    mode: Mode,
    on_gap: OnGap,
    known: Option<&KnownVersions>,
) -> Result<Written> {
    if let Some(f) = &prepared.failure {
        return Err(f.error.clone_of_batch());
    }
    // Poison events are dead letters where the batch's messages are at hand, else errors.
    let poison = prepared.events.iter().any(|e| e.poison().is_some());
    let source = prepared.source.as_ref().filter(|s| on_gap == OnGap::Park || poison || !s.undecodable.is_empty());
    if source.is_none() && poison {
        let (index, _) = prepared.failure().expect("a poison event");
        return Err(prepared.events[index].poison().expect("poison").clone_of_batch().at(index));
    }
    if !prepared.swap_locked {
        crate::swap_lock::share_swap_lock(conn, projection.name()).await?;
    }
    crate::writing::built_for::check(conn, projection, prepared).await?;
    // What PostgreSQL checks of the tables: as the caller last read it, else read once here.
    let read;
    let checked = match &prepared.checked {
        Some(known) => known,
        None => {
            read = crate::tables::checks::read(conn, projection.tables()).await?;
            &read
        }
    };
    let parked_on =
        source.map(|s| prepared.parked_on.as_ref().map_or((s.topic.as_str(), s.partition), |(t, p)| (t, *p)));
    let parked = match parked_on {
        Some((topic, partition)) => Some(parking::read(conn, projection.name(), topic, partition).await?),
        None => None,
    };
    let mut writer = Writer {
        projection,
        prepared,
        mode,
        gaps_halt: on_gap == OnGap::Halt,
        checked,
        parked,
        changes: Changes::new(),
        known,
    };
    // A poison event whose dead letter an operator discarded (met again: a replay after a
    // reset) is skipped again, as the discard skipped it, not parked behind it for good.
    let discarded = match source {
        Some(source) if poison => keep::discarded(conn, projection.name(), prepared, source).await?,
        _ => Vec::new(),
    };
    let skips: Vec<PreparedEvent> = discarded.iter().map(|&i| prepared.events[i].skipped()).collect();
    let events: Vec<&PreparedEvent> = prepared
        .events
        .iter()
        .enumerate()
        .map(|(i, e)| discarded.iter().position(|&d| d == i).map_or(e, |k| &skips[k]))
        .collect();
    let shared = SharedRows::of(prepared.events.iter().map(PreparedEvent::effect));
    let mut written = Written { outcomes: Vec::with_capacity(events.len()), ..Written::default() };
    let mut held = drain::Held::default();
    while written.outcomes.len() < events.len() {
        let start = written.outcomes.len();
        let ran = writer.write_events(conn, &events[start..], &shared).await;
        let (outcomes, per_event, unparked) = ran.map_err(|e| e.shifted(start))?;
        written.outcomes.extend(outcomes);
        written.per_event |= per_event;
        if batch::ends_in_a_gap(&written.outcomes) {
            break;
        }
        if let Some(aggregate) = unparked {
            writer.resume(conn, &aggregate, &events, &shared, &mut written, &mut held).await?;
        }
    }
    let Some(source) = source else { return Ok(written) };
    keep::save(conn, &writer, source, &events, held, &discarded, &mut written).await?;
    Ok(written)
}

/// One batch being written: the projection, how, and the parking as it goes.
struct Writer<'a> {
    projection: &'a dyn PgProjection,
    prepared: &'a Prepared,
    mode: Mode,
    gaps_halt: bool,
    /// What PostgreSQL checks of the tables (see [`Checks`]).
    checked: &'a Checks,
    /// The partition's parked aggregates, kept up to date (`None`: no source, no parking).
    parked: Option<ParkedMap>,
    /// Every aggregate parked or resumed so far.
    changes: Changes,
    /// The versions the caller's batches wrote, where it remembers them.
    known: Option<&'a KnownVersions>,
}

impl Writer<'_> {
    /// Writes `events` in order: runs of planned events set-based, a custom event through
    /// `apply` between them; up to the first gap (parking off), or up to the event that
    /// resumes a parked aggregate (returned: its held events come next). `shared`: the
    /// fan-in rows to lock. Returns the outcomes, and whether a run went event by event.
    async fn write_events(
        &mut self,
        conn: &mut PgConnection,
        events: &[&PreparedEvent],
        shared: &SharedRows,
    ) -> Result<(Vec<Outcome>, bool, Option<(String, String)>)> {
        let (name, tables) = (self.projection.name(), self.projection.tables());
        let mut outcomes = Vec::with_capacity(events.len());
        let mut per_event = false;
        let mut start = 0;
        while start < events.len() {
            let end = events[start..]
                .iter()
                .position(|e| matches!(e.step, Step::Custom(_)))
                .map_or(events.len(), |p| start + p);
            let run_end = if end > start { end } else { end + 1 };
            let run: Vec<(EventRef<'_>, Effect<'_>)> =
                events[start..run_end.min(events.len())].iter().map(|e| (e.event(), e.effect())).collect();
            // A custom event goes alone, gated like any event; `apply` runs if it applies.
            let run_mode = if end > start { self.mode } else { Mode::PerEvent };
            let (gaps_halt, checked, sole_writer) = (self.gaps_halt, self.checked, self.prepared.sole_writer);
            let (parked, known) = (self.parked.as_ref(), self.known);
            let context = RunContext { parked, gaps_halt, checked, sole_writer, per_event: false, shared, known };
            let ran = batch::apply(conn, name, tables, &run, run_mode, context).await.map_err(|e| e.shifted(start))?;
            per_event |= ran.per_event && end > start;
            for (aggregate, state) in ran.parks {
                if let Some(parked) = self.parked.as_mut() {
                    match state {
                        Some(p) => parked.insert(aggregate.clone(), p),
                        None => parked.remove(&aggregate),
                    };
                }
                self.changes.insert(aggregate, state);
            }
            if end == start {
                let outcome = match ran.outcomes.first() {
                    // Its aggregate's stale parking resumed before it: planned again after the drain.
                    None if ran.unparked.is_some() => return Ok((outcomes, per_event, ran.unparked)),
                    Some(Outcome::Applied) => self.apply(conn, events[end], end).await?,
                    Some(other) => *other,
                    None => unreachable!("one outcome per event"),
                };
                outcomes.push(outcome);
            } else {
                outcomes.extend(ran.outcomes);
            }
            if batch::ends_in_a_gap(&outcomes) || ran.unparked.is_some() {
                return Ok((outcomes, per_event, ran.unparked));
            }
            start = run_end;
        }
        Ok((outcomes, per_event, None))
    }

    /// The projection's own `apply` of a custom event, the `index`th of a run.
    async fn apply(&self, conn: &mut PgConnection, event: &PreparedEvent, index: usize) -> Result<Outcome> {
        let Step::Custom(envelope) = &event.step else { unreachable!("a custom event") };
        self.projection.apply_prepared(conn, envelope.as_ref()).await.map_err(|error| {
            let kind = EventErrorKind::Apply { projection: self.projection.name().into(), error: Arc::new(error) };
            Error::event(index, event.aggregate(), event.version, kind)
        })
    }
}
