//! A projection's event enum read from an envelope's `type` and `data`: [`EventDecoder`],
//! with the types it accepts looked up once per batch, and the `{"type", "data"}` view the
//! enum reads without a tree built for it.

use serde::de::value::BorrowedStrDeserializer;
use serde::de::{DeserializeOwned, DeserializeSeed, MapAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::Value;

use super::{Decoded, Envelope, RawEnvelope};
use crate::error::DecodeError;

/// Decodes envelopes into a projection's event enum `E`, with the event types `E` accepts
/// looked up once (for a whole batch) rather than per envelope.
pub struct EventDecoder<E> {
    types: Option<&'static [&'static str]>,
    event: std::marker::PhantomData<fn() -> E>,
}

impl<E: DeserializeOwned + 'static> Default for EventDecoder<E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E: DeserializeOwned + 'static> EventDecoder<E> {
    /// A decoder for `E`.
    pub fn new() -> Self {
        Self { types: crate::event_types::<E>(), event: std::marker::PhantomData }
    }

    /// Whether `E` has a variant for `event_type` (every type is offered to an `E` that is
    /// not an enum tagged by `type`).
    pub fn handles(&self, event_type: &str) -> bool {
        self.types.is_none_or(|types| types.contains(&event_type))
    }

    /// The event types `E` has variants for (`None`: `E` is not an enum tagged by `type`,
    /// and takes every type).
    pub fn types(&self) -> Option<&'static [&'static str]> {
        self.types
    }

    /// As [`RawEnvelope::decode`].
    pub fn decode(&self, raw: RawEnvelope) -> Result<Decoded<E>, DecodeError> {
        if !self.handles(&raw.event_type) {
            return Ok(Decoded::Ignored(raw));
        }
        let RawEnvelope { id, aggregate_type, aggregate_id, version, event_type, occurred_at, data, metadata } = raw;
        let event = self.event(&event_type, data)?;
        Ok(Decoded::Event(Envelope {
            id,
            aggregate_type,
            aggregate_id,
            version,
            event_type,
            occurred_at,
            event,
            metadata,
        }))
    }

    /// The event of a handled `event_type` carrying `data`, moved out of its envelope; an
    /// error names the type and the problem.
    pub fn event(&self, event_type: &str, data: Value) -> Result<E, DecodeError> {
        self.data(event_type, data)
    }

    /// The event of a handled `event_type` carrying `data` as JSON text (a
    /// [`LazyEnvelope`](super::LazyEnvelope)'s), read straight into `E`. Data it cannot read is read again as a
    /// `Value` tree, so that what is refused, and why, is exactly what [`EventDecoder::event`]
    /// says (a key given twice, which the tree keeps the last of, included).
    pub fn event_from_json(&self, event_type: &str, data: &RawValue) -> Result<E, DecodeError> {
        match E::deserialize(Tagged { event_type, data: Some(data) }) {
            Ok(event) => Ok(event),
            Err(_) => self.event(event_type, super::data_tree(data)?),
        }
    }

    /// The event of type `event_type` carrying `data` (a `Value` or a `&Value`).
    pub(super) fn data<'a, D>(&self, event_type: &'a str, data: D) -> Result<E, DecodeError>
    where
        D: serde::Deserializer<'a, Error = serde_json::Error>,
    {
        // The path of what does not fit, from `data` (`data.lines[2].qty`).
        serde_path_to_error::deserialize(Tagged { event_type, data: Some(data) }).map_err(|e| {
            let path = e.path().to_string();
            let field = if path.starts_with("data") { path } else { "data".to_owned() };
            DecodeError::Data { event_type: event_type.to_owned(), field, reason: e.into_inner().to_string() }
        })
    }
}

/// The event as the projection's enum reads it, `{"type": …, "data": …}`, without building
/// that object: the tag is the envelope's `type`, the content its `data` (read in place, or
/// moved out of an envelope the decoding consumes).
struct Tagged<'a, D> {
    event_type: &'a str,
    data: Option<D>,
}

impl<'de, D> serde::Deserializer<'de> for Tagged<'de, D>
where
    D: serde::Deserializer<'de, Error = serde_json::Error>,
{
    type Error = serde_json::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        visitor.visit_map(TaggedFields { tagged: self, next: 0 })
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
        unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier ignored_any
    }
}

struct TaggedFields<'a, D> {
    tagged: Tagged<'a, D>,
    next: u8,
}

impl<'de, D> MapAccess<'de> for TaggedFields<'de, D>
where
    D: serde::Deserializer<'de, Error = serde_json::Error>,
{
    type Error = serde_json::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, Self::Error> {
        let key = match self.next {
            0 => "type",
            1 => "data",
            _ => return Ok(None),
        };
        seed.deserialize(BorrowedStrDeserializer::new(key)).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Self::Error> {
        self.next += 1;
        match self.next {
            1 => seed.deserialize(BorrowedStrDeserializer::new(self.tagged.event_type)),
            _ => match self.tagged.data.take() {
                Some(data) => seed.deserialize(data),
                None => Err(serde::de::Error::custom("data read twice")),
            },
        }
    }
}
