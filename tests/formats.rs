//! Topics whose messages carry the envelope in another format than projectionist's own,
//! written by that format's real producer, against the broker at KAFKA_BROKERS and a fresh
//! database per test.

#[path = "common/kafka.rs"]
mod kafka;
#[path = "common/producers.rs"]
mod producers;

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;

use bank_accounts::generate::{self, ExpectedAccount};
use bank_accounts::BankAccounts;
use kafka::{brokers, config, rand_test_topic, run};
use producers::{publish_axon, publish_cloudevents};
use projectionist::format::Format;
use projectionist::kafka::{topics, Engine};
use projectionist::postgres::migrate;
use sqlx::PgPool;

/// The interpreter of the Python producers (`scripts/services.sh --python-producers`), or
/// the reason the test cannot run, recorded as the test command records skips.
fn python(test: &str) -> Option<String> {
    let python = std::env::var("PROJECTIONIST_PYTHON").ok().filter(|p| !p.is_empty());
    if python.is_none() {
        let reason = "PROJECTIONIST_PYTHON is not set: scripts/services.sh --python-producers makes it";
        eprintln!("SKIPPED {test}: {reason}");
        if let Ok(path) = std::env::var("PROJECTIONIST_SKIP_LOG") {
            let mut log = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
            writeln!(log, "{test}: {reason}").unwrap();
        }
    }
    python
}

async fn read_model(pool: &PgPool) -> BTreeMap<String, ExpectedAccount> {
    let rows: Vec<(String, String, i64, String, i64)> =
        sqlx::query_as("SELECT account_id, owner, balance, status, version FROM bank_accounts ORDER BY account_id")
            .fetch_all(pool)
            .await
            .unwrap();
    rows.into_iter()
        .map(|(id, owner, balance, status, version)| (id, ExpectedAccount { owner, balance, status, version }))
        .collect()
}

