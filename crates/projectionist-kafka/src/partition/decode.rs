//! Messages as the partition task holds them, and a batch's envelopes decoded: those that
//! are not an envelope at all are dead-lettered alone, or halt the partition, by policy.

use projectionist_core::format::schemas::schema_id;
use projectionist_core::format::{Message, Reader};
use projectionist_core::{DecodeError, LazyEnvelope, OnPoison};
use projectionist_postgres::park::{Headers, SourceMessage, Undecodable};
use rdkafka::message::{BorrowedMessage, Message as _};

use super::{Halt, HaltKind};

/// Where a message sits in its partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct At {
    pub offset: i64,
    /// The broker's timestamp (create or log-append time), ms since the epoch.
    pub timestamp: Option<i64>,
}

/// A consumed message, decoded as it is read (while the batch before it is written): its
/// envelope, or why it is poison; and the message as read, kept until its batch commits,
/// for what parking holds and dead letters keep.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Msg {
    pub at: At,
    pub envelope: Result<LazyEnvelope, Poison>,
    pub message: SourceMessage,
}

/// A message that cannot be applied: its key (or `?`), what kind and why. A message whose
/// schema is not fetched yet (`pending`) is not poison: it is read again once it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Poison {
    aggregate: String,
    kind: &'static str,
    reason: String,
    pub pending: Option<u32>,
}

impl Msg {
    /// The producer's trace context this message carries, if any (see [`crate::trace`]).
    pub(crate) fn producer_context(&self) -> Option<opentelemetry::trace::SpanContext> {
        let header = |name: &str| {
            let value = self.message.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))?;
            std::str::from_utf8(value.1.as_deref()?).ok()
        };
        let metadata = self.envelope.as_ref().ok().and_then(|e| e.metadata.as_ref());
        let field = |name: &str| metadata?.get(name)?.as_str();
        crate::trace::producer_context(header, field)
    }

    /// The message decoded (a payload over `max_bytes` is poison, unparsed), and its size in
    /// bytes (payload and key) for the batch bounds.
    pub(crate) fn from_kafka(message: &BorrowedMessage<'_>, reader: &Reader, max_bytes: usize) -> (Self, usize) {
        let at = At { offset: message.offset(), timestamp: message.timestamp().to_millis() };
        let headers = crate::headers::read(message);
        Self::read(at, (message.key(), message.payload(), headers), reader, max_bytes)
    }

    /// A message read at `at` from its parts (key, payload, headers), as
    /// [`Msg::from_kafka`] reads them: its envelope as `reader` reads it. A key or value in
    /// Confluent's wire format is kept as what it held (text, JSON), so that what parking
    /// holds and dead letters keep reads again without the registry.
    pub(crate) fn read(
        at: At,
        (key, payload, headers): (Option<&[u8]>, Option<&[u8]>, Headers),
        reader: &Reader,
        max_bytes: usize,
    ) -> (Self, usize) {
        let bytes = key.map_or(0, <[u8]>::len) + payload.map_or(0, <[u8]>::len);
        let (envelope, plain_key, plain_value) = match decode(key, payload, &headers, reader, max_bytes) {
            Ok((envelope, key, value)) => (Ok(envelope), key, value),
            Err(poison) => (Err(poison), None, None),
        };
        let message = SourceMessage {
            offset: Some(at.offset),
            key: plain_key.or_else(|| key.map(<[u8]>::to_vec)),
            payload: plain_value.or_else(|| payload.map(<[u8]>::to_vec)).unwrap_or_default(),
            headers,
        };
        (Self { at, envelope, message }, bytes)
    }

    /// The schema this message waits for, if its key or value is in the wire format and
    /// the schema was not fetched when it was read.
    pub(crate) fn pending(&self) -> Option<u32> {
        self.envelope.as_ref().err().and_then(|poison| poison.pending)
    }

    /// The schemas a message that waits (see [`Msg::pending`]) needs: its key's and its
    /// value's, as reading stops at the first not fetched.
    pub(crate) fn schemas_needed(&self) -> impl Iterator<Item = u32> + '_ {
        let ids =
            self.pending().map(|_| [self.message.key.as_deref().and_then(schema_id), schema_id(&self.message.payload)]);
        ids.into_iter().flatten().flatten()
    }

    /// The message read again (its schemas fetched since), at the same place.
    pub(crate) fn reread(self, reader: &Reader, max_bytes: usize) -> Self {
        let SourceMessage { key, payload, headers, .. } = self.message;
        Self::read(self.at, (key.as_deref(), Some(&payload), headers), reader, max_bytes).0
    }

    /// The aggregate the message is about, as far as it says: its envelope's, else its key
    /// (`?` without one).
    pub(crate) fn aggregate(&self) -> String {
        match &self.envelope {
            Ok(envelope) => envelope.aggregate_id.to_string(),
            Err(poison) => poison.aggregate.clone(),
        }
    }
}

