//! The Kafka runtime's errors.

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What stops the engine or one of its partitions.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The Kafka client failed.
    #[error("kafka error: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// The Postgres side failed.
    #[error(transparent)]
    Postgres(#[from] projectionist_postgres::Error),
    /// A partition was stopped: an event could not be decoded, left a gap, or failed to
    /// apply after bounded retries. Nothing at or after `offset` was applied or committed.
    #[error(
        "partition halted: {topic}/{partition}@{offset} in projection {projection}, aggregate {aggregate}: {reason}"
    )]
    Halted {
        /// Projection name.
        projection: String,
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Offset of the event that stopped it.
        offset: i64,
        /// Aggregate id (the message key when the envelope is unreadable), or `?`.
        aggregate: String,
        /// Why.
        reason: String,
    },
    /// No Kafka broker could be reached; `failure` names the part (TLS handshake,
    /// certificate, authentication, …), `detail` is librdkafka's reason without secrets.
    #[error("cannot connect to Kafka at {brokers}: {failure}: {detail}")]
    Connect {
        /// Bootstrap servers, user info redacted.
        brokers: String,
        /// Which part failed.
        failure: crate::client::ConnectFailure,
        /// librdkafka's last reported error.
        detail: String,
    },
    /// A topic the command needs does not exist on the brokers.
    #[error("topic {0} does not exist (`create-topics` creates the registered projections' topics)")]
    NoSuchTopic(String),
    /// A configuration problem.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A projection's task ended abnormally (a panic in projection code).
    #[error("projection task failed: {0}")]
    Task(String),
}

impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        Self::Postgres(e.into())
    }
}
