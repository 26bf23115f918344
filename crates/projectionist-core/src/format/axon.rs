//! Axon Framework's Kafka messages, as its Kafka extension writes them
//! (`DefaultKafkaMessageConverter`): the serialized payload as the value, everything else in
//! `axon-message-*` headers. Text headers are UTF-8; `axon-message-aggregate-seq` and
//! `axon-message-timestamp` are 8-byte big-endian integers (the sequence, from 0; epoch
//! milliseconds). The payload must be JSON (Axon's `JacksonSerializer`; its default XStream
//! writes XML).
//!
//! Axon counts an aggregate's events from 0, projectionist from 1: the version is the
//! sequence plus one. `axon-message-type` is the payload's class name; the event type is its
//! simple name (`MoneyDeposited` of `com.example.MoneyDeposited`) unless told otherwise.
//! `axon-metadata-*` headers and the revision are kept in the envelope's `metadata`.

use chrono::DateTime;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::Message;
use crate::envelope::EventId;
use crate::{DecodeError, LazyEnvelope};

/// How an Axon message's payload type names the event type.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AxonType {
    /// The class's simple name: what follows the last `.` or `$`.
    #[default]
    Simple,
    /// The class name as written.
    Full,
}

/// Axon's messages, and how their payload type names the event type.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Axon {
    /// How `axon-message-type` names the event type.
    pub event_type: AxonType,
}

const PREFIX: &str = "axon-message-";
const METADATA: &str = "axon-metadata-";

impl Axon {
    /// The envelope an Axon message carries.
    pub fn read(&self, message: &Message<'_>) -> Result<LazyEnvelope, DecodeError> {
        let id = text(message, "id", "id")?;
        let class = text(message, "type", "type")?;
        let event_type = match self.event_type {
            AxonType::Simple => class.rsplit(['.', '$']).next().unwrap_or(&class).to_owned(),
            AxonType::Full => class.clone(),
        };
        let millis = long(message, "timestamp", "occurred_at")?;
        let occurred_at = DateTime::from_timestamp_millis(millis).ok_or_else(|| {
            DecodeError::field("occurred_at", format!("the header {PREFIX}timestamp is out of range: {millis}"))
        })?;
        let aggregate_id = text(message, "aggregate-id", "aggregate_id")?;
        let aggregate_type = text(message, "aggregate-type", "aggregate_type")?;
        let sequence = long(message, "aggregate-seq", "version")?;
        let version =
            sequence.checked_add(1).ok_or_else(|| DecodeError::field("version", "the sequence is too large"))?;
        let mut metadata = Map::new();
        metadata.insert("type".into(), Value::String(class));
        if let Some(revision) = message.header(&format!("{PREFIX}revision")) {
            metadata.insert("revision".into(), Value::String(String::from_utf8_lossy(revision).into_owned()));
        }
        for (name, value) in message.headers {
            let Some(key) = name.strip_prefix(METADATA.as_bytes()) else { continue };
            let key = String::from_utf8_lossy(key).into_owned();
            let value =
                value.as_deref().map_or(Value::Null, |v| Value::String(String::from_utf8_lossy(v).into_owned()));
            metadata.insert(key, value);
        }
        let data = payload(message.value)?;
        let id = EventId::text(id);
        let metadata = Some(Value::Object(metadata));
        let envelope =
            LazyEnvelope { id, aggregate_type, aggregate_id, version, event_type, occurred_at, data, metadata };
        envelope.checked()
    }
}

/// The text header `axon-message-<name>`, for envelope field `field`.
fn text(message: &Message<'_>, name: &str, field: &'static str) -> Result<String, DecodeError> {
    let bytes = message.header(&format!("{PREFIX}{name}")).ok_or_else(|| missing(field, name))?;
    String::from_utf8(bytes.to_vec())
        .map_err(|_| DecodeError::field(field, format!("the header {PREFIX}{name} is not UTF-8")))
}

