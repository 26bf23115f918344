//! The event envelope: wire format, validation and typed decoding.

use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::error::DecodeError;

/// An envelope whose payload is still JSON: every envelope field has been validated,
/// the event type has not yet been matched against a projection's event enum.
///
/// Wire format (JSON; `metadata` optional, everything else required):
///
/// ```json
/// {"id": "6f1c…", "aggregate_type": "account", "aggregate_id": "acc-1", "version": 3,
///  "type": "MoneyDeposited", "occurred_at": "2026-11-21T10:00:00Z",
///  "data": {"amount": 500}, "metadata": {"trace": "…"}}
/// ```
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RawEnvelope {
    /// Producer-minted unique event id. Not used for deduplication: the version is.
    pub id: Uuid,
    /// Kind of aggregate that emitted the event, e.g. `account`.
    pub aggregate_type: String,
    /// Aggregate identity; also the Kafka message key.
    pub aggregate_id: String,
    /// Position of the event in its aggregate's stream, starting at 1.
    pub version: i64,
    /// Event type name, matched against the projection's event enum tag.
    #[serde(rename = "type")]
    pub event_type: String,
    /// When the aggregate emitted the event.
    pub occurred_at: DateTime<Utc>,
    /// Event payload.
    pub data: Value,
    /// Optional producer metadata (correlation ids, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
}

/// An envelope carrying a typed event `E` (the projection's serde enum, tagged by `type`).
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope<E> {
    /// Producer-minted unique event id.
    pub id: Uuid,
    /// Kind of aggregate that emitted the event.
    pub aggregate_type: String,
    /// Aggregate identity; also the Kafka message key.
    pub aggregate_id: String,
    /// Position of the event in its aggregate's stream, starting at 1.
    pub version: i64,
    /// Event type name as found on the wire.
    pub event_type: String,
    /// When the aggregate emitted the event.
    pub occurred_at: DateTime<Utc>,
    /// The decoded event.
    pub event: E,
    /// Optional producer metadata.
    pub metadata: Option<Value>,
}

/// Result of matching a [`RawEnvelope`] against a projection's event enum.
#[derive(Debug, Clone, PartialEq)]
pub enum Decoded<E> {
    /// The event type is one the projection handles, and its data decoded.
    Event(Envelope<E>),
    /// The projection has no variant for this event type: report it as
    /// [`Outcome::Ignored`](crate::Outcome::Ignored).
    Unhandled(RawEnvelope),
}

impl RawEnvelope {
    /// Decodes and validates an envelope from JSON bytes.
    ///
    /// Errors name the offending field and the problem, e.g.
    /// `field `version`: must be >= 1, got 0`.
    pub fn from_slice(bytes: &[u8]) -> Result<Self, DecodeError> {
        let value: Value = serde_json::from_slice(bytes).map_err(|e| DecodeError::Json(e.to_string()))?;
        Self::from_value(value)
    }

    /// Validates an envelope given as a JSON value.
    pub fn from_value(value: Value) -> Result<Self, DecodeError> {
        let Value::Object(mut obj) = value else {
            return Err(DecodeError::NotAnObject(json_kind(&value)));
        };
        let id = take_str(&mut obj, "id")?;
        let id = Uuid::parse_str(&id).map_err(|e| DecodeError::field("id", format!("not a UUID ({e}): {id:?}")))?;
        let aggregate_type = take_key(&mut obj, "aggregate_type")?;
        let aggregate_id = take_key(&mut obj, "aggregate_id")?;
        let version = match obj.remove("version") {
            None | Some(Value::Null) => return Err(DecodeError::missing("version")),
            Some(Value::Number(n)) => match n.as_i64() {
                Some(v) if v >= 1 => v,
                Some(v) => return Err(DecodeError::field("version", format!("must be >= 1, got {v}"))),
                None => return Err(DecodeError::field("version", format!("must be an integer >= 1, got {n}"))),
            },
            Some(other) => {
                return Err(DecodeError::field(
                    "version",
                    format!("must be an integer >= 1, got {}", json_kind(&other)),
                ))
            }
        };
        let event_type = take_nonempty(&mut obj, "type")?;
        let occurred_at = take_str(&mut obj, "occurred_at")?;
        let occurred_at = DateTime::parse_from_rfc3339(&occurred_at)
            .map_err(|e| {
                DecodeError::field("occurred_at", format!("not an RFC 3339 timestamp ({e}): {occurred_at:?}"))
            })?
            .with_timezone(&Utc);
        let data = match obj.remove("data") {
            None => return Err(DecodeError::missing("data")),
            Some(v) => v,
        };
        let metadata = match obj.remove("metadata") {
            None | Some(Value::Null) => None,
            Some(v @ Value::Object(_)) => Some(v),
            Some(other) => {
                return Err(DecodeError::field("metadata", format!("must be an object, got {}", json_kind(&other))))
            }
        };
        Ok(Self { id, aggregate_type, aggregate_id, version, event_type, occurred_at, data, metadata })
    }

