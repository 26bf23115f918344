//! CloudEvents 1.0 through its Kafka protocol binding, in both modes: structured (the event
//! as JSON in the value, `content-type: application/cloudevents+json`) and binary (each
//! attribute in a `ce_` header, the data as the value, its type in `content-type`).
//!
//! CloudEvents has no aggregate or version of its own: they come from attributes the
//! producer sets, named in [`CloudEvents`] (by default `subject`, `aggregatetype` and
//! `sequence`). `type` is the event type, `time` when it occurred, `id` its id (kept as
//! given: CloudEvents allows any string); every other attribute is kept in the envelope's
//! `metadata`.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::Message;
use crate::envelope::EventId;
use crate::{DecodeError, LazyEnvelope};

/// Which CloudEvents attributes carry the envelope's fields that CloudEvents has no name for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CloudEvents {
    /// The attribute holding the aggregate's id (`subject`); without it, the message key.
    pub aggregate_id: String,
    /// The attribute holding the aggregate's type (`aggregatetype`).
    pub aggregate_type: String,
    /// The attribute holding the aggregate's version, an integer from 1 (`sequence`).
    pub version: String,
}

impl Default for CloudEvents {
    fn default() -> Self {
        Self { aggregate_id: "subject".into(), aggregate_type: "aggregatetype".into(), version: "sequence".into() }
    }
}

/// The attributes CloudEvents names itself; every other one is an extension.
const DATA: [&str; 2] = ["data", "data_base64"];

impl CloudEvents {
    /// The envelope a CloudEvent carries, in either mode.
    pub fn read(&self, message: &Message<'_>) -> Result<LazyEnvelope, DecodeError> {
        let content_type = message.header("content-type").map(String::from_utf8_lossy);
        let (attributes, data) = if content_type.as_deref().is_some_and(|c| c.starts_with("application/cloudevents")) {
            structured(message.value)?
        } else if message.header("ce_specversion").is_some() {
            binary(message, content_type.as_deref())?
        } else {
            return Err(DecodeError::Json(
                "not a CloudEvent: no content-type application/cloudevents+json (structured mode) and no \
                 ce_specversion header (binary mode)"
                    .into(),
            ));
        };
        self.envelope(attributes, data, message.key)
    }

    fn envelope(
        &self,
        mut attributes: Map<String, Value>,
        data: Box<RawValue>,
        key: Option<&[u8]>,
    ) -> Result<LazyEnvelope, DecodeError> {
        let text = |attributes: &mut Map<String, Value>, name: &str, field: &'static str| match attributes.remove(name)
        {
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(DecodeError::field(field, format!("the attribute {name} is not a string: {other}"))),
            None => Ok(None),
        };
        let missing = |field: &'static str, name: &str| {
            DecodeError::field(field, format!("missing: looked for in the CloudEvents attribute {name}"))
        };
        let id = text(&mut attributes, "id", "id")?.ok_or_else(|| missing("id", "id"))?;
        let event_type = text(&mut attributes, "type", "type")?.ok_or_else(|| missing("type", "type"))?;
        let time = text(&mut attributes, "time", "occurred_at")?.ok_or_else(|| missing("occurred_at", "time"))?;
        let occurred_at = DateTime::parse_from_rfc3339(&time)
            .map_err(|e| {
                DecodeError::field("occurred_at", format!("the attribute time is not RFC 3339 ({e}): {time:?}"))
            })?
            .with_timezone(&Utc);
        let aggregate_id = match text(&mut attributes, &self.aggregate_id, "aggregate_id")? {
            Some(id) => id,
            None => key.and_then(|k| std::str::from_utf8(k).ok()).map(str::to_owned).ok_or_else(|| {
                let name = &self.aggregate_id;
                DecodeError::field(
                    "aggregate_id",
                    format!("missing: looked for in the CloudEvents attribute {name} and in the message key"),
                )
            })?,
        };
        let aggregate_type = text(&mut attributes, &self.aggregate_type, "aggregate_type")?
            .ok_or_else(|| missing("aggregate_type", &self.aggregate_type))?;
        let version = version(attributes.remove(&self.version), &self.version)?;
        let metadata = Some(Value::Object(attributes));
        let id = EventId::text(id);
        let envelope =
            LazyEnvelope { id, aggregate_type, aggregate_id, version, event_type, occurred_at, data, metadata };
        envelope.checked()
    }
}