/// The 8-byte big-endian integer header `axon-message-<name>`, for envelope field `field`.
fn long(message: &Message<'_>, name: &str, field: &'static str) -> Result<i64, DecodeError> {
    let bytes = message.header(&format!("{PREFIX}{name}")).ok_or_else(|| missing(field, name))?;
    let bytes: [u8; 8] = bytes.try_into().map_err(|_| {
        let problem = format!("the header {PREFIX}{name} is {} bytes, not an 8-byte integer", bytes.len());
        DecodeError::field(field, problem)
    })?;
    Ok(i64::from_be_bytes(bytes))
}

fn missing(field: &'static str, name: &str) -> DecodeError {
    DecodeError::field(field, format!("missing: looked for in the header {PREFIX}{name}"))
}

/// The payload as JSON text.
fn payload(value: &[u8]) -> Result<Box<RawValue>, DecodeError> {
    let text = std::str::from_utf8(value).map_err(|_| DecodeError::field("data", "the payload is not UTF-8 JSON"))?;
    serde_json::from_str(text).map_err(|e| {
        let hint = if text.trim_start().starts_with('<') {
            " (XML: Axon's XStream serializer; use its JacksonSerializer)"
        } else {
            ""
        };
        DecodeError::field("data", format!("the payload is not JSON{hint}: {e}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(seq: &[u8]) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        let text = |n: &str, v: &str| (n.as_bytes().to_vec(), Some(v.as_bytes().to_vec()));
        vec![
            text("axon-message-id", "5b1f0d2e-0000-4000-8000-000000000001"),
            text("axon-message-type", "com.example.bank.MoneyDeposited"),
            (b"axon-message-revision".to_vec(), None),
            (b"axon-message-timestamp".to_vec(), Some(1_795_000_000_000i64.to_be_bytes().to_vec())),
            text("axon-message-aggregate-id", "acc-1"),
            text("axon-message-aggregate-type", "account"),
            (b"axon-message-aggregate-seq".to_vec(), Some(seq.to_vec())),
            text("axon-metadata-traceId", "t-9"),
        ]
    }

    fn read(value: &[u8], headers: &[(Vec<u8>, Option<Vec<u8>>)]) -> Result<LazyEnvelope, DecodeError> {
        Axon::default().read(&Message { key: Some(b"acc-1"), value, headers })
    }

    #[test]
    fn a_message_reads_from_axons_headers_its_sequence_counted_from_one() {
        let e = read(br#"{"amount":5}"#, &headers(&0i64.to_be_bytes())).unwrap();
        assert_eq!((e.aggregate_type.as_str(), e.aggregate_id.as_str(), e.version), ("account", "acc-1", 1));
        assert_eq!((e.event_type.as_str(), e.data.get()), ("MoneyDeposited", r#"{"amount":5}"#));
        assert_eq!(e.occurred_at.timestamp_millis(), 1_795_000_000_000);
        assert_eq!(e.id.to_string(), "5b1f0d2e-0000-4000-8000-000000000001");
        let metadata = e.metadata.unwrap();
        assert_eq!(
            (metadata["traceId"].as_str(), metadata["type"].as_str()),
            (Some("t-9"), Some("com.example.bank.MoneyDeposited"))
        );
        let full = Axon { event_type: AxonType::Full };
        let e = full.read(&Message { key: None, value: b"{}", headers: &headers(&4i64.to_be_bytes()) }).unwrap();
        assert_eq!((e.event_type.as_str(), e.version), ("com.example.bank.MoneyDeposited", 5));
    }

    #[test]
    fn what_does_not_fit_is_named_with_the_header_it_was_looked_for_in() {
        let err = read(b"{}", &headers(b"12")).unwrap_err().to_string();
        assert_eq!(err, "field `version`: the header axon-message-aggregate-seq is 2 bytes, not an 8-byte integer");
        let mut without = headers(&0i64.to_be_bytes());
        without.retain(|(n, _)| n != b"axon-message-aggregate-id");
        let err = read(b"{}", &without).unwrap_err().to_string();
        assert_eq!(err, "field `aggregate_id`: missing: looked for in the header axon-message-aggregate-id");
        let err = read(b"<com.example.MoneyDeposited/>", &headers(&0i64.to_be_bytes())).unwrap_err().to_string();
        assert!(err.contains("XStream"), "{err}");
        assert!(read(b"{}", &headers(&i64::MAX.to_be_bytes())).is_err(), "a sequence past the last version");
    }
}
