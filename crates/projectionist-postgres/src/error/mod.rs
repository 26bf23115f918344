//! The Postgres side's error type, classified for retry at the boundary; an error about one
//! event of a batch is an [`EventError`] (`event.rs`).

pub(crate) mod answer;
mod drift;
mod event;
mod operation;

use std::sync::Arc;

use projectionist_core::{ApplyError, OnPoison};

pub use drift::Drift;
pub use event::{EventError, EventErrorKind};
pub use operation::{MigrateError, RebuildError, WaitError, HISTORY_TABLE};

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong writing a read model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A database error (connection, SQL, constraint…).
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// The stored checkpoint is no longer the one the writer read or last stored: someone
    /// else moved it (a rebuild's swap or rollback, `run --reset`, another process given the
    /// partition). Nothing of the writer's transaction is to be committed; it reads on from
    /// `stored` (see `checkpoint::store`).
    #[error("the checkpoint moved under this writer (expected {expected:?}, stored {stored:?}): reading on from it")]
    CheckpointMoved {
        /// Where the writer believed it stood.
        expected: Option<i64>,
        /// Where the checkpoint stands (`None`: removed).
        stored: Option<i64>,
    },
    /// A wait for the read model to reach an event ended without it ([`WaitError`]).
    #[error(transparent)]
    Wait(#[from] WaitError),
    /// The engine's migrations cannot run on this database ([`MigrateError`]).
    #[error("migration refused: {0}")]
    Migrate(#[from] MigrateError),
    /// A dead letter cannot be retried or discarded as asked.
    #[error("dead letter {id}: {problem}")]
    DeadLetter {
        /// Its id.
        id: i64,
        /// Why not.
        problem: String,
    },
    /// A parked aggregate cannot be resolved as asked.
    #[error("parked aggregate {aggregate}: {problem}")]
    Parking {
        /// Its type and id, `type/id`.
        aggregate: String,
        /// Why not.
        problem: String,
    },
    /// A rebuild of a projection cannot go on as asked ([`RebuildError`]).
    #[error(transparent)]
    Rebuild(#[from] RebuildError),
    /// Keeping a message's dead letter would pass a bound on dead letters
    /// (`max_dead_letters`, `max_dead_letter_bytes`): the partition halts at that message
    /// rather than keep letters without end. Nothing of the batch is to be committed; the
    /// events before it can be, without it.
    #[error("the dead letter of the message at offset {}: {problem}", offset.map_or("-".to_owned(), |o| o.to_string()))]
    DeadLetterBound {
        /// How many of the batch's events precede the message (see [`Error::event_index`]).
        index: usize,
        /// The message's offset.
        offset: Option<i64>,
        /// Its aggregate, `type/id`, when its envelope names one.
        aggregate: Option<String>,
        /// Which bound, and what to do.
        problem: String,
    },
    /// A table or column name from configuration breaks the identifier rules.
    #[error("invalid identifier {ident:?}: {reason}")]
    Identifier {
        /// The name as given.
        ident: String,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// A projection's declaration is incomplete (a gated table without its aggregate type).
    #[error("projection {projection}: {problem}")]
    Declaration {
        /// Projection name.
        projection: String,
        /// What is missing.
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
    /// Tables of the projection in the database differ from their declarations, or do not
    /// exist yet: nothing was written or emptied.
    #[error("{}", describe_drift(projection, drift))]
    Drift {
        /// Projection name.
        projection: String,
        /// Each difference, naming table and column.
        drift: Vec<Drift>,
    },
    /// An event of the batch cannot be applied: which, and why ([`EventError`]).
    #[error(transparent)]
    Event(#[from] EventError),
    /// An error kept for an event of a batch and told again, where its source cannot be
    /// copied (a database error): its text.
    #[error("{0}")]
    Repeated(String),
}

/// Every difference on a line of its own, then what to do about them.
fn describe_drift(projection: &str, drift: &[Drift]) -> String {
    let mut text = format!("projection {projection}: its tables in the database differ from their declarations:");
    for d in drift {
        text.push_str(&format!("\n  - {d}"));
        if d.fix.is_some() {
            text.push_str(" (can be added in place: `migrate --add-columns`)");
        }
    }
    let missing = |d: &&Drift| d.problem == MISSING_TABLE;
    if drift.iter().any(|d| d.fix.is_some()) {
        text.push_str(
            "\nTo fill the missing columns from the stream, run `rebuild`: it builds the tables as declared beside \
             the live ones from offset zero and swaps them in (docs/operations.md, \"Replaying and upgrading\"). To \
             add them in place instead, run `migrate --add-columns` (`MigrateOptions` in the library): the rows \
             already there get NULL in them, as if no event had set them yet; only later events fill them.",
        );
    }
    if drift.iter().any(|d| missing(&d)) {
        text.push_str("\nRun `migrate` to create the tables that do not exist.");
    }
    if drift.iter().any(|d| d.fix.is_none() && !missing(&d)) {
        text.push_str(
            "\nA table that differs otherwise must be rebuilt from the stream: run `rebuild` (built beside the live \
             tables and swapped in), or drop it (or rename it to keep it), run `migrate` to create it as declared, \
             then `run --reset` to replay the projection's topics from offset zero (docs/operations.md, \"Changing \
             a schema\"). Or change the declaration back to what the table is.",
        );
    }
    text
}

/// A database error with what PostgreSQL says besides its message: the detail (which
/// often quotes the value), the column, the constraint.
pub(crate) fn describe(e: &sqlx::Error) -> String {
    let mut text = e.to_string();
    if let Some(db) = e.as_database_error().and_then(|d| d.try_downcast_ref::<sqlx::postgres::PgDatabaseError>()) {
        if let Some(detail) = db.detail() {
            text.push_str(&format!(" ({detail})"));
        }
        if let Some(column) = db.column() {
            text.push_str(&format!(", column {column}"));
        }
        if let Some(constraint) = db.constraint() {
            text.push_str(&format!(", constraint {constraint}"));
        }
        if let Some(code) = e.as_database_error().and_then(|d| d.code()) {
            text.push_str(&format!(" [SQLSTATE {code}]"));
        }
    }
    text
}

impl Error {
    /// What kind of poison an error of one event is, as dead letters record it (see
    /// [`EventError::reason`]); `other` for the rest.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Event(e) => e.reason(),
            _ => "other",
        }
    }

    /// The error of one event, told without its place in a batch (which means nothing once
    /// the batch is gone): what a dead letter records.
    pub fn of_the_event(&self) -> String {
        match self {
            Self::Event(e) => e.of_the_event(),
            other => other.to_string(),
        }
    }

    /// The error of the event at `index` of the batch, of `aggregate` (type and id) at
    /// `version`: what is wrong is `kind`.
    pub(crate) fn event(index: usize, aggregate: (&str, &str), version: i64, kind: EventErrorKind) -> Self {
        Self::Event(EventError::new(index, aggregate, version, kind))
    }

    /// The same error, owned: a copy where its parts can be copied, else one that says the
    /// same ([`Error::Repeated`]).
    pub(crate) fn clone_of_batch(&self) -> Self {
        match self {
            Self::Event(e) => Self::Event(e.clone()),
            Self::Declaration { projection, problem } => {
                Self::Declaration { projection: projection.clone(), problem: problem.clone() }
            }
            Self::Rebuild(e) => Self::Rebuild(e.clone()),
            Self::Conflict { detail } => Self::Conflict { detail: detail.clone() },
            Self::DeadLetterBound { index, offset, aggregate, problem } => Self::DeadLetterBound {
                index: *index,
                offset: *offset,
                aggregate: aggregate.clone(),
                problem: problem.clone(),
            },
            other => Self::Repeated(other.to_string()),
        }
    }

    /// Whether the error halts a partition rather than dead-lettering its event under the
    /// policy `on_poison`: any poison under [`OnPoison::Halt`], and always a problem of the
    /// whole batch (its declarations), an unknown type the projection halts on, a bound on
    /// parking or on dead letters, and a type the release that built the tables handles and
    /// this one does not.
    pub fn halts(&self, on_poison: OnPoison) -> bool {
        on_poison == OnPoison::Halt
            || matches!(self, Self::Declaration { .. } | Self::DeadLetterBound { .. })
            || matches!(
                self.event_kind(),
                Some(EventErrorKind::UnknownType { .. } | EventErrorKind::Bound(_) | EventErrorKind::Release(_))
            )
    }

    /// What is wrong with the event the error is about, when it is about one.
    pub fn event_kind(&self) -> Option<&EventErrorKind> {
        match self {
            Self::Event(e) => Some(&e.kind),
            _ => None,
        }
    }

    /// True when trying the same transaction again may succeed: the environment's failures
    /// (see [`Error::is_environment`]), serialization failures (40001), deadlocks (40P01)
    /// and version races.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Database(e) => is_retryable_sqlx(e),
            Self::Conflict { .. } => true,
            Self::Event(e) => e.is_retryable(),
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
            Self::Event(e) => e.is_environment(),
            _ => false,
        }
    }

    /// True for an event that can never be applied as it is (decode failure): retrying
    /// cannot help, it must be dead-lettered or halt its partition.
    pub fn is_poison(&self) -> bool {
        matches!(self, Self::Event(e) if e.is_poison())
    }

    /// The position in the batch of the event the error is about, when it is about one:
    /// everything before it can be applied without it.
    pub fn event_index(&self) -> Option<usize> {
        match self {
            Self::Event(e) => Some(e.index),
            Self::DeadLetterBound { index, .. } => Some(*index),
            _ => None,
        }
    }

    /// The error with its event index counted `by` events further (an error of a run of
    /// events that starts there in the batch).
    pub(crate) fn shifted(self, by: usize) -> Self {
        self.reindexed(|index| index + by)
    }

    /// The error with its event index replaced by `index` (an error of an event held for a
    /// parked aggregate, blamed on the batch's event that resumed it).
    pub(crate) fn at(self, index: usize) -> Self {
        self.reindexed(|_| index)
    }

    fn reindexed(self, to: impl Fn(usize) -> usize) -> Self {
        match self {
            Self::Event(e) => Self::Event(EventError { index: to(e.index), ..e }),
            Self::DeadLetterBound { index, offset, aggregate, problem } => {
                Self::DeadLetterBound { index: to(index), offset, aggregate, problem }
            }
            other => other,
        }
    }

    /// The error of applying the event at `index` alone: a database error retrying cannot
    /// fix becomes [`EventErrorKind::Rejected`], naming the event.
    pub(crate) fn of_event(self, index: usize, event: &projectionist_core::plan::EventRef<'_>) -> Self {
        match self {
            Self::Database(source) if !is_retryable_sqlx(&source) => Self::event(
                index,
                (event.aggregate_type, event.aggregate_id),
                event.version,
                EventErrorKind::Rejected(Arc::new(source)),
            ),
            other => other.shifted(index),
        }
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

/// What a drift says of a declared table that is not there.
pub(crate) const MISSING_TABLE: &str = "does not exist";

impl Error {
    /// A rebuild of `projection` that cannot go on, and why.
    pub(crate) fn rebuild(projection: &str, problem: impl Into<String>) -> Self {
        Error::Rebuild(RebuildError::new(projection, problem))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{EventError, EventErrorKind};

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
        let apply = |error| {
            let kind = EventErrorKind::Apply { projection: "p".into(), error: Arc::new(error) };
            super::Error::event(0, ("t", "a"), 1, kind)
        };
        assert!(apply(projectionist_core::ApplyError::from(io())).is_environment());
        assert!(!apply(projectionist_core::ApplyError::msg("rule broken")).is_environment());
        let conflict = super::Error::Conflict { detail: "moved".into() };
        assert!(
            conflict.is_retryable() && !conflict.is_environment(),
            "a conflict is the batch's, not the environment's"
        );
    }

    #[test]
    fn a_copy_of_an_event_error_keeps_its_kind() {
        let refused = EventErrorKind::Rejected(Arc::new(sqlx::Error::RowNotFound));
        let error = super::Error::event(3, ("account", "a-1"), 2, refused);
        let copy = error.clone_of_batch();
        // A refused value stays one (it once became a declaration problem when copied).
        assert_eq!((copy.reason(), copy.to_string()), ("value", error.to_string()));
        assert!(copy.to_string().starts_with("the database refused event #3 of the batch (account/a-1 v2)"));
        assert_eq!(copy.shifted(2).event_index(), Some(5));
        let held = EventErrorKind::Held {
            held: 7,
            source: Box::new(EventError::new(0, ("account", "a-1"), 4, EventErrorKind::Invalid("no".into()))),
        };
        let held = super::Error::event(1, ("account", "a-1"), 4, held).clone_of_batch();
        assert_eq!((held.reason(), held.of_the_event().as_str()), ("declaration", "account/a-1 v4: no"));
    }

    #[test]
    fn a_copy_of_an_error_that_cannot_be_copied_says_the_same_under_its_own_name() {
        let database = super::Error::Database(sqlx::Error::RowNotFound);
        let copy = database.clone_of_batch();
        assert!(matches!(&copy, super::Error::Repeated(text) if *text == database.to_string()), "{copy:?}");
        let rebuild = super::Error::rebuild("p", "cannot");
        assert!(matches!(rebuild.clone_of_batch(), super::Error::Rebuild(e) if e.problem == "cannot"));
    }

    #[test]
    fn looks_inside_projection_errors() {
        let apply = projectionist_core::ApplyError::from(sqlx::Error::PoolTimedOut);
        assert!(super::is_retryable_apply(&apply));
        let apply = projectionist_core::ApplyError::msg("rule broken");
        assert!(!super::is_retryable_apply(&apply));
    }
}
