#![doc = include_str!("../README.md")]

mod apply;
mod batch;
pub mod checkpoint;
mod error;
mod ident;

pub use apply::{
    apply_batch, apply_batch_in, create_schema, reset, validate, Mode, PgProjection, Prepared, SharedProjection,
    Written,
};
pub use error::{is_retryable_apply, is_retryable_sqlx, Error, Result};
pub use ident::Ident;
pub use sqlx::{PgConnection, PgPool};

/// The engine's migrations (checkpoints, aggregate versions), embedded from `migrations/`.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");

/// Runs the engine migrations, then creates each projection's tables.
pub async fn migrate(pool: &PgPool, projections: &[&dyn PgProjection]) -> Result<()> {
    MIGRATOR.run(pool).await?;
    for projection in projections {
        validate(*projection)?;
        create_schema(pool, *projection).await?;
    }
    Ok(())
}
