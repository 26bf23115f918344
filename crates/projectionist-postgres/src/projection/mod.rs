//! The object-safe form of a projection the engine holds ([`PgProjection`]), and checking its
//! declarations.

pub(crate) mod formatted;
pub(crate) mod prepared;

use std::any::Any;
use std::sync::Arc;

use async_trait::async_trait;
use projectionist_core::format::Formats;
use projectionist_core::{
    validate_projection_name, ApplyError, Envelope, LazyEnvelope, OnUnknownType, Outcome, Projection, RawEnvelope,
    Table, Upcaster,
};
use sqlx::{PgConnection, PgPool};

use crate::error::Error;
use crate::error::Result;
use crate::projection::prepared::{check_declarations, prepare_all, Prepared};
use crate::tables::checks::Checks;
use crate::tables::ident::Ident;

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
    /// [`EventErrorKind::Decode`](crate::error::EventErrorKind::Decode) naming it, or [`Error::Declaration`] for the whole batch). The
    /// envelopes are consumed: their fields move into the typed events, uncopied.
    fn prepare(&self, batch: Vec<RawEnvelope>) -> Prepared;
    /// [`PgProjection::prepare`] for envelopes whose data is still JSON text, as the engine
    /// reads them: each event decoded straight from it (a `Value` tree is built only for an
    /// event an upcaster of the projection reads).
    fn prepare_lazy(&self, batch: Vec<LazyEnvelope>) -> Prepared;
    /// Runs the projection's own [`Projection::apply`] for a prepared event whose writes
    /// are custom (`envelope`: its typed envelope, as [`PgProjection::prepare`] made it).
    async fn apply_prepared(
        &self,
        conn: &mut PgConnection,
        envelope: &(dyn Any + Send + Sync),
    ) -> std::result::Result<Outcome, ApplyError>;
    /// How its topics' messages carry the envelope (none listed: projectionist's own JSON
    /// envelope on every topic); what reads a held event or a dead letter again reads it
    /// with. Set with [`Formatted`](crate::projection::formatted::Formatted).
    fn formats(&self) -> &Formats {
        static ENVELOPE: Formats = Formats::new();
        &ENVELOPE
    }
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
        prepare_all(self, batch.into_iter().map(LazyEnvelope::from))
    }

    fn prepare_lazy(&self, batch: Vec<LazyEnvelope>) -> Prepared {
        prepare_all(self, batch.into_iter())
    }

    async fn apply_prepared(
        &self,
        conn: &mut PgConnection,
        envelope: &(dyn Any + Send + Sync),
    ) -> std::result::Result<Outcome, ApplyError> {
        let Some(envelope) = envelope.downcast_ref::<Envelope<P::Event>>() else {
            let name = Projection::name(self);
            return Err(ApplyError::msg(format!("an event prepared by another projection was given to {name}")));
        };
        self.apply(conn, envelope).await
    }
}

/// What PostgreSQL checks of `projection`'s tables beyond their declarations (see
/// [`Checks`] and [`Prepared::set_checked`]).
pub async fn checked_tables(pool: &PgPool, projection: &dyn PgProjection) -> Result<Checks> {
    let mut conn = pool.acquire().await?;
    crate::tables::checks::read(&mut conn, projection.tables()).await
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
