//! The event envelope: wire format, validation (`wire.rs`) and typed decoding (`decoder.rs`).

use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::error::DecodeError;

mod decoder;
pub(crate) mod id;
mod wire;

pub use decoder::EventDecoder;
pub use id::EventId;
use wire::{from_slice, json_kind, lazy_from_slice, Checked, Wire};

/// An envelope whose payload is still JSON: every envelope field has been validated,
/// the event type has not yet been matched against a projection's event enum.
///
/// Wire format (JSON; `metadata` optional, everything else required; the JSON Schema is
/// `envelope.schema.json` in this crate):
///
/// ```json
/// {"id": "6f1c…", "aggregate_type": "account", "aggregate_id": "acc-1", "version": 3,
///  "type": "MoneyDeposited", "occurred_at": "2026-11-21T10:00:00Z",
///  "data": {"amount": 500}, "metadata": {"trace": "…"}}
/// ```
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RawEnvelope {
    /// Producer-minted unique event id, kept as given. Not used for deduplication: the
    /// version is.
    pub id: EventId,
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
    /// Producer-minted unique event id, kept as given.
    pub id: EventId,
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

impl Envelope<()> {
    /// An envelope of the core's unit tests: `aggregate_type`/`id` at `version`, type `T`,
    /// no event, nil id, occurred at the epoch.
    #[cfg(test)]
    pub(crate) fn for_test(aggregate_type: &str, id: &str, version: i64) -> Self {
        Envelope {
            id: Uuid::nil().into(),
            aggregate_type: aggregate_type.into(),
            aggregate_id: id.into(),
            version,
            event_type: "T".into(),
            occurred_at: DateTime::from_timestamp(0, 0).unwrap(),
            event: (),
            metadata: None,
        }
    }
}

/// Result of matching a [`RawEnvelope`] against a projection's event enum.
#[derive(Debug, Clone, PartialEq)]
pub enum Decoded<E> {
    /// The event type is one the projection handles, and its data decoded.
    Event(Envelope<E>),
    /// The projection has no variant for this event type: report it as
    /// [`Outcome::Ignored`](crate::Outcome::Ignored).
    Ignored(RawEnvelope),
}

impl RawEnvelope {
    /// Decodes and validates an envelope from JSON bytes.
    ///
    /// Errors name the offending field and the problem, e.g.
    /// `field `version`: must be >= 1, got 0`.
    pub fn from_slice(bytes: &[u8]) -> Result<Self, DecodeError> {
        from_slice(bytes).map(Checked::into_raw)
    }

    /// Validates an envelope given as a JSON value.
    pub fn from_value(value: Value) -> Result<Self, DecodeError> {
        if !value.is_object() {
            return Err(DecodeError::NotAnObject(json_kind(&value)));
        }
        let wire: Wire<'_, Value> = Wire::deserialize(value).map_err(|e| DecodeError::Json(e.to_string()))?;
        wire.validate().map(Checked::into_raw)
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
            id: Uuid::new_v4().into(),
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
    /// content = "data")]`) and decodes its data, moving the envelope's fields into the
    /// typed envelope.
    ///
    /// An event type `E` has no variant for is [`Decoded::Ignored`], not an error;
    /// a known type whose data does not fit is an error naming the type and the problem.
    /// To decode many envelopes, an [`EventDecoder`] looks `E`'s event types up once.
    pub fn decode<E: DeserializeOwned + 'static>(self) -> Result<Decoded<E>, DecodeError> {
        EventDecoder::<E>::new().decode(self)
    }

    /// As [`RawEnvelope::decode`], reading the envelope in place: the typed envelope, or
    /// `None` when `E` has no variant for the event type. The data is decoded straight
    /// from its JSON value, not copied first.
    pub fn event<E: DeserializeOwned + 'static>(&self) -> Result<Option<Envelope<E>>, DecodeError> {
        let decoder = EventDecoder::<E>::new();
        if !decoder.handles(&self.event_type) {
            return Ok(None);
        }
        let event = decoder.data(&self.event_type, &self.data)?;
        Ok(Some(Envelope {
            id: self.id.clone(),
            aggregate_type: self.aggregate_type.clone(),
            aggregate_id: self.aggregate_id.clone(),
            version: self.version,
            event_type: self.event_type.clone(),
            occurred_at: self.occurred_at,
            event,
            metadata: self.metadata.clone(),
        }))
    }
}