/// A batch's messages split: the envelopes with their places and messages, the messages that
/// are not envelopes (dead-lettered alone), and, with [`OnPoison::Halt`], the halt the first
/// of those causes (nothing from it on is kept).
#[derive(Debug, Default)]
pub(crate) struct Split {
    pub places: Vec<At>,
    pub envelopes: Vec<LazyEnvelope>,
    pub messages: Vec<SourceMessage>,
    pub undecodable: Vec<Undecodable>,
    pub halt: Option<Halt>,
}

/// The messages of `batch` that `scope` keeps, and the offsets of those it passes over
/// (other aggregates' events, for a repair); every message unless it names aggregates.
pub(crate) fn in_scope(batch: Vec<Msg>, scope: &crate::scope::Scope) -> (Vec<Msg>, Vec<i64>) {
    if scope.aggregates.is_none() {
        return (batch, Vec::new());
    }
    let (mut kept, mut passed) = (Vec::new(), Vec::new());
    for m in batch {
        let keep = match &m.envelope {
            Ok(e) => scope.keeps(&e.aggregate_type, &e.aggregate_id),
            Err(poison) => scope.keeps_unreadable(&poison.aggregate),
        };
        if keep {
            kept.push(m);
        } else {
            passed.push(m.at.offset);
        }
    }
    (kept, passed)
}

/// Splits a batch's messages (see [`Split`]).
pub(crate) fn split(batch: Vec<Msg>, on_poison: OnPoison) -> Split {
    let mut split = Split { places: Vec::with_capacity(batch.len()), ..Split::default() };
    split.envelopes.reserve(batch.len());
    split.messages.reserve(batch.len());
    for m in batch {
        match m.envelope {
            Ok(e) => {
                split.places.push(m.at);
                split.envelopes.push(e);
                split.messages.push(m.message);
            }
            Err(Poison { aggregate, reason, .. }) if on_poison == OnPoison::Halt => {
                let (offset, timestamp, kind) = (m.at.offset, m.at.timestamp, HaltKind::Poison);
                split.halt = Some(Halt { offset, timestamp, aggregate, reason, kind, heals: false });
                break;
            }
            Err(Poison { kind, reason, .. }) => {
                split.undecodable.push(Undecodable { message: m.message, reason: kind, error: reason })
            }
        }
    }
    split
}

/// The envelope, and what a wire-format key and value held.
type Read = (LazyEnvelope, Option<Vec<u8>>, Option<Vec<u8>>);

