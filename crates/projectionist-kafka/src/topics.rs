//! Topic administration and broker positions.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaErrorCode;

use crate::{Error, KafkaClientConfig, Result};

/// Creates `topics` with `partitions` partitions through the admin API; topics that exist
/// already are left as they are. Returns the topics created. `client` is a
/// [`KafkaClientConfig`] (security settings included) or bare brokers.
pub async fn create_topics(
    client: impl Into<KafkaClientConfig>,
    topics: &[&str],
    partitions: i32,
    replication: i32,
) -> Result<Vec<String>> {
    let admin: AdminClient<DefaultClientContext> = client.into().client_config().create()?;
    let new: Vec<NewTopic<'_>> =
        topics.iter().map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(replication))).collect();
    let results =
        admin.create_topics(&new, &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)))).await?;
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

/// The partitions of `topic`, from the broker's metadata.
pub fn partitions(client: impl Into<KafkaClientConfig>, topic: &str) -> Result<Vec<i32>> {
    let consumer: BaseConsumer = client.into().client_config().create()?;
    partitions_of(&consumer, topic)
}

/// The partitions of `topic`, from the metadata `consumer`'s client fetches.
pub(crate) fn partitions_of<C: rdkafka::consumer::ConsumerContext>(
    consumer: &impl Consumer<C>,
    topic: &str,
) -> Result<Vec<i32>> {
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let mut out = Vec::new();
    for t in metadata.topics() {
        match t.error() {
            None => {}
            Some(rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) => {
                return Err(Error::NoSuchTopic(topic.to_owned()))
            }
            Some(err) => return Err(Error::Config(format!("topic {topic}: {err:?}"))),
        }
        out.extend(t.partitions().iter().map(|p| p.id()));
    }
    out.sort_unstable();
    Ok(out)
}

/// Low and high watermark of every partition of `topic`.
pub fn watermarks(client: impl Into<KafkaClientConfig>, topic: &str) -> Result<Vec<(i32, i64, i64)>> {
    let consumer: BaseConsumer = client.into().client_config().create()?;
    let mut out = Vec::new();
    for partition in partitions_of(&consumer, topic)? {
        let (low, high) = consumer.fetch_watermarks(topic, partition, Duration::from_secs(10))?;
        out.push((partition, low, high));
    }
    Ok(out)
}
