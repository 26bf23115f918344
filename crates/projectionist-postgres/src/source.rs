//! Where a batch was read and its messages as they arrived: what parking holds and dead
//! letters keep. Leaf types, shared by a prepared batch and parking.

/// Where a batch was read, and each of its messages as it arrived: what the events held for
/// a parked aggregate are stored as.
#[derive(Debug, Clone, Default)]
pub struct Source {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// One per envelope of the batch, in the same order.
    pub messages: Vec<SourceMessage>,
    /// The batch's messages that are not an envelope at all (or whose key contradicts it):
    /// dead-lettered alone, with no aggregate parked.
    pub undecodable: Vec<Undecodable>,
}

/// A message of a batch that is not an envelope: dead-lettered alone.
#[derive(Debug, Clone)]
pub struct Undecodable {
    /// The message.
    pub message: SourceMessage,
    /// What kind: `envelope`, `key`, `tombstone`.
    pub reason: &'static str,
    /// Why, in full.
    pub error: String,
}

/// A message's headers as read: names and values as bytes (a name need not be UTF-8 on the
/// wire), a header without a value (null) kept apart from an empty one.
pub type Headers = Vec<(Vec<u8>, Option<Vec<u8>>)>;

/// One message of a [`Source`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourceMessage {
    /// Its offset (`None`: not read from Kafka).
    pub offset: Option<i64>,
    /// Its key, as read.
    pub key: Option<Vec<u8>>,
    /// Its payload, as read.
    pub payload: Vec<u8>,
    /// Its headers, as read (a header without a value: `None`, not empty).
    pub headers: Headers,
}
