//! Messages as the partition task holds them, and their envelopes decoded up to the first
//! poison message.

use projectionist_core::RawEnvelope;
use projectionist_postgres::park::SourceMessage;
use rdkafka::message::{BorrowedMessage, Message};

use super::{Halt, HaltKind};

/// Where a message sits in its partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct At {
    pub offset: i64,
    /// The broker's timestamp (create or log-append time), ms since the epoch.
    pub timestamp: Option<i64>,
}

/// A consumed message, decoded as it is read (while the batch before it is written): its
/// envelope, or why it is poison; and its bytes, kept until its batch commits, for what
/// parking holds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Msg {
    pub at: At,
    pub envelope: Result<RawEnvelope, Poison>,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
}

/// A message that cannot be applied: its key (or `?`) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Poison {
    aggregate: String,
    reason: String,
}

impl Msg {
    /// The message decoded, and its size in bytes (payload and key) for the batch bounds.
    pub(crate) fn from_kafka(message: &BorrowedMessage<'_>) -> (Self, usize) {
        let at = At { offset: message.offset(), timestamp: message.timestamp().to_millis() };
        let (key, payload) = (message.key(), message.payload());
        let bytes = key.map_or(0, <[u8]>::len) + payload.map_or(0, <[u8]>::len);
        let envelope = decode(key, payload);
        let (key, payload) = (key.map(<[u8]>::to_vec), payload.map(<[u8]>::to_vec).unwrap_or_default());
        (Self { at, envelope, key, payload }, bytes)
    }
}

/// The messages' places, their envelopes up to the first poison message, each one's bytes
/// as read (for parking), and the halt the poison message causes.
pub(crate) fn decode_until_poison(messages: Vec<Msg>) -> (Vec<At>, Vec<RawEnvelope>, Vec<SourceMessage>, Option<Halt>) {
    let at: Vec<At> = messages.iter().map(|m| m.at).collect();
    let mut envelopes = Vec::with_capacity(messages.len());
    let mut sources = Vec::with_capacity(messages.len());
    for m in messages {
        match m.envelope {
            Ok(e) => {
                envelopes.push(e);
                sources.push(SourceMessage { offset: Some(m.at.offset), key: m.key, payload: m.payload });
            }
            Err(Poison { aggregate, reason }) => {
                let (offset, timestamp, kind) = (m.at.offset, m.at.timestamp, HaltKind::Poison);
                return (at, envelopes, sources, Some(Halt { offset, timestamp, aggregate, reason, kind }));
            }
        }
    }
    (at, envelopes, sources, None)
}

fn decode(key: Option<&[u8]>, payload: Option<&[u8]>) -> Result<RawEnvelope, Poison> {
    let poison = |reason: String| Poison {
        aggregate: key.map_or_else(|| "?".to_owned(), |k| String::from_utf8_lossy(k).into_owned()),
        reason,
    };
    let payload = payload.ok_or_else(|| poison("message has no payload (tombstone)".into()))?;
    let envelope = RawEnvelope::from_slice(payload).map_err(|e| poison(format!("undecodable envelope: {e}")))?;
    match key {
        Some(key) if key != envelope.aggregate_id.as_bytes() => Err(poison(format!(
            "message key {:?} differs from aggregate_id {:?}: per-aggregate ordering is not guaranteed",
            String::from_utf8_lossy(key),
            envelope.aggregate_id
        ))),
        _ => Ok(envelope),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(offset: i64, key: &str, payload: &str) -> Msg {
        let at = At { offset, timestamp: Some(offset) };
        let (key, payload) = (key.as_bytes(), payload.as_bytes());
        Msg { at, envelope: decode(Some(key), Some(payload)), key: Some(key.to_vec()), payload: payload.to_vec() }
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
    fn decoding_stops_at_the_first_poison_message_and_names_it() {
        let messages = [msg(10, "a", &envelope("a", 1)), msg(11, "b", "{not json"), msg(12, "a", &envelope("a", 2))];
        let (_, envelopes, sources, halt) = decode_until_poison(messages.to_vec());
        assert_eq!(sources[0].payload, envelope("a", 1).as_bytes(), "the bytes as read");
        assert_eq!(envelopes.len(), 1);
        let halt = halt.expect("a halt");
        assert_eq!((halt.offset, halt.aggregate.as_str(), halt.kind), (11, "b", HaltKind::Poison));
        assert!(halt.reason.contains("undecodable envelope"), "{}", halt.reason);
    }

    #[test]
    fn a_key_that_contradicts_the_envelope_is_poison() {
        let (_, envelopes, _, halt) = decode_until_poison(vec![msg(5, "x", &envelope("y", 1))]);
        assert!(envelopes.is_empty());
        let halt = halt.expect("a halt");
        assert_eq!((halt.offset, halt.kind), (5, HaltKind::Poison));
        assert!(halt.reason.contains("differs from aggregate_id"), "{}", halt.reason);
        let at = At { offset: 6, timestamp: None };
        let tombstone = Msg { at, envelope: decode(Some(b"x"), None), key: Some(b"x".to_vec()), payload: Vec::new() };
        let (_, _, _, halt) = decode_until_poison(vec![tombstone]);
        assert!(halt.expect("a halt").reason.contains("tombstone"));
    }
}
