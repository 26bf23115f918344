//! Payloads in Confluent's wire format — a 0 byte, a 4-byte big-endian schema id, then Avro,
//! Protobuf or JSON Schema bytes — decoded to JSON with the writer's schema from a schema
//! registry. A topic's format then reads the JSON as it reads a JSON value, so a projection
//! does not change with the encoding.
//!
//! The registry is behind [`Schemas`] (the `projectionist-registry` crate implements it):
//! reading a message only decodes with schemas already fetched, and says which schema it
//! still needs ([`DecodeError::SchemaPending`]); the engine fetches it, waiting out a
//! registry that does not answer, and reads the message again.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;

use super::{Format, Message};
use crate::{DecodeError, LazyEnvelope};

/// Why a wire-format payload did not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// Its schema is not fetched yet: fetch it, then decode again.
    #[error("schema id {0} is not fetched yet")]
    NotFetched(u32),
    /// The registry does not answer: an outage of the environment, waited out.
    #[error("the schema registry does not answer: {0}")]
    Unavailable(String),
    /// The registry has no such schema, or the bytes do not fit it: a dead letter.
    #[error("{0}")]
    Invalid(String),
}

/// Decodes payloads in Confluent's wire format with the schemas a registry holds.
#[async_trait]
pub trait Schemas: Send + Sync + fmt::Debug {
    /// The JSON text of what `bytes` (in the wire format) hold, decoded with the writer's
    /// schema if it is fetched; [`SchemaError::NotFetched`] if not.
    fn decode(&self, bytes: &[u8]) -> Result<Vec<u8>, SchemaError>;

    /// Fetches the schemas `ids` not fetched yet. An id the registry does not have is fetched
    /// as unknown (decoding then says so); a registry that does not answer is
    /// [`SchemaError::Unavailable`].
    async fn fetch(&self, ids: &[u32]) -> Result<(), SchemaError>;
}

/// The schema id of `bytes` in Confluent's wire format: a 0 byte, then the id (4 bytes, big
/// endian), then at least the payload's first byte... or none (a JSON text never starts
/// with a 0 byte).
pub fn schema_id(bytes: &[u8]) -> Option<u32> {
    match bytes {
        [0, a, b, c, d, ..] => Some(u32::from_be_bytes([*a, *b, *c, *d])),
        _ => None,
    }
}

/// The schema ids `message`'s key and value name, if they are in the wire format.
pub fn schema_ids(message: &Message<'_>) -> impl Iterator<Item = u32> {
    [message.key.and_then(schema_id), schema_id(message.value)].into_iter().flatten()
}

/// How one topic's messages are read: its format, and the schemas of what is in the wire
/// format.
#[derive(Debug, Clone, Default)]
pub struct Reader {
    /// The topic's format.
    pub format: Format,
    /// The registry's schemas, if one is configured.
    pub schemas: Option<Arc<dyn Schemas>>,
}

/// A message read: its envelope, and what a wire-format key and value held (as the format
/// read them), to keep in their stead.
#[derive(Debug)]
pub struct Decoded {
    /// The envelope.
    pub envelope: LazyEnvelope,
    /// The key's text, when the key was in the wire format.
    pub key: Option<Vec<u8>>,
    /// The value as JSON, when it was in the wire format.
    pub value: Option<Vec<u8>>,
}

impl Reader {
    /// The envelope `message` carries (see [`Reader::decode`]).
    pub fn read(&self, message: &Message<'_>) -> Result<LazyEnvelope, DecodeError> {
        self.decode(message).map(|decoded| decoded.envelope)
    }

    /// The envelope `message` carries, a wire-format key and value decoded first.
    pub fn decode(&self, message: &Message<'_>) -> Result<Decoded, DecodeError> {
        let key = message.key.map(|key| self.plain(key, Part::Key)).transpose()?.flatten();
        let value = self.plain(message.value, Part::Value)?;
        let plain = Message {
            key: key.as_deref().or(message.key),
            value: value.as_deref().unwrap_or(message.value),
            headers: message.headers,
        };
        let envelope = self.format.read(&plain)?;
        Ok(Decoded { envelope, key, value })
    }

    /// What `bytes` hold when in the wire format: a key's text (a JSON string's, else the
    /// JSON), a value's JSON; `None` when they are not in the wire format.
    fn plain(&self, bytes: &[u8], part: Part) -> Result<Option<Vec<u8>>, DecodeError> {
        let Some(id) = schema_id(bytes) else { return Ok(None) };
        let Some(schemas) = &self.schemas else {
            let problem = format!("the {part} is in Confluent's wire format and no schema registry is configured");
            return Err(DecodeError::Schema { id, problem });
        };
        let json = schemas.decode(bytes).map_err(|e| match e {
            SchemaError::NotFetched(id) => DecodeError::SchemaPending { id },
            e => DecodeError::Schema { id, problem: format!("the {part}: {e}") },
        })?;
        match (part, json.first()) {
            (Part::Key, Some(b'"')) => serde_json::from_slice::<String>(&json)
                .map(|text| Some(text.into_bytes()))
                .map_err(|e| DecodeError::Schema { id, problem: format!("the key: {e}") }),
            _ => Ok(Some(json)),
        }
    }
}

