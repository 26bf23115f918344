//! Running projections against PostgreSQL: the object-safe form the engine holds, and
//! applying a batch of raw envelopes inside one transaction.

use std::any::Any;
use std::sync::Arc;

use async_trait::async_trait;
use projectionist_core::plan::{Effect, EventRef};
use projectionist_core::upcast::upcast;
use projectionist_core::{
    validate_projection_name, Envelope, EventDecoder, OnUnknownType, Outcome, Projection, RawEnvelope, Table, Upcaster,
    Writes,
};
use sqlx::types::chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};

use crate::{batch, Error, Ident, Result};

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

    fn event(&self, index: usize) -> EventRef<'_> {
        let e = &self.events[index];
        EventRef { aggregate_type: &e.aggregate_type, aggregate_id: &e.aggregate_id, version: e.version }
    }
}

/// What [`PgProjection::write`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// One outcome per event, up to and including the first [`Outcome::Gap`] (the batch
    /// ends there: nothing at or after it was written).
    pub outcomes: Vec<Outcome>,
    /// Whether the set-based path gave way to the per-event path (a value the database
    /// refused, or a concurrent writer).
    pub per_event: bool,
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
    /// [`Outcome::Gap`]: the outcomes then end with it, and nothing at or after it is
    /// written, so what precedes it can commit. An error about one event names it
    /// ([`Error::event_index`]): a write the declarations forbid, a value the database
    /// refuses, a failing `apply`; nothing of the batch is to be committed then.
    async fn write(&self, conn: &mut PgConnection, prepared: &Prepared, mode: Mode) -> Result<Written>;
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
            return Prepared { events, failure: Some(Failure { aggregate_id, error }) };
        }
        let decoder = EventDecoder::<P::Event>::new();
        let halt_on_unknown = Projection::on_unknown_type(self) == OnUnknownType::Halt;
        for (index, raw) in batch.into_iter().enumerate() {
            match prepare_event(self, &decoder, halt_on_unknown, index, raw) {
                Ok(event) => events.push(event),
                Err(failure) => return Prepared { events, failure: Some(failure) },
            }
        }
        Prepared { events, failure: None }
    }

    async fn write(&self, conn: &mut PgConnection, prepared: &Prepared, mode: Mode) -> Result<Written> {
        let name = Projection::name(self);
        let tables = Projection::tables(self);
        let events = &prepared.events;
        let mut written = Written { outcomes: Vec::with_capacity(events.len()), per_event: false };
        let mut start = 0;
        // Runs of planned events go set-based; a custom event goes to `apply` between them.
        while start < events.len() {
            let end = events[start..]
                .iter()
                .position(|e| matches!(e.step, Step::Custom(_)))
                .map_or(events.len(), |p| start + p);
            if end > start {
                let run: Vec<(EventRef<'_>, Effect<'_>)> = (start..end)
                    .map(|i| {
                        let effect = match &events[i].step {
                            Step::Writes(w) => Effect::Writes(w.writes()),
                            _ => Effect::Ignored,
                        };
                        (prepared.event(i), effect)
                    })
                    .collect();
                let (outcomes, per_event) =
                    batch::apply(conn, name, tables, &run, mode).await.map_err(|e| e.shifted(start))?;
                written.outcomes.extend(outcomes);
                written.per_event |= per_event;
                if batch::ends_in_a_gap(&written.outcomes) {
                    return Ok(written);
                }
            }
            if let Some(Step::Custom(env)) = events.get(end).map(|e| &e.step) {
                let env = env.downcast_ref::<Envelope<P::Event>>().expect("prepared by this projection");
                // Gated like any event: its gates move, and `apply` runs only if it applies.
                let event = [(prepared.event(end), Effect::Custom)];
                let (gated, _) =
                    batch::apply(conn, name, tables, &event, Mode::PerEvent).await.map_err(|e| e.shifted(end))?;
                let outcome = match gated.first() {
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
                written.outcomes.push(outcome);
                if batch::ends_in_a_gap(&written.outcomes) {
                    return Ok(written);
                }
            }
            start = end + 1;
        }
        Ok(written)
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
    apply_batch_in(pool, projection, batch, Mode::Batch).await
}

/// As [`apply_batch`], starting in the given mode.
pub async fn apply_batch_in(
    pool: &PgPool,
    projection: &dyn PgProjection,
    batch: &[RawEnvelope],
    mode: Mode,
) -> Result<Vec<Outcome>> {
    let mut tx = pool.begin().await?;
    let mut outcomes = Vec::with_capacity(batch.len());
    while outcomes.len() < batch.len() {
        let start = outcomes.len();
        let mut prepared = projection.prepare(batch[start..].to_vec());
        if let Some(failure) = prepared.take_failure() {
            return Err(failure.shifted(start));
        }
        let written = projection.write(&mut tx, &prepared, mode).await.map_err(|e| e.shifted(start))?;
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
