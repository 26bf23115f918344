//! The registry client with its cache of compiled schemas, and decoding from that cache.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, PoisonError, RwLock},
};

use serde::{Deserialize, Serialize as _};
use serde_json::Value as Json;

use crate::{
    avro::AvroSchema,
    client::{Answer, Client, Fetched, Reference},
    protobuf::ProtoSchema,
    wire, Error, RegistryConfig, Result,
};

/// A schema id's entry in the cache. A schema id never changes meaning, so a compiled
/// schema is kept for good; an unknown id is asked again by the next `prepare`.
#[derive(Debug, Clone)]
enum Entry {
    Ready(Arc<Compiled>),
    Unknown,
    Bad(String),
}

#[derive(Debug)]
enum Compiled {
    Avro(Box<AvroSchema>),
    Protobuf(ProtoSchema),
    /// JSON Schema: the payload is read as JSON, not validated against the schema.
    Json,
}

/// Where a reader's schema for Avro's schema resolution comes from.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ReaderSchema {
    /// A subject's version in the registry; without a version, the latest when read.
    Subject {
        /// The subject, e.g. `orders-value`.
        subject: String,
        /// The version; `None`: the latest at the time [`Registry::reader`] runs.
        #[serde(default)]
        version: Option<u32>,
    },
    /// An Avro schema's JSON text.
    Avro(String),
}

/// The reader's side of Avro's schema resolution, made by [`Registry::reader`].
#[derive(Debug, Clone)]
pub struct Reader(Arc<AvroSchema>);

/// A schema registry speaking Confluent's REST API, with a cache of the schemas it has
/// compiled, by id.
pub struct Registry {
    client: Client,
    cache: RwLock<HashMap<u32, Entry>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("url", &self.client.shown).finish_non_exhaustive()
    }
}

impl Registry {
    /// A client for the registry `config` names. Reads the TLS files; sends nothing yet.
    pub fn new(config: &RegistryConfig) -> Result<Self> {
        Ok(Self { client: Client::new(config)?, cache: RwLock::default() })
    }

    /// The registry's URL, without credentials.
    pub fn url(&self) -> &str {
        &self.client.shown
    }

    /// Fetches and compiles the schemas of `ids` that are not in the cache yet.
    ///
    /// Fails only with [`Error::Unavailable`]: wait and call it again. An id the registry
    /// does not have, or a schema that does not compile, is remembered and reported by
    /// [`Registry::decode`] for the messages that name it.
    pub async fn prepare(&self, ids: impl IntoIterator<Item = u32>) -> Result<()> {
        let wanted: HashSet<u32> = ids.into_iter().collect();
        for id in wanted {
            if matches!(self.entry(id), Some(Entry::Ready(_) | Entry::Bad(_))) {
                continue;
            }
            let entry = self.fetch(id).await?;
            tracing::debug!(id, ?entry, "Schema fetched from the registry.");
            self.cache.write().unwrap_or_else(PoisonError::into_inner).insert(id, entry);
        }
        Ok(())
    }

    /// The reader's schema `schema` names, for [`Registry::decode_with`].
    pub async fn reader(&self, schema: &ReaderSchema) -> Result<Reader> {
        let (text, references) = match schema {
            ReaderSchema::Avro(text) => (text.clone(), Vec::new()),
            ReaderSchema::Subject { subject, version } => {
                let version = version.map_or_else(|| "latest".to_owned(), |v| v.to_string());
                let unknown = || Error::UnknownSubject {
                    subject: subject.clone(),
                    version: version.clone(),
                    url: self.client.shown.clone(),
                };
                let Answer::Found(fetched) = self.client.subject_version(subject, &version).await? else {
                    return Err(unknown());
                };
                if !matches!(fetched.schema_type.as_deref(), None | Some("AVRO")) {
                    return Err(Error::Config(format!("subject {subject} version {version} is not an Avro schema")));
                }
                let references = self.references(&fetched.references).await?.map_err(Error::Config)?;
                (fetched.schema, references.into_iter().map(|(_, text)| text).collect())
            }
        };
        let parsed = AvroSchema::parse(&text, &references);
        parsed.map(|s| Reader(Arc::new(s))).map_err(|e| Error::Config(format!("the reader's schema: {e}")))
    }

    /// The value (or key) `bytes`, in Confluent's wire format, as JSON; Avro is read with the
    /// writer's schema alone. Uses only the cache: call [`Registry::prepare`] first.
    pub fn decode(&self, bytes: &[u8]) -> Result<Json> {
        self.decode_with(bytes, None)
    }

