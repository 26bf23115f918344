//! An error about one event of a batch: where it is (its index, aggregate and version) and
//! what is wrong with it, cloneable so that a batch written again carries it along.

use std::sync::Arc;

use projectionist_core::{ApplyError, DecodeError};

use super::{describe, is_environment_sqlx, is_retryable_apply};

/// An event of the batch that cannot be applied, and why ([`Error::Event`](super::Error::Event)).
#[derive(Debug, Clone)]
pub struct EventError {
    /// Position in the batch.
    pub index: usize,
    /// Aggregate of the event, `type/id`.
    pub aggregate: String,
    /// Version of the event.
    pub version: i64,
    /// What is wrong.
    pub kind: EventErrorKind,
}

/// What is wrong with an event ([`EventError::kind`]).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum EventErrorKind {
    /// It does not decode into the projection's event type, or an upcaster failed (poison).
    Decode(DecodeError),
    /// Its type is none the projection handles, and the projection halts on such an event
    /// ([`OnUnknownType::Halt`](projectionist_core::OnUnknownType::Halt)).
    UnknownType {
        /// The event's type, as on the wire.
        event_type: String,
        /// The types the projection handles, comma-separated.
        known: String,
    },
    /// Its writes break the projection's table declarations (an undeclared table or
    /// column, `add` on an upsert table, a key too long to store, …): a bug in the
    /// projection or an event that can never be stored. What is wrong, naming table and
    /// column.
    Invalid(String),
    /// Parking it would pass one of the bounds on parking: the partition halts at it rather
    /// than hold events without end. Which bound, and how to raise it.
    Bound(String),
    /// Its type is one this release of the projection does not handle, but the release whose
    /// rebuild swapped the tables in does: the partition halts at it rather than skip an
    /// event the tables were built to hold. What to run.
    Release(String),
    /// The database refused its writes for good (a value its column cannot take, a NOT NULL
    /// or CHECK constraint): found by applying the batch event by event.
    Rejected(Arc<sqlx::Error>),
    /// The projection's own `apply` failed on it.
    Apply {
        /// Projection name.
        projection: String,
        /// The projection's error.
        error: Arc<ApplyError>,
    },
    /// An event held for its aggregate cannot be applied now that this event resumes the
    /// aggregate (its data does not decode, the database refuses a value, …): this event
    /// stands for it in the batch, and `held` names it, so that the held event itself is
    /// dead-lettered on the next attempt (`Prepared::poison`).
    Held {
        /// The held event's id in `projectionist_held`.
        held: i64,
        /// Why it cannot be applied.
        source: Box<EventError>,
    },
}

impl EventError {
    /// The error of the event at `index` of the batch, of `aggregate_type`/`aggregate_id`
    /// at `version`.
    pub fn new(index: usize, (aggregate_type, aggregate_id): (&str, &str), version: i64, kind: EventErrorKind) -> Self {
        EventError { index, aggregate: format!("{aggregate_type}/{aggregate_id}"), version, kind }
    }

    /// What kind of poison it is, as dead letters record it: `data` (it does not decode, or
    /// an upcaster failed), `unknown_type`, `value` (the database refused a value),
    /// `declaration` (a write the tables' declarations forbid), `apply` (the projection's
    /// own `apply` failed), `bound`.
    pub fn reason(&self) -> &'static str {
        match &self.kind {
            EventErrorKind::Decode(_) => "data",
            EventErrorKind::UnknownType { .. } => "unknown_type",
            EventErrorKind::Rejected(_) => "value",
            EventErrorKind::Invalid(_) => "declaration",
            EventErrorKind::Apply { .. } => "apply",
            EventErrorKind::Bound(_) => "bound",
            EventErrorKind::Release(_) => "release",
            EventErrorKind::Held { source, .. } => source.reason(),
        }
    }

    /// The error told without its place in a batch (which means nothing once the batch is
    /// gone): what a dead letter records.
    pub fn of_the_event(&self) -> String {
        let EventError { aggregate, version, .. } = self;
        match &self.kind {
            EventErrorKind::Decode(source) => format!("{aggregate} v{version} does not decode: {source}"),
            EventErrorKind::UnknownType { event_type, known } => {
                format!(
                    "{aggregate} v{version} has type {event_type:?}, none of those the projection handles ({known})"
                )
            }
            EventErrorKind::Invalid(problem) | EventErrorKind::Bound(problem) | EventErrorKind::Release(problem) => {
                format!("{aggregate} v{version}: {problem}")
            }
            EventErrorKind::Rejected(source) => {
                format!("the database refused {aggregate} v{version}: {}", describe(source))
            }
            EventErrorKind::Apply { projection, error } => {
                format!("projection {projection} failed on {aggregate} v{version}: {error}")
            }
            EventErrorKind::Held { source, .. } => source.of_the_event(),
        }
    }

    /// True when writing the batch again may succeed (see [`super::Error::is_retryable`]).
    pub(super) fn is_retryable(&self) -> bool {
        match &self.kind {
            EventErrorKind::Apply { error, .. } => is_retryable_apply(error),
            EventErrorKind::Held { source, .. } => source.is_retryable(),
            _ => false,
        }
    }

    /// True when the failure is the environment's (see [`super::Error::is_environment`]).
    pub(super) fn is_environment(&self) -> bool {
        match &self.kind {
            EventErrorKind::Apply { error, .. } => {
                error.downcast_ref::<sqlx::Error>().is_some_and(is_environment_sqlx)
                    || error.downcast_ref::<super::Error>().is_some_and(super::Error::is_environment)
            }
            EventErrorKind::Held { source, .. } => source.is_environment(),
            _ => false,
        }
    }

    /// True for an event that can never be applied as it is (see [`super::Error::is_poison`]).
    pub(super) fn is_poison(&self) -> bool {
        match &self.kind {
            EventErrorKind::Held { source, .. } => source.is_poison(),
            kind => matches!(kind, EventErrorKind::Decode(_) | EventErrorKind::UnknownType { .. }),
        }
    }
}

impl std::fmt::Display for EventError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let EventError { index, aggregate, version, .. } = self;
        match &self.kind {
            EventErrorKind::Decode(source) => {
                write!(f, "event #{index} of the batch ({aggregate} v{version}) does not decode: {source}")
            }
            EventErrorKind::UnknownType { event_type, known } => write!(
                f,
                "event #{index} of the batch ({aggregate} v{version}) has type {event_type:?}, which the projection \
                 does not handle (on_unknown_type = halt; its types: {known})"
            ),
            EventErrorKind::Invalid(problem) | EventErrorKind::Bound(problem) | EventErrorKind::Release(problem) => {
                write!(f, "event #{index} of the batch ({aggregate} v{version}): {problem}")
            }
            EventErrorKind::Rejected(source) => write!(
                f,
                "the database refused event #{index} of the batch ({aggregate} v{version}): {}",
                describe(source)
            ),
            EventErrorKind::Apply { projection, error } => {
                write!(
                    f,
                    "projection {projection} failed on event #{index} of the batch ({aggregate} v{version}): {error}"
                )
            }
            EventErrorKind::Held { source, .. } => {
                write!(f, "{source} (an event held for its aggregate, drained behind event #{index} of the batch)")
            }
        }
    }
}

impl std::error::Error for EventError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            EventErrorKind::Decode(source) => Some(source),
            EventErrorKind::Rejected(source) => Some(source.as_ref()),
            EventErrorKind::Held { source, .. } => Some(source.as_ref()),
            _ => None,
        }
    }
}
