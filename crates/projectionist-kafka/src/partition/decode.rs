//! Messages as the partition task holds them, and their envelopes decoded up to the first
//! poison message.

use projectionist_core::RawEnvelope;
use rdkafka::message::{BorrowedMessage, Message};

use super::{Halt, HaltKind};

/// A consumed message, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Msg {
    pub offset: i64,
    pub key: Option<String>,
    pub payload: Option<Vec<u8>>,
    /// The broker's timestamp (create or log-append time), ms since the epoch.
    pub timestamp: Option<i64>,
}

impl Msg {
    pub(crate) fn from_kafka(message: &BorrowedMessage<'_>) -> Self {
        Self {
            offset: message.offset(),
            key: message.key().map(|k| String::from_utf8_lossy(k).into_owned()),
            payload: message.payload().map(<[u8]>::to_vec),
            timestamp: message.timestamp().to_millis(),
        }
    }

    pub(crate) fn bytes(&self) -> usize {
        self.payload.as_ref().map_or(0, Vec::len) + self.key.as_ref().map_or(0, String::len)
    }
}

/// Decodes messages up to the first poison one: the envelopes before it, and the halt it causes.
pub(crate) fn decode_until_poison(messages: &[Msg]) -> (Vec<RawEnvelope>, Option<Halt>) {
    let mut envelopes = Vec::with_capacity(messages.len());
    for m in messages {
        match decode(m) {
            Ok(e) => envelopes.push(e),
            Err(reason) => {
                let halt = Halt {
                    offset: m.offset,
                    timestamp: m.timestamp,
                    aggregate: m.key.clone().unwrap_or_else(|| "?".into()),
                    reason,
                    kind: HaltKind::Poison,
                };
                return (envelopes, Some(halt));
            }
        }
    }
    (envelopes, None)
}

fn decode(m: &Msg) -> std::result::Result<RawEnvelope, String> {
    let payload = m.payload.as_deref().ok_or("message has no payload (tombstone)")?;
    let envelope = RawEnvelope::from_slice(payload).map_err(|e| format!("undecodable envelope: {e}"))?;
    if let Some(key) = &m.key {
        if *key != envelope.aggregate_id {
            return Err(format!(
                "message key {key:?} differs from aggregate_id {:?}: per-aggregate ordering is not guaranteed",
                envelope.aggregate_id
            ));
        }
    }
    Ok(envelope)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(offset: i64, key: &str, payload: &str) -> Msg {
        Msg { offset, key: Some(key.into()), payload: Some(payload.as_bytes().to_vec()), timestamp: Some(offset) }
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
        let (envelopes, halt) = decode_until_poison(&messages);
        assert_eq!(envelopes.len(), 1);
        let halt = halt.expect("a halt");
        assert_eq!((halt.offset, halt.aggregate.as_str(), halt.kind), (11, "b", HaltKind::Poison));
        assert!(halt.reason.contains("undecodable envelope"), "{}", halt.reason);
    }

    #[test]
    fn a_key_that_contradicts_the_envelope_is_poison() {
        let (envelopes, halt) = decode_until_poison(&[msg(5, "x", &envelope("y", 1))]);
        assert!(envelopes.is_empty());
        let halt = halt.expect("a halt");
        assert_eq!((halt.offset, halt.kind), (5, HaltKind::Poison));
        assert!(halt.reason.contains("differs from aggregate_id"), "{}", halt.reason);
        let (_, tombstone) =
            decode_until_poison(&[Msg { offset: 6, key: Some("x".into()), payload: None, timestamp: None }]);
        assert!(tombstone.expect("a halt").reason.contains("tombstone"));
    }
}