    /// Builds an envelope with a fresh id for `event`, a serde enum tagged by `type` with
    /// its fields under `data` (`#[serde(tag = "type", content = "data")]`).
    ///
    /// # Panics
    /// If `event` does not serialise to an object with a string `type`.
    pub fn new<E: Serialize>(
        aggregate_type: &str,
        aggregate_id: &str,
        version: i64,
        occurred_at: DateTime<Utc>,
        event: &E,
    ) -> Self {
        let mut tagged = match serde_json::to_value(event) {
            Ok(Value::Object(m)) => m,
            _ => panic!("event must serialise to an object tagged by `type`"),
        };
        let event_type = match tagged.remove("type") {
            Some(Value::String(t)) => t,
            _ => panic!("event must serialise to an object tagged by `type`"),
        };
        Self {
            id: Uuid::new_v4(),
            aggregate_type: aggregate_type.to_owned(),
            aggregate_id: aggregate_id.to_owned(),
            version,
            event_type,
            occurred_at,
            data: tagged.remove("data").unwrap_or_else(|| Value::Object(Map::new())),
            metadata: None,
        }
    }

    /// Serialises the envelope to its JSON wire format.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an envelope always serialises")
    }

    /// Matches the event type against `E` (a serde enum with `#[serde(tag = "type",
    /// content = "data")]`) and decodes its data.
    ///
    /// An event type `E` has no variant for is [`Decoded::Unhandled`], not an error;
    /// a known type whose data does not fit is an error naming the type and the problem.
    pub fn decode<E: DeserializeOwned + 'static>(self) -> Result<Decoded<E>, DecodeError> {
        if let Some(types) = crate::event_types::<E>() {
            if !types.contains(&self.event_type.as_str()) {
                return Ok(Decoded::Unhandled(self));
            }
        }
        let tagged = serde_json::json!({ "type": self.event_type, "data": self.data });
        match serde_json::from_value::<E>(tagged) {
            Ok(event) => Ok(Decoded::Event(Envelope {
                id: self.id,
                aggregate_type: self.aggregate_type,
                aggregate_id: self.aggregate_id,
                version: self.version,
                event_type: self.event_type,
                occurred_at: self.occurred_at,
                event,
                metadata: self.metadata,
            })),
            Err(e) => Err(DecodeError::Data { event_type: self.event_type, reason: e.to_string() }),
        }
    }
}

impl<E> Envelope<E> {}

impl<E: Serialize> Envelope<E> {
    /// Converts back to a [`RawEnvelope`] (used by producers and test kits).
    pub fn to_raw(&self) -> RawEnvelope {
        let tagged = serde_json::to_value(&self.event).expect("an event always serialises");
        let data = match tagged {
            Value::Object(mut m) => m.remove("data").unwrap_or(Value::Object(Map::new())),
            _ => Value::Object(Map::new()),
        };
        RawEnvelope {
            id: self.id,
            aggregate_type: self.aggregate_type.clone(),
            aggregate_id: self.aggregate_id.clone(),
            version: self.version,
            event_type: self.event_type.clone(),
            occurred_at: self.occurred_at,
            data,
            metadata: self.metadata.clone(),
        }
    }
}

fn take_str(obj: &mut Map<String, Value>, field: &'static str) -> Result<String, DecodeError> {
    match obj.remove(field) {
        None | Some(Value::Null) => Err(DecodeError::missing(field)),
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(DecodeError::field(field, format!("must be a string, got {}", json_kind(&other)))),
    }
}

fn take_nonempty(obj: &mut Map<String, Value>, field: &'static str) -> Result<String, DecodeError> {
    let s = take_str(obj, field)?;
    if s.trim().is_empty() {
        return Err(DecodeError::field(field, "must not be empty"));
    }
    Ok(s)
}