/// The bank stream, with duplicates and re-sends mixed in, published as CloudEvents by the
/// CloudEvents SDK in both modes of its Kafka binding, ids that are not UUIDs: the read model
/// is the one the stream's oracle computes, nothing is dead-lettered, and a replay from
/// offset zero changes nothing. Without the topic's format, the same messages are dead
/// letters naming why.
#[sqlx::test(migrations = false)]
async fn cloudevents_written_by_the_sdk_in_both_modes_project_exactly(pool: PgPool) {
    let Some(python) = python("cloudevents_written_by_the_sdk_in_both_modes_project_exactly") else { return };
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let events = projectionist_testing::with_redeliveries(&generate::stream(30, 12, 68), 0.1, 0.05, 68);
    let topic = rand_test_topic("cloudevents");
    topics::create_topics(&brokers(), &[topic.as_str()], 2, 1).await.unwrap();
    publish_cloudevents(&python, &brokers(), &topic, &events);

    let cloudevents = Format::named("cloudevents").unwrap();
    let formatted = config().with_topic_format(&topic, cloudevents.clone());
    let report = run(Engine::new(pool.clone(), formatted).register(Arc::new(BankAccounts), [topic.clone()])).await;
    assert!(report.halts().is_empty(), "{:?}", report.halts());
    let letters = projectionist::postgres::park::dead_letters(&pool, None, false).await.unwrap();
    assert!(letters.is_empty(), "{letters:#?}");
    let want = generate::expected(&events);
    assert_eq!(read_model(&pool).await, want);

    let replay = config().with_topic_format(&topic, cloudevents).with_from_beginning(true);
    let report = run(Engine::new(pool.clone(), replay).register(Arc::new(BankAccounts), [topic.clone()])).await;
    assert!(report.halts().is_empty(), "{:?}", report.halts());
    assert_eq!(read_model(&pool).await, want, "a replay from offset zero changes nothing");
    assert_eq!(report.projections[0].1.outcomes().applied, 0, "a replay applies nothing again");

    // A rebuild reads the topic in its format too, folding it into tables of its own: the
    // same read model, swapped in.
    let folded = std::sync::atomic::AtomicU64::default();
    let rebuilding = config().with_topic_format(&topic, Format::named("cloudevents").unwrap());
    let rebuilt = projectionist::kafka::rebuild::rebuild(
        &pool,
        rebuilding,
        Arc::new(BankAccounts),
        vec![topic.clone()],
        &folded,
        std::future::pending(),
    );
    let rebuilt = tokio::time::timeout(std::time::Duration::from_secs(120), rebuilt).await.expect("in time").unwrap();
    assert!(matches!(rebuilt, projectionist::kafka::rebuild::Rebuilt::Swapped { .. }));
    assert_eq!(read_model(&pool).await, want, "the rebuilt read model");

    // An aggregate's events out of order: the one that comes early is held, in its
    // format, and read again as the topic's format says once its predecessor arrives.
    let e = |v, event| generate::envelope("acc-ce-gap", v, &event);
    let opened = e(1, bank_accounts::AccountEvent::AccountOpened { owner: "o".into() });
    let (two, three) = (
        bank_accounts::AccountEvent::MoneyDeposited { amount: 2 },
        bank_accounts::AccountEvent::MoneyDeposited { amount: 3 },
    );
    publish_cloudevents(&python, &brokers(), &topic, &[opened, e(3, three)]);
    let cloudevents = Format::named("cloudevents").unwrap();
    let formatted = config().with_topic_format(&topic, cloudevents.clone());
    let report = run(Engine::new(pool.clone(), formatted).register(Arc::new(BankAccounts), [topic.clone()])).await;
    assert!(report.halts().is_empty(), "{:?}", report.halts());
    assert_eq!(projectionist::postgres::park::list(&pool, None).await.unwrap().len(), 1, "v3 held, waiting for v2");
    publish_cloudevents(&python, &brokers(), &topic, &[e(2, two)]);
    let formatted = config().with_topic_format(&topic, cloudevents);
    let report = run(Engine::new(pool.clone(), formatted).register(Arc::new(BankAccounts), [topic.clone()])).await;
    assert!(report.halts().is_empty(), "{:?}", report.halts());
    let late: (i64, i64) = sqlx::query_as("SELECT balance, version FROM bank_accounts WHERE account_id = 'acc-ce-gap'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(late, (5, 3), "the held event applied as the format reads it");
    assert!(projectionist::postgres::park::list(&pool, None).await.unwrap().is_empty(), "nothing left parked");
    let letters = projectionist::postgres::park::dead_letters(&pool, None, false).await.unwrap();
    assert!(letters.is_empty(), "{letters:#?}");

    // Read as projectionist's own envelope, they are not one: dead letters, named.
    projectionist::postgres::reset(&pool, &BankAccounts).await.unwrap();
    let plain = config().with_from_beginning(true);
    let report = run(Engine::new(pool.clone(), plain).register(Arc::new(BankAccounts), [topic.clone()])).await;
    assert!(report.halts().is_empty(), "{:?}", report.halts());
    let letters = projectionist::postgres::park::dead_letters(&pool, None, false).await.unwrap();
    assert!(!letters.is_empty());
    assert!(letters.iter().all(|d| d.error.contains("undecodable envelope")), "{:?}", letters[0].error);
}

/// The bank stream, with duplicates and re-sends, as Axon's Kafka messages: the read model is
/// the one the stream's oracle computes (Axon's sequence 0 is version 1), nothing is
/// dead-lettered, and a replay applies nothing again.
#[sqlx::test(migrations = false)]
async fn axon_messages_project_exactly(pool: PgPool) {
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let events = projectionist_testing::with_redeliveries(&generate::stream(30, 12, 69), 0.1, 0.05, 69);
    let topic = rand_test_topic("axon");
    topics::create_topics(&brokers(), &[topic.as_str()], 2, 1).await.unwrap();
    publish_axon(&brokers(), &topic, &events).await;
    let axon = Format::named("axon").unwrap();
    for replay in [false, true] {
        let config = config().with_topic_format(&topic, axon.clone()).with_from_beginning(replay);
        let report = run(Engine::new(pool.clone(), config).register(Arc::new(BankAccounts), [topic.clone()])).await;
        assert!(report.halts().is_empty(), "{:?}", report.halts());
        let letters = projectionist::postgres::park::dead_letters(&pool, None, false).await.unwrap();
        assert!(letters.is_empty(), "{letters:#?}");
        assert_eq!(read_model(&pool).await, generate::expected(&events), "replay: {replay}");
        if replay {
            assert_eq!(report.projections[0].1.outcomes().applied, 0, "a replay applies nothing again");
        }
    }
}

/// The bank stream laid out as an outbox relay might write it — keyed by aggregate id, the
/// event id and type in headers, version, time and data inside the value — read through a
/// general mapping: the read model is the oracle's; a message lacking its version is a dead
/// letter naming where the version was looked for.
#[sqlx::test(migrations = false)]
async fn a_general_mapping_reads_each_field_where_it_says(pool: PgPool) {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let events = projectionist_testing::with_redeliveries(&generate::stream(20, 10, 70), 0.1, 0.05, 70);
    let topic = rand_test_topic("mapped");
    topics::create_topics(&brokers(), &[topic.as_str()], 2, 1).await.unwrap();
    let producer: FutureProducer = rdkafka::ClientConfig::new().set("bootstrap.servers", brokers()).create().unwrap();
    let mut values: Vec<(String, String, Vec<u8>)> = events
        .iter()
        .map(|e| {
            let value = serde_json::json!({ "v": e.version, "at": e.occurred_at, "payload": e.data });
            (e.aggregate_id.clone(), e.event_type.clone(), serde_json::to_vec(&value).unwrap())
        })
        .collect();
    values.push((
        "acc-no-version".into(),
        "AccountOpened".into(),
        br#"{"at":"2026-11-21T10:00:00Z","payload":{}}"#.to_vec(),
    ));
    for (n, (key, event_type, value)) in values.iter().enumerate() {
        let id = format!("outbox-{n}");
        let headers = OwnedHeaders::new()
            .insert(Header { key: "id", value: Some(id.as_bytes()) })
            .insert(Header { key: "eventType", value: Some(event_type.as_bytes()) });
        let record = FutureRecord::to(&topic).key(key).payload(value).headers(headers);
        producer.send(record, std::time::Duration::from_secs(30)).await.map_err(|(e, _)| e).unwrap();
    }
    let mapped: Format = serde_json::from_value(serde_json::json!({
        "format": "mapped", "id": "header:id", "aggregate_id": "key", "aggregate_type": "const:account",
        "version": "value:/v", "type": "header:eventType", "occurred_at": "value:/at", "data": "value:/payload",
    }))
    .unwrap();
    let config = config().with_topic_format(&topic, mapped);
    let report = run(Engine::new(pool.clone(), config).register(Arc::new(BankAccounts), [topic.clone()])).await;
    assert!(report.halts().is_empty(), "{:?}", report.halts());
    assert_eq!(read_model(&pool).await, generate::expected(&events));
    let letters = projectionist::postgres::park::dead_letters(&pool, None, false).await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:#?}");
    let error = &letters[0].error;
    assert!(error.contains("field `version`: missing: looked for in value:/v"), "{error}");
}

/// A CloudEvent whose data does not fit its type is a dead letter with its exact bytes; a
/// retry reads it again as a CloudEvent (through the projection as the engine registers it,
/// `Formatted`), not as projectionist's envelope.
#[sqlx::test(migrations = false)]
async fn a_cloudevents_dead_letter_is_retried_in_its_format(pool: PgPool) {
    use projectionist::postgres::park::{dead_letters, resolve, Resolve};
    let Some(python) = python("a_cloudevents_dead_letter_is_retried_in_its_format") else { return };
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let e = |v, event| generate::envelope("acc-ce-bad", v, &event);
    let mut bad = e(2, bank_accounts::AccountEvent::MoneyDeposited { amount: 1 });
    bad.data = serde_json::json!({ "amount": "a lot" });
    let topic = rand_test_topic("cloudevents-letter");
    topics::create_topics(&brokers(), &[topic.as_str()], 1, 1).await.unwrap();
    publish_cloudevents(
        &python,
        &brokers(),
        &topic,
        &[e(1, bank_accounts::AccountEvent::AccountOpened { owner: "o".into() }), bad],
    );
    let cloudevents = Format::named("cloudevents").unwrap();
    let config = config().with_topic_format(&topic, cloudevents.clone());
    let report = run(Engine::new(pool.clone(), config).register(Arc::new(BankAccounts), [topic.clone()])).await;
    assert!(report.halts().is_empty(), "{:?}", report.halts());
    let letters = dead_letters(&pool, None, false).await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:#?}");
    assert!(letters[0].error.contains("amount"), "{}", letters[0].error);

    let plain = resolve(&pool, &BankAccounts, letters[0].id, Resolve::Retry).await.unwrap_err();
    assert!(plain.to_string().contains("still not an envelope"), "read as the JSON envelope: {plain}");
    let formats = projectionist::format::Formats::new().with(topic.clone(), cloudevents);
    let formatted = projectionist::postgres::Formatted::wrap(Arc::new(BankAccounts), &formats);
    let retried = resolve(&pool, formatted.as_ref(), letters[0].id, Resolve::Retry).await.unwrap();
    assert_eq!(retried.outcome, projectionist::Outcome::DeadLettered, "read as a CloudEvent, its data still refused");
    let error = retried.error.unwrap_or_default();
    assert!(error.contains("amount"), "{error}");
}
