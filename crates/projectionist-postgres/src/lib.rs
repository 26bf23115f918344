#![doc = include_str!("../README.md")]

mod apply;
mod batch;
pub mod checkpoint;
mod checks;
mod dependents;
mod drift;
mod error;
mod ident;
mod migrate;
pub mod park;
pub mod rebuild;
mod shared_rows;
mod swap_lock;
pub mod wait;

pub use apply::{
    analyze, apply_batch, apply_batch_in, checked_tables, create_schema, reset, validate, Folding, Mode, PgProjection,
    Policy, Prepared, SharedProjection, Written,
};
pub use checks::Checks;
pub use drift::{check_tables, Drift};
pub use error::{is_retryable_apply, is_retryable_sqlx, Error, Result};
pub use ident::Ident;
pub use migrate::{migrate, migrate_with, MigrateOptions, HISTORY_TABLE};
pub use sqlx::{PgConnection, PgPool};
