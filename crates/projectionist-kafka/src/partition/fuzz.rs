//! Arbitrary messages through the whole path a partition takes them before PostgreSQL: read
//! (key, payload, header names and values as bytes), decoded in each format (the JSON
//! envelope, CloudEvents, Axon's, a general mapping), split, projected and planned in
//! memory. Whatever the bytes, nothing panics, and every message is accounted for: an
//! envelope to apply, or one set aside as a dead letter with its exact bytes.
//!
//! Bounded for CI: `PROPTEST_CASES` cases (default below); set it higher to fuzz for longer.

use projectionist_core::format::Format;
use projectionist_core::{Envelope, OnPoison, Projection, Table, Writes};
use projectionist_postgres::park::Headers;
use projectionist_postgres::{PgConnection, PgProjection};
use proptest::prelude::*;
use serde::Deserialize;

use super::decode::{split, At, Msg};

/// Cases where `PROPTEST_CASES` does not say.
const CASES: u32 = 3_000;

#[derive(Debug, Deserialize)]
#[serde(tag = "type", content = "data")]
#[allow(dead_code)]
enum Ev {
    Opened { owner: String },
    Deposited { amount: i64 },
    Noted(serde_json::Value),
}

const ACCOUNTS: Table = Table::transition("accounts", "account_id")
    .aggregate_type("account")
    .columns(&[("owner", "text"), ("balance", "bigint NOT NULL DEFAULT 0")]);
const DAILY: Table =
    Table::fan_in("daily", "day").aggregate_type("account").columns(&[("amount", "bigint NOT NULL DEFAULT 0")]);

struct Accounts;

impl Projection<PgConnection> for Accounts {
    type Event = Ev;

    fn name(&self) -> &str {
        "fuzzed"
    }

    fn tables(&self) -> &[Table] {
        &[ACCOUNTS, DAILY]
    }

    fn project(&self, event: &Envelope<Ev>) -> Writes {
        let account = ACCOUNTS.write(event);
        match &event.event {
            Ev::Opened { owner } => account.set("owner", owner).into(),
            Ev::Deposited { amount } => {
                let day = DAILY.row(event.occurred_at.date_naive().to_string());
                account.add("balance", amount).and(day.add("amount", amount))
            }
            Ev::Noted(_) => account.into(),
        }
    }
}

/// What producers and hostile peers put in `data` and around it.
const FRAGMENTS: &[&str] = &[
    "1e400",
    "-0",
    "99999999999999999999999",
    "\"\\ud83d\"",
    "\"\\u0000\"",
    "{",
    "}",
    "[",
    "]",
    ",",
    "\"",
    "\\",
    "null",
    "{\"amount\": 1}",
    "{\"amount\": 9223372036854775807}",
    "{\"owner\": \"o\"}",
    "\"version\": 0,",
    "\"version\": -1,",
    "\"type\": \"Noted\",",
    "\u{e9}",
    "\u{fffd}",
];

/// A valid envelope of aggregate `id` at `version`, of one of the types or another.
fn envelope(id: &str, version: i64, event_type: &str, data: &str) -> String {
    format!(
        concat!(
            r#"{{"id": "6f1c2d9e-8a6b-4c1e-9d0a-2b3c4d5e6f70", "aggregate_type": "account", "#,
            r#""aggregate_id": {:?}, "version": {}, "type": "{}", "#,
            r#""occurred_at": "2026-11-21T10:00:00Z", "data": {}}}"#
        ),
        id, version, event_type, data
    )
}

/// A payload: arbitrary bytes, or an envelope salted with the fragments and cut or flipped.
fn payload(id: String) -> impl Strategy<Value = Option<Vec<u8>>> {
    let types = prop::sample::select(&["Opened", "Deposited", "Noted", "Other"][..]);
    let data = prop::sample::select(FRAGMENTS);
    let valid = (0i64..4, types, data).prop_map(move |(v, t, d)| envelope(&id, v, t, d).into_bytes());
    let edits = prop::collection::vec((any::<usize>(), any::<u8>()), 0..3);
    let salted = (valid.clone(), edits, any::<Option<usize>>()).prop_map(|(mut bytes, edits, cut)| {
        for (at, b) in edits {
            let len = bytes.len();
            bytes[at % len] = b;
        }
        if let Some(cut) = cut {
            bytes.truncate(cut % (bytes.len() + 1));
        }
        bytes
    });
    prop_oneof![
        3 => valid.prop_map(Some),
        3 => salted.prop_map(Some),
        2 => prop::collection::vec(any::<u8>(), 0..64).prop_map(Some),
        1 => Just(None),
    ]
}

