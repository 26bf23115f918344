//! A batch decoded and projected once, outside any transaction: what `writer`
//! writes, and what a retry writes again without decoding anything again.

use std::any::Any;
use std::collections::HashMap;

use projectionist_core::plan::{Effect, EventRef};
use projectionist_core::upcast::upcast;
use projectionist_core::{Envelope, EventDecoder, LazyEnvelope, OnUnknownType, Projection, Table, Writes};
use sqlx::types::chrono::{DateTime, Utc};
use sqlx::PgConnection;

use crate::error::Error;
use crate::error::EventError;
use crate::error::EventErrorKind;
use crate::error::Result;
use crate::source::Source;
use crate::tables::checks::Checks;

/// A batch decoded and projected once, outside any transaction, so that writing it again
/// (a retry, a prefix after a failure) decodes and projects nothing again. Made by
/// [`PgProjection::prepare`](crate::projection::PgProjection::prepare): every event, those that cannot be applied as they stand
/// (poison: data that does not decode, a failing upcaster, …) marked with their error.
#[derive(Default)]
pub struct Prepared {
    pub(crate) events: Vec<PreparedEvent>,
    /// A problem of the whole batch (the projection's declarations): no event is prepared.
    pub(crate) failure: Option<Failure>,
    /// Where the events were read, as they arrived: set for parking and dead letters to
    /// store what they keep.
    pub(crate) source: Option<Source>,
    /// The partition whose parkings the batch is planned against, when it is not the one
    /// its events were read on: an operator's resolution, or the resumption of a parking,
    /// of an event read on another partition than the one that parked its aggregate.
    pub(crate) parked_on: Option<(String, i32)>,
    /// Events held for parked aggregates found poison when their aggregate resumed, by id
    /// in `projectionist_held`: dead-lettered when they drain.
    pub(crate) held_poison: HashMap<i64, Error>,
    /// What PostgreSQL checks of the projection's tables beyond their declarations, when
    /// the caller knows it (see [`Prepared::set_checked`]).
    pub(crate) checked: Option<Checks>,
    /// Whether the caller is the only writer of the tables (see [`Prepared::set_sole_writer`]).
    pub(crate) sole_writer: bool,
    /// Whether every transaction the batch is written in begins holding the swap lock (see
    /// [`Prepared::set_swap_locked`]).
    pub(crate) swap_locked: bool,
    /// Most bytes of a dead letter's payload stored (see
    /// [`Prepared::set_dead_letter_payload_max`]); `None`: whole.
    pub(crate) dead_letter_payload_max: Option<usize>,
}

pub(crate) struct PreparedEvent {
    pub(crate) aggregate_type: String,
    pub(crate) aggregate_id: String,
    pub(crate) version: i64,
    pub(crate) occurred_at: DateTime<Utc>,
    pub(crate) step: Step,
}

impl PreparedEvent {
    /// This event as a discarded dead letter is met again: its version skipped, nothing
    /// written (see [`Prepared::skipping`]).
    pub(crate) fn skipped(&self) -> Self {
        PreparedEvent {
            aggregate_type: self.aggregate_type.clone(),
            aggregate_id: self.aggregate_id.clone(),
            version: self.version,
            occurred_at: self.occurred_at,
            step: Step::Ignored(DISCARDED.to_owned()),
        }
    }
}

/// The type an event skipped as a discarded dead letter counts as ignored under.
const DISCARDED: &str = "(discarded)";

/// A problem of the whole batch, blamed on its first event: that event's aggregate id, and why.
pub(crate) struct Failure {
    pub(crate) aggregate_id: String,
    pub(crate) error: Error,
}

/// What one prepared event does.
pub(crate) enum Step {
    /// The projection has no variant for its type (named).
    Ignored(String),
    /// The projection's writes.
    Writes(Writes),
    /// The typed envelope, for the projection's `apply` (an `Envelope<P::Event>`).
    Custom(Box<dyn Any + Send + Sync>),
    /// It cannot be applied as it stands, and why: dead-lettered (with a source) or halting.
    Poison(Error),
}

