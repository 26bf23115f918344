//! How a topic's messages carry the envelope's fields: projectionist's own JSON envelope (the
//! default), CloudEvents in either mode of its Kafka binding ([`cloudevents`]), Axon
//! Framework's Kafka messages ([`axon`]), Debezium's outbox event router ([`debezium`]), or each field where a mapping says ([`mapped`]). A format
//! reads a message's key, value and headers into a [`LazyEnvelope`], or says which field it
//! could not find and where it looked.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::{DecodeError, LazyEnvelope};

pub mod axon;
pub mod cloudevents;
pub mod debezium;
pub mod mapped;
pub mod schemas;

pub use axon::{Axon, AxonType};
pub use cloudevents::CloudEvents;
pub use debezium::Debezium;
pub use mapped::{Mapped, Source};
pub use schemas::{Decoded, Reader, SchemaError, Schemas};

/// A message's parts, as a format reads them.
#[derive(Debug, Clone, Copy)]
pub struct Message<'a> {
    /// The message key.
    pub key: Option<&'a [u8]>,
    /// The message value.
    pub value: &'a [u8],
    /// The message headers: each name's bytes and its value (`None`: a header without one).
    pub headers: &'a [(Vec<u8>, Option<Vec<u8>>)],
}

impl<'a> Message<'a> {
    /// The value of the first header named `name`, when there is one with a value.
    pub fn header(&self, name: &str) -> Option<&'a [u8]> {
        self.headers.iter().find(|(n, _)| n.as_slice() == name.as_bytes()).and_then(|(_, v)| v.as_deref())
    }
}

/// How a topic's messages carry the envelope.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "format", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Format {
    /// projectionist's own JSON envelope as the value (see [`crate::RawEnvelope`]).
    #[default]
    Envelope,
    /// CloudEvents, structured or binary mode, told apart by the message's headers.
    #[serde(rename = "cloudevents")]
    CloudEvents(CloudEvents),
    /// Axon Framework's Kafka messages (`axon-message-*` headers, a JSON payload).
    Axon(Axon),
    /// Debezium's outbox event router: the aggregate id as the key, the payload as the value,
    /// the rest in headers.
    Debezium(Debezium),
    /// Each field where the mapping says: the key, a header, a JSON pointer, a constant.
    Mapped(Mapped),
}

impl Format {
    /// The envelope `message` carries, or why it carries none.
    pub fn read(&self, message: &Message<'_>) -> Result<LazyEnvelope, DecodeError> {
        match self {
            Self::Envelope => LazyEnvelope::from_slice(message.value),
            Self::CloudEvents(fields) => fields.read(message),
            Self::Axon(axon) => axon.read(message),
            Self::Debezium(debezium) => debezium.read(message),
            Self::Mapped(mapped) => mapped.read(message),
        }
    }

    /// The aggregate id a message's `key` names, as this format writes keys: the key itself,
    /// or for `debezium` a key Kafka Connect's `JsonConverter` quoted, unquoted.
    pub fn key_of<'k>(&self, key: &'k [u8]) -> Cow<'k, [u8]> {
        match self {
            Self::Debezium(_) => debezium::unquoted(key),
            _ => Cow::Borrowed(key),
        }
    }

    /// The format's name, as configured.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Envelope => "envelope",
            Self::CloudEvents(_) => "cloudevents",
            Self::Axon(_) => "axon",
            Self::Debezium(_) => "debezium",
            Self::Mapped(_) => "mapped",
        }
    }

    /// The format named `name` with its default fields (`envelope`, `cloudevents`, `axon`,
    /// `debezium`).
    pub fn named(name: &str) -> Result<Self, String> {
        match name {
            "envelope" => Ok(Self::Envelope),
            "cloudevents" => Ok(Self::CloudEvents(CloudEvents::default())),
            "axon" => Ok(Self::Axon(Axon::default())),
            "debezium" => Ok(Self::Debezium(Debezium::default())),
            "mapped" => Err("mapped has no defaults: say where each field is in the settings file's \
                             [topics.\"TOPIC\"] table (format = \"mapped\")"
                .into()),
            other => Err(format!(
                "no format named {other:?}: envelope, cloudevents, axon or debezium (mapped in the settings file)"
            )),
        }
    }
}

