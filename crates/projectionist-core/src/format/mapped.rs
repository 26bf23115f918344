//! A general mapping: each envelope field from where the producer puts it — the message key,
//! a header, a JSON pointer into the value, or a constant — for topics no named format fits.
//!
//! A source is written as text: `key`, `header:NAME`, `value` (the whole value),
//! `value:/json/pointer`, or `const:TEXT`. A header's value is UTF-8 text; a version is an
//! integer (a JSON number, or text of one).

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

use super::Message;
use crate::envelope::EventId;
use crate::{DecodeError, LazyEnvelope};

/// Where one envelope field is found in a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Source {
    /// The message key.
    Key,
    /// A header's value.
    Header(String),
    /// The whole value (JSON).
    Value,
    /// What a JSON pointer (RFC 6901) finds in the value.
    Pointer(String),
    /// Always this text.
    Const(String),
}

impl TryFrom<String> for Source {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        match text.split_once(':') {
            None if text == "key" => Ok(Self::Key),
            None if text == "value" => Ok(Self::Value),
            Some(("header", name)) if !name.is_empty() => Ok(Self::Header(name.to_owned())),
            Some(("value", pointer)) if pointer.starts_with('/') => Ok(Self::Pointer(pointer.to_owned())),
            Some(("const", text)) => Ok(Self::Const(text.to_owned())),
            _ => Err(format!("{text:?} is not a source: key, header:NAME, value, value:/json/pointer or const:TEXT")),
        }
    }
}

impl From<Source> for String {
    fn from(source: Source) -> String {
        source.to_string()
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Key => f.write_str("key"),
            Self::Header(name) => write!(f, "header:{name}"),
            Self::Value => f.write_str("value"),
            Self::Pointer(pointer) => write!(f, "value:{pointer}"),
            Self::Const(text) => write!(f, "const:{text}"),
        }
    }
}

/// Where each envelope field is found. Every field but `id` is required; without an `id`,
/// the event's id is `TYPE/ID/VERSION` of its aggregate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mapped {
    /// The event's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<Source>,
    /// The aggregate's id.
    pub aggregate_id: Source,
    /// The aggregate's type.
    pub aggregate_type: Source,
    /// The aggregate's version, an integer from 1.
    pub version: Source,
    /// The event type.
    #[serde(rename = "type")]
    pub event_type: Source,
    /// When it occurred (RFC 3339).
    pub occurred_at: Source,
    /// The event's data (JSON).
    #[serde(default = "whole_value")]
    pub data: Source,
}

fn whole_value() -> Source {
    Source::Value
}

impl Mapped {
    /// The envelope `message` carries where this mapping says.
    pub fn read(&self, message: &Message<'_>) -> Result<LazyEnvelope, DecodeError> {
        let value = Parsed::new(message.value);
        let find = |source: &Source, field: &'static str| find(source, field, message, &value);
        let text = |source: &Source, field: &'static str| match find(source, field)? {
            Value::String(s) => Ok(s),
            other => Err(DecodeError::field(field, format!("{source} is not text: {other}"))),
        };
        let aggregate_id = text(&self.aggregate_id, "aggregate_id")?;
        let aggregate_type = text(&self.aggregate_type, "aggregate_type")?;
        let version = match find(&self.version, "version")? {
            Value::Number(n) => n.as_i64(),
            Value::String(s) => s.trim().parse().ok(),
            _ => None,
        }
        .ok_or_else(|| DecodeError::field("version", format!("{} is not an integer", self.version)))?;
        let event_type = text(&self.event_type, "type")?;
        let time = text(&self.occurred_at, "occurred_at")?;
        let occurred_at = DateTime::parse_from_rfc3339(&time)
            .map_err(|e| {
                DecodeError::field("occurred_at", format!("{} is not RFC 3339 ({e}): {time:?}", self.occurred_at))
            })?
            .with_timezone(&Utc);
        let id = match &self.id {
            Some(source) => EventId::text(text(source, "id")?),
            None => EventId::text(format!("{aggregate_type}/{aggregate_id}/{version}")),
        };
        let data = find(&self.data, "data")?;
        let data = serde_json::value::to_raw_value(&data).map_err(|e| DecodeError::field("data", e.to_string()))?;
        let envelope =
            LazyEnvelope { id, aggregate_type, aggregate_id, version, event_type, occurred_at, data, metadata: None };
        envelope.checked()
    }
}

