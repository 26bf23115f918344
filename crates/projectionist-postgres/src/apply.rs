//! Running projections against PostgreSQL: the object-safe form the engine holds, and
//! applying a batch of raw envelopes inside one transaction.

use std::sync::Arc;

use async_trait::async_trait;
use projectionist_core::plan::{Effect, EventRef};
use projectionist_core::{
    validate_projection_name, Decoded, Envelope, Outcome, Projection, RawEnvelope, Table, Writes,
};
use sqlx::{PgConnection, PgPool};

use crate::{batch, Error, Ident, Result};

/// How a batch is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Set-based: the batch planned in memory, a few statements per table. The default.
    Batch,
    /// One event at a time, each under a savepoint, waiting on concurrent writers' row
    /// locks: what a batch falls back to when a concurrent writer moved its rows.
    PerEvent,
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
    /// Decodes `batch` and applies it in offset order in the caller's transaction, one
    /// outcome per envelope up to the first [`Outcome::Gap`]: the outcomes then end with it,
    /// and nothing at or after it is written, so what precedes it can commit. An error
    /// about one event names it
    /// ([`Error::event_index`]): a decode failure, a write the declarations forbid, a value
    /// the database refuses; nothing of the batch is to be committed then.
    /// [`Error::Conflict`] in [`Mode::Batch`]: roll back and apply the batch again in
    /// [`Mode::PerEvent`].
    async fn apply_raw(&self, conn: &mut PgConnection, batch: &[RawEnvelope], mode: Mode) -> Result<Vec<Outcome>>;
}

/// One decoded event and what it does.
enum Item<E> {
    Unhandled,
    Writes(Writes),
    Custom(Envelope<E>),
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

    async fn apply_raw(&self, conn: &mut PgConnection, batch: &[RawEnvelope], mode: Mode) -> Result<Vec<Outcome>> {
        let name = Projection::name(self);
        let tables = Projection::tables(self);
        check_declarations(name, tables)?;
        let mut items = Vec::with_capacity(batch.len());
        for (index, raw) in batch.iter().enumerate() {
            let decoded = raw.clone().decode::<P::Event>().map_err(|source| Error::Decode {
                index,
                aggregate: format!("{}/{}", raw.aggregate_type, raw.aggregate_id),
                version: raw.version,
                source,
            })?;
            items.push(match decoded {
                Decoded::Unhandled(_) => Item::Unhandled,
                Decoded::Event(env) => match self.project(&env) {
                    writes if writes.is_custom() => Item::Custom(env),
                    writes => Item::Writes(writes),
                },
            });
        }
        let event = |i: usize| {
            let raw = &batch[i];
            EventRef { aggregate_type: &raw.aggregate_type, aggregate_id: &raw.aggregate_id, version: raw.version }
        };
        let mut outcomes = Vec::with_capacity(batch.len());
        let mut start = 0;
        // Runs of planned events go set-based; a custom event goes to `apply` between them.
        while start < items.len() {
            let end =
                items[start..].iter().position(|i| matches!(i, Item::Custom(_))).map_or(items.len(), |p| start + p);
            if end > start {
                let run: Vec<(EventRef<'_>, Effect<'_>)> = (start..end)
                    .map(|i| {
                        let effect = match &items[i] {
                            Item::Writes(w) => Effect::Writes(w.writes()),
                            _ => Effect::Unhandled,
                        };
                        (event(i), effect)
                    })
                    .collect();
                let applied = batch::apply(conn, name, tables, &run, mode).await.map_err(|e| e.shifted(start))?;
                outcomes.extend(applied);
                if batch::ends_in_a_gap(&outcomes) {
                    return Ok(outcomes);
                }
            }
            if let Some(Item::Custom(env)) = items.get(end) {
                // Gated like any event: its gates move, and `apply` runs only if it applies.
                let gated = batch::apply(conn, name, tables, &[(event(end), Effect::Custom)], Mode::PerEvent)
                    .await
                    .map_err(|e| e.shifted(end))?;
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
                outcomes.push(outcome);
                if batch::ends_in_a_gap(&outcomes) {
                    return Ok(outcomes);
                }
            }
            start = end + 1;
        }
        Ok(outcomes)
    }
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
/// engine adds its own in the same transaction): set-based, or per event when a concurrent
/// writer moved the batch's rows. Used by tests and tools: unlike the engine, which halts
/// a partition at a gap, it goes on past one (the gap's event is not applied), so every
/// event has an outcome.
pub async fn apply_batch(pool: &PgPool, projection: &dyn PgProjection, batch: &[RawEnvelope]) -> Result<Vec<Outcome>> {
    match apply_batch_in(pool, projection, batch, Mode::Batch).await {
        Err(Error::Conflict { .. }) => apply_batch_in(pool, projection, batch, Mode::PerEvent).await,
        other => other,
    }
}

/// As [`apply_batch`], always in the given mode.
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
        outcomes.extend(projection.apply_raw(&mut tx, &batch[start..], mode).await.map_err(|e| e.shifted(start))?);
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

/// Empties the projection's tables and forgets its watermarks and checkpoints, in one
/// transaction, so the next run rebuilds it from the start of its topics.
pub async fn reset(pool: &PgPool, projection: &dyn PgProjection) -> Result<()> {
    validate(projection)?;
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