/// Header names and values as bytes: not UTF-8, empty, NUL inside, without a value; and
/// those CloudEvents' binary mode reads, with any value.
fn headers() -> impl Strategy<Value = Headers> {
    let ce = prop::sample::select(
        &[
            "ce_specversion",
            "ce_id",
            "ce_type",
            "ce_time",
            "ce_subject",
            "ce_sequence",
            "ce_aggregatetype",
            "content-type",
        ][..],
    );
    let name = prop_oneof![
        2 => prop::collection::vec(any::<u8>(), 0..8),
        1 => ce.prop_map(|n| n.as_bytes().to_vec()),
    ];
    let value = prop::option::of(prop::collection::vec(any::<u8>(), 0..8));
    prop::collection::vec((name, value), 0..4)
}

/// A message: its key (the aggregate's, another, bytes that are not UTF-8, or none), payload
/// and headers.
fn message() -> impl Strategy<Value = (Option<Vec<u8>>, Option<Vec<u8>>, Headers)> {
    let id = prop::sample::select(&["acc-1", "acc-2", "\u{e9}"][..]).prop_map(str::to_owned);
    id.prop_flat_map(|id| {
        let key = prop_oneof![
            4 => Just(Some(id.clone().into_bytes())),
            1 => prop::option::of(prop::collection::vec(any::<u8>(), 0..6)),
        ];
        (key, payload(id), headers())
    })
}

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(CASES);
    ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_messages_are_read_decoded_and_planned_without_a_panic_and_each_is_accounted_for(
        batch in prop::collection::vec(message(), 1..8),
        max_bytes in prop_oneof![Just(1usize << 20), 16usize..256],
        format in 0..5u8,
    ) {
        let format = match format {
            0 => Format::Envelope,
            1 => Format::named("cloudevents").unwrap(),
            2 => Format::named("axon").unwrap(),
            3 => Format::named("debezium").unwrap(),
            _ => serde_json::from_value(serde_json::json!({
                "format": "mapped", "id": "header:ce_id", "aggregate_id": "key", "aggregate_type": "value:/aggregate_type",
                "version": "value:/version", "type": "header:ce_type", "occurred_at": "value:/occurred_at", "data": "value:/data",
            }))
            .unwrap(),
        };
        let reader = projectionist_core::format::Reader { format, schemas: None };
        let messages: Vec<Msg> = batch
            .iter()
            .enumerate()
            .map(|(offset, (key, payload, headers))| {
                let at = At { offset: offset as i64, timestamp: None };
                Msg::read(at, (key.as_deref(), payload.as_deref(), headers.clone()), &reader, max_bytes).0
            })
            .collect();
        let halted = split(messages.clone(), OnPoison::Halt);
        let split = split(messages, OnPoison::DeadLetter);
        prop_assert_eq!(split.envelopes.len() + split.undecodable.len(), batch.len());
        prop_assert!(split.halt.is_none());
        // Under `halt`, it stops at the first message set aside, naming its offset.
        let first_aside = split.undecodable.first().and_then(|u| u.message.offset);
        prop_assert_eq!(halted.halt.as_ref().map(|h| h.offset), first_aside);
        for aside in &split.undecodable {
            let offset = usize::try_from(aside.message.offset.unwrap_or(-1)).unwrap_or(usize::MAX);
            let (key, payload, headers) = &batch[offset];
            prop_assert_eq!(&aside.message.payload, &payload.clone().unwrap_or_default(), "the exact bytes");
            prop_assert_eq!(&aside.message.key, key);
            prop_assert_eq!(&aside.message.headers, headers);
        }
        let prepared = Accounts.prepare_lazy(split.envelopes);
        prop_assert_eq!(prepared.len(), split.messages.len());
        // A plan, or a problem named: never a panic.
        let _ = prepared.plan_in_memory(&[ACCOUNTS, DAILY]);
    }
}
