//! Running projections against PostgreSQL: the object-safe form the engine holds, and
//! applying a batch of raw envelopes inside one transaction.

use std::any::Any;
use std::sync::Arc;

use async_trait::async_trait;
use std::collections::HashMap;

use projectionist_core::plan::{Effect, EventRef, Parked};
use projectionist_core::upcast::upcast;
use projectionist_core::{
    validate_projection_name, Envelope, EventDecoder, OnGap, OnUnknownType, Outcome, OutcomeCounts, Projection,
    RawEnvelope, Table, Upcaster, Writes,
};
use sqlx::types::chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};

use crate::batch::{self, ParkedMap};
use crate::park::{self, Hold, Source, SourceMessage};
use crate::{Error, Ident, Result};

/// How a batch is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Set-based: the batch planned in memory, a few statements per table; event by event
    /// (in the same transaction) when the database refuses a value or a concurrent writer
    /// moved the batch's rows. The default.
    Batch,
    /// One event at a time, each under a savepoint, waiting on concurrent writers' row
    /// locks: what a batch falls back to.
    PerEvent,
}

/// A batch decoded and projected once, outside any transaction, so that writing it again
/// (a retry, a prefix after a failure) decodes and projects nothing again. Made by
/// [`PgProjection::prepare`]; it holds the events up to the first that could not be
/// prepared, and that event's error.
pub struct Prepared {
    events: Vec<PreparedEvent>,
    failure: Option<Failure>,
    /// Where the events were read, as they arrived: set for parking to store what it holds.
    source: Option<Source>,
}

struct PreparedEvent {
    aggregate_type: String,
    aggregate_id: String,
    version: i64,
    occurred_at: DateTime<Utc>,
    step: Step,
}

/// The event that could not be prepared: its aggregate id, and why.
struct Failure {
    aggregate_id: String,
    error: Error,
}

/// What one prepared event does.
enum Step {
    /// The projection has no variant for its type (named).
    Ignored(String),
    /// The projection's writes.
    Writes(Writes),
    /// The typed envelope, for the projection's `apply` (an `Envelope<P::Event>`).
    Custom(Box<dyn Any + Send + Sync>),
}

impl Prepared {
    /// Events prepared (those before the failure, if any).
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether no event was prepared.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The event that could not be prepared (its index is [`Prepared::len`]), and why.
    pub fn failure(&self) -> Option<&Error> {
        self.failure.as_ref().map(|f| &f.error)
    }

    /// Takes the failure out, leaving the prepared events.
    pub fn take_failure(&mut self) -> Option<Error> {
        self.failure.take().map(|f| f.error)
    }

    /// The aggregate id of the event at `index`: a prepared event, or (at
    /// [`Prepared::len`]) the one that could not be prepared while its failure is held.
    pub fn aggregate_id(&self, index: usize) -> Option<&str> {
        match self.events.get(index) {
            Some(e) => Some(&e.aggregate_id),
            None if index == self.events.len() => self.failure.as_ref().map(|f| f.aggregate_id.as_str()),
            None => None,
        }
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

    /// Keeps the first `len` events only (the failure, if any, goes too).
    pub fn truncate(&mut self, len: usize) {
        if len < self.events.len() {
            self.events.truncate(len);
            self.failure = None;
        }
    }

    /// Where the events were read, and each one's message as it arrived (in the order of
    /// the envelopes given to [`PgProjection::prepare`]): what gaps park is stored as.
    /// Without it, a gap is [`Outcome::Gap`] whatever the policy.
    pub fn set_source(&mut self, source: Source) {
        self.source = Some(source);
    }
}

impl PreparedEvent {
    fn event(&self) -> EventRef<'_> {
        EventRef { aggregate_type: &self.aggregate_type, aggregate_id: &self.aggregate_id, version: self.version }
    }

    fn effect(&self) -> Effect<'_> {
        match &self.step {
            Step::Writes(w) => Effect::Writes(w.writes()),
            Step::Custom(_) => Effect::Custom,
            Step::Ignored(_) => Effect::Ignored,
        }
    }

    fn aggregate(&self) -> (&str, &str) {
        (&self.aggregate_type, &self.aggregate_id)
    }
}

