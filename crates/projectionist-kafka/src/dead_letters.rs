//! The dead-letter topic: each dead letter also produced to a Kafka topic, as Kafka
//! Connect's does, once the batch that kept it has committed — the message's own key, payload
//! and headers, with where it was read and why it failed in `projectionist.*` headers.
//! PostgreSQL's `projectionist_dead_letters` stays the record (retry and discard work from
//! it); the topic is a copy for other tools. A failure to produce is logged, never halts.

use std::sync::Arc;
use std::time::Duration;

use projectionist_postgres::park::StoredDeadLetter;
use projectionist_postgres::PgPool;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use crate::{EngineConfig, Error, Result};

/// Where dead letters are produced.
pub(crate) struct DeadLetterTopic {
    topic: String,
    producer: FutureProducer,
}

impl DeadLetterTopic {
    /// The topic `config` names, with its producer; `None` when it names none.
    pub(crate) fn from_config(config: &EngineConfig) -> Result<Option<Arc<Self>>> {
        let Some(topic) = config.dead_letter_topic.clone() else { return Ok(None) };
        let producer = config
            .client
            .client_config_with_defaults(&[("linger.ms", "5")])
            .set("enable.idempotence", "true")
            .create()
            .map_err(|e| Error::Config(format!("cannot create the dead-letter topic's producer: {e}")))?;
        Ok(Some(Arc::new(Self { topic, producer })))
    }

    /// Produces dead letters `ids` (their batch committed), waiting for the broker's
    /// acknowledgement (at most 30 s each); a failure is logged.
    pub(crate) async fn send(&self, pool: &PgPool, ids: &[i64]) {
        let letters = match projectionist_postgres::park::dead_letters_by_id(pool, ids).await {
            Ok(letters) => letters,
            Err(e) => {
                tracing::warn!(error = %e, topic = %self.topic, "Cannot read dead letters to produce them.");
                return;
            }
        };
        for d in letters {
            if let Err(e) = self.produce(&d).await {
                tracing::warn!(error = %e, topic = %self.topic, id = d.id, "Cannot produce a dead letter.");
            }
        }
    }

    async fn produce(&self, d: &StoredDeadLetter) -> std::result::Result<(), rdkafka::error::KafkaError> {
        let mut headers = OwnedHeaders::new();
        // rdkafka's producer takes a header name as text: one that is not UTF-8 goes out
        // made readable (PostgreSQL's record keeps its bytes).
        for (name, value) in d.header_names.iter().zip(&d.header_values) {
            let key = String::from_utf8_lossy(name);
            headers = headers.insert(Header { key: &key, value: value.as_deref() });
        }
        let (partition, offset, id) = (d.partition.to_string(), d.offset.map(|o| o.to_string()), d.id.to_string());
        // A payload stored as its head goes out as its head, saying so.
        let full_bytes = d.payload_bytes.map(|n| n.to_string());
        let sha256: Option<String> = d.payload_sha256.as_ref().map(|h| h.iter().map(|b| format!("{b:02x}")).collect());
        let ours = [
            ("projectionist.projection", Some(d.projection.as_str())),
            ("projectionist.topic", Some(d.topic.as_str())),
            ("projectionist.partition", Some(partition.as_str())),
            ("projectionist.offset", offset.as_deref()),
            ("projectionist.dead_letter_id", Some(id.as_str())),
            ("projectionist.reason", Some(d.reason.as_str())),
            ("projectionist.error", Some(d.error.as_str())),
        ];
        let truncated = [
            ("projectionist.payload_bytes", full_bytes.as_deref()),
            ("projectionist.payload_sha256", sha256.as_deref()),
        ];
        for (key, value) in ours.into_iter().chain(truncated.into_iter().filter(|(_, v)| v.is_some())) {
            headers = headers.insert(Header { key, value });
        }
        let mut record = FutureRecord::<[u8], [u8]>::to(&self.topic).payload(&d.payload).headers(headers);
        if let Some(key) = &d.key {
            record = record.key(key);
        }
        self.producer.send(record, Duration::from_secs(30)).await.map(|_| ()).map_err(|(e, _)| e)
    }
}
