#![doc = include_str!("../README.md")]

mod apply;
mod batch;
mod built_for;
pub mod checkpoint;
mod checks;
mod dependents;
mod drift;
mod error;
/// Fault points for the fault suite (`fault-hooks`); not an API.
#[doc(hidden)]
pub mod fault;
pub mod folding;
mod formatted;
pub mod halts;
mod ident;
mod known;
mod migrate;
mod parking;
mod prepared;
pub mod park {
    //! Parking: aggregates waiting for a version that never arrived or behind a dead letter of
    //! their own, the events held for them and the dead letters — the messages' exact bytes — in
    //! the engine's tables `projectionist_parked`, `projectionist_held` and
    //! `projectionist_dead_letters`, written in the batch's own transaction.

    pub use crate::parking::*;
    pub use crate::resolve::{resolve, resume_stale, skip_gap, Resolve, Resolved};
}
mod projection;
pub mod rebuild;
mod resolve;
mod shared_rows;
mod source;
mod swap_lock;
mod types;
pub mod wait;
pub mod writer;

pub use apply::{apply_batch, apply_batch_in, apply_batch_knowing, Policy};
pub use checks::Checks;
pub use drift::check_tables;
pub use error::{
    is_retryable_apply, is_retryable_sqlx, Drift, Error, EventError, EventErrorKind, MigrateError, RebuildError,
    Result, WaitError,
};
pub use folding::{analyze, Folding};
pub use formatted::Formatted;
pub use ident::Ident;
pub use known::KnownVersions;
pub use migrate::{create_schema, migrate, migrate_with, reset, MigrateOptions, HISTORY_TABLE};
pub use prepared::Prepared;
pub use projection::{checked_tables, validate, PgProjection, SharedProjection};
pub use sqlx::{PgConnection, PgPool};
pub use types::PgTypes;
pub use writer::{Mode, Written};