/// What [`PgProjection::write`] did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Written {
    /// One outcome per event, up to and including the first [`Outcome::Gap`] (the batch
    /// ends there: nothing at or after it was written). [`Outcome::Parked`]: held.
    pub outcomes: Vec<Outcome>,
    /// Whether the set-based path gave way to the per-event path (a value the database
    /// refused, or a concurrent writer).
    pub per_event: bool,
    /// The outcomes of events held by earlier batches and applied by this one (their
    /// aggregate's missing version arrived).
    pub drained: OutcomeCounts,
    /// Aggregates parked by this batch, and resumed by it.
    pub parked: u64,
    /// Aggregates resumed by this batch.
    pub resumed: u64,
}

/// A projection over PostgreSQL with its event type erased, so the engine can hold many
/// side by side. Every `Projection<PgConnection>` is one.
#[async_trait]
pub trait PgProjection: Send + Sync + 'static {
    /// See [`Projection::name`].
    fn name(&self) -> &str;
    /// See [`Projection::tables`].
    fn tables(&self) -> &[Table];
    /// See [`Projection::schema`].
    fn schema(&self) -> &[&str];
    /// See [`Projection::on_unknown_type`].
    fn on_unknown_type(&self) -> OnUnknownType;
    /// See [`Projection::upcasters`].
    fn upcasters(&self) -> &[Upcaster];
    /// The event types the projection's events have variants for (empty when its event
    /// type is not an enum tagged by `type`: it is offered every type).
    fn event_types(&self) -> &'static [&'static str];
    /// Decodes and projects `batch`, each event once, up to the first that fails (an
    /// [`Error::Decode`] naming it, or [`Error::Declaration`] for the whole batch). The
    /// envelopes are consumed: their fields move into the typed events, uncopied.
    fn prepare(&self, batch: Vec<RawEnvelope>) -> Prepared;
    /// Writes a prepared batch in offset order in the caller's transaction, up to its first
    /// [`Outcome::Gap`] (with [`OnGap::Halt`], or without a source): the outcomes then end
    /// with it, and nothing at or after it is written, so what precedes it can commit. With
    /// [`OnGap::Park`] and a source ([`Prepared::set_source`]) a gap parks its aggregate
    /// instead, and the parking is stored in the same transaction. An error about one event names it
    /// ([`Error::event_index`]): a write the declarations forbid, a value the database
    /// refuses, a failing `apply`; nothing of the batch is to be committed then.
    async fn write(&self, conn: &mut PgConnection, prepared: &Prepared, mode: Mode, on_gap: OnGap) -> Result<Written>;
}

#[async_trait]
impl<P: Projection<PgConnection>> PgProjection for P {
    fn name(&self) -> &str {
        Projection::name(self)
    }

    fn tables(&self) -> &[Table] {
        Projection::tables(self)
    }

    fn schema(&self) -> &[&str] {
        Projection::schema(self)
    }

    fn on_unknown_type(&self) -> OnUnknownType {
        Projection::on_unknown_type(self)
    }

    fn upcasters(&self) -> &[Upcaster] {
        Projection::upcasters(self)
    }

