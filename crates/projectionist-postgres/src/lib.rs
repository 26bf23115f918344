#![doc = include_str!("../README.md")]

// The crate by concern, each folder using only those listed before it: errors at the bottom;
// what PostgreSQL says of a table; the projection and its batches decoded; writing a batch;
// the schema; the operator's side. This file is the crate's face: nothing in it is used from
// inside the crate.
mod error;
/// Fault points for the fault suite (`fault-hooks`); not an API.
#[doc(hidden)]
pub mod fault;
pub mod halts;
mod operator;
mod projection;
mod schema;
mod source;
mod swap_lock;
mod tables;
pub mod wait;
mod writing;

pub mod park {
    //! Parking: aggregates waiting for a version that never arrived or behind a dead letter of
    //! their own, the events held for them and the dead letters — the messages' exact bytes — in
    //! the engine's tables `projectionist_parked`, `projectionist_held` and
    //! `projectionist_dead_letters`, written in the batch's own transaction; and what resumes
    //! them besides their version: an operator's retry, discard or skip.

    pub use crate::operator::resolve::{resolve, resume_stale, skip_gap, Resolve, Resolved};
    pub use crate::writing::parking::*;
}
pub use operator::rebuild;
pub use writing::{checkpoint, folding, writer};

pub use error::{
    is_retryable_apply, is_retryable_sqlx, Drift, Error, EventError, EventErrorKind, MigrateError, RebuildError,
    Result, WaitError,
};
pub use projection::formatted::Formatted;
pub use projection::prepared::Prepared;
pub use projection::{checked_tables, validate, PgProjection, SharedProjection};
pub use schema::drift::check_tables;
pub use schema::migrate::{create_schema, migrate, migrate_with, reset, MigrateOptions, HISTORY_TABLE};
pub use sqlx::{PgConnection, PgPool};
pub use tables::checks::Checks;
pub use tables::ident::Ident;
pub use tables::types::PgTypes;
pub use writer::{Mode, Written};
pub use writing::apply::{apply_batch, apply_batch_in, apply_batch_knowing, Policy};
pub use writing::folding::{analyze, Folding};
pub use writing::known::KnownVersions;