/// The version an attribute holds: an integer, or a string of one (extensions travel as
/// strings in binary mode).
fn version(value: Option<Value>, name: &str) -> Result<i64, DecodeError> {
    let number = match &value {
        None => {
            let problem = format!("missing: looked for in the CloudEvents attribute {name}");
            return Err(DecodeError::field("version", problem));
        }
        Some(Value::Number(n)) => n.as_i64(),
        Some(Value::String(s)) => s.trim().parse::<i64>().ok(),
        Some(_) => None,
    };
    let value = value.unwrap_or(Value::Null);
    number.ok_or_else(|| DecodeError::field("version", format!("the attribute {name} is not an integer: {value}")))
}

/// A structured-mode event: its attributes, and its data as JSON text (`null` without).
fn structured(value: &[u8]) -> Result<(Map<String, Value>, Box<RawValue>), DecodeError> {
    let event: BTreeMap<String, &RawValue> =
        serde_json::from_slice(value).map_err(|e| DecodeError::Json(format!("not a structured CloudEvent: {e}")))?;
    if event.contains_key("data_base64") {
        return Err(DecodeError::field("data", "the CloudEvent carries data_base64 (binary data), not JSON"));
    }
    let mut attributes = Map::new();
    let mut data = None;
    for (name, raw) in event {
        if name == DATA[0] {
            data = Some(raw.to_owned());
        } else if !DATA.contains(&name.as_str()) {
            let value = serde_json::from_str(raw.get())
                .map_err(|e| DecodeError::Json(format!("the CloudEvent's attribute {name}: {e}")))?;
            attributes.insert(name, value);
        }
    }
    Ok((attributes, data.unwrap_or_else(null)))
}

/// A binary-mode event: its attributes from the `ce_` headers (`content-type` as
/// `datacontenttype`), and its data, the value, as JSON text.
fn binary(
    message: &Message<'_>,
    content_type: Option<&str>,
) -> Result<(Map<String, Value>, Box<RawValue>), DecodeError> {
    let mut attributes = Map::new();
    for (name, value) in message.headers {
        let Some(attribute) = name.strip_prefix(b"ce_") else { continue };
        let attribute = std::str::from_utf8(attribute)
            .map_err(|_| DecodeError::Json(format!("a CloudEvents header name is not UTF-8: {name:?}")))?;
        let value = std::str::from_utf8(value.as_deref().unwrap_or_default())
            .map_err(|_| DecodeError::field("metadata", format!("the header ce_{attribute} is not UTF-8")))?;
        attributes.insert(attribute.to_owned(), Value::String(value.to_owned()));
    }
    if let Some(content_type) = content_type {
        attributes.insert("datacontenttype".into(), Value::String(content_type.to_owned()));
        let json = content_type.starts_with("application/json")
            || content_type.starts_with("text/json")
            || content_type.split(';').next().is_some_and(|c| c.trim().ends_with("+json"));
        if !json {
            return Err(DecodeError::field("data", format!("of content-type {content_type:?}, not JSON")));
        }
    }
    if message.value.is_empty() {
        return Ok((attributes, null()));
    }
    let text = std::str::from_utf8(message.value)
        .map_err(|_| DecodeError::field("data", "the message value is not UTF-8 JSON"))?;
    let data: Box<RawValue> =
        serde_json::from_str(text).map_err(|e| DecodeError::field("data", format!("not JSON: {e}")))?;
    Ok((attributes, data))
}