/// The format of each topic (a topic not listed carries projectionist's own envelope), and
/// the schemas of payloads in Confluent's wire format, if a registry is configured. Written
/// in settings as a table of topics.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(from = "BTreeMap<String, Format>", into = "BTreeMap<String, Format>")]
pub struct Formats {
    topics: BTreeMap<String, Format>,
    schemas: Option<Arc<dyn Schemas>>,
}

impl Formats {
    /// No topic listed, no registry: every topic carries projectionist's own envelope.
    pub const fn new() -> Self {
        Self { topics: BTreeMap::new(), schemas: None }
    }

    /// These formats, `topic`'s being `format`.
    pub fn with(mut self, topic: impl Into<String>, format: Format) -> Self {
        self.insert(topic, format);
        self
    }

    /// Sets `topic`'s format.
    pub fn insert(&mut self, topic: impl Into<String>, format: Format) {
        self.topics.insert(topic.into(), format);
    }

    /// These formats, decoding payloads in Confluent's wire format with `schemas`.
    pub fn with_schemas(mut self, schemas: Arc<dyn Schemas>) -> Self {
        self.schemas = Some(schemas);
        self
    }

    /// The registry's schemas, if one is configured.
    pub fn schemas(&self) -> Option<&Arc<dyn Schemas>> {
        self.schemas.as_ref()
    }

    /// The topics listed, with their formats.
    pub fn topics(&self) -> &BTreeMap<String, Format> {
        &self.topics
    }

    /// Whether every topic carries projectionist's own JSON envelope, and no registry is set.
    pub fn is_empty(&self) -> bool {
        self.topics.is_empty() && self.schemas.is_none()
    }

    /// The format of `topic`.
    pub fn of(&self, topic: &str) -> &Format {
        static ENVELOPE: Format = Format::Envelope;
        self.topics.get(topic).unwrap_or(&ENVELOPE)
    }

    /// How `topic`'s messages are read: its format and the registry's schemas.
    pub fn reader(&self, topic: &str) -> Reader {
        Reader { format: self.of(topic).clone(), schemas: self.schemas.clone() }
    }

    /// The envelope `message`, read on `topic`, carries (see [`Reader::read`]).
    pub fn read(&self, topic: &str, message: &Message<'_>) -> Result<LazyEnvelope, DecodeError> {
        self.reader(topic).read(message)
    }
}

impl PartialEq for Formats {
    fn eq(&self, other: &Self) -> bool {
        let same_schemas = match (&self.schemas, &other.schemas) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (a, b) => a.is_none() && b.is_none(),
        };
        self.topics == other.topics && same_schemas
    }
}

impl Eq for Formats {}

impl From<BTreeMap<String, Format>> for Formats {
    fn from(topics: BTreeMap<String, Format>) -> Self {
        Self { topics, schemas: None }
    }
}

impl From<Formats> for BTreeMap<String, Format> {
    fn from(formats: Formats) -> Self {
        formats.topics
    }
}

impl Extend<(String, Format)> for Formats {
    fn extend<I: IntoIterator<Item = (String, Format)>>(&mut self, topics: I) {
        self.topics.extend(topics);
    }
}

impl FromIterator<(String, Format)> for Formats {
    fn from_iter<I: IntoIterator<Item = (String, Format)>>(topics: I) -> Self {
        Self::from(topics.into_iter().collect::<BTreeMap<_, _>>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_format_is_configured_by_name_and_a_topic_not_listed_carries_the_envelope() {
        let formats: Formats = serde_json::from_value(serde_json::json!({
            "orders": { "format": "cloudevents", "version": "seq" },
            "accounts": { "format": "envelope" },
        }))
        .unwrap();
        let Format::CloudEvents(fields) = formats.of("orders") else { panic!("{formats:?}") };
        assert_eq!((fields.version.as_str(), fields.aggregate_id.as_str()), ("seq", "subject"));
        assert_eq!((formats.of("accounts"), formats.of("other")), (&Format::Envelope, &Format::Envelope));
        assert_eq!(Format::named("cloudevents").unwrap().name(), "cloudevents");
        assert!(Format::named("avro").unwrap_err().contains("envelope, cloudevents, axon or debezium"));
        let unknown = serde_json::from_value::<Formats>(serde_json::json!({ "t": { "format": "x" } }));
        assert!(unknown.is_err());
    }
}
