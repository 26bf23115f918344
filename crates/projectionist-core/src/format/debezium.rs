//! Debezium's outbox event router (`io.debezium.transforms.outbox.EventRouter`), as it writes
//! by default: the outbox row's `aggregateid` as the key, its `id` in the header `id`, its
//! `payload` as the value. Every other field is where the router's
//! `table.fields.additional.placement` puts it; the defaults here are headers:
//!
//! ```text
//! table.fields.additional.placement=type:header:eventType,aggregatetype:header:aggregateType,version:header:version,occurred_at:header:occurredAt
//! ```
//!
//! The outbox table has no version column by default: add one (`version bigint not null`)
//! and place it. A key or value written by Kafka Connect's `JsonConverter` is read too: a key
//! that is a JSON string is unquoted, and a value that is a JSON string holding a JSON object
//! or array is read as that object or array.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use super::{Mapped, Message, Source};
use crate::{DecodeError, LazyEnvelope};

/// Where each envelope field is in a message the outbox event router wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Debezium {
    /// The event's id (the router's header `id`).
    pub id: Source,
    /// The aggregate's id (the router's key: the row's `aggregateid`).
    pub aggregate_id: Source,
    /// The aggregate's type.
    pub aggregate_type: Source,
    /// The aggregate's version, an integer from 1 (a column the outbox does not have by default).
    pub version: Source,
    /// The event type.
    #[serde(rename = "type")]
    pub event_type: Source,
    /// When it occurred (RFC 3339: a `timestamptz` column, as Debezium writes it).
    pub occurred_at: Source,
    /// The event's data (the router's value: the row's `payload`).
    pub data: Source,
}

impl Default for Debezium {
    fn default() -> Self {
        let header = |name: &str| Source::Header(name.into());
        Self {
            id: header("id"),
            aggregate_id: Source::Key,
            aggregate_type: header("aggregateType"),
            version: header("version"),
            event_type: header("eventType"),
            occurred_at: header("occurredAt"),
            data: Source::Value,
        }
    }
}

impl Debezium {
    /// The envelope an outbox event carries.
    pub fn read(&self, message: &Message<'_>) -> Result<LazyEnvelope, DecodeError> {
        let mapped = Mapped {
            id: Some(self.id.clone()),
            aggregate_id: self.aggregate_id.clone(),
            aggregate_type: self.aggregate_type.clone(),
            version: self.version.clone(),
            event_type: self.event_type.clone(),
            occurred_at: self.occurred_at.clone(),
            data: self.data.clone(),
        };
        let key = message.key.map(unquoted);
        let value = unwrapped(message.value);
        let message = Message { key: key.as_deref(), value: value.as_deref().unwrap_or(message.value), ..*message };
        mapped.read(&message).map_err(|e| match e {
            DecodeError::Field { field: "version", problem } if problem.starts_with("missing") => {
                DecodeError::field("version", format!("{problem} ({VERSION_HINT})"))
            }
            e => e,
        })
    }
}

const VERSION_HINT: &str = "the outbox table has no version column by default: add one \
                            (`version bigint not null`) and place it with the router's \
                            table.fields.additional.placement=version:header:version";

/// A key `JsonConverter` wrote as a JSON string, unquoted; any other key as it is.
pub(crate) fn unquoted(key: &[u8]) -> Cow<'_, [u8]> {
    match serde_json::from_slice::<String>(key) {
        Ok(text) if key.first() == Some(&b'"') => Cow::Owned(text.into_bytes()),
        _ => Cow::Borrowed(key),
    }
}

/// A value `JsonConverter` wrote as a JSON string holding a JSON object or array: that object
/// or array. `None` for any other value (read as it is).
fn unwrapped(value: &[u8]) -> Option<Vec<u8>> {
    if value.first() != Some(&b'"') {
        return None;
    }
    let text: String = serde_json::from_slice(value).ok()?;
    let inner = text.trim_start();
    (inner.starts_with('{') || inner.starts_with('[')).then(|| text.into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(version: Option<&str>) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        let mut headers = vec![
            (b"id".to_vec(), Some(b"5f0c6a44-52a4-4b0e-9c4e-2f1f4f0a6d11".to_vec())),
            (b"eventType".to_vec(), Some(b"Deposited".to_vec())),
            (b"aggregateType".to_vec(), Some(b"account".to_vec())),
            (b"occurredAt".to_vec(), Some(b"2026-12-06T07:10:00.123456Z".to_vec())),
        ];
        headers.extend(version.map(|v| (b"version".to_vec(), Some(v.as_bytes().to_vec()))));
        headers
    }

    #[test]
    fn the_routers_default_shape_is_read() {
        let headers = headers(Some("3"));
        let message = Message { key: Some(b"acc-1"), value: br#"{"amount": 5}"#, headers: &headers };
        let e = Debezium::default().read(&message).unwrap();
        assert_eq!((e.aggregate_type.as_str(), e.aggregate_id.as_str(), e.version), ("account", "acc-1", 3));
        assert_eq!((e.event_type.as_str(), e.data.get()), ("Deposited", r#"{"amount":5}"#));
        assert_eq!(e.id.to_string(), "5f0c6a44-52a4-4b0e-9c4e-2f1f4f0a6d11");
        assert_eq!(e.occurred_at.to_rfc3339(), "2026-12-06T07:10:00.123456+00:00");
    }

    #[test]
    fn json_converters_quoted_key_and_string_payload_are_read_as_what_they_hold() {
        let headers = headers(Some("1"));
        let value = br#""{\"amount\": 5}""#;
        let e = Debezium::default().read(&Message { key: Some(br#""acc-1""#), value, headers: &headers }).unwrap();
        assert_eq!((e.aggregate_id.as_str(), e.data.get()), ("acc-1", r#"{"amount":5}"#));
        let text = br#""just text""#;
        let e = Debezium::default().read(&Message { key: Some(b"acc-1"), value: text, headers: &headers }).unwrap();
        assert_eq!(e.data.get(), r#""just text""#, "a string that holds no object stays a string");
    }

    #[test]
    fn an_event_without_a_version_names_where_it_was_looked_for_and_how_to_add_one() {
        let headers = headers(None);
        let message = Message { key: Some(b"acc-1"), value: b"{}", headers: &headers };
        let err = Debezium::default().read(&message).unwrap_err().to_string();
        assert!(err.starts_with("field `version`: missing: looked for in header:version"), "{err}");
        assert!(err.contains("table.fields.additional.placement=version:header:version"), "{err}");
    }

    #[test]
    fn a_placement_of_its_own_is_configured_per_field() {
        let debezium: Debezium =
            serde_json::from_value(serde_json::json!({ "type": "header:type", "aggregate_type": "const:account" }))
                .unwrap();
        assert_eq!(
            (debezium.event_type, debezium.aggregate_type),
            (Source::Header("type".into()), Source::Const("account".into()))
        );
        assert_eq!(debezium.version, Source::Header("version".into()), "the rest keep their defaults");
    }
}
