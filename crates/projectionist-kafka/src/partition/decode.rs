//! Messages as the partition task holds them, and a batch's envelopes decoded: those that
//! are not an envelope at all are dead-lettered alone, or halt the partition, by policy.

use projectionist_core::format::{Format, Message};
use projectionist_core::{LazyEnvelope, OnPoison};
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

/// A message that cannot be applied: its key (or `?`), what kind and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Poison {
    aggregate: String,
    kind: &'static str,
    reason: String,
}

impl Msg {
    /// The message decoded (a payload over `max_bytes` is poison, unparsed), and its size in
    /// bytes (payload and key) for the batch bounds.
    pub(crate) fn from_kafka(message: &BorrowedMessage<'_>, format: &Format, max_bytes: usize) -> (Self, usize) {
        let at = At { offset: message.offset(), timestamp: message.timestamp().to_millis() };
        let headers = crate::headers::read(message);
        Self::read(at, (message.key(), message.payload(), headers), format, max_bytes)
    }

    /// A message read at `at` from its parts (key, payload, headers), as
    /// [`Msg::from_kafka`] reads them: its envelope as `format` carries it.
    pub(crate) fn read(
        at: At,
        (key, payload, headers): (Option<&[u8]>, Option<&[u8]>, Headers),
        format: &Format,
        max_bytes: usize,
    ) -> (Self, usize) {
        let bytes = key.map_or(0, <[u8]>::len) + payload.map_or(0, <[u8]>::len);
        let envelope = decode(key, payload, &headers, format, max_bytes);
        let message = SourceMessage {
            offset: Some(at.offset),
            key: key.map(<[u8]>::to_vec),
            payload: payload.map(<[u8]>::to_vec).unwrap_or_default(),
            headers,
        };
        (Self { at, envelope, message }, bytes)
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
                split.halt = Some(Halt { offset, timestamp, aggregate, reason, kind });
                break;
            }
            Err(Poison { kind, reason, .. }) => {
                split.undecodable.push(Undecodable { message: m.message, reason: kind, error: reason })
            }
        }
    }
    split
}

fn decode(
    key: Option<&[u8]>,
    payload: Option<&[u8]>,
    headers: &Headers,
    format: &Format,
    max_bytes: usize,
) -> Result<LazyEnvelope, Poison> {
    let poison = |kind: &'static str, reason: String| Poison {
        aggregate: key.map_or_else(|| "?".to_owned(), |k| String::from_utf8_lossy(k).into_owned()),
        kind,
        reason,
    };
    let payload = payload.ok_or_else(|| poison("tombstone", "message has no payload (tombstone)".into()))?;
    if payload.len() > max_bytes {
        let reason = format!("payload of {} bytes is over max_event_bytes ({max_bytes}); not parsed", payload.len());
        return Err(poison("oversized", reason));
    }
    let message = Message { key, value: payload, headers };
    let envelope = format.read(&message).map_err(|e| match format {
        Format::Envelope => poison("envelope", format!("undecodable envelope: {e}")),
        other => poison("envelope", format!("undecodable {} message: {e}", other.name())),
    })?;
    match key.map(|key| format.key_of(key)) {
        Some(key) if *key != *envelope.aggregate_id.as_bytes() => Err(poison(
            "key",
            format!(
                "message key {:?} differs from aggregate_id {:?}: per-aggregate ordering is not guaranteed",
                String::from_utf8_lossy(&key),
                envelope.aggregate_id
            ),
        )),
        Some(_) => Ok(envelope),
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

    fn msg(offset: i64, key: &str, payload: &str) -> Msg {
        let at = At { offset, timestamp: Some(offset) };
        let (key, payload) = (key.as_bytes(), payload.as_bytes());
        let message =
            SourceMessage { offset: Some(offset), key: Some(key.to_vec()), payload: payload.to_vec(), headers: vec![] };
        Msg { at, envelope: decode(Some(key), Some(payload), &vec![], &Format::Envelope, 1 << 20), message }
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
            envelope: decode(Some(b"x"), None, &vec![], &Format::Envelope, 1 << 20),
            message: message.clone(),
        };
        let big = envelope("x", 1);
        let oversized = Msg {
            at,
            envelope: decode(Some(b"x"), Some(big.as_bytes()), &vec![], &Format::Envelope, 10),
            message: message.clone(),
        };
        let keyless =
            Msg { at, envelope: decode(None, Some(big.as_bytes()), &vec![], &Format::Envelope, 1 << 20), message };
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
        let debezium = Format::named("debezium").unwrap();
        let quoted = decode(Some(br#""acc-1""#), Some(b"{}"), &headers, &debezium, 1 << 20);
        assert_eq!(quoted.map(|e| e.aggregate_id.to_string()), Ok("acc-1".to_owned()), "JsonConverter's key");
        let from_a_header: Format = serde_json::from_value(serde_json::json!({
            "format": "debezium", "aggregate_id": "header:aggregateType"
        }))
        .unwrap();
        let other = decode(Some(br#""acc-1""#), Some(b"{}"), &headers, &from_a_header, 1 << 20);
        assert!(other.unwrap_err().reason.contains("differs from aggregate_id"));
    }
}