fn null() -> Box<RawValue> {
    RawValue::from_string("null".to_owned()).unwrap_or_else(|_| unreachable!("null is JSON"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        pairs.iter().map(|(n, v)| (n.as_bytes().to_vec(), Some(v.as_bytes().to_vec()))).collect()
    }

    fn read(
        key: Option<&[u8]>,
        value: &[u8],
        headers: &[(Vec<u8>, Option<Vec<u8>>)],
    ) -> Result<LazyEnvelope, DecodeError> {
        CloudEvents::default().read(&Message { key, value, headers })
    }

    const STRUCTURED: &str = r#"{"specversion": "1.0", "id": "order-17/3", "source": "/orders", "type": "Shipped",
        "subject": "o-17", "aggregatetype": "order", "sequence": 3, "time": "2026-11-21T10:00:00Z",
        "datacontenttype": "application/json", "tenant": "t1", "data": {"carrier": "ups"}}"#;

    #[test]
    fn a_structured_event_reads_with_its_id_as_given_and_its_other_attributes_kept() {
        let h = headers(&[("content-type", "application/cloudevents+json; charset=utf-8")]);
        let e = read(Some(b"o-17"), STRUCTURED.as_bytes(), &h).unwrap();
        assert_eq!(
            (e.id.to_string(), e.aggregate_type.as_str(), e.aggregate_id.as_str()),
            ("order-17/3".into(), "order", "o-17")
        );
        assert_eq!((e.version, e.event_type.as_str(), e.data.get()), (3, "Shipped", r#"{"carrier": "ups"}"#));
        assert_eq!(e.occurred_at.to_rfc3339(), "2026-11-21T10:00:00+00:00");
        let metadata = e.metadata.unwrap();
        assert_eq!((metadata["source"].as_str(), metadata["tenant"].as_str()), (Some("/orders"), Some("t1")));
        assert!(metadata.get("subject").is_none() && metadata.get("data").is_none());
    }

    #[test]
    fn a_binary_event_reads_from_its_headers_and_its_value() {
        let h = headers(&[
            ("ce_specversion", "1.0"),
            ("ce_id", "b-1"),
            ("ce_source", "/orders"),
            ("ce_type", "Shipped"),
            ("ce_aggregatetype", "order"),
            ("ce_sequence", "2"),
            ("ce_time", "2026-11-21T10:00:00Z"),
            ("content-type", "application/json"),
        ]);
        let e = read(Some(b"o-9"), br#"{"carrier":"dhl"}"#, &h).unwrap();
        assert_eq!(
            (e.aggregate_id.as_str(), e.version, e.data.get()),
            ("o-9", 2, r#"{"carrier":"dhl"}"#),
            "the key, no subject"
        );
        assert_eq!(e.metadata.unwrap()["datacontenttype"], "application/json");
    }

    #[test]
    fn what_does_not_fit_is_named_with_where_it_was_looked_for() {
        let structured = headers(&[("content-type", "application/cloudevents+json")]);
        let without = STRUCTURED.replace(r#""sequence": 3,"#, "");
        let err = read(None, without.as_bytes(), &structured).unwrap_err().to_string();
        assert_eq!(err, "field `version`: missing: looked for in the CloudEvents attribute sequence");
        let zero = STRUCTURED.replace(r#""sequence": 3"#, r#""sequence": "0""#);
        assert_eq!(
            read(None, zero.as_bytes(), &structured).unwrap_err().to_string(),
            "field `version`: must be >= 1, got 0"
        );
        let base64 = STRUCTURED.replace(r#""data": {"carrier": "ups"}"#, r#""data_base64": "AAE=""#);
        assert!(read(None, base64.as_bytes(), &structured).unwrap_err().to_string().contains("data_base64"));
        let deep = STRUCTURED.replace(r#"{"carrier": "ups"}"#, &format!("{}1{}", "[".repeat(200), "]".repeat(200)));
        assert!(read(None, deep.as_bytes(), &structured).is_err(), "nesting no reader can hold");
        let err = read(None, b"{}", &[]).unwrap_err().to_string();
        assert!(err.contains("not a CloudEvent"), "{err}");
        let text = headers(&[("ce_specversion", "1.0"), ("content-type", "text/plain")]);
        assert!(read(None, b"hello", &text).unwrap_err().to_string().contains("not JSON"));
        let no_time = headers(&[("ce_specversion", "1.0"), ("ce_id", "x"), ("ce_type", "T")]);
        let err = read(Some(b"k"), b"{}", &no_time).unwrap_err().to_string();
        assert_eq!(err, "field `occurred_at`: missing: looked for in the CloudEvents attribute time");
    }
}