#[derive(Clone, Copy)]
enum Part {
    Key,
    Value,
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Key => "key",
            Self::Value => "value",
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use serde_json::Value;

    use super::*;

    /// Schema 7 holds an envelope's JSON after its header; schema 9 a key; schema 8 is
    /// unknown; the rest are not fetched until `fetch`.
    #[derive(Debug, Default)]
    struct Fake(Mutex<Vec<u32>>);

    #[async_trait]
    impl Schemas for Fake {
        fn decode(&self, bytes: &[u8]) -> Result<Vec<u8>, SchemaError> {
            let id = schema_id(bytes).unwrap();
            if !self.0.lock().unwrap().contains(&id) {
                return Err(SchemaError::NotFetched(id));
            }
            match id {
                9 => Ok(serde_json::to_vec(&String::from_utf8(bytes[5..].to_vec()).unwrap()).unwrap()),
                8 => Err(SchemaError::Invalid("schema id 8 is not in the registry".into())),
                _ => serde_json::from_slice::<Value>(&bytes[5..])
                    .map(|_| bytes[5..].to_vec())
                    .map_err(|e| SchemaError::Invalid(e.to_string())),
            }
        }

        async fn fetch(&self, ids: &[u32]) -> Result<(), SchemaError> {
            self.fetched(ids);
            Ok(())
        }
    }

    impl Fake {
        fn fetched(&self, ids: &[u32]) {
            self.0.lock().unwrap().extend(ids);
        }
    }

    fn wire(id: u32, body: &[u8]) -> Vec<u8> {
        [&[0][..], &id.to_be_bytes(), body].concat()
    }

    const ENVELOPE: &str = r#"{"id":"00000000-0000-4000-8000-000000000001","aggregate_type":"account","aggregate_id":"a-1","version":1,"type":"Opened","occurred_at":"2026-01-01T00:00:00Z","data":{"owner":"o"}}"#;

    #[test]
    fn the_wire_format_is_told_by_its_first_byte() {
        assert_eq!(schema_id(&wire(258, b"x")), Some(258));
        assert_eq!((schema_id(b"{}"), schema_id(&[0, 0, 0, 1])), (None, None), "JSON, or too short");
    }

    #[test]
    fn a_wire_format_key_and_value_decode_once_their_schemas_are_fetched() {
        let fake = Arc::new(Fake::default());
        let reader = Reader { format: Format::Envelope, schemas: Some(fake.clone()) };
        let (key, value) = (wire(9, b"a-1"), wire(7, ENVELOPE.as_bytes()));
        let message = Message { key: Some(&key), value: &value, headers: &[] };
        assert_eq!(schema_ids(&message).collect::<Vec<_>>(), [9, 7]);
        assert_eq!(reader.read(&message).unwrap_err(), DecodeError::SchemaPending { id: 9 });
        fake.fetched(&[9, 7]);
        let decoded = reader.decode(&message).unwrap();
        assert_eq!((decoded.envelope.aggregate_id.as_str(), decoded.key.as_deref()), ("a-1", Some(&b"a-1"[..])));
        let json: Value = serde_json::from_slice(decoded.value.as_deref().unwrap()).unwrap();
        assert_eq!(json["data"]["owner"], "o");
    }

    #[test]
    fn what_does_not_decode_names_its_schema_id() {
        let fake = Arc::new(Fake::default());
        fake.fetched(&[8, 7]);
        let reader = Reader { format: Format::Envelope, schemas: Some(fake) };
        let (unknown, cut) = (wire(8, b"{}"), wire(7, &ENVELOPE.as_bytes()[..20]));
        let err = reader.read(&Message { key: None, value: &unknown, headers: &[] }).unwrap_err();
        assert_eq!(err.to_string(), "schema id 8: the value: schema id 8 is not in the registry");
        let err = reader.read(&Message { key: None, value: &cut, headers: &[] }).unwrap_err();
        assert!(err.to_string().starts_with("schema id 7: the value: "), "{err}");
        let none = Reader::default().read(&Message { key: None, value: &cut, headers: &[] }).unwrap_err();
        assert!(none.to_string().contains("no schema registry is configured"), "{none}");
    }
}