impl Prepared {
    /// Events prepared, poison ones included.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether no event was prepared.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The plan of the events that are not poison against tables that hold nothing yet,
    /// made in memory: how many outcomes it has, or the problem it names. What the fuzzing
    /// of the read, decode and plan path walks without a database; not an API.
    #[doc(hidden)]
    pub fn plan_in_memory(&self, tables: &[Table]) -> std::result::Result<usize, String> {
        let events: Vec<(EventRef<'_>, Effect<'_>)> =
            self.events.iter().filter(|e| e.poison().is_none()).map(|e| (e.event(), e.effect())).collect();
        let stored = projectionist_core::plan::Stored::default();
        let plan = projectionist_core::plan::plan(tables, &crate::tables::types::PgTypes, &stored, &events);
        plan.map(|p| p.outcomes.len()).map_err(|e| e.problem)
    }

    /// The first event that cannot be applied as it stands (or, for a problem of the whole
    /// batch, its first event): its index, and why.
    pub fn failure(&self) -> Option<(usize, &Error)> {
        if let Some(f) = &self.failure {
            return Some((0, &f.error));
        }
        self.events.iter().enumerate().find_map(|(i, e)| match &e.step {
            Step::Poison(error) => Some((i, error)),
            _ => None,
        })
    }

    /// One event that moves its aggregate's gates past `version` and writes nothing (as an
    /// event of a type the projection ignores): a dead letter discarded on purpose.
    pub fn skipping(aggregate_type: &str, aggregate_id: &str, version: i64) -> Self {
        let event = PreparedEvent {
            aggregate_type: aggregate_type.to_owned(),
            aggregate_id: aggregate_id.to_owned(),
            version,
            occurred_at: Utc::now(),
            step: Step::Ignored(DISCARDED.to_owned()),
        };
        Prepared { events: vec![event], ..Prepared::default() }
    }

    /// Every event that cannot be applied as it stands (or, for a problem of the whole
    /// batch, its first event), in order: its index, and why.
    pub fn failures(&self) -> impl Iterator<Item = (usize, &Error)> {
        let batch = self.failure.as_ref().map(|f| (0, &f.error));
        batch.into_iter().chain(self.events.iter().enumerate().filter_map(|(i, e)| e.poison().map(|p| (i, p))))
    }

    /// Takes the first failure out (see [`Prepared::failure`]).
    pub fn take_failure(&mut self) -> Option<Error> {
        if let Some(f) = self.failure.take() {
            return Some(f.error);
        }
        let index = self.events.iter().position(|e| matches!(e.step, Step::Poison(_)))?;
        match std::mem::replace(&mut self.events[index].step, Step::Ignored(String::new())) {
            Step::Poison(error) => Some(error),
            _ => unreachable!("a poison step"),
        }
    }

    /// The error of the event at `index` when it is poison.
    pub fn poison_at(&self, index: usize) -> Option<&Error> {
        self.events.get(index)?.poison()
    }

    /// The batch's source, when set (see [`Prepared::set_source`]).
    pub fn source_mut(&mut self) -> Option<&mut Source> {
        self.source.as_mut()
    }

    /// Marks the event `error` is about as poison: what retrying the batch cannot fix (a
    /// value the table refuses, an `apply` that keeps failing), so that the next write
    /// dead-letters it and applies the rest. The event at `index`, or for
    /// [`EventErrorKind::Held`] the held event it names. `Err(error)` when that event is poison
    /// already, or there is no such event: writing again would fail the same way.
    pub fn poison(&mut self, index: usize, error: Error) -> Result<()> {
        if let Some(&EventErrorKind::Held { held, .. }) = error.event_kind() {
            if self.held_poison.contains_key(&held) {
                return Err(error);
            }
            let Error::Event(EventError { kind: EventErrorKind::Held { source, .. }, .. }) = error else {
                unreachable!("a held event's error")
            };
            self.held_poison.insert(held, Error::Event(*source));
            return Ok(());
        }
        match self.events.get_mut(index) {
            Some(e) if e.poison().is_none() => {
                e.step = Step::Poison(error);
                Ok(())
            }
            _ => Err(error),
        }
    }

    /// The aggregate id of the event at `index` (or, for a problem of the whole batch, of
    /// its first event).
    pub fn aggregate_id(&self, index: usize) -> Option<&str> {
        match self.events.get(index) {
            Some(e) => Some(&e.aggregate_id),
            None => self.failure.as_ref().map(|f| f.aggregate_id.as_str()),
        }
    }

    /// The aggregate (type and id) and version of the event at `index`.
    pub fn aggregate(&self, index: usize) -> Option<(&str, &str, i64)> {
        let e = self.events.get(index)?;
        Some((&e.aggregate_type, &e.aggregate_id, e.version))
    }

