//! A projection whose topics carry other formats than projectionist's own envelope.

use std::any::Any;

use async_trait::async_trait;
use projectionist_core::format::Formats;
use projectionist_core::{ApplyError, LazyEnvelope, OnUnknownType, Outcome, RawEnvelope, Table, Upcaster};
use sqlx::PgConnection;

use crate::projection::prepared::Prepared;
use crate::projection::PgProjection;
use crate::projection::SharedProjection;

/// `projection`, its topics read as `formats` says (see [`PgProjection::formats`]): what the
/// engine runs and the operator's commands resolve with, so that a held event or a dead
/// letter is read again as it was read first.
pub struct Formatted {
    projection: SharedProjection,
    formats: Formats,
}

impl Formatted {
    /// `projection` reading its topics as `formats` says; as it is when `formats` lists
    /// none.
    pub fn wrap(projection: SharedProjection, formats: &Formats) -> SharedProjection {
        if formats.is_empty() {
            return projection;
        }
        std::sync::Arc::new(Self { projection, formats: formats.clone() })
    }
}

#[async_trait]
impl PgProjection for Formatted {
    fn name(&self) -> &str {
        self.projection.name()
    }

    fn tables(&self) -> &[Table] {
        self.projection.tables()
    }

    fn schema(&self) -> &[&str] {
        self.projection.schema()
    }

    fn on_unknown_type(&self) -> OnUnknownType {
        self.projection.on_unknown_type()
    }

    fn upcasters(&self) -> &[Upcaster] {
        self.projection.upcasters()
    }

    fn event_types(&self) -> &'static [&'static str] {
        self.projection.event_types()
    }

    fn prepare(&self, batch: Vec<RawEnvelope>) -> Prepared {
        self.projection.prepare(batch)
    }

    fn prepare_lazy(&self, batch: Vec<LazyEnvelope>) -> Prepared {
        self.projection.prepare_lazy(batch)
    }

    async fn apply_prepared(
        &self,
        conn: &mut PgConnection,
        envelope: &(dyn Any + Send + Sync),
    ) -> std::result::Result<Outcome, ApplyError> {
        self.projection.apply_prepared(conn, envelope).await
    }

    fn formats(&self) -> &Formats {
        &self.formats
    }
}