/// A [`RawEnvelope`] whose `data` is still the JSON text it arrived in, every other field
/// validated as [`RawEnvelope::from_slice`] does: what the engine reads off Kafka. A
/// projection's event is decoded straight from that text ([`EventDecoder::event_from_json`]),
/// with no `Value` tree built, walked and dropped in between, and a buffered event holds its
/// data's bytes rather than a tree. [`LazyEnvelope::into_raw`] gives the tree when something
/// needs it (an upcaster).
#[derive(Debug, Clone)]
pub struct LazyEnvelope {
    /// As [`RawEnvelope::id`].
    pub id: EventId,
    /// As [`RawEnvelope::aggregate_type`].
    pub aggregate_type: String,
    /// As [`RawEnvelope::aggregate_id`].
    pub aggregate_id: String,
    /// As [`RawEnvelope::version`].
    pub version: i64,
    /// As [`RawEnvelope::event_type`].
    pub event_type: String,
    /// As [`RawEnvelope::occurred_at`].
    pub occurred_at: DateTime<Utc>,
    /// The event payload, as the JSON text it arrived in.
    pub data: Box<RawValue>,
    /// As [`RawEnvelope::metadata`].
    pub metadata: Option<Value>,
}

impl PartialEq for LazyEnvelope {
    fn eq(&self, other: &Self) -> bool {
        (&self.id, &self.aggregate_type, &self.aggregate_id, self.version, &self.event_type, self.occurred_at)
            == (
                &other.id,
                &other.aggregate_type,
                &other.aggregate_id,
                other.version,
                &other.event_type,
                other.occurred_at,
            )
            && self.data.get() == other.data.get()
            && self.metadata == other.metadata
    }
}

impl LazyEnvelope {
    /// Decodes and validates an envelope from JSON bytes, as [`RawEnvelope::from_slice`]
    /// does (same errors), keeping `data` as text.
    pub fn from_slice(bytes: &[u8]) -> Result<Self, DecodeError> {
        let c = lazy_from_slice(bytes)?;
        let (id, aggregate_type, aggregate_id, version) = (c.id.into(), c.aggregate_type, c.aggregate_id, c.version);
        let (event_type, occurred_at, data, metadata) = (c.event_type, c.occurred_at, c.data, c.metadata);
        Ok(Self { id, aggregate_type, aggregate_id, version, event_type, occurred_at, data, metadata })
    }

    /// The envelope as [`LazyEnvelope::from_slice`] would take it, or the error naming the
    /// field it would refuse: what a format that builds an envelope from other fields (see
    /// [`crate::format`]) checks it with.
    pub fn checked(self) -> Result<Self, DecodeError> {
        for (field, value) in [("aggregate_type", &self.aggregate_type), ("aggregate_id", &self.aggregate_id)] {
            if let Some(problem) = wire::key_problem(value) {
                return Err(DecodeError::field(field, problem));
            }
        }
        if self.version < 1 {
            return Err(DecodeError::field("version", format!("must be >= 1, got {}", self.version)));
        }
        if self.event_type.trim().is_empty() {
            return Err(DecodeError::field("type", "must not be empty"));
        }
        if !wire::is_a_value(self.data.get()) {
            return Err(data_tree(&self.data).err().unwrap_or_else(|| DecodeError::field("data", "nested too deep")));
        }
        Ok(self)
    }

    /// The envelope with its data read into a `Value` tree. An envelope read by
    /// [`LazyEnvelope::from_slice`] always reads so; one built by hand may hold data that
    /// does not (a number out of range, a lone surrogate, nesting past 128 levels): an error
    /// then.
    pub fn into_raw(self) -> Result<RawEnvelope, DecodeError> {
        let data = self.data_tree()?;
        let (id, aggregate_type, aggregate_id, version) =
            (self.id, self.aggregate_type, self.aggregate_id, self.version);
        let (event_type, occurred_at, metadata) = (self.event_type, self.occurred_at, self.metadata);
        Ok(RawEnvelope { id, aggregate_type, aggregate_id, version, event_type, occurred_at, data, metadata })
    }

    /// The envelope's data read into a `Value` tree (what an upcaster reads); an error as
    /// [`LazyEnvelope::into_raw`]'s.
    pub fn data_tree(&self) -> Result<Value, DecodeError> {
        data_tree(&self.data)
    }
}

/// An envelope's `data` text read into a `Value` tree, or the error naming why it does not
/// read so (see [`LazyEnvelope::into_raw`]).
pub fn data_tree(data: &RawValue) -> Result<Value, DecodeError> {
    serde_json::from_str(data.get()).map_err(|e| DecodeError::field("data", format!("not a JSON value: {e}")))
}