fn decode(
    key: Option<&[u8]>,
    payload: Option<&[u8]>,
    headers: &Headers,
    reader: &Reader,
    max_bytes: usize,
) -> Result<Read, Poison> {
    let poison = |kind: &'static str, reason: String| Poison {
        aggregate: key.map_or_else(|| "?".to_owned(), |k| String::from_utf8_lossy(k).into_owned()),
        kind,
        reason,
        pending: None,
    };
    let payload = payload.ok_or_else(|| poison("tombstone", "message has no payload (tombstone)".into()))?;
    if payload.len() > max_bytes {
        let reason = format!("payload of {} bytes is over max_event_bytes ({max_bytes}); not parsed", payload.len());
        return Err(poison("oversized", reason));
    }
    let message = Message { key, value: payload, headers };
    let decoded = reader.decode(&message).map_err(|e| match (e, &reader.format) {
        (DecodeError::SchemaPending { id }, _) => {
            Poison { pending: Some(id), ..poison("schema", format!("schema id {id} is not fetched")) }
        }
        (e @ DecodeError::Schema { .. }, _) => poison("schema", format!("undecodable payload: {e}")),
        (e, projectionist_core::format::Format::Envelope) => poison("envelope", format!("undecodable envelope: {e}")),
        (e, other) => poison("envelope", format!("undecodable {} message: {e}", other.name())),
    })?;
    let envelope = decoded.envelope;
    let key = match (&decoded.key, key) {
        (Some(plain), _) => Some(std::borrow::Cow::Borrowed(plain.as_slice())),
        (None, key) => key.map(|key| reader.format.key_of(key)),
    };
    match key {
        Some(key) if *key != *envelope.aggregate_id.as_bytes() => Err(poison(
            "key",
            format!(
                "message key {:?} differs from aggregate_id {:?}: per-aggregate ordering is not guaranteed",
                String::from_utf8_lossy(&key),
                envelope.aggregate_id
            ),
        )),
        Some(_) => Ok((envelope, decoded.key, decoded.value)),
        None => Err(poison(
            "key",
            format!(
                "message has no key (aggregate_id {:?}): per-aggregate ordering is not guaranteed; publish it keyed \
                 by aggregate_id",
                envelope.aggregate_id
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use projectionist_core::format::Format;

    fn msg(offset: i64, key: &str, payload: &str) -> Msg {
        let at = At { offset, timestamp: Some(offset) };
        let (key, payload) = (key.as_bytes(), payload.as_bytes());
        let message =
            SourceMessage { offset: Some(offset), key: Some(key.to_vec()), payload: payload.to_vec(), headers: vec![] };
        Msg {
            at,
            envelope: decode(Some(key), Some(payload), &vec![], &Reader::default(), 1 << 20).map(|r| r.0),
            message,
        }
    }

    fn envelope(id: &str, version: u64) -> String {
        format!(
            concat!(
                r#"{{"id":"00000000-0000-4000-8000-00000000000{version}","aggregate_type":"account","#,
                r#""aggregate_id":"{id}","version":{version},"type":"Opened","#,
                r#""occurred_at":"2026-01-01T00:00:00Z","data":{{}}}}"#
            ),
            version = version,
            id = id
        )
    }

    #[test]
    fn with_halt_decoding_stops_at_the_first_poison_message_and_names_it() {
        let messages =
            vec![msg(10, "a", &envelope("a", 1)), msg(11, "b", "{not json"), msg(12, "a", &envelope("a", 2))];
        let split = split(messages, OnPoison::Halt);
        assert_eq!(split.messages[0].payload, envelope("a", 1).as_bytes(), "the bytes as read");
        assert_eq!(split.envelopes.len(), 1);
        let halt = split.halt.expect("a halt");
        assert_eq!((halt.offset, halt.aggregate.as_str(), halt.kind), (11, "b", HaltKind::Poison));
        assert!(halt.reason.contains("undecodable envelope"), "{}", halt.reason);
    }

    #[test]
    fn with_dead_letters_what_is_not_an_envelope_is_set_aside_with_its_bytes() {
        let messages =
            vec![msg(10, "a", &envelope("a", 1)), msg(11, "b", "{not json"), msg(12, "a", &envelope("a", 2))];
        let split = split(messages, OnPoison::DeadLetter);
        assert_eq!((split.envelopes.len(), split.places[1].offset, split.halt), (2, 12, None));
        let bad = &split.undecodable[0];
        assert_eq!((bad.reason, bad.message.offset), ("envelope", Some(11)));
        assert_eq!(bad.message.payload, b"{not json");
    }

    #[test]
    fn a_key_that_contradicts_the_envelope_is_poison_and_so_is_a_tombstone() {
        let halted = split(vec![msg(5, "x", &envelope("y", 1))], OnPoison::Halt);
        assert!(halted.envelopes.is_empty());
        let halt = halted.halt.expect("a halt");
        assert_eq!((halt.offset, halt.kind), (5, HaltKind::Poison));
        assert!(halt.reason.contains("differs from aggregate_id"), "{}", halt.reason);
        let at = At { offset: 6, timestamp: None };
        let message = SourceMessage { offset: Some(6), key: Some(b"x".to_vec()), ..SourceMessage::default() };
        let tombstone = Msg {
            at,
            envelope: decode(Some(b"x"), None, &vec![], &Reader::default(), 1 << 20).map(|r| r.0),
            message: message.clone(),
        };
        let big = envelope("x", 1);
        let oversized = Msg {
            at,
            envelope: decode(Some(b"x"), Some(big.as_bytes()), &vec![], &Reader::default(), 10).map(|r| r.0),
            message: message.clone(),
        };
        let keyless = Msg {
            at,
            envelope: decode(None, Some(big.as_bytes()), &vec![], &Reader::default(), 1 << 20).map(|r| r.0),
            message,
        };
        let set_aside = split(vec![tombstone, oversized, keyless], OnPoison::DeadLetter);
        let reasons: Vec<&str> = set_aside.undecodable.iter().map(|u| u.reason).collect();
        assert_eq!(reasons, ["tombstone", "oversized", "key"]);
        assert!(set_aside.undecodable[1].error.contains("over max_event_bytes (10)"));
    }

    #[test]
    fn a_key_is_compared_with_the_aggregate_as_its_format_writes_keys() {
        let headers: Headers = [("id", "e-1"), ("eventType", "Opened"), ("aggregateType", "account"), ("version", "1")]
            .into_iter()
            .chain([("occurredAt", "2026-01-01T00:00:00Z")])
            .map(|(n, v)| (n.as_bytes().to_vec(), Some(v.as_bytes().to_vec())))
            .collect();
        let debezium = Reader { format: Format::named("debezium").unwrap(), schemas: None };
        let quoted = decode(Some(br#""acc-1""#), Some(b"{}"), &headers, &debezium, 1 << 20);
        assert_eq!(quoted.map(|(e, ..)| e.aggregate_id.to_string()), Ok("acc-1".to_owned()), "JsonConverter's key");
        let format = serde_json::from_value(serde_json::json!({
            "format": "debezium", "aggregate_id": "header:aggregateType"
        }));
        let from_a_header = Reader { format: format.unwrap(), schemas: None };
        let other = decode(Some(br#""acc-1""#), Some(b"{}"), &headers, &from_a_header, 1 << 20);
        assert!(other.unwrap_err().reason.contains("differs from aggregate_id"));
    }

    /// A registry that has fetched nothing yet.
    #[derive(Debug)]
    struct Unfetched;

    #[async_trait::async_trait]
    impl projectionist_core::format::Schemas for Unfetched {
        fn decode(&self, bytes: &[u8]) -> Result<Vec<u8>, projectionist_core::format::SchemaError> {
            Err(projectionist_core::format::SchemaError::NotFetched(schema_id(bytes).unwrap_or_default()))
        }

        async fn fetch(&self, _: &[u32]) -> Result<(), projectionist_core::format::SchemaError> {
            Ok(())
        }
    }

    #[test]
    fn a_message_waiting_for_its_schemas_needs_its_keys_and_its_values() {
        let reader = Reader { format: Format::Envelope, schemas: Some(std::sync::Arc::new(Unfetched)) };
        let (key, value) = ([&[0, 0, 0, 0, 1][..], b"a-1"].concat(), [&[0, 0, 0, 0, 2][..], b"{}"].concat());
        let at = At { offset: 3, timestamp: None };
        let (waiting, _) = Msg::read(at, (Some(&key), Some(&value), vec![]), &reader, 1 << 20);
        assert_eq!(waiting.pending(), Some(1), "reading stops at the key");
        assert_eq!(waiting.schemas_needed().collect::<Vec<_>>(), [1, 2]);
        let (plain, _) = Msg::read(at, (Some(b"a-1"), Some(&value), vec![]), &reader, 1 << 20);
        assert_eq!(plain.schemas_needed().collect::<Vec<_>>(), [2]);
    }
}
