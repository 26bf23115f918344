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
    /// True when trying the same transaction again may succeed: the environment's failures
    /// (see [`Error::is_environment`]), serialization failures (40001), deadlocks (40P01)
    /// and version races.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Database(e) => is_retryable_sqlx(e),
            Self::Race { .. } | Self::Conflict { .. } => true,
            Self::Apply { error, .. } => is_retryable_apply(error),
            _ => false,
        }
    }

    /// True when the failure is the environment's, not the batch's: PostgreSQL cannot be
    /// reached or cannot take writes right now — lost or refused connections, I/O errors,
    /// pool time-outs, SQLSTATE class 08, shutdowns and restarts (57P01..3), too many
    /// connections (53300), a read-only server (25006, as after a failover), protocol
    /// errors (a connection closed as soon as it opens, as by a proxy whose server is gone,
    /// reaches sqlx as "unexpected response from SSLRequest"). Such a failure lasts as long
    /// as the outage, so it is waited out rather than counted against a retry budget.
    /// Implies [`Error::is_retryable`].
    pub fn is_environment(&self) -> bool {
        match self {
            Self::Database(e) => is_environment_sqlx(e),
            Self::Apply { error, .. } => {
                error.downcast_ref::<sqlx::Error>().is_some_and(is_environment_sqlx)
                    || error.downcast_ref::<Error>().is_some_and(Error::is_environment)
            }
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
        sqlx::Error::Database(db) => db.code().is_some_and(|c| is_retryable_sqlstate(&c)),
        other => is_environment_sqlx(other),
    }
}

/// Whether a sqlx error is the environment's (see [`Error::is_environment`]).
pub fn is_environment_sqlx(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|c| is_environment_sqlstate(&c)),
        _ => false,
    }
}

fn is_retryable_sqlstate(code: &str) -> bool {
    matches!(code, "40001" | "40P01") || is_environment_sqlstate(code)
}

fn is_environment_sqlstate(code: &str) -> bool {
    matches!(code, "25006" | "53300" | "57P01" | "57P02" | "57P03") || code.starts_with("08")
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
    fn the_environment_s_failures_are_told_apart_from_the_batch_s() {
        for code in ["08006", "08001", "57P01", "57P02", "57P03", "53300", "25006"] {
            assert!(super::is_environment_sqlstate(code) && super::is_retryable_sqlstate(code), "{code}");
        }
        for code in ["40001", "40P01", "23505", "42P01", "57P04", "57014"] {
            assert!(!super::is_environment_sqlstate(code), "{code}");
        }
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let closed = sqlx::Error::Protocol("unexpected response from SSLRequest: 0x00".into());
        for e in [sqlx::Error::Io(refused), sqlx::Error::PoolTimedOut, closed] {
            assert!(super::is_environment_sqlx(&e) && super::is_retryable_sqlx(&e), "{e}");
        }
        for e in [sqlx::Error::RowNotFound, sqlx::Error::PoolClosed] {
            assert!(!super::is_environment_sqlx(&e), "{e}");
        }
        let io = || sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(super::Error::Database(io()).is_environment());
        let apply = |error| super::Error::Apply { projection: "p".into(), error };
        assert!(apply(projectionist_core::ApplyError::from(io())).is_environment());
        assert!(!apply(projectionist_core::ApplyError::msg("rule broken")).is_environment());
        let conflict = super::Error::Conflict { detail: "moved".into() };
        assert!(
            conflict.is_retryable() && !conflict.is_environment(),
            "a conflict is the batch's, not the environment's"
        );
    }

    #[test]
    fn looks_inside_projection_errors() {
        let apply = projectionist_core::ApplyError::from(sqlx::Error::PoolTimedOut);
        assert!(super::is_retryable_apply(&apply));
        let apply = projectionist_core::ApplyError::msg("rule broken");
        assert!(!super::is_retryable_apply(&apply));
    }
}