    /// The type of the prepared event at `index` when the projection has no variant for it
    /// (it is ignored), for the engine's count of ignored events by type.
    pub fn ignored_type(&self, index: usize) -> Option<&str> {
        match &self.events.get(index)?.step {
            Step::Ignored(event_type) => Some(event_type),
            _ => None,
        }
    }

    /// When the prepared event at `index` occurred.
    pub fn occurred_at(&self, index: usize) -> Option<DateTime<Utc>> {
        self.events.get(index).map(|e| e.occurred_at)
    }

    /// Keeps the first `len` events only (a problem of the whole batch goes too).
    pub fn truncate(&mut self, len: usize) {
        if len < self.events.len() || len == 0 {
            self.events.truncate(len);
            self.failure = None;
        }
    }

    /// Where the events were read, and each one's message as it arrived (in the order of
    /// the envelopes given to [`PgProjection::prepare`](crate::projection::PgProjection::prepare)), with the messages of the batch
    /// that are not even an envelope: what parking holds and dead letters keep. Without
    /// it, a gap is [`Outcome::Gap`](projectionist_core::Outcome::Gap) whatever the policy, and a poison event an error.
    pub fn set_source(&mut self, source: Source) {
        self.source = Some(source);
    }

    /// Sets what PostgreSQL checks of the projection's tables beyond their declarations
    /// (`checked_tables`), as the caller last read it, so that writing the batch does not
    /// ask the catalog. A run that writes a row of a table checked row by row twice is
    /// written in rounds, one that writes a table checked across rows event by event (see
    /// [`Checks`]), and a rebuild folds only where nothing is checked. Unset, the catalog is
    /// asked once per batch.
    pub fn set_checked(&mut self, checks: Checks) {
        self.checked = Some(checks);
    }

    /// Says that no one else writes the projection's tables while this batch is written (as
    /// a rebuild's shadow, behind its rebuild lock): a rebuild's fold keeps the versions it
    /// wrote instead of reading them back, and even the per-event path reads the rows without
    /// row locks. Every write still checks the version it builds on, so a writer there after
    /// all is met as a conflict, never lost; only the waiting for one is gone.
    pub fn set_sole_writer(&mut self) {
        self.sole_writer = true;
    }

    /// Every transaction this batch is written in is begun by
    /// `begin_sharing_swap_lock`, which takes the
    /// projection's swap lock in the `BEGIN`'s own round trip: the write does not take it
    /// again.
    pub fn set_swap_locked(&mut self) {
        self.swap_locked = true;
    }

    /// Stores at most `max` bytes of a dead letter's payload: a longer one is stored as its
    /// head, with its full length and SHA-256, and the letter says so. Unset, it is stored
    /// whole.
    pub fn set_dead_letter_payload_max(&mut self, max: usize) {
        self.dead_letter_payload_max = Some(max);
    }

    /// The one event of a batch prepared from an event held for a parked aggregate (its
    /// type, id and `version`), its error (if poison) blamed on the event at `index` that
    /// resumed the aggregate.
    pub(crate) fn into_held(mut self, index: usize, aggregate: (&str, &str), version: i64) -> PreparedEvent {
        if let Some(mut event) = self.events.pop() {
            event.step = match event.step {
                Step::Poison(error) => Step::Poison(error.at(index)),
                step => step,
            };
            return event;
        }
        // A problem of the whole batch (its declarations), met by every event.
        let problem = || {
            Error::event(index, aggregate, version, EventErrorKind::Invalid("the held event was not prepared".into()))
        };
        PreparedEvent {
            aggregate_type: aggregate.0.to_owned(),
            aggregate_id: aggregate.1.to_owned(),
            version,
            occurred_at: Utc::now(),
            step: Step::Poison(self.failure.map_or_else(problem, |f| f.error)),
        }
    }
}

impl PreparedEvent {
    pub(crate) fn event(&self) -> EventRef<'_> {
        EventRef { aggregate_type: &self.aggregate_type, aggregate_id: &self.aggregate_id, version: self.version }
    }

    pub(crate) fn effect(&self) -> Effect<'_> {
        match &self.step {
            Step::Writes(w) => Effect::Writes(w.writes()),
            Step::Custom(_) => Effect::Custom,
            Step::Ignored(_) => Effect::Ignored,
            Step::Poison(_) => Effect::Poison,
        }
    }

    pub(crate) fn aggregate(&self) -> (&str, &str) {
        (&self.aggregate_type, &self.aggregate_id)
    }

    pub(crate) fn poison(&self) -> Option<&Error> {
        match &self.step {
            Step::Poison(e) => Some(e),
            _ => None,
        }
    }
}