    fn event_types(&self) -> &'static [&'static str] {
        projectionist_core::event_types::<P::Event>().unwrap_or_default()
    }

    fn prepare(&self, batch: Vec<RawEnvelope>) -> Prepared {
        let mut events = Vec::with_capacity(batch.len());
        if let Err(error) = check_declarations(Projection::name(self), Projection::tables(self)) {
            let aggregate_id = batch.into_iter().next().map(|raw| raw.aggregate_id).unwrap_or_default();
            return Prepared { events, failure: Some(Failure { aggregate_id, error }), source: None };
        }
        let decoder = EventDecoder::<P::Event>::new();
        let halt_on_unknown = Projection::on_unknown_type(self) == OnUnknownType::Halt;
        for (index, raw) in batch.into_iter().enumerate() {
            match prepare_event(self, &decoder, halt_on_unknown, index, raw) {
                Ok(event) => events.push(event),
                Err(failure) => return Prepared { events, failure: Some(failure), source: None },
            }
        }
        Prepared { events, failure: None, source: None }
    }

    async fn write(&self, conn: &mut PgConnection, prepared: &Prepared, mode: Mode, on_gap: OnGap) -> Result<Written> {
        let name = Projection::name(self);
        let source = prepared.source.as_ref().filter(|_| on_gap == OnGap::Park);
        let mut parked = match source {
            Some(source) => Some(park::read(conn, name, &source.topic, source.partition).await?),
            None => None,
        };
        let mut changes: HashMap<(String, String), Option<Parked>> = HashMap::new();
        let events: Vec<&PreparedEvent> = prepared.events.iter().collect();
        let mut written = Written { outcomes: Vec::with_capacity(events.len()), ..Written::default() };
        let mut drained = Vec::new();
        while written.outcomes.len() < events.len() {
            let start = written.outcomes.len();
            let ran = self.write_events(conn, &events[start..], mode, &mut parked, &mut changes).await;
            let (outcomes, per_event, unparked) = ran.map_err(|e| e.shifted(start))?;
            written.outcomes.extend(outcomes);
            written.per_event |= per_event;
            if batch::ends_in_a_gap(&written.outcomes) {
                return Ok(written);
            }
            if let Some(aggregate) = unparked {
                // The resumed aggregate's held events, in version order: those of earlier
                // batches (stored), then those of this one, as one event at a time would.
                let resumed_at = written.outcomes.len() - 1;
                let stored = park::held(conn, name, &aggregate).await?;
                let decoder = EventDecoder::<P::Event>::new();
                let halt_on_unknown = Projection::on_unknown_type(self) == OnUnknownType::Halt;
                let mut held: Vec<(Option<i64>, PreparedEvent)> = Vec::with_capacity(stored.len());
                for (id, payload) in stored {
                    let raw = RawEnvelope::from_slice(&payload).map_err(|source| Error::Decode {
                        index: resumed_at,
                        aggregate: format!("{}/{}", aggregate.0, aggregate.1),
                        version: 0,
                        source,
                    })?;
                    let event = prepare_event(self, &decoder, halt_on_unknown, resumed_at, raw)
                        .map_err(|failure| failure.error.at(resumed_at))?;
                    held.push((Some(id), event));
                }
                let mut drain: Vec<(Result<i64, usize>, &PreparedEvent)> = held
                    .iter()
                    .map(|(id, e)| (Ok(id.expect("stored")), e))
                    .chain(
                        (0..resumed_at)
                            .filter(|&i| {
                                written.outcomes[i] == Outcome::Parked
                                    && events[i].aggregate() == (aggregate.0.as_str(), aggregate.1.as_str())
                            })
                            .map(|i| (Err(i), events[i])),
                    )
                    .collect();
                drain.sort_by_key(|(_, e)| e.version);
                let drain_events: Vec<&PreparedEvent> = drain.iter().map(|(_, e)| *e).collect();
                let (outcomes, per_event, _) = self
                    .write_events(conn, &drain_events, mode, &mut parked, &mut changes)
                    .await
                    .map_err(|e| e.at(resumed_at))?;
                written.per_event |= per_event;
                for ((origin, _), outcome) in drain.iter().zip(outcomes) {
                    match origin {
                        Err(index) => written.outcomes[*index] = outcome,
                        Ok(_) if outcome == Outcome::Parked => {}
                        Ok(id) => {
                            drained.push(*id);
                            written.drained.add(&outcome);
                        }
                    }
                }
            }
        }
        if let Some(source) = source {
            let mut hold = Vec::new();
            for (index, outcome) in written.outcomes.iter().enumerate() {
                if *outcome == Outcome::Parked {
                    let (e, message) = (events[index], source.messages.get(index));
                    let message = message.ok_or_else(|| Error::Invalid {
                        index,
                        aggregate: format!("{}/{}", e.aggregate_type, e.aggregate_id),
                        version: e.version,
                        problem: "the batch's source holds no message for this event".into(),
                    })?;
                    let (aggregate_type, aggregate_id, version) = (&e.aggregate_type, &e.aggregate_id, e.version);
                    hold.push(Hold { aggregate_type, aggregate_id, version, message });
                }
            }
            written.parked = changes.values().filter(|c| c.is_some()).count() as u64;
            written.resumed = changes.values().filter(|c| c.is_none()).count() as u64;
            park::save(conn, name, source, &changes, &hold, &drained).await?;
        }
        Ok(written)
    }
}

impl<P: Projection<PgConnection>> WriteEvents for P {}

