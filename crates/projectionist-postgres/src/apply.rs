//! Running projections against PostgreSQL: the object-safe form the engine holds, and
//! applying a batch of raw envelopes inside one transaction.

use std::sync::Arc;

use async_trait::async_trait;
use projectionist_core::{event_types, validate_projection_name, Decoded, Outcome, Projection, RawEnvelope};
use sqlx::{PgConnection, PgPool};

use crate::{Error, Ident, Result};

/// A projection over PostgreSQL with its event type erased, so the engine can hold many
/// side by side. Every `Projection<PgConnection>` is one.
#[async_trait]
pub trait PgProjection: Send + Sync + 'static {
    /// See [`Projection::name`].
    fn name(&self) -> &str;
    /// See [`Projection::schema`].
    fn schema(&self) -> &[&str];
    /// See [`Projection::tables`].
    fn tables(&self) -> &[&str];
    /// Whether the projection has a variant for `event_type`.
    fn handles(&self, event_type: &str) -> bool;
    /// Decodes `batch` and applies it in offset order in the caller's transaction, one
    /// outcome per envelope (unhandled types are [`Outcome::Ignored`]). A decode failure
    /// is an [`Error::Decode`] naming the event; nothing is applied then.
    async fn apply_raw(&self, conn: &mut PgConnection, batch: &[RawEnvelope]) -> Result<Vec<Outcome>>;
}

#[async_trait]
impl<P: Projection<PgConnection>> PgProjection for P {
    fn name(&self) -> &str {
        Projection::name(self)
    }

    fn schema(&self) -> &[&str] {
        Projection::schema(self)
    }

    fn tables(&self) -> &[&str] {
        Projection::tables(self)
    }

    fn handles(&self, event_type: &str) -> bool {
        event_types::<P::Event>().is_none_or(|types| types.contains(&event_type))
    }

    async fn apply_raw(&self, conn: &mut PgConnection, batch: &[RawEnvelope]) -> Result<Vec<Outcome>> {
        let mut outcomes = vec![Outcome::Ignored; batch.len()];
        let mut handled = Vec::with_capacity(batch.len());
        let mut positions = Vec::with_capacity(batch.len());
        for (index, raw) in batch.iter().enumerate() {
            let decoded = raw.clone().decode::<P::Event>().map_err(|source| Error::Decode {
                index,
                aggregate_id: raw.aggregate_id.clone(),
                version: raw.version,
                source,
            })?;
            if let Decoded::Event(env) = decoded {
                handled.push(env);
                positions.push(index);
            }
        }
        if handled.is_empty() {
            return Ok(outcomes);
        }
        let applied = Projection::apply_batch(self, conn, &handled)
            .await
            .map_err(|error| Error::Apply { projection: Projection::name(self).into(), error })?;
        if applied.len() != handled.len() {
            return Err(Error::Contract {
                projection: Projection::name(self).into(),
                problem: format!("apply_batch returned {} outcomes for {} events", applied.len(), handled.len()),
            });
        }
        for (pos, outcome) in positions.into_iter().zip(applied) {
            outcomes[pos] = outcome;
        }
        Ok(outcomes)
    }
}

/// A shared, type-erased projection.
pub type SharedProjection = Arc<dyn PgProjection>;

/// Checks a projection before the engine runs it: its name and its table names.
pub fn validate(projection: &dyn PgProjection) -> Result<()> {
    validate_projection_name(projection.name())
        .map_err(|_| Error::Identifier { ident: projection.name().into(), reason: "not a valid projection name" })?;
    for table in projection.tables() {
        Ident::new(table)?;
    }
    Ok(())
}

/// Applies `batch` in one transaction of its own and commits it (no checkpoint: the
/// Kafka engine adds its own in the same transaction). Used by tests and tools.
pub async fn apply_batch(pool: &PgPool, projection: &dyn PgProjection, batch: &[RawEnvelope]) -> Result<Vec<Outcome>> {
    let mut tx = pool.begin().await?;
    let outcomes = projection.apply_raw(&mut tx, batch).await?;
    tx.commit().await?;
    Ok(outcomes)
}

/// Creates the projection's tables by running its idempotent [`Projection::schema`].
pub async fn create_schema(pool: &PgPool, projection: &dyn PgProjection) -> Result<()> {
    let mut tx = pool.begin().await?;
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
        let tables = projection.tables().iter().map(|t| Ident::new(t).map(|i| i.to_string())).collect::<Result<Vec<_>>>()?;
        sqlx::raw_sql(&format!("TRUNCATE {}", tables.join(", "))).execute(&mut *tx).await?;
    }
    for table in ["projectionist_watermarks", "projectionist_checkpoints"] {
        sqlx::query(&format!("DELETE FROM {table} WHERE projection = $1")).bind(projection.name()).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(())
}