/// One event decoded (its envelope's fields moved, not copied) and projected; one that
/// cannot be is poison, with the error.
pub(crate) fn prepare_event<P: Projection<PgConnection>>(
    projection: &P,
    decoder: &EventDecoder<P::Event>,
    halt_on_unknown: bool,
    index: usize,
    envelope: LazyEnvelope,
) -> PreparedEvent {
    let LazyEnvelope { id, aggregate_type, aggregate_id, version, mut event_type, occurred_at, data, metadata } =
        envelope;
    let poison = |aggregate_type: String, aggregate_id: String, error: Error| PreparedEvent {
        aggregate_type,
        aggregate_id,
        version,
        occurred_at,
        step: Step::Poison(error),
    };
    // A tree only for an event an upcaster reads.
    let upcasters = Projection::upcasters(projection);
    let mut upcast_data = None;
    if upcasters.iter().any(|u| u.event_type() == event_type) {
        let upcasted = projectionist_core::data_tree(&data)
            .and_then(|mut tree| upcast(upcasters, &mut event_type, &mut tree, metadata.as_ref()).map(|()| tree));
        let tree = match upcasted {
            Ok(tree) => tree,
            Err(source) => {
                let of = (aggregate_type.as_str(), aggregate_id.as_str());
                let error = Error::event(index, of, version, EventErrorKind::Decode(source));
                return poison(aggregate_type, aggregate_id, error);
            }
        };
        upcast_data = Some(tree);
    }
    if !decoder.handles(&event_type) {
        if halt_on_unknown {
            let known = decoder.types().unwrap_or_default().join(", ");
            let kind = EventErrorKind::UnknownType { event_type, known };
            let error = Error::event(index, (&aggregate_type, &aggregate_id), version, kind);
            return poison(aggregate_type, aggregate_id, error);
        }
        let step = Step::Ignored(event_type);
        return PreparedEvent { aggregate_type, aggregate_id, version, occurred_at, step };
    }
    let decoded = match upcast_data {
        Some(tree) => decoder.event(&event_type, tree),
        None => decoder.event_from_json(&event_type, &data),
    };
    let event = match decoded {
        Ok(event) => event,
        Err(source) => {
            let error = Error::event(index, (&aggregate_type, &aggregate_id), version, EventErrorKind::Decode(source));
            return poison(aggregate_type, aggregate_id, error);
        }
    };
    let env = Envelope { id, aggregate_type, aggregate_id, version, event_type, occurred_at, event, metadata };
    let writes = projection.project(&env);
    if writes.is_custom() {
        let (aggregate_type, aggregate_id) = (env.aggregate_type.clone(), env.aggregate_id.clone());
        let step = Step::Custom(Box::new(env));
        return PreparedEvent { aggregate_type, aggregate_id, version, occurred_at, step };
    }
    // The envelope's names move on with the writes.
    let Envelope { aggregate_type, aggregate_id, .. } = env;
    PreparedEvent { aggregate_type, aggregate_id, version, occurred_at, step: Step::Writes(writes) }
}

/// Decodes and projects each event of a batch (see [`PgProjection::prepare`](crate::projection::PgProjection::prepare)).
pub(crate) fn prepare_all<P: Projection<PgConnection>>(
    projection: &P,
    batch: impl Iterator<Item = LazyEnvelope>,
) -> Prepared {
    let mut batch = batch.peekable();
    if let Err(error) = check_declarations(Projection::name(projection), Projection::tables(projection)) {
        let aggregate_id = batch.next().map(|e| e.aggregate_id).unwrap_or_default();
        let failure = Some(Failure { aggregate_id, error });
        return Prepared { failure, ..Prepared::default() };
    }
    let decoder = EventDecoder::<P::Event>::new();
    let halt_on_unknown = Projection::on_unknown_type(projection) == OnUnknownType::Halt;
    let events = batch
        .enumerate()
        .map(|(index, envelope)| prepare_event(projection, &decoder, halt_on_unknown, index, envelope))
        .collect();
    Prepared { events, ..Prepared::default() }
}

pub(crate) fn check_declarations(projection: &str, tables: &[Table]) -> Result<()> {
    for table in tables {
        table.check().map_err(|problem| Error::Declaration { projection: projection.into(), problem })?;
    }
    Ok(())
}