/// Writing a sequence of prepared events, for [`PgProjection::write`].
#[async_trait]
trait WriteEvents: Projection<PgConnection> {
    /// Writes `events` in order: runs of planned events set-based, a custom event through
    /// `apply` between them; up to the first gap (parking off), or up to the event that
    /// resumes a parked aggregate (returned: its held events come next). `parked`: the
    /// parking state, kept up to date, and every aggregate parked or resumed in `changes`.
    async fn write_events(
        &self,
        conn: &mut PgConnection,
        events: &[&PreparedEvent],
        mode: Mode,
        parked: &mut Option<ParkedMap>,
        changes: &mut HashMap<(String, String), Option<Parked>>,
    ) -> Result<(Vec<Outcome>, bool, Option<(String, String)>)> {
        let name = Projection::name(self);
        let tables = Projection::tables(self);
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
            let run_mode = if end > start { mode } else { Mode::PerEvent };
            let ran = batch::apply(conn, name, tables, &run, run_mode, parked.as_ref())
                .await
                .map_err(|e| e.shifted(start))?;
            per_event |= ran.per_event && end > start;
            for (aggregate, state) in ran.parks {
                if let Some(parked) = parked.as_mut() {
                    match state {
                        Some(p) => parked.insert(aggregate.clone(), p),
                        None => parked.remove(&aggregate),
                    };
                }
                changes.insert(aggregate, state);
            }
            if end == start {
                let Some(Step::Custom(env)) = events.get(end).map(|e| &e.step) else { unreachable!("a custom event") };
                let env = env.downcast_ref::<Envelope<Self::Event>>().expect("prepared by this projection");
                let outcome = match ran.outcomes.first() {
                    Some(Outcome::Applied) => self.apply(conn, env).await.map_err(|error| Error::Apply {
                        projection: name.into(),
                        index: end,
                        aggregate: format!("{}/{}", env.aggregate_type, env.aggregate_id),
                        version: env.version,
                        error,
                    })?,
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
}

/// One event decoded (its envelope's fields moved, not copied) and projected.
fn prepare_event<P: Projection<PgConnection>>(
    projection: &P,
    decoder: &EventDecoder<P::Event>,
    halt_on_unknown: bool,
    index: usize,
    raw: RawEnvelope,
) -> std::result::Result<PreparedEvent, Failure> {
    let RawEnvelope { id, aggregate_type, aggregate_id, version, mut event_type, occurred_at, mut data, metadata } =
        raw;
    if let Err(source) = upcast(Projection::upcasters(projection), &mut event_type, &mut data, metadata.as_ref()) {
        let aggregate = format!("{aggregate_type}/{aggregate_id}");
        return Err(Failure { aggregate_id, error: Error::Decode { index, aggregate, version, source } });
    }
    if !decoder.handles(&event_type) {
        if halt_on_unknown {
            let aggregate = format!("{aggregate_type}/{aggregate_id}");
            let error = Error::UnknownType {
                index,
                aggregate,
                version,
                event_type,
                known: decoder.types().unwrap_or_default().join(", "),
            };
            return Err(Failure { aggregate_id, error });
        }
        let step = Step::Ignored(event_type);
        return Ok(PreparedEvent { aggregate_type, aggregate_id, version, occurred_at, step });
    }
    let event = match decoder.event(&event_type, data) {
        Ok(event) => event,
        Err(source) => {
            let aggregate = format!("{aggregate_type}/{aggregate_id}");
            return Err(Failure { aggregate_id, error: Error::Decode { index, aggregate, version, source } });
        }
    };
    let env = Envelope { id, aggregate_type, aggregate_id, version, event_type, occurred_at, event, metadata };
    let writes = projection.project(&env);
    if writes.is_custom() {
        let (aggregate_type, aggregate_id) = (env.aggregate_type.clone(), env.aggregate_id.clone());
        return Ok(PreparedEvent {
            aggregate_type,
            aggregate_id,
            version,
            occurred_at,
            step: Step::Custom(Box::new(env)),
        });
    }
    // The envelope's names move on with the writes.
    let Envelope { aggregate_type, aggregate_id, .. } = env;
    Ok(PreparedEvent { aggregate_type, aggregate_id, version, occurred_at, step: Step::Writes(writes) })
}

fn check_declarations(projection: &str, tables: &[Table]) -> Result<()> {
    for table in tables {
        table.check().map_err(|problem| Error::Declaration { projection: projection.into(), problem })?;
    }
    Ok(())
}

/// A shared, type-erased projection.
pub type SharedProjection = Arc<dyn PgProjection>;

/// Checks a projection before the engine runs it: its name, every identifier of its table
/// declarations, and that each gated table names its aggregate type.
pub fn validate(projection: &dyn PgProjection) -> Result<()> {
    validate_projection_name(projection.name())
        .map_err(|_| Error::Identifier { ident: projection.name().into(), reason: "not a valid projection name" })?;
    for table in projection.tables() {
        for ident in table.identifiers() {
            Ident::new(ident)?;
        }
    }
    check_declarations(projection.name(), projection.tables())
}

/// Applies `batch` in one transaction of its own and commits it (no checkpoint: the Kafka
/// engine adds its own in the same transaction): set-based, or per event where the batch
/// needs it. Used by tests and tools: unlike the engine, which halts a partition at a gap,
/// it goes on past one (the gap's event is not applied), so every event has an outcome.
pub async fn apply_batch(pool: &PgPool, projection: &dyn PgProjection, batch: &[RawEnvelope]) -> Result<Vec<Outcome>> {
    apply_batch_in(pool, projection, batch, Mode::Batch, OnGap::Halt).await
}

/// As [`apply_batch`], starting in the given mode, with the given gap policy: with
/// [`OnGap::Park`] a gap parks its aggregate as the engine does (the held events stored as
/// their envelopes' JSON, with no topic and no offset), and [`Outcome::Parked`] events can
/// be applied by a later call, when the missing version comes.
pub async fn apply_batch_in(
    pool: &PgPool,
    projection: &dyn PgProjection,
    batch: &[RawEnvelope],
    mode: Mode,
    on_gap: OnGap,
) -> Result<Vec<Outcome>> {
    let mut tx = pool.begin().await?;
    let mut outcomes = Vec::with_capacity(batch.len());
    while outcomes.len() < batch.len() {
        let start = outcomes.len();
        let rest = &batch[start..];
        let mut prepared = projection.prepare(rest.to_vec());
        if let Some(failure) = prepared.take_failure() {
            return Err(failure.shifted(start));
        }
        let messages = rest.iter().map(|raw| SourceMessage { offset: None, key: None, payload: raw.to_json() });
        prepared.set_source(Source { topic: String::new(), partition: 0, messages: messages.collect() });
        let written = projection.write(&mut tx, &prepared, mode, on_gap).await.map_err(|e| e.shifted(start))?;
        outcomes.extend(written.outcomes);
    }
    tx.commit().await?;
    Ok(outcomes)
}

/// Creates the projection's tables from their declarations, then runs its extra
/// [`Projection::schema`] statements.
pub async fn create_schema(pool: &PgPool, projection: &dyn PgProjection) -> Result<()> {
    validate(projection)?;
    let mut tx = pool.begin().await?;
    for table in projection.tables() {
        sqlx::raw_sql(&table.ddl()).execute(&mut *tx).await?;
    }
    for statement in projection.schema() {
        sqlx::raw_sql(statement).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Empties the projection's tables and forgets its aggregate versions and checkpoints, in one
/// transaction, so the next run rebuilds it from the start of its topics.
///
/// Refuses ([`Error::Drift`]) before emptying anything when a table does not exist or is not
/// as declared: the replay would halt on it, leaving the read model empty.
pub async fn reset(pool: &PgPool, projection: &dyn PgProjection) -> Result<()> {
    crate::check_tables(pool, projection).await?;
    let mut tx = pool.begin().await?;
    if !projection.tables().is_empty() {
        let tables = projection
            .tables()
            .iter()
            .map(|t| Ident::new(t.name()).map(|i| i.to_string()))
            .collect::<Result<Vec<_>>>()?;
        sqlx::raw_sql(&format!("TRUNCATE {}", tables.join(", "))).execute(&mut *tx).await?;
    }
    for table in ["projectionist_watermarks", "projectionist_checkpoints"] {
        sqlx::query(&format!("DELETE FROM {table} WHERE projection = $1"))
            .bind(projection.name())
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(())
}