    /// As [`Registry::decode`]; an Avro payload is resolved against `reader` when given
    /// (ignored for Protobuf and JSON Schema, whose evolution needs no reader's schema).
    pub fn decode_with(&self, bytes: &[u8], reader: Option<&Reader>) -> Result<Json> {
        self.decode_into(bytes, reader, serde_json::value::Serializer)
    }

    /// As [`Registry::decode`], written as JSON text: what the engine reads, with no JSON
    /// value built between.
    pub fn decode_text(&self, bytes: &[u8]) -> Result<Vec<u8>> {
        let mut text = Vec::with_capacity(bytes.len() * 2);
        self.decode_into(bytes, None, &mut serde_json::Serializer::new(&mut text))?;
        Ok(text)
    }

    fn decode_into<S: serde::Serializer>(&self, bytes: &[u8], reader: Option<&Reader>, into: S) -> Result<S::Ok> {
        let (id, payload) = wire::split(bytes)?;
        let compiled = match self.entry(id) {
            None => return Err(Error::NotPrepared { id }),
            Some(Entry::Unknown) => return Err(Error::UnknownSchema { id, url: self.client.shown.clone() }),
            Some(Entry::Bad(reason)) => return Err(Error::BadSchema { id, reason }),
            Some(Entry::Ready(compiled)) => compiled,
        };
        let decoded = match &*compiled {
            Compiled::Avro(schema) => schema.decode_into(payload, reader.map(|r| &*r.0), into),
            Compiled::Protobuf(schema) => schema.decode_into(payload, into),
            Compiled::Json => serde_json::from_slice::<Json>(payload)
                .map_err(|e| format!("not JSON: {e}"))
                .and_then(|json| json.serialize(into).map_err(|e| e.to_string())),
        };
        decoded.map_err(|reason| Error::DoesNotFit { id, reason })
    }

    fn entry(&self, id: u32) -> Option<Entry> {
        self.cache.read().unwrap_or_else(PoisonError::into_inner).get(&id).cloned()
    }

    /// The registry's schema `id`, compiled: Err only when the registry is unavailable.
    async fn fetch(&self, id: u32) -> Result<Entry> {
        let Answer::Found(fetched) = self.client.schema(id).await? else { return Ok(Entry::Unknown) };
        let references = match self.references(&fetched.references).await? {
            Ok(references) => references,
            Err(reason) => return Ok(Entry::Bad(reason)),
        };
        Ok(compile(&fetched, &references).map_or_else(Entry::Bad, |c| Entry::Ready(Arc::new(c))))
    }

    /// Every schema `references` lead to, transitively, as (name, text); Ok(Err) names a
    /// reference the registry does not have.
    async fn references(&self, references: &[Reference]) -> Result<Result<Vec<(String, String)>, String>> {
        const MAX: usize = 256;
        let (mut found, mut seen, mut todo) = (Vec::new(), HashSet::new(), references.to_vec());
        while let Some(reference) = todo.pop() {
            if !seen.insert(reference.name.clone()) {
                continue;
            }
            if seen.len() > MAX {
                return Ok(Err(format!("more than {MAX} references")));
            }
            let version = if reference.version < 0 { "latest".to_owned() } else { reference.version.to_string() };
            match self.client.subject_version(&reference.subject, &version).await? {
                Answer::Found(Fetched { schema, references, .. }) => {
                    todo.extend(references);
                    found.push((reference.name, schema));
                }
                Answer::NotFound => {
                    let Reference { name, subject, .. } = reference;
                    return Ok(Err(format!(
                        "its reference {name} (subject {subject} version {version}) is not in the registry"
                    )));
                }
            }
        }
        Ok(Ok(found))
    }
}

/// A fetched schema compiled by its type.
fn compile(fetched: &Fetched, references: &[(String, String)]) -> Result<Compiled, String> {
    match fetched.schema_type.as_deref().unwrap_or("AVRO") {
        "AVRO" => {
            let texts: Vec<String> = references.iter().map(|(_, text)| text.clone()).collect();
            AvroSchema::parse(&fetched.schema, &texts).map(|s| Compiled::Avro(Box::new(s)))
        }
        "PROTOBUF" => ProtoSchema::compile(&fetched.schema, references).map(Compiled::Protobuf),
        "JSON" => Ok(Compiled::Json),
        other => Err(format!("the schema type {other} is not one this crate reads")),
    }
}

#[cfg(test)]
#[path = "registry_tests.rs"]
mod tests;
