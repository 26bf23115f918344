//! The keys the engine's parts share: a topic and partition, and the wall clock its
//! progress is stamped with. A leaf: it uses no other module of the crate.

/// A topic and partition.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Tp {
    pub topic: String,
    pub partition: i32,
}

impl Tp {
    pub(crate) fn new(topic: impl Into<String>, partition: i32) -> Self {
        Self { topic: topic.into(), partition }
    }
}

/// Milliseconds since the Unix epoch, as Kafka stamps messages.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}
