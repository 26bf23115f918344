//! The Postgres side's error type, classified for retry at the boundary.

use projectionist_core::{ApplyError, DecodeError};

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong writing a read model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A database error (connection, SQL, constraint…).
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// Running the engine migrations failed.
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A table or column name from configuration breaks the identifier rules.
    #[error("invalid identifier {ident:?}: {reason}")]
    Identifier {
        /// The name as given.
        ident: String,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// A value could not be encoded for a column.
    #[error("cannot bind a value for column {column}: {reason}")]
    Bind {
        /// Column the value was for.
        column: String,
        /// The encoder's message.
        reason: String,
    },
    /// Another transaction moved the row's version between the write and the read-back.
    #[error("version of {table} row {key:?} moved concurrently at version {version}; retry the transaction")]
    Race {
        /// Table of the row.
        table: String,
        /// Key of the row.
        key: String,
        /// Version being applied.
        version: i64,
    },
    /// An event of the batch does not decode into the projection's event type (poison).
    #[error("event #{index} of the batch ({aggregate_id} v{version}) does not decode: {source}")]
    Decode {
        /// Position in the batch.
        index: usize,
        /// Aggregate of the event.
        aggregate_id: String,
        /// Version of the event.
        version: i64,
        /// Why.
        source: DecodeError,
    },
    /// An event's writes break the projection's table declarations (an undeclared table or
    /// column, `add` on an upsert table, …): a bug in the projection, not in the event.
    #[error("event #{index} of the batch ({aggregate_id} v{version}): {problem}")]
    Invalid {
        /// Position in the batch.
        index: usize,
        /// Aggregate of the event.
        aggregate_id: String,
        /// Version of the event.
        version: i64,
        /// What is wrong, naming table and column.
        problem: String,
    },
    /// A concurrent writer moved (or inserted) rows under the batch: a statement changed
    /// another number of rows than planned, or the aggregate's gates were read at different
    /// versions. The batch is rolled back and applied on the per-event path.
    #[error("concurrent write under the batch: {detail}")]
    Conflict {
        /// What was seen, naming the table.
        detail: String,
    },
    /// The projection's own code failed.
    #[error("projection {projection} failed: {error}")]
    Apply {
        /// Projection name.
        projection: String,
        /// The projection's error.
        error: ApplyError,
    },
    /// The projection broke its contract (e.g. returned the wrong number of outcomes).
    #[error("projection {projection} broke its contract: {problem}")]
    Contract {
        /// Projection name.
        projection: String,
        /// What it did.
        problem: String,
    },
}

impl Error {
    /// True when trying the same transaction again may succeed: serialization failures
    /// (40001), deadlocks (40P01), lost connections (08xxx), shutdowns (57P01..3), too many
    /// connections (53300), pool time-outs, I/O errors and version races.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Database(e) => is_retryable_sqlx(e),
            Self::Race { .. } | Self::Conflict { .. } => true,
            Self::Apply { error, .. } => is_retryable_apply(error),
            _ => false,
        }
    }

    /// True for an event that can never be applied as it is (decode failure): retrying
    /// cannot help, it must be dead-lettered or halt its partition.
    pub fn is_poison(&self) -> bool {
        matches!(self, Self::Decode { .. })
    }
}

/// Whether an error a projection returned is worth retrying (see [`Error::is_retryable`]).
pub fn is_retryable_apply(e: &ApplyError) -> bool {
    if let Some(e) = e.downcast_ref::<sqlx::Error>() {
        return is_retryable_sqlx(e);
    }
    if let Some(e) = e.downcast_ref::<Error>() {
        return e.is_retryable();
    }
    false
}

/// Whether a sqlx error is transient (see [`Error::is_retryable`]).
pub fn is_retryable_sqlx(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|c| is_retryable_sqlstate(&c)),
        _ => false,
    }
}

fn is_retryable_sqlstate(code: &str) -> bool {
    matches!(code, "40001" | "40P01" | "53300" | "57P01" | "57P02" | "57P03") || code.starts_with("08")
}

#[cfg(test)]
mod tests {
    #[test]
    fn classifies_sqlstates() {
        for code in ["40001", "40P01", "08006", "08003", "57P01", "53300"] {
            assert!(super::is_retryable_sqlstate(code), "{code}");
        }
        for code in ["23505", "42P01", "22P02", "42601"] {
            assert!(!super::is_retryable_sqlstate(code), "{code}");
        }
        assert!(super::is_retryable_sqlx(&sqlx::Error::PoolTimedOut));
        assert!(!super::is_retryable_sqlx(&sqlx::Error::RowNotFound));
    }

    #[test]
    fn looks_inside_projection_errors() {
        let apply = projectionist_core::ApplyError::from(sqlx::Error::PoolTimedOut);
        assert!(super::is_retryable_apply(&apply));
        let apply = projectionist_core::ApplyError::msg("rule broken");
        assert!(!super::is_retryable_apply(&apply));
    }
}
