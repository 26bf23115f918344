//! Errors a projection author meets: decoding envelopes and applying events.

use std::fmt;

/// An envelope that cannot be decoded. A poison message: retrying cannot fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The bytes are not JSON.
    #[error("invalid JSON: {0}")]
    Json(String),
    /// The JSON is not an object.
    #[error("envelope must be a JSON object, got {0}")]
    NotAnObject(&'static str),
    /// An envelope field is missing or invalid.
    #[error("field `{field}`: {problem}")]
    Field {
        /// The envelope field, e.g. `version`.
        field: &'static str,
        /// What is wrong with it, e.g. `must be >= 1, got 0`.
        problem: String,
    },
    /// An upcaster could not read the event's data (see [`Upcaster`](crate::Upcaster)).
    #[error("upcasting event type {event_type} from schema version {schema_version}: {reason}")]
    Upcast {
        /// The event type the upcaster reads.
        event_type: String,
        /// The schema version it reads.
        schema_version: u32,
        /// Why it failed, in the upcaster's words.
        reason: String,
    },
    /// A key or value in Confluent's wire format whose schema is not fetched yet. Not poison:
    /// the engine fetches the schema (waiting out the registry) and reads the message again.
    #[error("schema id {id} is not fetched yet")]
    SchemaPending {
        /// The schema id the message names.
        id: u32,
    },
    /// A key or value in Confluent's wire format that the registry has no schema for, or that
    /// does not fit its schema.
    #[error("schema id {id}: {problem}")]
    Schema {
        /// The schema id the message names.
        id: u32,
        /// What is wrong, naming the field where the decoder says.
        problem: String,
    },
    /// The event type is one the projection handles but its `data` does not fit.
    #[error("field `{field}` of event type {event_type}: {reason}")]
    Data {
        /// The event type on the wire.
        event_type: String,
        /// Where in the envelope the data does not fit: `data`, or the path inside it
        /// (`data.qty`, `data.lines[2].sku`).
        field: String,
        /// Why the data does not decode.
        reason: String,
    },
}

impl DecodeError {
    pub(crate) fn field(field: &'static str, problem: impl Into<String>) -> Self {
        Self::Field { field, problem: problem.into() }
    }

    pub(crate) fn missing(field: &'static str) -> Self {
        Self::field(field, "missing")
    }
}

/// The error a [`Projection`](crate::Projection) returns when it cannot apply an event.
///
/// Any `std::error::Error` converts into it with `?`, so authors write `sqlx` calls as
/// usual; the engine looks inside (e.g. for a SQLSTATE) to decide whether to retry.
pub struct ApplyError(Box<dyn std::error::Error + Send + Sync + 'static>);

impl ApplyError {
    /// Wraps a message as an error (for projection-level rule violations).
    pub fn msg(message: impl fmt::Display) -> Self {
        Self(message.to_string().into())
    }

    /// The underlying error.
    pub fn inner(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }

    /// Downcasts to the underlying error type, if it is `T`.
    pub fn downcast_ref<T: std::error::Error + 'static>(&self) -> Option<&T> {
        self.0.downcast_ref::<T>()
    }

    /// Unwraps the boxed error.
    pub fn into_inner(self) -> Box<dyn std::error::Error + Send + Sync + 'static> {
        self.0
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for ApplyError {
    fn from(e: E) -> Self {
        Self(Box::new(e))
    }
}

impl fmt::Debug for ApplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for ApplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)?;
        let mut source = self.0.source();
        while let Some(s) = source {
            write!(f, ": {s}")?;
            source = s.source();
        }
        Ok(())
    }
}
