//! The errors of the engine's operations beside the write path, each a type of its own (as
//! sqlx keeps its `MigrateError`): its migrations, a rebuild, and a wait for the read model.

use super::answer::{Fate, Position};

/// Where the engine records which of its migrations a database has.
pub const HISTORY_TABLE: &str = "projectionist_migrations";

/// Why the engine's own migrations cannot run on a database.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MigrateError {
    /// The history records a migration this build does not know: a newer release migrated
    /// the database.
    #[error(
        "{HISTORY_TABLE} records engine migration {version}, which this build does not know: a newer release of \
         projectionist migrated this database; run that release"
    )]
    Unknown {
        /// The migration's version.
        version: i64,
    },
    /// A migration was applied with other contents than this build's.
    #[error(
        "engine migration {version} ({description}) was applied with other contents than this build's; the \
         database was migrated by a modified build"
    )]
    Modified {
        /// The migration's version.
        version: i64,
        /// What it does.
        description: String,
    },
    /// A migration failed; nothing of the run was committed.
    #[error("engine migration {version} ({description}) failed: {source}")]
    Failed {
        /// The migration's version.
        version: i64,
        /// What it does.
        description: String,
        /// PostgreSQL's error.
        #[source]
        source: sqlx::Error,
    },
    /// The engine's tables are not in the database.
    #[error("the engine's tables are not in this database: run `migrate` first")]
    NotMigrated,
}

/// A rebuild of a projection that cannot start, swap, verify or roll back as asked.
#[derive(Debug, Clone, thiserror::Error)]
#[error("rebuild of projection {projection}: {problem}")]
pub struct RebuildError {
    /// Projection name.
    pub projection: String,
    /// Why not, and what to do.
    pub problem: String,
}

impl RebuildError {
    /// A rebuild of `projection` that cannot go on, and why.
    pub(crate) fn new(projection: &str, problem: impl Into<String>) -> Self {
        Self { projection: projection.to_owned(), problem: problem.into() }
    }
}

/// A wait for the read model to reach an event (see `wait::Waiter`) that ends
/// without it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WaitError {
    /// It timed out.
    #[error("timed out after {waited_ms} ms waiting for {wanted}: {position}")]
    Timeout {
        /// How long it waited.
        waited_ms: u64,
        /// What it waited for.
        wanted: String,
        /// Where the projection stood when it gave up.
        position: Position,
    },
    /// The event is past the checkpoint but not in the read model: parked, dead-lettered or
    /// discarded.
    #[error("{wanted}: not applied, {fate}")]
    NotApplied {
        /// What it waited for.
        wanted: String,
        /// What became of the event.
        fate: Fate,
    },
}