impl From<RawEnvelope> for LazyEnvelope {
    /// The envelope with its data written back to JSON text (for callers holding
    /// [`RawEnvelope`]s: tests and tools).
    fn from(e: RawEnvelope) -> Self {
        let data = serde_json::value::to_raw_value(&e.data).expect("a Value always serialises");
        let RawEnvelope { id, aggregate_type, aggregate_id, version, event_type, occurred_at, metadata, .. } = e;
        Self { id, aggregate_type, aggregate_id, version, event_type, occurred_at, data, metadata }
    }
}

impl<E: Serialize> Envelope<E> {
    /// Converts back to a [`RawEnvelope`] (used by producers and test kits).
    pub fn to_raw(&self) -> RawEnvelope {
        let tagged = serde_json::to_value(&self.event).expect("an event always serialises");
        let data = match tagged {
            Value::Object(mut m) => m.remove("data").unwrap_or(Value::Object(Map::new())),
            _ => Value::Object(Map::new()),
        };
        RawEnvelope {
            id: self.id.clone(),
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

    /// An envelope read lazily is the envelope read whole, its data still text; it fails
    /// where and as the whole one does; and its event decodes from the text as from the
    /// tree, with the same errors.
    #[test]
    fn a_lazy_envelope_reads_as_a_raw_one_and_its_event_decodes_the_same() {
        let bytes = serde_json::to_vec(&good()).unwrap();
        let lazy = LazyEnvelope::from_slice(&bytes).unwrap();
        assert_eq!(lazy.data.get(), r#"{"amount":500}"#);
        assert_eq!(lazy.clone().into_raw().unwrap(), RawEnvelope::from_slice(&bytes).unwrap());
        let raw = RawEnvelope::from_slice(&bytes).unwrap();
        assert_eq!(LazyEnvelope::from(raw.clone()).into_raw().unwrap(), raw, "a RawEnvelope made lazy and back");
        for bad in [&b"[1]"[..], b"{\"id\":", b"", br#"{"version": 0}"#] {
            let (lazy, raw) = (LazyEnvelope::from_slice(bad).unwrap_err(), RawEnvelope::from_slice(bad).unwrap_err());
            assert_eq!(lazy.to_string(), raw.to_string());
        }
        let mut no_data = good();
        no_data.as_object_mut().unwrap().remove("data");
        let no_data = serde_json::to_vec(&no_data).unwrap();
        assert_eq!(
            LazyEnvelope::from_slice(&no_data).unwrap_err().to_string(),
            RawEnvelope::from_slice(&no_data).unwrap_err().to_string()
        );
        let decoder = EventDecoder::<Ev>::new();
        let cases = [
            ("Deposited", r#"{"amount": 500}"#),
            ("Deposited", r#"{"amount": "a lot"}"#),
            ("Deposited", r#"{"amount": 1.5}"#),
            ("Deposited", r#"{}"#),
            ("Deposited", r#"null"#),
            ("Deposited", r#"{"amount": 5, "extra": [1, {"a": null}]}"#),
            ("Opened", r#"{"owner": "caf\u00e9 \"x\""}"#),
            ("Opened", r#"[1, 2]"#),
            ("Closed", r#"{}"#),
            ("Deposited", r#"{"amount": 1, "amount": 2}"#),
            ("Nope", r#"{}"#),
        ];
        for (event_type, text) in cases {
            let raw = serde_json::value::RawValue::from_string(text.to_owned()).unwrap();
            let from_text = decoder.event_from_json(event_type, &raw).map_err(|e| e.to_string());
            let from_tree = decoder.event(event_type, serde_json::from_str(text).unwrap()).map_err(|e| e.to_string());
            assert_eq!(from_text, from_tree, "{event_type} {text}");
        }
    }

    /// A lazy envelope is read first as producers write envelopes, then, failing that, field
    /// by field: whichever way, it is what the field-by-field reading gives, or fails as it
    /// fails, whatever each field holds.
    #[test]
    fn a_lazy_envelope_reads_every_field_as_the_checked_reading_does() {
        let json = |t: &str| -> Value { serde_json::from_str(t).unwrap() };
        let any = ["null", "true", "7", "1.5", "\"\"", "\" \"", "[1]", "{}", "{\"a\": 1}"];
        let mut fields: Vec<(&str, Vec<Value>)> = vec![
            ("id", vec![json("\"6F1C2D9E8A6B4C1E9D0A2B3C4D5E6F70\""), json("\"6f1c2d9e-8a6b-4c1e-9d0a\"")]),
            ("aggregate_type", vec![json("\"acc\\u0000\""), json("\"acc\\u0001\""), json("\"a\\\"b\"")]),
            (
                "aggregate_id",
                vec!["k".repeat(crate::MAX_KEY_BYTES).into(), "k".repeat(crate::MAX_KEY_BYTES + 1).into()],
            ),
            ("version", vec![0.into(), (-1).into(), 1.into(), u64::MAX.into(), json("\"3\""), json("3.0")]),
            ("type", vec![json("\"\\t\""), json("\"Dep\\u00e9sited\"")]),
            ("occurred_at", vec![json("\"2026-11-21T12:00:00+02:00\""), json("\"2026-11-21\"")]),
            ("data", vec![json("{\"amount\": \"\\u00e9\"}")]),
            ("metadata", vec![json("{\"trace\": {\"a\": [1]}}")]),
            ("extra", vec![]),
        ];
        for (_, values) in &mut fields {
            values.extend(any.iter().map(|t| json(t)));
        }
        let mut texts: Vec<Vec<u8>> = vec![
            b" \n{\"id\": 1}".to_vec(),
            b"[\"6f1c2d9e-8a6b-4c1e-9d0a-2b3c4d5e6f70\", \"account\"]".to_vec(),
            serde_json::to_string(&good()).unwrap().replacen('{', "{\"version\": 2, ", 1).into_bytes(),
        ];
        for (field, values) in &fields {
            let mut absent = good();
            absent.as_object_mut().unwrap().remove(*field);
            texts.push(serde_json::to_vec(&absent).unwrap());
            for value in values {
                let mut v = good();
                v[*field] = value.clone();
                texts.push(serde_json::to_vec(&v).unwrap());
            }
        }
        let mut taken = 0;
        for text in &texts {
            let lazy = LazyEnvelope::from_slice(text).and_then(LazyEnvelope::into_raw).map_err(|e| e.to_string());
            let checked = RawEnvelope::from_slice(text).map_err(|e| e.to_string());
            assert_eq!(lazy, checked, "{}", String::from_utf8_lossy(text));
            taken += usize::from(checked.is_ok());
        }
        assert!(taken > 10 && taken + 10 < texts.len(), "{taken} of {} taken", texts.len());
    }

    /// Data that is JSON by its grammar but not a JSON value serde_json can hold (a number
    /// out of range, a lone surrogate, nesting past 128 levels) is refused by both readings,
    /// with the same error, wherever it sits in `data`; the lazy reading never hands on data
    /// that its event's decoding or [`LazyEnvelope::into_raw`] could not read.
    #[test]
    fn hostile_data_is_refused_by_both_readings_alike() {
        let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        let hostile = ["1e400", "-1e400", &"9".repeat(400), "\"\\ud83d\"", "\"\\udc00 x\"", &deep];
        let good = serde_json::to_string(&good()).unwrap();
        for value in hostile {
            for data in
                [value.to_owned(), format!("{{\"amount\": {value}}}"), format!("{{\"x\": [{{\"y\": {value}}}]}}")]
            {
                let text = good.replace(r#"{"amount":500}"#, &data);
                assert!(text.contains(&data), "{text}");
                let checked = RawEnvelope::from_slice(text.as_bytes()).map_err(|e| e.to_string());
                let lazy = LazyEnvelope::from_slice(text.as_bytes()).and_then(LazyEnvelope::into_raw);
                let lazy = lazy.map_err(|e| e.to_string());
                assert!(checked.is_err(), "{text}");
                assert_eq!(lazy, checked, "{text}");
            }
        }
    }

    fn err_with(f: impl FnOnce(&mut Map<String, Value>)) -> String {
        let mut v = good();
        f(v.as_object_mut().unwrap());
        RawEnvelope::from_value(v).unwrap_err().to_string()
    }

    /// The shipped JSON Schema says what the decoder does: the same fields, the same
    /// required ones, the version's lower bound, metadata an object or null.
    #[test]
    fn the_json_schema_matches_the_decoder() {
        let schema: Value = serde_json::from_str(include_str!("../../envelope.schema.json")).unwrap();
        let mut full = good();
        full["metadata"] = serde_json::json!({"correlation_id": "c-1"});
        let fields: std::collections::BTreeSet<&String> = full.as_object().unwrap().keys().collect();
        let properties: std::collections::BTreeSet<&String> =
            schema["properties"].as_object().unwrap().keys().collect();
        assert_eq!(properties, fields, "the schema's properties are the envelope's fields");
        let required: Vec<&str> = schema["required"].as_array().unwrap().iter().map(|r| r.as_str().unwrap()).collect();
        for field in fields {
            let mut without = full.clone();
            without.as_object_mut().unwrap().remove(field);
            let refused = RawEnvelope::from_value(without).is_err();
            assert_eq!(refused, required.contains(&field.as_str()), "required: {field}");
        }
        assert_eq!(schema["properties"]["version"]["minimum"], 1);
        for (version, ok) in [(0, false), (1, true)] {
            let mut v = full.clone();
            v["version"] = version.into();
            assert_eq!(RawEnvelope::from_value(v).is_ok(), ok, "version {version}");
        }
        assert_eq!(schema["properties"]["metadata"]["type"], serde_json::json!(["object", "null"]));
        let mut null_metadata = full.clone();
        null_metadata["metadata"] = Value::Null;
        assert!(RawEnvelope::from_value(null_metadata).is_ok());
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
    fn bytes_that_are_not_utf8_are_refused_saying_where_and_escapes_still_read() {
        let mut bytes = serde_json::to_vec(&good()).unwrap();
        let at = bytes.windows(4).position(|w| w == b"acc-").expect("the aggregate id");
        bytes[at] = 0xff;
        let err = LazyEnvelope::from_slice(&bytes).unwrap_err().to_string();
        assert!(err.starts_with("invalid JSON") && err.contains("line 1 column"), "{err}");
        let mut v = good();
        v["aggregate_id"] = "\u{e9}t\u{e9} \"quoted\"".into();
        // The accents written as JSON escapes: read as text, they are still unescaped.
        let text = serde_json::to_string(&v).unwrap().replace('\u{e9}', "\\u00e9");
        assert!(text.contains(r#""\u00e9t\u00e9 \"quoted\"""#), "{text}");
        let lazy = LazyEnvelope::from_slice(text.as_bytes()).unwrap();
        assert_eq!(lazy.aggregate_id, "\u{e9}t\u{e9} \"quoted\"");
    }

    #[test]
    fn unknown_event_types_are_unhandled_not_errors() {
        let mut v = good();
        v["type"] = "SomethingElse".into();
        let raw = RawEnvelope::from_value(v).unwrap();
        assert!(matches!(raw.decode::<Ev>().unwrap(), Decoded::Ignored(_)));
    }

    #[test]
    fn one_decoder_for_a_batch_moves_what_in_place_decoding_copies() {
        let decoder = EventDecoder::<Ev>::new();
        assert!(decoder.handles("Opened") && decoder.handles("Deposited") && !decoder.handles("SomethingElse"));
        let mut opened = good();
        opened["type"] = "Opened".into();
        opened["data"] = serde_json::json!({"owner": "ann"});
        for v in [good(), opened] {
            let raw = RawEnvelope::from_value(v).unwrap();
            let in_place = raw.event::<Ev>().unwrap().expect("handled");
            let Decoded::Event(moved) = decoder.decode(raw).unwrap() else { panic!("not decoded") };
            assert_eq!(moved, in_place);
        }
        let err = decoder.event("Deposited", serde_json::json!({"amount": "lots"})).unwrap_err().to_string();
        assert!(err.contains("Deposited") && err.contains("invalid type"), "{err}");
        // Not an enum tagged by `type`: every event is offered to it.
        assert!(EventDecoder::<Value>::new().handles("Anything"));
    }

    #[test]
    fn a_known_type_with_bad_data_is_an_error_naming_the_type() {
        let mut v = good();
        v["data"] = serde_json::json!({"amount": "lots"});
        let err = RawEnvelope::from_value(v).unwrap().decode::<Ev>().unwrap_err().to_string();
        // The field inside `data` is named, not only `data`.
        assert!(err.starts_with("field `data.amount` of event type Deposited: invalid type"), "{err}");
        let decoder = EventDecoder::<Ev>::new();
        let data = serde_json::value::RawValue::from_string(r#"{"amount": "lots"}"#.into()).unwrap();
        let lazy = decoder.event_from_json("Deposited", &data).unwrap_err().to_string();
        assert_eq!(lazy, err, "the engine's path says the same");
        let missing = decoder.event("Deposited", serde_json::json!({})).unwrap_err().to_string();
        assert_eq!(missing, "field `data` of event type Deposited: missing field `amount`");
    }
}
