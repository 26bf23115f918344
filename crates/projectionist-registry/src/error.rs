//! What can go wrong, in three classes: the registry is unavailable (wait), the message does
//! not fit (a dead letter), or the setup is wrong.

/// This crate's error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The registry did not answer, or not as a registry does (refused, timed out, 5xx, 429,
    /// 401/403, a 404 without a registry's error code). Wait and try again.
    #[error("the schema registry at {url} is unavailable: {reason}")]
    Unavailable {
        /// The registry's URL, without credentials.
        url: String,
        /// What happened.
        reason: String,
    },
    /// The registry does not know the message's schema id (404, error code 40403).
    #[error("schema id {id} is not in the registry at {url}")]
    UnknownSchema {
        /// The schema id the message names.
        id: u32,
        /// The registry's URL, without credentials.
        url: String,
    },
    /// The registry's schema cannot be used: it does not parse or compile, or a reference of
    /// it is missing.
    #[error("schema id {id} cannot be used: {reason}")]
    BadSchema {
        /// The schema id.
        id: u32,
        /// Why.
        reason: String,
    },
    /// The message's bytes do not decode with its schema.
    #[error("the bytes do not fit schema id {id}: {reason}")]
    DoesNotFit {
        /// The schema id the message names.
        id: u32,
        /// Where decoding stopped (a field or message name, as far as the decoder tells) and why.
        reason: String,
    },
    /// The bytes are not in Confluent's wire format (magic byte 0, a 4-byte schema id).
    #[error("not in Confluent's wire format: {0}")]
    NotWireFormat(String),
    /// [`crate::Registry::decode`] met a schema id that [`crate::Registry::prepare`] was not
    /// given: a bug in the caller.
    #[error("schema id {id} was not prepared: call Registry::prepare with it before decoding")]
    NotPrepared {
        /// The schema id.
        id: u32,
    },
    /// A subject (a reader's schema, a reference) the registry does not have.
    #[error("subject {subject} version {version} is not in the registry at {url}")]
    UnknownSubject {
        /// The subject.
        subject: String,
        /// The version asked for (`latest` or a number).
        version: String,
        /// The registry's URL, without credentials.
        url: String,
    },
    /// The settings cannot be used (a CA file that does not read, a URL that does not parse).
    #[error("schema registry settings: {0}")]
    Config(String),
}

impl Error {
    /// Whether the environment is at fault: wait it out and try again, as for a database
    /// outage; never a dead letter.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
    }

    /// Whether the message is at fault: a dead letter, read again by a later retry.
    pub fn is_dead_letter(&self) -> bool {
        matches!(
            self,
            Self::UnknownSchema { .. } | Self::BadSchema { .. } | Self::DoesNotFit { .. } | Self::NotWireFormat(_)
        )
    }
}

/// This crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        let unavailable = Error::Unavailable { url: "u".into(), reason: "refused".into() };
        assert!(unavailable.is_retryable() && !unavailable.is_dead_letter());
        let unknown = Error::UnknownSchema { id: 42, url: "http://r".into() };
        assert!(unknown.is_dead_letter() && !unknown.is_retryable());
        assert_eq!(unknown.to_string(), "schema id 42 is not in the registry at http://r");
        let bug = Error::NotPrepared { id: 1 };
        assert!(!bug.is_dead_letter() && !bug.is_retryable());
    }
}
