//! projectionist builds PostgreSQL read models from versioned event streams, applying every
//! event as a natural-idempotent write gated by aggregate ID + version.
//!
//! This facade re-exports the pieces a user needs: the core types at the top level, the
//! PostgreSQL side as [`postgres`], the Kafka runtime as [`kafka`]. See the README for a first projection.

pub use projectionist_core::*;
pub use projectionist_kafka as kafka;
pub use projectionist_postgres as postgres;
pub use projectionist_postgres::gate;
