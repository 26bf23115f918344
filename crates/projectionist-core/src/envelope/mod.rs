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
mod tests;
