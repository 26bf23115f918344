//! The envelope's two readings fuzzed against each other: the lazy one the engine reads
//! messages with ([`LazyEnvelope::from_slice`], its data kept as text) and the checked one
//! ([`RawEnvelope::from_slice`], its data read into a tree). On any bytes — arbitrary ones,
//! and valid envelopes cut, spliced and salted with what producers get wrong — neither
//! panics, both take the same envelopes or give the same error, and an event decodes from
//! the text as from the tree.
//!
//! Bounded for CI: `PROPTEST_CASES` cases a property (default below); set it higher to fuzz
//! for longer.

use projectionist_core::{EventDecoder, LazyEnvelope, RawEnvelope};
use proptest::prelude::*;
use serde::Deserialize;

#[derive(Debug, Deserialize, PartialEq)]
#[serde(tag = "type", content = "data")]
#[allow(dead_code)]
enum Ev {
    Deposited { amount: i64 },
    Opened { owner: String, tags: Vec<String> },
    Noted(serde_json::Value),
}

/// Cases per property where `PROPTEST_CASES` does not say.
const CASES: u32 = 10_000;

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(CASES);
    ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() }
}

/// Fragments producers and hostile peers write: numbers out of range, lone surrogates,
/// escapes, nesting, control characters, bytes that are not UTF-8, broken structure.
const FRAGMENTS: &[&str] = &[
    "1e400",
    "-1e400",
    "1e-400",
    "99999999999999999999999999",
    "-0",
    "1.5",
    "\"\\ud83d\"",
    "\"\\udc00\"",
    "\"\\ud83d\\ude00\"",
    "\"\\u0000\"",
    "\"\\x\"",
    "\"\u{1}\"",
    "\\",
    "\"",
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "null",
    "true",
    "{\"amount\": 1}",
    "{\"owner\": \"o\", \"tags\": []}",
    "\"version\": 2,",
    "\"type\": \"Noted\",",
    "\"data\": 1,",
    "\"metadata\": {},",
    "\u{e9}",
    "\u{fffd}",
];

/// A valid envelope of one of `Ev`'s types (or another), its data from `data`.
fn envelope(event_type: &str, data: &str, version: i64) -> String {
    format!(
        concat!(
            r#"{{"id": "6f1c2d9e-8a6b-4c1e-9d0a-2b3c4d5e6f70", "aggregate_type": "account", "#,
            r#""aggregate_id": "acc-1", "version": {}, "type": "{}", "#,
            r#""occurred_at": "2026-11-21T10:00:00Z", "data": {}, "metadata": {{"k": "v"}}}}"#
        ),
        version, event_type, data
    )
}

/// Data of some depth, salted with the fragments.
fn data() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        prop::sample::select(FRAGMENTS).prop_map(str::to_owned),
        any::<i64>().prop_map(|n| n.to_string()),
        "[a-z\u{e9}\\\\\"]{0,6}".prop_map(|s| format!("{s:?}")),
    ];
    leaf.prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(","))),
            prop::collection::vec(("[a-z]{1,3}", inner), 0..4).prop_map(|fields| {
                let fields: Vec<String> = fields.into_iter().map(|(k, v)| format!("{k:?}: {v}")).collect();
                format!("{{{}}}", fields.join(", "))
            }),
            (1usize..300).prop_map(|depth| format!("{}0{}", "[".repeat(depth), "]".repeat(depth))),
        ]
    })
}

/// One change to a message's bytes.
#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Insert(usize, &'static str),
    Delete(usize, usize),
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(at, b)| Mutation::Flip(at, b)),
        (any::<usize>(), prop::sample::select(FRAGMENTS)).prop_map(|(at, f)| Mutation::Insert(at, f)),
        (any::<usize>(), 1usize..8).prop_map(|(at, n)| Mutation::Delete(at, n)),
        any::<usize>().prop_map(Mutation::Truncate),
    ]
}

fn mutate(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        let len = bytes.len().max(1);
        match *m {
            Mutation::Flip(at, b) if !bytes.is_empty() => bytes[at % len] = b,
            Mutation::Flip(..) => {}
            Mutation::Insert(at, f) => {
                let at = at % (bytes.len() + 1);
                bytes.splice(at..at, f.bytes());
            }
            Mutation::Delete(at, n) => {
                let at = at % len;
                bytes.drain(at.min(bytes.len())..(at + n).min(bytes.len()));
            }
            Mutation::Truncate(at) => bytes.truncate(at % len),
        }
    }
    bytes
}

/// The property: both readings agree on `bytes`, and so does decoding the event.
fn agree(bytes: &[u8]) -> Result<(), TestCaseError> {
    let checked = RawEnvelope::from_slice(bytes).map_err(|e| e.to_string());
    let lazy = LazyEnvelope::from_slice(bytes);
    let lazy_raw = lazy.clone().and_then(LazyEnvelope::into_raw).map_err(|e| e.to_string());
    prop_assert_eq!(&lazy_raw, &checked, "{}", String::from_utf8_lossy(bytes));
    if let (Ok(lazy), Ok(raw)) = (lazy, checked) {
        let decoder = EventDecoder::<Ev>::new();
        if decoder.handles(&raw.event_type) {
            let from_text = decoder.event_from_json(&lazy.event_type, &lazy.data).map_err(|e| e.to_string());
            let from_tree = decoder.event(&raw.event_type, raw.data.clone()).map_err(|e| e.to_string());
            prop_assert_eq!(from_text, from_tree, "{}", String::from_utf8_lossy(bytes));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_bytes_read_alike(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        agree(&bytes)?;
    }

    #[test]
    fn envelopes_with_hostile_data_read_alike(
        event_type in prop::sample::select(&["Deposited", "Opened", "Noted", "Other"][..]),
        data in data(),
        version in prop_oneof![Just(1i64), Just(0), Just(-1), any::<i64>()],
    ) {
        agree(envelope(event_type, &data, version).as_bytes())?;
    }

    #[test]
    fn mutated_envelopes_read_alike(
        event_type in prop::sample::select(&["Deposited", "Opened", "Noted"][..]),
        data in data(),
        mutations in prop::collection::vec(mutation(), 1..4),
    ) {
        agree(&mutate(envelope(event_type, &data, 3).into_bytes(), &mutations))?;
    }
}