/// A non-empty string the engine can store as a key (see [`crate::MAX_KEY_BYTES`]).
fn take_key(obj: &mut Map<String, Value>, field: &'static str) -> Result<String, DecodeError> {
    let s = take_nonempty(obj, field)?;
    crate::check_key("the value", &s).map_err(|problem| DecodeError::field(field, problem))?;
    Ok(s)
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, Serialize, PartialEq)]
    #[serde(tag = "type", content = "data")]
    enum Ev {
        Opened { owner: String },
        Deposited { amount: i64 },
        Closed {},
    }

    fn good() -> Value {
        serde_json::json!({
            "id": "6f1c2d9e-8a6b-4c1e-9d0a-2b3c4d5e6f70", "aggregate_type": "account",
            "aggregate_id": "acc-1", "version": 3, "type": "Deposited",
            "occurred_at": "2026-11-21T10:00:00Z", "data": {"amount": 500}
        })
    }

    fn err_with(f: impl FnOnce(&mut Map<String, Value>)) -> String {
        let mut v = good();
        f(v.as_object_mut().unwrap());
        RawEnvelope::from_value(v).unwrap_err().to_string()
    }

    #[test]
    fn decodes_a_valid_envelope_into_the_typed_event() {
        let raw = RawEnvelope::from_slice(&serde_json::to_vec(&good()).unwrap()).unwrap();
        assert_eq!(raw.version, 3);
        assert_eq!(raw.metadata, None);
        match raw.decode::<Ev>().unwrap() {
            Decoded::Event(env) => {
                assert_eq!(env.event, Ev::Deposited { amount: 500 });
                assert_eq!(env.aggregate_id, "acc-1");
            }
            other => panic!("expected an event, got {other:?}"),
        }
    }

    #[test]
    fn round_trips_through_the_wire_format() {
        let mut v = good();
        v["metadata"] = serde_json::json!({"trace": "t-1"});
        let raw = RawEnvelope::from_value(v).unwrap();
        let again = RawEnvelope::from_slice(&raw.to_json()).unwrap();
        assert_eq!(raw, again);
        let Decoded::Event(env) = again.decode::<Ev>().unwrap() else { panic!() };
        assert_eq!(env.to_raw(), raw);
    }

    #[test]
    fn errors_name_the_field_and_the_problem() {
        assert_eq!(
            err_with(|o| {
                o.insert("version".into(), 0.into());
            }),
            "field `version`: must be >= 1, got 0"
        );
        assert_eq!(
            err_with(|o| {
                o.insert("version".into(), (-4).into());
            }),
            "field `version`: must be >= 1, got -4"
        );
        assert_eq!(
            err_with(|o| {
                o.insert("version".into(), "3".into());
            }),
            "field `version`: must be an integer >= 1, got a string"
        );
        assert!(err_with(|o| {
            o.insert("version".into(), serde_json::json!(1.5));
        })
        .contains("must be an integer >= 1, got 1.5"));
        assert_eq!(
            err_with(|o| {
                o.remove("aggregate_id");
            }),
            "field `aggregate_id`: missing"
        );
        assert_eq!(
            err_with(|o| {
                o.insert("aggregate_id".into(), "".into());
            }),
            "field `aggregate_id`: must not be empty"
        );
        assert_eq!(
            err_with(|o| {
                o.insert("aggregate_id".into(), "k".repeat(crate::MAX_KEY_BYTES + 1).into());
            }),
            "field `aggregate_id`: the value is 1025 bytes long, longer than the 1024 bytes a key may have"
        );
        assert!(err_with(|o| {
            o.insert("aggregate_type".into(), "acc\0".into());
        })
        .starts_with("field `aggregate_type`: the value holds a NUL character"));
        assert!(err_with(|o| {
            o.insert("id".into(), "nope".into());
        })
        .starts_with("field `id`: not a UUID"));
        assert!(err_with(|o| {
            o.insert("occurred_at".into(), "yesterday".into());
        })
        .starts_with("field `occurred_at`: not an RFC 3339"));
        assert_eq!(
            err_with(|o| {
                o.remove("data");
            }),
            "field `data`: missing"
        );
        assert_eq!(
            err_with(|o| {
                o.insert("metadata".into(), 7.into());
            }),
            "field `metadata`: must be an object, got a number"
        );
        assert_eq!(
            err_with(|o| {
                o.insert("type".into(), Value::Null);
            }),
            "field `type`: missing"
        );
    }

    #[test]
    fn rejects_non_objects_and_broken_json_without_panicking() {
        assert_eq!(
            RawEnvelope::from_slice(b"[1,2]").unwrap_err().to_string(),
            "envelope must be a JSON object, got an array"
        );
        assert!(RawEnvelope::from_slice(b"{\"id\":").unwrap_err().to_string().starts_with("invalid JSON"));
        assert!(RawEnvelope::from_slice(b"").is_err());
    }

    #[test]
    fn unknown_event_types_are_unhandled_not_errors() {
        let mut v = good();
        v["type"] = "SomethingElse".into();
        let raw = RawEnvelope::from_value(v).unwrap();
        assert!(matches!(raw.decode::<Ev>().unwrap(), Decoded::Unhandled(_)));
    }

    #[test]
    fn a_known_type_with_bad_data_is_an_error_naming_the_type() {
        let mut v = good();
        v["data"] = serde_json::json!({"amount": "lots"});
        let err = RawEnvelope::from_value(v).unwrap().decode::<Ev>().unwrap_err().to_string();
        assert!(err.starts_with("field `data` of event type Deposited: invalid type"), "{err}");
    }
}
