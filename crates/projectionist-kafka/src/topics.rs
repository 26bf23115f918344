//! Topic administration and broker positions.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaErrorCode;

use crate::{Error, Result};

/// Creates `topics` with `partitions` partitions through the admin API; topics that exist
/// already are left as they are. Returns the topics created.
pub async fn create_topics(brokers: &str, topics: &[&str], partitions: i32, replication: i32) -> Result<Vec<String>> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new().set("bootstrap.servers", brokers).create()?;
    let new: Vec<NewTopic<'_>> = topics.iter().map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(replication))).collect();
    let results = admin.create_topics(&new, &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)))).await?;
    let mut created = Vec::new();
    for result in results {
        match result {
            Ok(topic) => created.push(topic),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => return Err(Error::Config(format!("cannot create topic {topic}: {code}"))),
        }
    }
    Ok(created)
}

/// Low and high watermark of every partition of `topic`.
pub fn watermarks(brokers: &str, topic: &str) -> Result<Vec<(i32, i64, i64)>> {
    let consumer: BaseConsumer = ClientConfig::new().set("bootstrap.servers", brokers).create()?;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let mut out = Vec::new();
    for t in metadata.topics() {
        if let Some(err) = t.error() {
            return Err(Error::Config(format!("topic {topic}: {err:?}")));
        }
        for p in t.partitions() {
            let (low, high) = consumer.fetch_watermarks(topic, p.id(), Duration::from_secs(10))?;
            out.push((p.id(), low, high));
        }
    }
    out.sort();
    Ok(out)
}