/// The value read as JSON once, when a source asks for it.
struct Parsed<'a> {
    bytes: &'a [u8],
    json: std::cell::OnceCell<Result<Value, String>>,
}

impl<'a> Parsed<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, json: std::cell::OnceCell::new() }
    }

    fn json(&self) -> Result<&Value, String> {
        let parsed = self.json.get_or_init(|| {
            serde_json::from_slice::<&RawValue>(self.bytes)
                .map_err(|e| e.to_string())
                .and_then(|raw| serde_json::from_str(raw.get()).map_err(|e| e.to_string()))
        });
        parsed.as_ref().map_err(Clone::clone)
    }
}

/// What `source` finds for envelope field `field`.
fn find(source: &Source, field: &'static str, message: &Message<'_>, value: &Parsed<'_>) -> Result<Value, DecodeError> {
    let missing = || DecodeError::field(field, format!("missing: looked for in {source}"));
    let utf8 = |bytes: &[u8]| {
        std::str::from_utf8(bytes)
            .map(|s| Value::String(s.to_owned()))
            .map_err(|_| DecodeError::field(field, format!("{source} is not UTF-8")))
    };
    let json = || value.json().map_err(|e| DecodeError::field(field, format!("{source}: the value is not JSON: {e}")));
    match source {
        Source::Key => utf8(message.key.ok_or_else(missing)?),
        Source::Header(name) => utf8(message.header(name).ok_or_else(missing)?),
        Source::Value => json().cloned(),
        Source::Pointer(pointer) => json()?.pointer(pointer).cloned().ok_or_else(missing),
        Source::Const(text) => Ok(Value::String(text.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping() -> Mapped {
        serde_json::from_value(serde_json::json!({
            "id": "header:id",
            "aggregate_id": "key",
            "aggregate_type": "const:order",
            "version": "value:/meta/version",
            "type": "header:eventType",
            "occurred_at": "value:/meta/at",
            "data": "value:/payload",
        }))
        .unwrap()
    }

    fn headers() -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        vec![(b"id".to_vec(), Some(b"e-1".to_vec())), (b"eventType".to_vec(), Some(b"Shipped".to_vec()))]
    }

    const VALUE: &[u8] = br#"{"meta": {"version": 2, "at": "2026-11-21T10:00:00Z"}, "payload": {"carrier": "ups"}}"#;

    #[test]
    fn each_field_comes_from_where_the_mapping_says() {
        let e = mapping().read(&Message { key: Some(b"o-1"), value: VALUE, headers: &headers() }).unwrap();
        assert_eq!(
            (e.id.to_string(), e.aggregate_type.as_str(), e.aggregate_id.as_str()),
            ("e-1".into(), "order", "o-1")
        );
        assert_eq!((e.version, e.event_type.as_str(), e.data.get()), (2, "Shipped", r#"{"carrier":"ups"}"#));
        let text = serde_json::to_value(mapping()).unwrap();
        assert_eq!(text["version"], "value:/meta/version", "written as it is read");
    }

    #[test]
    fn a_field_not_found_is_named_with_where_it_was_looked_for() {
        let err = mapping().read(&Message { key: None, value: VALUE, headers: &headers() }).unwrap_err();
        assert_eq!(err.to_string(), "field `aggregate_id`: missing: looked for in key");
        let err = mapping().read(&Message { key: Some(b"o-1"), value: b"{}", headers: &headers() }).unwrap_err();
        assert_eq!(err.to_string(), "field `version`: missing: looked for in value:/meta/version");
        let err = mapping().read(&Message { key: Some(b"o-1"), value: b"nope", headers: &headers() }).unwrap_err();
        assert!(err.to_string().contains("the value is not JSON"), "{err}");
        let bad = serde_json::from_value::<Mapped>(serde_json::json!({
            "aggregate_id": "keys", "aggregate_type": "const:a", "version": "key", "type": "key", "occurred_at": "key"
        }));
        assert!(bad.unwrap_err().to_string().contains("is not a source"));
    }
}
