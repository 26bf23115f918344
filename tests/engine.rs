//! The Kafka runtime as a library, against the broker (KAFKA_BROKERS, default
//! localhost:9092) and a fresh database per test.

use std::sync::Arc;
use std::time::Duration;

use bank_accounts::{AccountEvent, BankAccounts};
use order_status::{OrderEvent, OrderStatus};
use projectionist::kafka::{topics, Engine, EngineConfig, Exclusive};
use projectionist::postgres::migrate;
use projectionist::postgres::PgConnection;
use projectionist::{Envelope, OnGap, OnPoison, OnUnknownType, Projection, RawEnvelope, Table, Upcaster, Writes};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use sqlx::PgPool;

fn brokers() -> String {
    std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "localhost:9092".into())
}

fn rand_test_topic(name: &str) -> String {
    format!("test.{name}.{}", uuid::Uuid::new_v4().simple())
}

fn config() -> EngineConfig {
    EngineConfig::new(brokers())
        .with_group_id(format!("engine-{}", uuid::Uuid::new_v4().simple()))
        .with_exit_when_caught_up(true)
        .with_kafka_property("session.timeout.ms", "6000")
}

async fn produce(topic: &str, events: &[RawEnvelope]) {
    topics::create_topics(&brokers(), &[topic], 2, 1).await.unwrap();
    let producer: ThreadedProducer<DefaultProducerContext> =
        ClientConfig::new().set("bootstrap.servers", brokers()).create().unwrap();
    for e in events {
        let payload = e.to_json();
        producer.send(BaseRecord::to(topic).key(&e.aggregate_id).payload(&payload)).map_err(|(e, _)| e).unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();
}

async fn run(engine: Engine) -> projectionist::kafka::RunReport {
    tokio::time::timeout(Duration::from_secs(120), engine.run(std::future::pending()))
        .await
        .expect("engine caught up in time")
        .unwrap()
}

/// A `run` of the bank accounts that does not stop when caught up, until told to.
struct Live {
    stop: tokio::sync::oneshot::Sender<()>,
    run: tokio::task::JoinHandle<projectionist::kafka::Result<projectionist::kafka::RunReport>>,
}

impl Live {
    fn start(pool: &PgPool, topic: &str) -> Self {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let engine = Engine::new(pool.clone(), config().with_exit_when_caught_up(false))
            .register(Arc::new(BankAccounts), [topic.to_owned()]);
        let run = tokio::spawn(engine.run(async move {
            let _ = stopped.await;
        }));
        Self { stop, run }
    }

    async fn stop(self) -> projectionist::kafka::RunReport {
        let _ = self.stop.send(());
        self.run.await.unwrap().unwrap()
    }
}

#[sqlx::test(migrations = false)]
async fn two_projections_run_in_one_process_with_their_own_checkpoints(pool: PgPool) {
    migrate(&pool, &[&BankAccounts, &OrderStatus]).await.unwrap();
    let (accounts_topic, orders_topic) = (rand_test_topic("accounts"), rand_test_topic("orders"));
    let accounts = bank_accounts::generate::stream(40, 10, 8);
    let orders = order_status::generate::stream(60, 10, 8);
    produce(&accounts_topic, &accounts).await;
    produce(&orders_topic, &orders).await;

    let engine = Engine::new(pool.clone(), config().with_group_id(format!("multi-{}", uuid::Uuid::new_v4().simple())))
        .register(Arc::new(BankAccounts), [accounts_topic.clone()])
        .register(Arc::new(OrderStatus), [orders_topic.clone()]);
    let report = run(engine).await;
    assert!(report.halts().is_empty(), "{:?}", report.halts());
    let counts: Vec<u64> = report.projections.iter().map(|(_, s)| s.outcomes().applied).collect();
    assert_eq!(counts, vec![accounts.len() as u64, orders.len() as u64]);

    let placed: i64 = sqlx::query_scalar("SELECT coalesce(sum(orders_placed), 0)::bigint FROM customer_order_stats")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(placed, 60);
    let versions: i64 =
        sqlx::query_scalar("SELECT sum(version)::bigint FROM bank_accounts").fetch_one(&pool).await.unwrap();
    assert_eq!(versions, accounts.len() as i64);
    let rows: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT projection, topic, sum(next_offset)::bigint FROM projectionist_checkpoints GROUP BY 1, 2 ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        rows,
        vec![
            ("bank_accounts".into(), accounts_topic, accounts.len() as i64),
            ("order_status".into(), orders_topic, orders.len() as i64)
        ],
        "each projection checkpoints its own topic, up to the last event"
    );
}

/// A second reader of the account events, with a table of its own: events per account.
struct AccountEventCounts;

const EVENT_COUNTS: Table = Table::transition("account_event_counts", "account_id")
    .aggregate_type(bank_accounts::AGGREGATE_TYPE)
    .columns(&[("events", "bigint NOT NULL DEFAULT 0")]);

impl Projection<PgConnection> for AccountEventCounts {
    type Event = AccountEvent;

    fn name(&self) -> &str {
        "account_event_counts"
    }

    fn tables(&self) -> &[Table] {
        &[EVENT_COUNTS]
    }

    fn project(&self, env: &Envelope<AccountEvent>) -> Writes {
        EVENT_COUNTS.write(env).add("events", 1).into()
    }
}

/// One configured group id and two projections of one topic: each projection still reads
/// every partition (its own group, `<group id>.<projection>`), none misses events.
#[sqlx::test(migrations = false)]
async fn one_group_id_still_gives_every_projection_every_partition(pool: PgPool) {
    migrate(&pool, &[&BankAccounts, &AccountEventCounts]).await.unwrap();
    let topic = rand_test_topic("shared");
    topics::create_topics(&brokers(), &[&topic], 4, 1).await.unwrap();
    let events = bank_accounts::generate::stream(200, 8, 21);
    produce(&topic, &events).await;

    let engine = Engine::new(pool.clone(), config())
        .register(Arc::new(BankAccounts), [topic.clone()])
        .register(Arc::new(AccountEventCounts), [topic.clone()]);
    let report = run(engine).await;
    assert!(report.halts().is_empty(), "{:?}", report.halts());
    let applied: Vec<(&str, u64)> =
        report.projections.iter().map(|(name, s)| (name.as_str(), s.outcomes().applied)).collect();
    let total = events.len() as u64;
    assert_eq!(applied, [("bank_accounts", total), ("account_event_counts", total)]);

    let versions: i64 =
        sqlx::query_scalar("SELECT sum(version)::bigint FROM bank_accounts").fetch_one(&pool).await.unwrap();
    let counted: i64 =
        sqlx::query_scalar("SELECT sum(events)::bigint FROM account_event_counts").fetch_one(&pool).await.unwrap();
    assert_eq!((versions, counted), (total as i64, total as i64), "both tables hold every event");
    let partitions: Vec<(String, i64)> = sqlx::query_as(
        "SELECT projection, count(*) FROM projectionist_checkpoints WHERE topic = $1 GROUP BY 1 ORDER BY 1",
    )
    .bind(&topic)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(partitions, [("account_event_counts".into(), 4), ("bank_accounts".into(), 4)]);
}

/// Makes the first `failures` writes to `bank_accounts` fail with a real SQLSTATE (a
/// statement trigger counting in a sequence, which a rollback does not reset).
async fn inject_failures(pool: &PgPool, failures: i64, sqlstate: &str) {
    sqlx::raw_sql(&format!(
        "CREATE SEQUENCE inject_calls; \
         CREATE FUNCTION inject_failure() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN IF nextval('inject_calls') <= {failures} THEN RAISE EXCEPTION 'injected failure' USING ERRCODE = \
         '{sqlstate}'; END IF; RETURN NULL; END $$; \
         CREATE TRIGGER inject BEFORE INSERT OR UPDATE ON bank_accounts FOR EACH STATEMENT EXECUTE FUNCTION \
         inject_failure();"
    ))
    .execute(pool)
    .await
    .unwrap();
}

async fn injector_calls(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT last_value FROM inject_calls").fetch_one(pool).await.unwrap()
}

fn account_events() -> Vec<RawEnvelope> {
    let e = bank_accounts::generate::envelope;
    vec![
        e("acc-r", 1, &AccountEvent::AccountOpened { owner: "r".into() }),
        e("acc-r", 2, &AccountEvent::MoneyDeposited { amount: 9 }),
    ]
}

#[sqlx::test(migrations = false)]
async fn retryable_database_errors_are_retried_with_backoff(pool: PgPool) {
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    inject_failures(&pool, 3, "40001").await;
    let topic = rand_test_topic("retry");
    produce(&topic, &account_events()).await;
    let mut cfg = config();
    cfg.retry_backoff_ms = 10;
    let report = run(Engine::new(pool.clone(), cfg).register(Arc::new(BankAccounts), [topic])).await;
    assert!(report.halts().is_empty(), "{:?}", report.halts());
    let balance: i64 = sqlx::query_scalar("SELECT balance FROM bank_accounts WHERE account_id = 'acc-r'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(balance, 9, "applied once after the serialization failures");
    assert!(injector_calls(&pool).await >= 4, "three failed tries, then the write");
}

#[sqlx::test(migrations = false)]
async fn under_on_poison_halt_a_non_retryable_failure_halts_the_partition_at_once(pool: PgPool) {
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    inject_failures(&pool, i64::MAX, "23514").await;
    let topic = rand_test_topic("fatal");
    produce(&topic, &account_events()).await;
    let config = config().with_on_poison(OnPoison::Halt);
    let report = run(Engine::new(pool.clone(), config).register(Arc::new(BankAccounts), [topic.clone()])).await;
    let halts = report.halts();
    assert_eq!(halts.len(), 1, "{halts:?}");
    assert!(halts[0].contains(&format!("partition halted: {topic}/")) && halts[0].contains("injected"), "{}", halts[0]);
    assert!(halts[0].contains("account/acc-r v1") && halts[0].contains("SQLSTATE 23514"), "{}", halts[0]);
    assert_eq!(
        injector_calls(&pool).await,
        2,
        "no retry of a check violation: the batch's statement, then the first event alone to name it"
    );
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM bank_accounts").fetch_one(&pool).await.unwrap();
    assert_eq!(rows, 0);
}

#[sqlx::test(migrations = false)]
async fn under_on_poison_halt_a_refused_value_halts_at_its_own_event_after_the_ones_before_it(pool: PgPool) {
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    sqlx::raw_sql("ALTER TABLE bank_accounts ADD CONSTRAINT owner_is_no_robot CHECK (owner <> 'robot')")
        .execute(&pool)
        .await
        .unwrap();
    let e = bank_accounts::generate::envelope;
    let events = [
        e("acc-a", 1, &AccountEvent::AccountOpened { owner: "ann".into() }),
        e("acc-a", 2, &AccountEvent::MoneyDeposited { amount: 5 }),
        e("acc-a", 3, &AccountEvent::MoneyDeposited { amount: 6 }),
        e("acc-a", 4, &AccountEvent::MoneyDeposited { amount: 7 }),
    ];
    let topic = rand_test_topic("refused");
    topics::create_topics(&brokers(), &[&topic], 1, 1).await.unwrap();
    let bad = e("acc-a", 5, &AccountEvent::AccountOpened { owner: "robot".into() });
    let after = e("acc-a", 6, &AccountEvent::MoneyDeposited { amount: 100 });
    produce(&topic, &[&events[..], &[bad, after]].concat()).await;
    let config = config().with_on_poison(OnPoison::Halt);
    let report = run(Engine::new(pool.clone(), config).register(Arc::new(BankAccounts), [topic.clone()])).await;
    let halts = report.halts();
    assert_eq!(halts.len(), 1, "{halts:?}");
    assert!(
        halts[0].contains(&format!("{topic}/0@4 ")) && halts[0].contains("account/acc-a v5"),
        "halted at the refused event, naming it: {}",
        halts[0]
    );
    assert!(halts[0].contains("owner_is_no_robot"), "the database's reason: {}", halts[0]);
    let (balance, version): (i64, i64) =
        sqlx::query_as("SELECT balance, version FROM bank_accounts WHERE account_id = 'acc-a'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((balance, version), (18, 4), "the events before it are applied and committed");
}

/// A gap parks its aggregate: the events after it are held with their exact bytes while
/// every other aggregate flows and the checkpoint reaches the head; publishing the missing
/// version resumes it, and the held events are applied in version order.
#[sqlx::test(migrations = false)]
async fn a_gap_parks_its_aggregate_and_the_missing_version_resumes_it(pool: PgPool) {
    migrate(&pool, &[&OrderStatus]).await.unwrap();
    let topic = rand_test_topic("park");
    let e = order_status::generate::envelope;
    let placed = |id: &str| e(id, 1, &OrderEvent::OrderPlaced { customer_id: format!("c-{id}"), total_cents: 10 });
    let paid = |id: &str, v| e(id, v, &OrderEvent::OrderPaid { amount_cents: 10 });
    let shipped = |id: &str, v| e(id, v, &OrderEvent::OrderShipped {});
    let healthy: Vec<String> = (0..40).map(|i| format!("ord-{i}")).collect();
    let held_first = shipped("ord-g", 3);
    let mut events = vec![placed("ord-g"), held_first.clone()];
    for id in &healthy {
        events.extend([placed(id), paid(id, 2)]);
    }
    // Held behind the gap too, in version order when resumed.
    events.push(paid("ord-g", 4));
    produce(&topic, &events).await;
    let report = run(Engine::new(pool.clone(), config()).register(Arc::new(OrderStatus), [topic.clone()])).await;
    assert!(report.halts().is_empty(), "a gap halts nothing: {:?}", report.halts());
    let rows: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT order_id, status, version FROM orders ORDER BY order_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(rows.len(), 41);
    for (id, status, version) in &rows {
        let want = if id == "ord-g" { ("placed", 1) } else { ("paid", 2) };
        assert_eq!((status.as_str(), *version), want, "{id}");
    }
    let parked = projectionist::postgres::park::list(&pool, Some("order_status")).await.unwrap();
    assert_eq!(parked.len(), 1, "{parked:?}");
    let p = &parked[0];
    assert_eq!((p.aggregate_id.as_str(), p.waiting_for, p.held, p.held_versions), ("ord-g", 2, 2, Some((3, 4))));
    // Held as read: the exact bytes of the message, with its topic, partition and offset.
    type Held = (Vec<u8>, Option<Vec<u8>>, String, Option<i64>);
    let held: Vec<Held> = sqlx::query_as(
        "SELECT payload, key, topic, \"offset\" FROM projectionist_held WHERE aggregate_id = 'ord-g' ORDER BY version",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(held[0].0, held_first.to_json());
    assert_eq!((held[0].1.as_deref(), held[0].2.as_str()), (Some(&b"ord-g"[..]), topic.as_str()));
    assert!(held[0].3.is_some());
    // The checkpoints reached the head: every message was read, applied or held.
    let next: i64 = sqlx::query_scalar("SELECT sum(next_offset)::bigint FROM projectionist_checkpoints")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(next, events.len() as i64);

    // The missing version arrives: applied, then the held events, in version order.
    produce(&topic, &[paid("ord-g", 2)]).await;
    let report = run(Engine::new(pool.clone(), config()).register(Arc::new(OrderStatus), [topic.clone()])).await;
    assert!(report.halts().is_empty(), "{:?}", report.halts());
    let (status, version, paid_cents): (String, i64, i64) =
        sqlx::query_as("SELECT status, version, paid_cents FROM orders WHERE order_id = 'ord-g'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((status.as_str(), version, paid_cents), ("paid", 4, 20), "v2 paid, v3 shipped, v4 paid");
    assert!(projectionist::postgres::park::list(&pool, None).await.unwrap().is_empty());
    let held: i64 = sqlx::query_scalar("SELECT count(*) FROM projectionist_held").fetch_one(&pool).await.unwrap();
    assert_eq!(held, 0, "drained");
}

/// Produces messages as given: a key or none, a payload or none (a tombstone).
async fn produce_raw(topic: &str, messages: &[(Option<&str>, Option<Vec<u8>>)]) {
    topics::create_topics(&brokers(), &[topic], 1, 1).await.unwrap();
    let producer: ThreadedProducer<DefaultProducerContext> =
        ClientConfig::new().set("bootstrap.servers", brokers()).create().unwrap();
    for (key, payload) in messages {
        let mut record: BaseRecord<'_, str, Vec<u8>> = BaseRecord::to(topic);
        if let Some(key) = key {
            record = record.key(*key);
        }
        if let Some(payload) = payload {
            record = record.payload(payload);
        }
        producer.send(record).map_err(|(e, _)| e).unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();
}

/// `event`'s JSON with `field` set to `value`.
fn with(event: RawEnvelope, field: &str, value: serde_json::Value) -> Vec<u8> {
    let mut json: serde_json::Value = serde_json::from_slice(&event.to_json()).unwrap();
    json[field] = value;
    serde_json::to_vec(&json).unwrap()
}

/// Poison events are dead-lettered with their exact bytes, each in a stream of healthy
/// aggregates on the same partition: an event whose aggregate is known parks it behind the
/// dead letter (its later events held), one with no usable aggregate stands alone; every
/// healthy aggregate ends exact, the checkpoint reaches the head, and every message read is
/// accounted for.
#[sqlx::test(migrations = false)]
async fn poison_events_are_dead_lettered_and_their_aggregates_parked_while_the_rest_flows(pool: PgPool) {
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    sqlx::raw_sql("ALTER TABLE bank_accounts ADD CONSTRAINT owner_is_no_robot CHECK (owner <> 'robot')")
        .execute(&pool)
        .await
        .unwrap();
    let e = bank_accounts::generate::envelope;
    let opened = |id: &str, owner: &str| e(id, 1, &AccountEvent::AccountOpened { owner: owner.into() });
    let deposit = |id: &str, v, amount| e(id, v, &AccountEvent::MoneyDeposited { amount });
    let mut wrong_type = deposit("acc-d", 2, 1);
    wrong_type.data = serde_json::json!({ "amount": "a lot" });
    // What kind, key, payload.
    type Bad<'a> = (&'a str, Option<&'a str>, Option<Vec<u8>>);
    let mut bad: Vec<Bad<'_>> = vec![
        ("envelope", Some("acc-x"), Some(b"{not json".to_vec())),
        ("tombstone", Some("acc-t"), None),
        ("key", Some("acc-k"), Some(opened("acc-other", "o").to_json())),
        ("data", Some("acc-d"), Some(wrong_type.to_json())),
        ("value", Some("acc-r"), Some(opened("acc-r", "robot").to_json())),
        ("envelope", Some("acc-8"), Some(b"{\"id\": \"\xff\xfe\"}".to_vec())),
        (
            "envelope",
            Some("acc-m"),
            Some(br#"{"aggregate_type":"account","aggregate_id":"acc-m","version":1}"#.to_vec()),
        ),
        ("envelope", Some("acc-v0"), Some(with(opened("acc-v0", "v"), "version", 0.into()))),
        ("envelope", Some("acc-vn"), Some(with(opened("acc-vn", "v"), "version", (-3).into()))),
        ("envelope", Some("acc-ts"), Some(with(opened("acc-ts", "v"), "occurred_at", "yesterday".into()))),
        ("key", None, Some(opened("acc-nokey", "n").to_json())),
        ("oversized", Some("acc-big"), Some(opened("acc-big", &"b".repeat(3000)).to_json())),
    ];
    let mut messages: Vec<(Option<&str>, Option<Vec<u8>>)> = Vec::new();
    let healthy: Vec<String> = (0..30).map(|i| format!("acc-{i}")).collect();
    messages.push((Some("acc-d"), Some(opened("acc-d", "dee").to_json())));
    // An unknown type is ignored (its version still moves), not dead-lettered.
    let mut unheard = deposit("acc-u", 2, 1);
    unheard.event_type = "Unheard".into();
    for event in [opened("acc-u", "u"), unheard, deposit("acc-u", 3, 3)] {
        messages.push((Some("acc-u"), Some(event.to_json())));
    }
    for (i, id) in healthy.iter().enumerate() {
        messages.push((Some(id), Some(opened(id, "h").to_json())));
        if let Some((_, key, payload)) = (i % 2 == 0).then(|| bad.pop()).flatten() {
            messages.push((key, payload));
        }
        messages.push((Some(id), Some(deposit(id, 2, 10).to_json())));
    }
    // Held behind their dead letters.
    messages.push((Some("acc-d"), Some(deposit("acc-d", 3, 7).to_json())));
    messages.push((Some("acc-r"), Some(deposit("acc-r", 2, 7).to_json())));
    assert!(bad.is_empty());
    let topic = rand_test_topic("dead");
    produce_raw(&topic, &messages).await;
    let mut config = config();
    config.max_event_bytes = 2000;
    let report = run(Engine::new(pool.clone(), config).register(Arc::new(BankAccounts), [topic.clone()])).await;
    assert!(report.halts().is_empty(), "poison halts nothing: {:?}", report.halts());
    for id in &healthy {
        let (balance, version): (i64, i64) =
            sqlx::query_as("SELECT balance, version FROM bank_accounts WHERE account_id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!((balance, version), (10, 2), "{id}");
    }
    let version: i64 = sqlx::query_scalar("SELECT version FROM bank_accounts WHERE account_id = 'acc-d'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(version, 1, "acc-d waits behind its dead letter");
    // Each dead letter holds the message as it was read.
    let letters = projectionist::postgres::park::dead_letters(&pool, Some("bank_accounts"), false).await.unwrap();
    let mut reasons: Vec<&str> = letters.iter().map(|d| d.reason.as_str()).collect();
    reasons.sort_unstable();
    let want = ["data", "envelope", "envelope", "envelope", "envelope", "envelope", "envelope", "key", "key"];
    assert_eq!(reasons, [&want[..], &["oversized", "tombstone", "value"]].concat(), "{letters:#?}");
    for d in &letters {
        let (_, payload) = messages
            .iter()
            .zip(0i64..)
            .find(|(_, offset)| Some(*offset) == d.offset)
            .map(|(m, _)| m)
            .expect("a message at the dead letter's offset");
        let payload = payload.clone().unwrap_or_default();
        if d.reason == "oversized" {
            // Past dead_letter_payload_max_bytes (max_event_bytes): its head, and its length.
            assert_eq!((&d.payload[..], d.payload_bytes), (&payload[..2000], Some(payload.len() as i64)));
        } else {
            assert_eq!(d.payload, payload, "dead letter {}: the exact bytes", d.id);
        }
        assert_eq!(d.topic, topic);
        assert!(!d.error.is_empty());
    }
    let data = letters.iter().find(|d| d.reason == "data").unwrap();
    assert_eq!((data.aggregate_id.as_deref(), data.version), (Some("acc-d"), Some(2)));
    assert!(data.error.contains("invalid type: string \"a lot\""), "the full error: {}", data.error);
    let value = letters.iter().find(|d| d.reason == "value").unwrap();
    assert!(value.error.contains("owner_is_no_robot"), "the database's reason: {}", value.error);
    let alone = ["envelope", "tombstone", "key", "oversized"];
    assert!(letters.iter().filter(|d| alone.contains(&d.reason.as_str())).all(|d| d.aggregate_id.is_none()));
    let errors: Vec<&str> = letters.iter().map(|d| d.error.as_str()).collect();
    for needle in
        ["invalid unicode code point", "`id`", "`version`: must be >= 1, got 0", "got -3", "`occurred_at`", "no key"]
    {
        assert!(errors.iter().any(|e| e.contains(needle)), "an error names {needle:?}: {errors:#?}");
    }
    let unknown: (i64, i64) = sqlx::query_as("SELECT balance, version FROM bank_accounts WHERE account_id = 'acc-u'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(unknown, (3, 3), "the unknown type is ignored, not parked");
    // Their aggregates are parked behind them, later events held.
    let parked = projectionist::postgres::park::list(&pool, Some("bank_accounts")).await.unwrap();
    let parked: Vec<(&str, i64, i64, Option<i64>)> =
        parked.iter().map(|p| (p.aggregate_id.as_str(), p.waiting_for, p.held, p.dead_letter)).collect();
    assert_eq!(parked, [("acc-d", 2, 1, Some(data.id)), ("acc-r", 1, 1, Some(value.id))]);
    // Every message read is accounted for, and the checkpoint reached the head.
    let next: i64 =
        sqlx::query_scalar("SELECT next_offset FROM projectionist_checkpoints").fetch_one(&pool).await.unwrap();
    assert_eq!(next, messages.len() as i64);
    let (_, stats) = &report.projections[0];
    let c = stats.outcomes();
    let load = |n: &std::sync::atomic::AtomicU64| n.load(std::sync::atomic::Ordering::Relaxed);
    let (read, drained, dead) = (stats.read(), load(&stats.drained), load(&stats.dead_letters));
    assert_eq!(read, messages.len() as u64);
    assert_eq!(read, c.applied + c.duplicate + c.stale + c.ignored + c.parked + dead - drained, "{c:?}, dead {dead}");
    assert_eq!((c.parked, dead, c.applied, c.ignored), (2, 12, 63, 1));
}

#[sqlx::test(migrations = false)]
async fn a_gap_halts_after_applying_what_precedes_it(pool: PgPool) {
    migrate(&pool, &[&OrderStatus]).await.unwrap();
    let topic = rand_test_topic("gap");
    let e = order_status::generate::envelope;
    let events = vec![
        e("ord-g", 1, &OrderEvent::OrderPlaced { customer_id: "c".into(), total_cents: 10 }),
        e("ord-g", 3, &OrderEvent::OrderShipped {}),
        e("ord-g", 2, &OrderEvent::OrderPaid { amount_cents: 10 }),
    ];
    topics::create_topics(&brokers(), &[&topic], 1, 1).await.unwrap();
    produce(&topic, &events).await;
    let config = config().with_on_gap(OnGap::Halt);
    let report = run(Engine::new(pool.clone(), config).register(Arc::new(OrderStatus), [topic.clone()])).await;
    let halts = report.halts();
    assert_eq!(halts.len(), 1, "{halts:?}");
    let want = format!(
        "partition halted: {topic}/0@1 in projection order_status, aggregate ord-g: gap: expected version 2, found 3"
    );
    assert!(halts[0].starts_with(&want), "{}", halts[0]);
    let status: String = sqlx::query_scalar("SELECT status FROM orders").fetch_one(&pool).await.unwrap();
    assert_eq!(status, "placed", "the event before the gap is applied, nothing after it");
    let next: i64 =
        sqlx::query_scalar("SELECT next_offset FROM projectionist_checkpoints").fetch_one(&pool).await.unwrap();
    assert_eq!(next, 1);
}

async fn wait_for(what: &str, done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A rebuild's fold whose last batches changed nothing (duplicates, stale events) holds no
/// rows, but the checkpoint past them: it is stored all the same once the partition is idle,
/// before the run counts it caught up. (It was not: a rebuild whose partition ended on such
/// batches read them again in every catch-up round, and gave up after twenty.)
#[sqlx::test(migrations = false)]
async fn a_fold_of_duplicates_alone_still_stores_its_checkpoint(pool: PgPool) {
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let topic = rand_test_topic("fold-dups");
    let e = bank_accounts::generate::envelope;
    let first = vec![
        e("acc-f", 1, &AccountEvent::AccountOpened { owner: "f".into() }),
        e("acc-f", 2, &AccountEvent::MoneyDeposited { amount: 7 }),
    ];
    produce(&topic, &first).await;
    let folding = || {
        let exclusive = Exclusive { fold: true, sole_writer: true, ..Exclusive::default() };
        Engine::new(pool.clone(), config()).exclusive(exclusive).register(Arc::new(BankAccounts), [topic.clone()])
    };
    let stored = || async {
        sqlx::query_scalar::<_, Option<i64>>("SELECT sum(next_offset)::bigint FROM projectionist_checkpoints")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    assert!(run(folding()).await.halts().is_empty());
    assert_eq!(stored().await, Some(2), "the fold's rows and checkpoint written");
    // The same events again: every one a duplicate, nothing to write but the checkpoint.
    produce(&topic, &first).await;
    assert!(run(folding()).await.halts().is_empty());
    assert_eq!(stored().await, Some(4), "the checkpoint past the duplicates is stored");
    let (balance, version): (i64, i64) =
        sqlx::query_as("SELECT balance, version FROM bank_accounts WHERE account_id = 'acc-f'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((balance, version), (7, 2));
}

/// Batches size themselves: far behind, a partition applies what it read while its
/// previous batch committed (large batches); at the head, one new event is applied at once,
/// in a batch of its own.
#[sqlx::test(migrations = false)]
async fn batches_grow_while_behind_and_an_event_at_the_head_is_applied_alone(pool: PgPool) {
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let topic = rand_test_topic("adaptive");
    let events = bank_accounts::generate::stream(300, 10, 3);
    produce(&topic, &events).await;
    let engine = Engine::new(pool.clone(), config().with_exit_when_caught_up(false))
        .register(Arc::new(BankAccounts), [topic.clone()]);
    let stats = engine.stats().remove(0);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(engine.run(async {
        let _ = stopped.await;
    }));
    let total = events.len() as u64;
    wait_for("the backlog to be applied", || stats.outcomes().applied == total).await;
    let behind = stats.batches.load(std::sync::atomic::Ordering::SeqCst);
    assert!(behind * 10 <= total, "{total} events behind took {behind} batches: batches did not grow");

    let last =
        events.iter().filter(|e| e.aggregate_id == "acc-00001").map(|e| e.version).max().expect("acc-00001 has events");
    produce(
        &topic,
        &[bank_accounts::generate::envelope("acc-00001", last + 1, &AccountEvent::MoneyDeposited { amount: 1 })],
    )
    .await;
    wait_for("the new event to be applied", || stats.outcomes().applied == total + 1).await;
    assert_eq!(
        stats.batches.load(std::sync::atomic::Ordering::SeqCst),
        behind + 1,
        "the event at the head is a batch of its own"
    );
    let version: i64 = sqlx::query_scalar("SELECT version FROM bank_accounts WHERE account_id = 'acc-00001'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(version, last + 1);

    stop.send(()).unwrap();
    let report = tokio::time::timeout(Duration::from_secs(30), running).await.expect("stops in time").unwrap().unwrap();
    assert!(report.halts().is_empty(), "{:?}", report.halts());
}

/// A customer's event on the accounts topic: a type the accounts projection does not handle.
#[derive(serde::Serialize)]
#[serde(tag = "type", content = "data")]
enum CustomerEvent {
    CustomerRenamed { name: String },
}

#[sqlx::test(migrations = false)]
async fn customers_sharing_the_accounts_ids_leave_every_account_exact(pool: PgPool) {
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let accounts = bank_accounts::generate::stream(60, 8, 11);
    // Every account id is also a customer's, with versions running ahead of the account's.
    let mut per_aggregate: Vec<Vec<RawEnvelope>> = Vec::new();
    for (id, _) in bank_accounts::generate::expected(&accounts) {
        let history = accounts.iter().filter(|e| e.aggregate_id == id).cloned().collect();
        per_aggregate.push(history);
        let renames = (1..=12)
            .map(|v| {
                projectionist_testing::envelope(
                    "customer",
                    &id,
                    v,
                    &CustomerEvent::CustomerRenamed { name: format!("c{v}") },
                )
            })
            .collect();
        per_aggregate.push(renames);
    }
    let stream = projectionist_testing::interleave(per_aggregate, 3);
    let topic = rand_test_topic("shared-ids");
    produce(&topic, &stream).await;
    let report = run(Engine::new(pool.clone(), config()).register(Arc::new(BankAccounts), [topic])).await;
    assert!(report.halts().is_empty(), "{:?}", report.halts());
    let outcomes = report.projections[0].1.outcomes();
    assert_eq!((outcomes.applied, outcomes.ignored), (accounts.len() as u64, 60 * 12), "{outcomes:?}");
    let rows: Vec<(String, String, i64, String, i64)> =
        sqlx::query_as("SELECT account_id, owner, balance, status, version FROM bank_accounts ORDER BY account_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let want: Vec<(String, String, i64, String, i64)> = bank_accounts::generate::expected(&accounts)
        .into_iter()
        .map(|(id, a)| (id, a.owner, a.balance, a.status, a.version))
        .collect();
    assert_eq!(rows, want, "every account exact, whatever the customers sharing its id did");
}

/// BankAccounts under another name, with its own policy for unknown event types and its
/// own upcasters.
struct AccountsWith {
    name: &'static str,
    on_unknown_type: OnUnknownType,
    upcasters: &'static [Upcaster],
}

impl Projection<PgConnection> for AccountsWith {
    type Event = AccountEvent;

    fn name(&self) -> &str {
        self.name
    }

    fn tables(&self) -> &[Table] {
        Projection::tables(&BankAccounts)
    }

    fn on_unknown_type(&self) -> OnUnknownType {
        self.on_unknown_type
    }

    fn upcasters(&self) -> &[Upcaster] {
        self.upcasters
    }

    fn project(&self, event: &Envelope<AccountEvent>) -> Writes {
        BankAccounts.project(event)
    }
}

/// Halts on an event type it does not handle.
const STRICT: AccountsWith =
    AccountsWith { name: "strict_accounts", on_unknown_type: OnUnknownType::Halt, upcasters: &[] };

#[sqlx::test(migrations = false)]
async fn an_unknown_event_type_halts_a_projection_that_says_so_at_that_event(pool: PgPool) {
    migrate(&pool, &[&STRICT]).await.unwrap();
    let e = bank_accounts::generate::envelope;
    let mut unknown = e("acc-s", 3, &AccountEvent::MoneyDeposited { amount: 1 });
    unknown.event_type = "stock_added".into();
    let events = [
        e("acc-s", 1, &AccountEvent::AccountOpened { owner: "sam".into() }),
        e("acc-s", 2, &AccountEvent::MoneyDeposited { amount: 5 }),
        unknown,
        e("acc-s", 4, &AccountEvent::MoneyDeposited { amount: 6 }),
    ];
    let topic = rand_test_topic("strict");
    topics::create_topics(&brokers(), &[&topic], 1, 1).await.unwrap();
    produce(&topic, &events).await;
    let report = run(Engine::new(pool.clone(), config()).register(Arc::new(STRICT), [topic.clone()])).await;
    let halts = report.halts();
    assert_eq!(halts.len(), 1, "{halts:?}");
    assert!(halts[0].contains(&format!("{topic}/0@2 ")) && halts[0].contains("\"stock_added\""), "{}", halts[0]);
    assert!(halts[0].contains("AccountOpened, MoneyDeposited"), "names the handled types: {}", halts[0]);
    let version: i64 = sqlx::query_scalar("SELECT version FROM bank_accounts WHERE account_id = 'acc-s'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(version, 2, "the events before it applied, nothing at or after it");
}

fn funds_added_to_money_deposited(mut data: serde_json::Value) -> Result<serde_json::Value, String> {
    let cents = data.as_object_mut().and_then(|d| d.remove("cents")).ok_or("no `cents`")?;
    data["amount"] = cents;
    Ok(data)
}

const UPCASTERS: &[Upcaster] =
    &[Upcaster::new("FundsAdded", 1, funds_added_to_money_deposited).renamed("MoneyDeposited")];

/// Over a topic that also holds the first release's deposits: `FundsAdded` with `cents`
/// (schema version 1), upcast to today's `MoneyDeposited`.
const UPCASTING: AccountsWith =
    AccountsWith { name: "upcast_accounts", on_unknown_type: OnUnknownType::Warn, upcasters: UPCASTERS };

#[sqlx::test(migrations = false)]
async fn old_event_shapes_are_upcast_on_the_live_path_and_on_a_replay(pool: PgPool) {
    migrate(&pool, &[&UPCASTING]).await.unwrap();
    let e = bank_accounts::generate::envelope;
    let old = |version, cents: i64| {
        let mut event = e("acc-o", version, &AccountEvent::MoneyDeposited { amount: 0 });
        event.event_type = "FundsAdded".into();
        event.data = serde_json::json!({ "cents": cents });
        event
    };
    let mut current = e("acc-o", 4, &AccountEvent::MoneyDeposited { amount: 1000 });
    current.metadata = Some(serde_json::json!({"schema_version": 2}));
    let mut broken = old(2, 0);
    broken.aggregate_id = "acc-b".into();
    broken.version = 2;
    broken.data = serde_json::json!({ "amount": 1 });
    let events = [
        e("acc-o", 1, &AccountEvent::AccountOpened { owner: "olga".into() }),
        old(2, 5),
        old(3, 7),
        current,
        e("acc-b", 1, &AccountEvent::AccountOpened { owner: "bea".into() }),
        broken,
    ];
    let topic = rand_test_topic("upcast");
    topics::create_topics(&brokers(), &[&topic], 1, 1).await.unwrap();
    produce(&topic, &events).await;
    let balance = |pool: PgPool| async move {
        sqlx::query_as::<_, (i64, i64)>("SELECT balance, version FROM bank_accounts WHERE account_id = 'acc-o'")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    let halting = config().with_on_poison(OnPoison::Halt);
    let report = run(Engine::new(pool.clone(), halting).register(Arc::new(UPCASTING), [topic.clone()])).await;
    assert_eq!(balance(pool.clone()).await, (1012, 4), "the old deposits counted in today's shape");
    let halts = report.halts();
    assert_eq!(halts.len(), 1, "{halts:?}");
    assert!(
        halts[0].contains("acc-b")
            && halts[0].contains("upcasting event type FundsAdded from schema version 1: no `cents`"),
        "an upcaster's failure halts at its event, naming it: {}",
        halts[0]
    );

    // A replay from offset zero reads the old shapes again, through the same upcasters.
    let replay = config().with_from_beginning(true).with_on_poison(OnPoison::Halt);
    let report = run(Engine::new(pool.clone(), replay).register(Arc::new(UPCASTING), [topic])).await;
    let outcomes = report.projections[0].1.outcomes();
    assert_eq!(
        (outcomes.applied, outcomes.duplicate + outcomes.stale),
        (0, 4 + 1),
        "every event before the broken one decodes again and is skipped by its gate: {outcomes:?}"
    );
    assert_eq!(balance(pool).await, (1012, 4));
}

/// Before the fix: the first release's deposits (`cents`, schema version 1) do not decode.
const RETRY_BEFORE: AccountsWith =
    AccountsWith { name: "retry_accounts", on_unknown_type: OnUnknownType::Warn, upcasters: &[] };

/// The fix shipped: an upcaster for them.
const RETRY_AFTER: AccountsWith = AccountsWith {
    name: "retry_accounts",
    on_unknown_type: OnUnknownType::Warn,
    upcasters: &[Upcaster::new("MoneyDeposited", 1, funds_added_to_money_deposited)],
};

/// A dead letter caused by an old shape is fixed by shipping an upcaster and retrying it:
/// applied, then the events held behind it. A retry that still fails counts the attempt; a
/// discard skips the version on purpose, records why, and the held events apply.
#[sqlx::test(migrations = false)]
async fn a_dead_letter_retried_after_shipping_an_upcaster_or_discarded_resumes_its_aggregate(pool: PgPool) {
    use projectionist::postgres::park::{dead_letter, dead_letters, list, resolve, Resolve};
    migrate(&pool, &[&RETRY_BEFORE]).await.unwrap();
    let e = bank_accounts::generate::envelope;
    let today = |id: &str, version, amount| {
        let mut event = e(id, version, &AccountEvent::MoneyDeposited { amount });
        event.metadata = Some(serde_json::json!({ "schema_version": 2 }));
        event
    };
    let old = |id: &str, version, cents: i64| {
        let mut event = e(id, version, &AccountEvent::MoneyDeposited { amount: 0 });
        event.data = serde_json::json!({ "cents": cents });
        event.metadata = Some(serde_json::json!({ "schema_version": 1 }));
        event
    };
    let opened = |id: &str| e(id, 1, &AccountEvent::AccountOpened { owner: id.into() });
    let events = [
        opened("acc-u"),
        old("acc-u", 2, 5),
        today("acc-u", 3, 7),
        opened("acc-z"),
        old("acc-z", 2, 100),
        today("acc-z", 3, 4),
    ];
    let topic = rand_test_topic("retry");
    topics::create_topics(&brokers(), &[&topic], 1, 1).await.unwrap();
    produce(&topic, &events).await;
    let report = run(Engine::new(pool.clone(), config()).register(Arc::new(RETRY_BEFORE), [topic.clone()])).await;
    assert!(report.halts().is_empty(), "{:?}", report.halts());
    let balance = |id: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_as::<_, (i64, i64)>("SELECT balance, version FROM bank_accounts WHERE account_id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    assert_eq!((balance("acc-u").await, balance("acc-z").await), ((0, 1), (0, 1)), "both wait behind a dead letter");
    let letters = dead_letters(&pool, Some("retry_accounts"), false).await.unwrap();
    let id_of = |aggregate: &str| letters.iter().find(|d| d.aggregate_id.as_deref() == Some(aggregate)).unwrap().id;
    let (u, z) = (id_of("acc-u"), id_of("acc-z"));

    // The fix shipped: the retry applies the old deposit, then the one held behind it.
    let retried = resolve(&pool, &RETRY_AFTER, u, Resolve::Retry).await.unwrap();
    assert_eq!((retried.outcome, retried.drained.applied), (projectionist::Outcome::Applied, 1), "{retried:?}");
    assert_eq!(balance("acc-u").await, (12, 3));

    // Without it, a retry fails again: the attempt counted, the aggregate still parked.
    let again = resolve(&pool, &RETRY_BEFORE, z, Resolve::Retry).await.unwrap();
    assert_eq!(again.outcome, projectionist::Outcome::DeadLettered, "{again:?}");
    assert!(again.error.as_deref().is_some_and(|e| e.contains("amount")), "{again:?}");
    assert_eq!(dead_letter(&pool, z).await.unwrap().unwrap().attempts, 2);
    assert_eq!(list(&pool, None).await.unwrap().len(), 1);

    // A discard skips the version on purpose: the held deposit applies on the unchanged row.
    let reason = "refunded by hand, ticket 42".to_owned();
    let discarded = resolve(&pool, &RETRY_BEFORE, z, Resolve::Discard { reason: reason.clone() }).await.unwrap();
    assert_eq!((discarded.outcome, discarded.drained.applied), (projectionist::Outcome::Ignored, 1));
    assert_eq!(balance("acc-z").await, (4, 3));
    assert!(list(&pool, None).await.unwrap().is_empty(), "nothing parked any more");
    let held: i64 = sqlx::query_scalar("SELECT count(*) FROM projectionist_held").fetch_one(&pool).await.unwrap();
    assert_eq!(held, 0);
    assert!(dead_letters(&pool, None, false).await.unwrap().is_empty(), "no open dead letter");
    let record = dead_letter(&pool, z).await.unwrap().unwrap();
    assert_eq!((record.resolution.as_deref(), record.resolution_note), (Some("discarded"), Some(reason)));
    assert_eq!(dead_letter(&pool, u).await.unwrap().unwrap().resolution.as_deref(), Some("retried"));
    let err = resolve(&pool, &RETRY_BEFORE, z, Resolve::Retry).await.unwrap_err();
    assert!(err.to_string().contains("already discarded"), "{err}");
}

/// Parking is bounded: past the events held for one aggregate (or the aggregates parked),
/// the partition halts with an error naming the bound and how to raise it, rather than hold
/// without end or drop anything.
#[sqlx::test(migrations = false)]
async fn parking_past_its_bounds_halts_naming_the_bound(pool: PgPool) {
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let e = bank_accounts::generate::envelope;
    let deposit = |v| e("acc-b", v, &AccountEvent::MoneyDeposited { amount: 1 });
    let events =
        [e("acc-b", 1, &AccountEvent::AccountOpened { owner: "b".into() }), deposit(3), deposit(4), deposit(5)];
    let topic = rand_test_topic("bound");
    topics::create_topics(&brokers(), &[&topic], 1, 1).await.unwrap();
    produce(&topic, &events).await;
    let mut config = config();
    config.max_held_per_aggregate = 2;
    let report = run(Engine::new(pool.clone(), config).register(Arc::new(BankAccounts), [topic.clone()])).await;
    let halts = report.halts();
    assert_eq!(halts.len(), 1, "{halts:?}");
    assert!(
        halts[0].contains("over max_held_per_aggregate (2)") && halts[0].contains("--max-held-per-aggregate"),
        "names the bound and how to raise it: {}",
        halts[0]
    );
    let version: i64 = sqlx::query_scalar("SELECT version FROM bank_accounts WHERE account_id = 'acc-b'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(version, 1, "what precedes the halt is applied");
    let held: i64 = sqlx::query_scalar("SELECT count(*) FROM projectionist_held").fetch_one(&pool).await.unwrap();
    assert!(held <= 2, "never more held than the bound: {held}");
}

/// The bounds are checked for every aggregate a batch parks or holds events of, at once:
/// the halt names the aggregate past the bound, not the first one the batch held events of;
/// and past the aggregates parked, the bound on those.
#[sqlx::test(migrations = false)]
async fn parking_bounds_name_the_aggregate_past_them(pool: PgPool) {
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let e = bank_accounts::generate::envelope;
    let opened = |id| e(id, 1, &AccountEvent::AccountOpened { owner: id.into() });
    let deposit = |id, v| e(id, v, &AccountEvent::MoneyDeposited { amount: 1 });
    // acc-a waits for its version 2 with one event held, acc-b with three.
    let events = [
        opened("acc-a"),
        deposit("acc-a", 3),
        opened("acc-b"),
        deposit("acc-b", 3),
        deposit("acc-b", 4),
        deposit("acc-b", 5),
    ];
    for (held, parked, bound) in [(2, 10, "over max_held_per_aggregate (2)"), (10, 1, "over max_parked_aggregates (1)")]
    {
        projectionist::postgres::reset(&pool, &BankAccounts).await.unwrap();
        sqlx::raw_sql("TRUNCATE projectionist_parked, projectionist_held").execute(&pool).await.unwrap();
        let topic = rand_test_topic("bounds");
        topics::create_topics(&brokers(), &[&topic], 1, 1).await.unwrap();
        produce(&topic, &events).await;
        let mut config = config();
        config.max_held_per_aggregate = held;
        config.max_parked_aggregates = parked;
        let report = run(Engine::new(pool.clone(), config).register(Arc::new(BankAccounts), [topic.clone()])).await;
        let halts = report.halts();
        assert_eq!(halts.len(), 1, "{halts:?}");
        assert!(halts[0].contains(bound), "names the bound: {}", halts[0]);
        if held == 2 {
            assert!(halts[0].contains("acc-b") && !halts[0].contains("acc-a"), "names acc-b: {}", halts[0]);
        }
    }
}

/// With a dead-letter topic, each dead letter is also produced there once its batch
/// commits: the message's own key and payload, with where it was read and why it failed in
/// `projectionist.*` headers.
#[sqlx::test(migrations = false)]
async fn dead_letters_are_also_produced_to_the_dead_letter_topic(pool: PgPool) {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::{Headers, Message};
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let e = bank_accounts::generate::envelope;
    let mut poison = e("acc-q", 2, &AccountEvent::MoneyDeposited { amount: 1 });
    poison.data = serde_json::json!({ "amount": "a lot" });
    let events = [e("acc-q", 1, &AccountEvent::AccountOpened { owner: "q".into() }), poison.clone()];
    let (topic, dlq) = (rand_test_topic("dlq-source"), rand_test_topic("dlq"));
    topics::create_topics(&brokers(), &[&topic, &dlq], 1, 1).await.unwrap();
    produce(&topic, &events).await;
    let mut config = config();
    config.dead_letter_topic = Some(dlq.clone());
    let report = run(Engine::new(pool.clone(), config).register(Arc::new(BankAccounts), [topic.clone()])).await;
    assert!(report.halts().is_empty(), "{:?}", report.halts());

    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("group.id", format!("dlq-{}", uuid::Uuid::new_v4().simple()))
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    consumer.subscribe(&[&dlq]).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let message = loop {
        assert!(std::time::Instant::now() < deadline, "nothing on the dead-letter topic");
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            break m.detach();
        }
    };
    assert_eq!(message.payload(), Some(poison.to_json().as_slice()), "the exact bytes");
    assert_eq!(message.key(), Some(&b"acc-q"[..]));
    let headers = message.headers().expect("headers");
    let header = |name: &str| {
        headers.iter().find(|h| h.key == name).and_then(|h| h.value).map(|v| String::from_utf8_lossy(v).into_owned())
    };
    assert_eq!(header("projectionist.reason").as_deref(), Some("data"));
    assert_eq!(header("projectionist.topic").as_deref(), Some(topic.as_str()));
    assert_eq!(header("projectionist.offset").as_deref(), Some("1"));
    assert!(header("projectionist.error").is_some_and(|e| e.contains("acc-q v2 does not decode")), "{headers:?}");
}

/// A projection's own policy wins over the engine's, for it alone: in one process, a gap
/// halts `order_status` (its own `on_gap = halt`) and parks in `bank_accounts` (the engine's
/// `park`). A setting for a projection that is not registered refuses to start.
#[sqlx::test(migrations = false)]
async fn a_projections_own_policy_applies_to_it_alone(pool: PgPool) {
    migrate(&pool, &[&BankAccounts, &OrderStatus]).await.unwrap();
    let (accounts_topic, orders_topic) = (rand_test_topic("own-accounts"), rand_test_topic("own-orders"));
    topics::create_topics(&brokers(), &[&accounts_topic, &orders_topic], 1, 1).await.unwrap();
    let a = bank_accounts::generate::envelope;
    let o = order_status::generate::envelope;
    let accounts = [
        a("acc-g", 1, &AccountEvent::AccountOpened { owner: "g".into() }),
        a("acc-g", 3, &AccountEvent::MoneyDeposited { amount: 5 }),
        a("acc-h", 1, &AccountEvent::AccountOpened { owner: "h".into() }),
    ];
    let orders = [
        o("ord-g", 1, &OrderEvent::OrderPlaced { customer_id: "c".into(), total_cents: 10 }),
        o("ord-g", 3, &OrderEvent::OrderShipped {}),
        o("ord-h", 1, &OrderEvent::OrderPlaced { customer_id: "c".into(), total_cents: 10 }),
    ];
    produce(&accounts_topic, &accounts).await;
    produce(&orders_topic, &orders).await;
    let own = projectionist::kafka::ProjectionSettings { on_gap: Some(OnGap::Halt), ..Default::default() };
    let engine = |config: EngineConfig| {
        Engine::new(pool.clone(), config)
            .register(Arc::new(BankAccounts), [accounts_topic.clone()])
            .register(Arc::new(OrderStatus), [orders_topic.clone()])
    };

    let refused = engine(config().with_projection_settings("order_stats", own.clone())).run(std::future::pending());
    let Err(err) = refused.await else { panic!("started with a setting for no projection") };
    assert!(err.to_string().contains("per_projection names \"order_stats\", which is not registered"), "{err}");

    let report = run(engine(config().with_projection_settings("order_status", own))).await;
    let halts = report.halts();
    assert_eq!(halts.len(), 1, "{halts:?}");
    assert!(halts[0].contains("in projection order_status, aggregate ord-g: gap"), "{}", halts[0]);
    let parked = projectionist::postgres::park::list(&pool, None).await.unwrap();
    let parked: Vec<(&str, &str)> = parked.iter().map(|p| (p.projection.as_str(), p.aggregate_id.as_str())).collect();
    assert_eq!(parked, [("bank_accounts", "acc-g")], "the engine's policy parks the other projection's gap");
    let accounts: i64 = sqlx::query_scalar("SELECT count(*) FROM bank_accounts").fetch_one(&pool).await.unwrap();
    assert_eq!(accounts, 2, "bank_accounts flowed");
}

/// A held event the table refuses, found so only when its aggregate resumes: the held event
/// itself is dead-lettered (its bytes and headers as read, its own error), not the event
/// that resumed the aggregate, which applies; the events held behind it stay held, and
/// discarding it drains them.
#[sqlx::test(migrations = false)]
async fn a_held_event_refused_when_its_aggregate_resumes_is_dead_lettered_itself(pool: PgPool) {
    use projectionist::postgres::park::{dead_letters, list, resolve, Resolve};
    use rdkafka::message::{Header, OwnedHeaders};
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    sqlx::raw_sql("ALTER TABLE bank_accounts ADD CONSTRAINT owner_is_no_robot CHECK (owner <> 'robot')")
        .execute(&pool)
        .await
        .unwrap();
    let e = bank_accounts::generate::envelope;
    let topic = rand_test_topic("held-refused");
    topics::create_topics(&brokers(), &[&topic], 1, 1).await.unwrap();
    let refused = e("acc-x", 3, &AccountEvent::AccountOpened { owner: "robot".into() });
    produce(&topic, &[e("acc-x", 1, &AccountEvent::AccountOpened { owner: "x".into() })]).await;
    let producer: ThreadedProducer<DefaultProducerContext> =
        ClientConfig::new().set("bootstrap.servers", brokers()).create().unwrap();
    let payload = refused.to_json();
    // A header's value as read: bytes, empty, or none at all (null), each kept apart.
    let headers = OwnedHeaders::new()
        .insert(Header { key: "trace", value: Some(&[0u8, 255, 7][..]) })
        .insert(Header { key: "empty", value: Some(&[][..]) })
        .insert(Header { key: "null", value: None::<&[u8]> });
    producer.send(BaseRecord::to(&topic).key("acc-x").payload(&payload).headers(headers)).map_err(|(e, _)| e).unwrap();
    producer.flush(Duration::from_secs(10)).unwrap();
    produce(&topic, &[e("acc-x", 4, &AccountEvent::MoneyDeposited { amount: 5 })]).await;
    let engine = || Engine::new(pool.clone(), config()).register(Arc::new(BankAccounts), [topic.clone()]);
    let report = run(engine()).await;
    assert!(report.halts().is_empty(), "{:?}", report.halts());
    assert_eq!(list(&pool, None).await.unwrap()[0].held, 2, "v3 and v4 held behind the gap");

    // v2 arrives: applied; v3 is refused as it drains, and is the dead letter.
    produce(&topic, &[e("acc-x", 2, &AccountEvent::MoneyDeposited { amount: 1 })]).await;
    let report = run(engine()).await;
    assert!(report.halts().is_empty(), "{:?}", report.halts());
    let row: (i64, i64) = sqlx::query_as("SELECT balance, version FROM bank_accounts WHERE account_id = 'acc-x'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(row, (1, 2), "the resuming event applied");
    let letters = dead_letters(&pool, None, false).await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:#?}");
    let d = &letters[0];
    assert_eq!((d.reason.as_str(), d.version, d.offset), ("value", Some(3), Some(1)), "{d:#?}");
    assert!(d.error.contains("account/acc-x v3") && d.error.contains("owner_is_no_robot"), "{}", d.error);
    assert_eq!(d.payload, payload, "the exact bytes");
    assert_eq!(
        (d.header_names.clone(), d.header_values.clone()),
        (
            vec![b"trace".to_vec(), b"empty".to_vec(), b"null".to_vec()],
            vec![Some(vec![0u8, 255, 7]), Some(vec![]), None]
        )
    );
    let parked = list(&pool, None).await.unwrap();
    assert_eq!((parked.len(), parked[0].held, parked[0].dead_letter), (1, 1, Some(d.id)), "v4 waits behind it");

    // Discarded: v4 drains.
    let discarded = resolve(&pool, &BankAccounts, d.id, Resolve::Discard { reason: "a robot".into() }).await.unwrap();
    assert_eq!(discarded.drained.applied, 1, "{discarded:?}");
    let row: (i64, i64) = sqlx::query_as("SELECT balance, version FROM bank_accounts WHERE account_id = 'acc-x'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(row, (6, 4));
    assert!(list(&pool, None).await.unwrap().is_empty());

    // Replayed from offset zero after a reset, the stream meets the dead letter again: the
    // operator's discard holds (its version skipped again), nothing stays parked behind it.
    projectionist::postgres::reset(&pool, &BankAccounts).await.unwrap();
    let report = run(engine()).await;
    assert!(report.halts().is_empty(), "{:?}", report.halts());
    let row: (i64, i64) = sqlx::query_as("SELECT balance, version FROM bank_accounts WHERE account_id = 'acc-x'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(row, (6, 4), "the replay ends where the discard left the read model");
    assert!(list(&pool, None).await.unwrap().is_empty(), "nothing parked behind a discarded dead letter");
    assert!(dead_letters(&pool, None, false).await.unwrap().is_empty(), "the dead letter stays discarded");
}

/// A blue/green rebuild: built beside the live tables from offset zero and swapped in, a
/// reader polling the live table all along never sees it shrink nor gets an error; the
/// rebuilt tables are exact (a row tampered with by hand is repaired) with the projection's
/// checkpoints and parking; a second rebuild at once is refused; a rollback restores the
/// replaced tables exactly.
#[sqlx::test(migrations = false)]
async fn a_rebuild_is_built_beside_the_live_tables_and_swapped_in(pool: PgPool) {
    use projectionist::kafka::rebuild::{rebuild, Rebuilt};
    let folded = std::sync::atomic::AtomicU64::default();
    use projectionist::postgres::rebuild as shadow;
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let topic = rand_test_topic("rebuild");
    let mut events = bank_accounts::generate::stream(60, 12, 7);
    let e = bank_accounts::generate::envelope;
    events.push(e("acc-gap", 1, &AccountEvent::AccountOpened { owner: "g".into() }));
    events.push(e("acc-gap", 3, &AccountEvent::MoneyDeposited { amount: 1 }));
    events.push(e("acc-p", 1, &AccountEvent::AccountOpened { owner: "p".into() }));
    let mut poison = e("acc-p", 2, &AccountEvent::MoneyDeposited { amount: 1 });
    poison.data = serde_json::json!({ "amount": "a lot" });
    events.push(poison);
    produce(&topic, &events).await;
    let live = || Engine::new(pool.clone(), config()).register(Arc::new(BankAccounts), [topic.clone()]);
    assert!(run(live()).await.halts().is_empty());
    let letters = || async { projectionist::postgres::park::dead_letters(&pool, None, true).await.unwrap() };
    let first = letters().await;
    assert_eq!(first.len(), 1);
    let dump = || projectionist_testing::dump_tables(&pool, &BankAccounts);
    let clean = dump().await;
    let checkpoints = || async {
        sqlx::query_as::<_, (String, i32, i64)>(
            "SELECT topic, partition, next_offset FROM projectionist_checkpoints ORDER BY 1, 2",
        )
        .fetch_all(&pool)
        .await
        .unwrap()
    };
    let live_checkpoints = checkpoints().await;
    sqlx::query(
        "UPDATE bank_accounts SET owner = 'tampered' WHERE account_id = (SELECT min(account_id) FROM bank_accounts)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let tampered = dump().await;
    assert_ne!(tampered, clean);

    // A reader polls the live table while the rebuild runs and swaps.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = tokio::spawn({
        let (pool, stop) = (pool.clone(), stop.clone());
        async move {
            let (mut polls, mut least) = (0, (i64::MAX, i64::MAX));
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let (count, versions): (i64, i64) =
                    sqlx::query_as("SELECT count(*), coalesce(sum(version), 0)::bigint FROM bank_accounts")
                        .fetch_one(&pool)
                        .await
                        .expect("the reader never gets an error");
                least = (least.0.min(count), least.1.min(versions));
                polls += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (polls, least)
        }
    });
    let held = shadow::lock(&pool, "bank_accounts").await.unwrap();
    let refused =
        rebuild(&pool, config(), Arc::new(BankAccounts), vec![topic.clone()], &folded, std::future::pending());
    let Err(err) = refused.await else { panic!("a second rebuild at once started") };
    assert!(err.to_string().contains("another rebuild of it is running"), "{err}");
    held.release().await.unwrap();
    // A shadow that has read nothing is behind the live checkpoints: no swap.
    assert!(!shadow::prepare(&pool, &BankAccounts).await.unwrap().resumed);
    let behind = shadow::swap(&pool, &BankAccounts, std::slice::from_ref(&topic)).await.unwrap();
    assert!(matches!(&behind, shadow::Swap::Behind(p) if p.len() == 2), "{behind:?}");
    let rebuilt =
        rebuild(&pool, config(), Arc::new(BankAccounts), vec![topic.clone()], &folded, std::future::pending());
    let rebuilt = tokio::time::timeout(Duration::from_secs(120), rebuilt).await.expect("rebuilt in time").unwrap();
    assert!(matches!(rebuilt, Rebuilt::Swapped { resumed: true, .. }), "the shadow made above, resumed");
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (polls, least) = reader.await.unwrap();
    let full: (i64, i64) =
        sqlx::query_as("SELECT count(*), sum(version)::bigint FROM bank_accounts").fetch_one(&pool).await.unwrap();
    assert!(polls > 0 && least == full, "the reader saw {least:?} at least, over {polls} polls; full: {full:?}");
    assert_eq!(dump().await, clean, "the rebuilt tables equal a clean run's (the tampered row repaired)");
    assert_eq!(checkpoints().await, live_checkpoints, "the projection's checkpoints are the rebuild's");
    let parked = projectionist::postgres::park::list(&pool, None).await.unwrap();
    let parked: Vec<(&str, i64, i64, Option<i64>)> =
        parked.iter().map(|p| (p.aggregate_id.as_str(), p.waiting_for, p.held, p.dead_letter)).collect();
    let again = letters().await;
    let again: Vec<(i64, i32, Option<&str>)> =
        again.iter().map(|d| (d.id, d.attempts, d.resolution.as_deref())).collect();
    assert_eq!(again, [(first[0].id, 2, None)], "the same dead letter, met again by the rebuild");
    assert_eq!(
        parked,
        [("acc-gap", 2, 1, None), ("acc-p", 2, 0, Some(first[0].id))],
        "the gap and the poison event parked again by the rebuild, once"
    );
    let schemas: Vec<String> =
        sqlx::query_scalar("SELECT nspname::text FROM pg_namespace WHERE nspname LIKE 'projectionist_%' ORDER BY 1")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(schemas, ["projectionist_old_bank_accounts"], "the shadow is gone, the replaced tables kept");

    // The live run goes on with the new tables.
    produce(&topic, &[e("acc-gap", 2, &AccountEvent::MoneyDeposited { amount: 1 })]).await;
    assert!(run(live()).await.halts().is_empty());
    let (version,): (i64,) = sqlx::query_as("SELECT version FROM bank_accounts WHERE account_id = 'acc-gap'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(version, 3, "the gap filled and drained in the rebuilt tables");

    // Rolled back: the replaced tables, tampered row included, and their checkpoints.
    shadow::rollback(&pool, &BankAccounts).await.unwrap();
    assert_eq!(dump().await, tampered);
    assert_eq!(checkpoints().await, live_checkpoints);
    let parked = projectionist::postgres::park::list(&pool, None).await.unwrap();
    let parked: Vec<(&str, Option<i64>)> = parked.iter().map(|p| (p.aggregate_id.as_str(), p.dead_letter)).collect();
    assert_eq!(parked, [("acc-gap", None), ("acc-p", Some(first[0].id))], "parked as it was");
    let restored = letters().await;
    assert_eq!((restored.len(), restored[0].id, restored[0].attempts), (1, first[0].id, 1));
    assert!(!shadow::drop_old(&pool, "bank_accounts").await.unwrap(), "nothing left to drop");
}

/// A rebuild of a projection whose rows are deleted and whose children are cleared (orders
/// archived, their lines removed and cleared): built from offset zero into tables created
/// with their composite keys, it swaps in exactly what a clean live run built (a deleted
/// line put back by hand is gone again, the aggregate versions moved by hand are the run's
/// again), and a rollback restores the tampered tables.
#[sqlx::test(migrations = false)]
async fn a_rebuild_deletes_and_clears_as_the_live_run_did(pool: PgPool) {
    use projectionist::kafka::rebuild::{rebuild, Rebuilt};
    use projectionist::postgres::rebuild as shadow;
    let folded = std::sync::atomic::AtomicU64::default();
    migrate(&pool, &[&OrderStatus]).await.unwrap();
    let topic = rand_test_topic("rebuild-deletes");
    let events = order_status::generate::stream(80, 10, 12);
    assert!(
        events.iter().any(|e| e.event_type == "OrderArchived") && events.iter().any(|e| e.event_type == "ItemRemoved")
    );
    produce(&topic, &events).await;
    let live = || Engine::new(pool.clone(), config()).register(Arc::new(OrderStatus), [topic.clone()]);
    assert!(run(live()).await.halts().is_empty());
    let dump = || projectionist_testing::dump_tables(&pool, &OrderStatus);
    let clean = dump().await;
    let (orders, lines): (i64, i64) =
        sqlx::query_as("SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM order_lines)")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(orders < 80 && lines > 0, "some orders archived ({orders} of 80 left), lines kept ({lines})");
    // A line deleted by the stream, put back by hand.
    sqlx::query("INSERT INTO order_lines (order_id, sku, quantity) VALUES ('ord-00001', 'sku-back', 9)")
        .execute(&pool)
        .await
        .unwrap();
    // The aggregate versions the gate keeps (part of the dump), tampered too: one moved, one
    // gone, one stray.
    sqlx::raw_sql(
        "UPDATE projectionist_aggregate_versions SET version = version + 100 WHERE aggregate_id = 'ord-00002'; \
         DELETE FROM projectionist_aggregate_versions WHERE aggregate_id = 'ord-00003'; \
         INSERT INTO projectionist_aggregate_versions VALUES ('order_status', 'order', 'ord-stray', 7)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let tampered = dump().await;
    assert_ne!(tampered, clean);
    let rebuilt = rebuild(&pool, config(), Arc::new(OrderStatus), vec![topic.clone()], &folded, std::future::pending());
    let rebuilt = tokio::time::timeout(Duration::from_secs(120), rebuilt).await.expect("rebuilt in time").unwrap();
    assert!(matches!(rebuilt, Rebuilt::Swapped { .. }), "the rebuild swapped in");
    assert_eq!(dump().await, clean, "the rebuilt tables and versions equal the clean run's");
    shadow::rollback(&pool, &OrderStatus).await.unwrap();
    assert_eq!(dump().await, tampered, "rolled back");
}

/// `rebuild --verify`: a shadow built from the stream and compared with the live tables at
/// the same offsets, instead of swapped in. Clean, it finds nothing and leaves no shadow;
/// after rows and versions changed by hand it counts each kind of difference and names the
/// first keys with both values, the live tables untouched and the shadow kept for a swap
/// (which restores the clean read model). Compared at different offsets, it says which side
/// is behind instead.
#[sqlx::test(migrations = false)]
async fn a_verification_compares_the_rebuilt_tables_with_the_live_ones_at_the_same_offsets(pool: PgPool) {
    use projectionist::kafka::rebuild::{rebuild, verify, Rebuilt};
    use projectionist::postgres::rebuild::{self as shadow, Verification};
    let folded = std::sync::atomic::AtomicU64::default();
    migrate(&pool, &[&OrderStatus]).await.unwrap();
    let topic = rand_test_topic("verify");
    produce(&topic, &order_status::generate::stream(60, 8, 21)).await;
    let live = || Engine::new(pool.clone(), config()).register(Arc::new(OrderStatus), [topic.clone()]);
    assert!(run(live()).await.halts().is_empty());
    let dump = || projectionist_testing::dump_tables(&pool, &OrderStatus);
    let clean = dump().await;
    let verified = || async {
        let verified =
            verify(&pool, config(), Arc::new(OrderStatus), vec![topic.clone()], &folded, std::future::pending());
        match tokio::time::timeout(Duration::from_secs(120), verified).await.expect("verified in time").unwrap() {
            Rebuilt::Verified { differences, .. } => differences,
            _ => panic!("a verification ends verified"),
        }
    };
    assert_eq!(verified().await, vec![], "a clean run");
    let shadow_kept = || async { shadow::shadow_checkpoints(&pool, "order_status").await.unwrap().is_some() };
    assert!(!shadow_kept().await, "no shadow left when nothing differs");

    let (lines, orders): (i64, i64) =
        sqlx::query_as("SELECT (SELECT count(*) FROM order_lines), (SELECT count(*) FROM orders)")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(lines > 0 && orders > 2, "{lines} lines, {orders} orders");
    sqlx::raw_sql(
        "INSERT INTO order_lines (order_id, sku, quantity) VALUES ('ord-00001', 'sku-stray', 9); \
         UPDATE orders SET status = 'tampered' WHERE order_id = (SELECT min(order_id) FROM orders); \
         DELETE FROM orders WHERE order_id = (SELECT max(order_id) FROM orders); \
         UPDATE projectionist_aggregate_versions SET version = version + 100 WHERE aggregate_id = 'ord-00002'",
    )
    .execute(&pool)
    .await
    .unwrap();
    let tampered = dump().await;
    let differences = verified().await;
    let found: Vec<(&str, i64, i64, i64)> =
        differences.iter().map(|d| (d.table.as_str(), d.only_live, d.only_rebuilt, d.changed)).collect();
    assert_eq!(
        found,
        vec![("orders", 0, 1, 1), ("order_lines", 1, 0, 0), ("projectionist_aggregate_versions", 0, 0, 1)],
        "{differences:#?}"
    );
    let lines = &differences[1].first;
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0].0, serde_json::json!(["ord-00001", "sku-stray"]));
    assert_eq!(lines[0].1["quantity"], 9);
    assert!(lines[0].2.is_null(), "the rebuilt table has no such line");
    let tampered_order = differences[0].first.iter().find(|(_, live, _)| live["status"] == "tampered").unwrap();
    assert_ne!(tampered_order.2["status"], "tampered", "the rebuilt row is the stream's");
    assert_eq!(dump().await, tampered, "the live tables untouched");
    assert!(shadow_kept().await, "the shadow kept when rows differ");

    // At different offsets there is nothing to compare: the side behind is named.
    let move_checkpoint = |schema: &str, by: i64| {
        format!("UPDATE {schema}.projectionist_checkpoints SET next_offset = next_offset + {by} WHERE partition = 0")
    };
    sqlx::raw_sql(&move_checkpoint("public", 1)).execute(&pool).await.unwrap();
    let topics = [topic.clone()];
    let at = shadow::verify(&pool, &OrderStatus, &topics).await.unwrap();
    assert!(matches!(&at, Verification::ShadowBehind(p) if p.len() == 1 && p[0].1 == 0), "{at:?}");
    sqlx::raw_sql(&move_checkpoint("projectionist_rebuild_order_status", 2)).execute(&pool).await.unwrap();
    let at = shadow::verify(&pool, &OrderStatus, &topics).await.unwrap();
    assert!(matches!(&at, Verification::LiveBehind(p) if p.len() == 1 && p[0].1 == 0), "{at:?}");
    sqlx::raw_sql(&move_checkpoint("projectionist_rebuild_order_status", -2)).execute(&pool).await.unwrap();
    sqlx::raw_sql(&move_checkpoint("public", -1)).execute(&pool).await.unwrap();

    // `rebuild` swaps the verified shadow in: the stream's read model again.
    let rebuilt = rebuild(&pool, config(), Arc::new(OrderStatus), vec![topic.clone()], &folded, std::future::pending());
    let rebuilt = tokio::time::timeout(Duration::from_secs(120), rebuilt).await.expect("rebuilt in time").unwrap();
    assert!(matches!(rebuilt, Rebuilt::Swapped { resumed: true, .. }), "the kept shadow resumed and swapped in");
    assert_eq!(dump().await, clean);
}

/// A rebuild folds its batches in memory (see `Folding`); an add that overflows only once
/// the fold is written cannot be blamed on its event there, so the rebuild goes again batch
/// by batch from its checkpoints: the overflowing deposit is dead-lettered as the live run
/// dead-lettered it, and the rebuilt tables equal the live ones.
#[sqlx::test(migrations = false)]
async fn a_rebuild_whose_fold_postgresql_refuses_goes_again_batch_by_batch(pool: PgPool) {
    use projectionist::kafka::rebuild::{rebuild, Rebuilt};
    let folded = std::sync::atomic::AtomicU64::default();
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let topic = rand_test_topic("rebuild-refused");
    let mut events = bank_accounts::generate::stream(40, 12, 11);
    let e = bank_accounts::generate::envelope;
    events.push(e("acc-big", 1, &AccountEvent::AccountOpened { owner: "b".into() }));
    events.push(e("acc-big", 2, &AccountEvent::MoneyDeposited { amount: i64::MAX }));
    events.push(e("acc-big", 3, &AccountEvent::MoneyDeposited { amount: 1 }));
    events.push(e("acc-big", 4, &AccountEvent::MoneyWithdrawn { amount: 5 }));
    produce(&topic, &events).await;
    let live = Engine::new(pool.clone(), config()).register(Arc::new(BankAccounts), [topic.clone()]);
    assert!(run(live).await.halts().is_empty());
    let letters = || async { projectionist::postgres::park::dead_letters(&pool, None, true).await.unwrap() };
    let first = letters().await;
    assert_eq!(first.len(), 1, "the overflowing deposit");
    assert!(first[0].error.contains("acc-big v3"), "{}", first[0].error);
    let clean = projectionist_testing::dump_tables(&pool, &BankAccounts).await;
    let rebuilt =
        rebuild(&pool, config(), Arc::new(BankAccounts), vec![topic.clone()], &folded, std::future::pending());
    let rebuilt = tokio::time::timeout(Duration::from_secs(120), rebuilt).await.expect("rebuilt in time").unwrap();
    assert!(matches!(rebuilt, Rebuilt::Swapped { .. }));
    assert_eq!(projectionist_testing::dump_tables(&pool, &BankAccounts).await, clean, "the rebuilt tables");
    // The bulk load ended in the round that went again: its statistics were read there, once.
    let analyzed: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_stats WHERE schemaname = current_schema() AND tablename = 'bank_accounts')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(analyzed, "the swapped-in table has statistics");
    let again = letters().await;
    let again: Vec<(i64, i32, Option<&str>)> =
        again.iter().map(|d| (d.id, d.attempts, d.resolution.as_deref())).collect();
    assert_eq!(again, [(first[0].id, 2, None)], "the same dead letter, met again by the rebuild");
}

/// A rebuild's progress counts the offsets its partitions have folded and not yet written
/// (`Stats::folded`), beside the checkpoints: none once the fold is written; those after the
/// checkpoint of a partition whose fold PostgreSQL refused.
#[sqlx::test(migrations = false)]
async fn folded_offsets_count_until_the_fold_is_written(pool: PgPool) {
    use std::sync::atomic::Ordering;
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let folding = config();
    let exclusive = Exclusive { fold: true, sole_writer: true, ..Exclusive::default() };
    let topic = rand_test_topic("folded");
    let events = bank_accounts::generate::stream(40, 12, 11);
    produce(&topic, &events).await;
    let engine = Engine::new(pool.clone(), folding.clone())
        .exclusive(exclusive)
        .register(Arc::new(BankAccounts), [topic.clone()]);
    let stats = engine.stats().remove(0);
    assert!(run(engine).await.halts().is_empty());
    assert_eq!(stats.advanced.load(Ordering::Relaxed), events.len() as u64, "every offset read");
    assert_eq!(stats.folded.load(Ordering::Relaxed), 0, "and written");

    // One account, so one partition: the deposit past i64::MAX overflows only once written.
    let refused = rand_test_topic("folded-refused");
    let e = bank_accounts::generate::envelope;
    let big = [
        e("acc-big", 1, &AccountEvent::AccountOpened { owner: "b".into() }),
        e("acc-big", 2, &AccountEvent::MoneyDeposited { amount: i64::MAX }),
        e("acc-big", 3, &AccountEvent::MoneyDeposited { amount: 1 }),
    ];
    produce(&refused, &big).await;
    let engine =
        Engine::new(pool.clone(), folding).exclusive(exclusive).register(Arc::new(BankAccounts), [refused.clone()]);
    let stats = engine.stats().remove(0);
    let halts = run(engine).await.halts();
    assert!(halts.len() == 1 && halts[0].contains("refused"), "{halts:?}");
    let written: Option<i64> = sqlx::query_scalar("SELECT next_offset FROM projectionist_checkpoints WHERE topic = $1")
        .bind(&refused)
        .fetch_optional(&pool)
        .await
        .unwrap();
    let folded = stats.folded.load(Ordering::Relaxed);
    assert_eq!(folded, 3 - written.unwrap_or(0) as u64, "read past the checkpoint, not written");
    assert!(folded > 0, "the overflowing deposit was folded, not written");
}

/// A version that will never come (published only as a message that is no envelope, so its
/// dead letter names no aggregate): `skip_gap` declares it lost, the held events apply, and
/// the skip is recorded; `parked` says which way out each aggregate has.
#[sqlx::test(migrations = false)]
async fn a_lost_version_is_declared_lost_and_what_is_held_behind_it_applies(pool: PgPool) {
    use projectionist::postgres::park::{dead_letters, list, resolve, skip_gap, Resolve};
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let topic = rand_test_topic("lost-version");
    let e = bank_accounts::generate::envelope;
    produce(&topic, &[e("acc-g", 1, &AccountEvent::AccountOpened { owner: "g".into() })]).await;
    let producer: ThreadedProducer<DefaultProducerContext> =
        ClientConfig::new().set("bootstrap.servers", brokers()).create().unwrap();
    producer.send(BaseRecord::to(&topic).key("acc-g").payload("v2, mangled")).map_err(|(e, _)| e).unwrap();
    producer.flush(Duration::from_secs(10)).unwrap();
    produce(&topic, &[e("acc-g", 3, &AccountEvent::MoneyDeposited { amount: 4 })]).await;
    assert!(run(Engine::new(pool.clone(), config()).register(Arc::new(BankAccounts), [topic.clone()]))
        .await
        .halts()
        .is_empty());
    let parked = list(&pool, None).await.unwrap();
    assert_eq!((parked.len(), parked[0].waiting_for, parked[0].dead_letter), (1, 2, None));
    assert!(parked[0].to_resume().contains("parked skip bank_accounts account acc-g"), "{}", parked[0].to_resume());
    // Its dead letter names no aggregate: retrying it is refused, discarding it moves nothing.
    let letter = dead_letters(&pool, None, false).await.unwrap()[0].id;
    assert!(resolve(&pool, &BankAccounts, letter, Resolve::Retry).await.is_err());
    let skipped = skip_gap(&pool, &BankAccounts, "account", "acc-g", "mangled by the producer").await.unwrap();
    assert_eq!(skipped.drained.applied, 1, "{skipped:?}");
    let row: (i64, i64) = sqlx::query_as("SELECT balance, version FROM bank_accounts WHERE account_id = 'acc-g'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(row, (4, 3));
    assert!(list(&pool, None).await.unwrap().is_empty());
    let recorded = dead_letters(&pool, None, true).await.unwrap();
    let gap = recorded.iter().find(|d| d.reason == "gap").expect("the skip recorded");
    assert_eq!((gap.version, gap.resolution.as_deref()), (Some(2), Some("discarded")));
    assert_eq!(gap.resolution_note.as_deref(), Some("mangled by the producer"));
    let again = skip_gap(&pool, &BankAccounts, "account", "acc-g", "twice").await.unwrap_err();
    assert!(again.to_string().contains("not parked"), "{again}");
}

/// An aggregate's missing version that arrives on another partition (a topic whose
/// partitions were increased, another producer's partitioner) resumes the aggregate parked
/// on the first: its held event applies, and so do its later events, wherever they land.
#[sqlx::test(migrations = false)]
async fn a_version_that_arrives_on_another_partition_resumes_its_parked_aggregate(pool: PgPool) {
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let topic = rand_test_topic("other-partition");
    topics::create_topics(&brokers(), &[&topic], 2, 1).await.unwrap();
    let producer: ThreadedProducer<DefaultProducerContext> =
        ClientConfig::new().set("bootstrap.servers", brokers()).create().unwrap();
    let send = |partition: i32, event: RawEnvelope| {
        let payload = event.to_json();
        let record = BaseRecord::to(&topic).partition(partition).key(&event.aggregate_id).payload(&payload);
        producer.send(record).map_err(|(e, _)| e).unwrap();
        producer.flush(Duration::from_secs(10)).unwrap();
    };
    let e = bank_accounts::generate::envelope;
    let deposit = |v, amount| e("acc-m", v, &AccountEvent::MoneyDeposited { amount });
    send(0, e("acc-m", 1, &AccountEvent::AccountOpened { owner: "m".into() }));
    send(0, deposit(3, 3));
    assert!(run(Engine::new(pool.clone(), config()).register(Arc::new(BankAccounts), [topic.clone()]))
        .await
        .halts()
        .is_empty());
    let parked = projectionist::postgres::park::list(&pool, None).await.unwrap();
    assert_eq!((parked.len(), parked[0].waiting_for, parked[0].held), (1, 2, 1), "v3 held on partition 0");
    let row = || async {
        sqlx::query_as::<_, (i64, i64)>("SELECT balance, version FROM bank_accounts WHERE account_id = 'acc-m'")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    send(1, deposit(2, 2));
    let live = Live::start(&pool, &topic);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while row().await != (5, 3) {
        assert!(std::time::Instant::now() < deadline, "v2 applied on partition 1 resumed acc-m: {:?}", row().await);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(projectionist::postgres::park::list(&pool, None).await.unwrap().is_empty());
    send(0, deposit(4, 4));
    send(1, deposit(5, 5));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while row().await != (14, 5) {
        assert!(std::time::Instant::now() < deadline, "v4 and v5 applied: {:?}", row().await);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(live.stop().await.halts().is_empty());
}

/// The bank accounts with a view over them in `schema()`.
struct Viewed;

impl Projection<PgConnection> for Viewed {
    type Event = AccountEvent;

    fn name(&self) -> &str {
        "bank_accounts"
    }

    fn tables(&self) -> &[Table] {
        &[bank_accounts::ACCOUNTS]
    }

    fn schema(&self) -> &[&str] {
        &["CREATE OR REPLACE VIEW open_accounts AS SELECT account_id, balance FROM bank_accounts WHERE status = 'open'"]
    }

    fn project(&self, e: &Envelope<AccountEvent>) -> Writes {
        BankAccounts.project(e)
    }
}

/// Views over the read model (one from `schema()`, one made by hand over it) and grants
/// follow the tables a swap puts in place, and back on a rollback; `--drop-old` leaves them.
#[sqlx::test(migrations = false)]
async fn views_and_grants_follow_a_swap_and_a_rollback(pool: PgPool) {
    use projectionist::kafka::rebuild::{rebuild, Rebuilt};
    use projectionist::postgres::rebuild as shadow;
    migrate(&pool, &[&Viewed]).await.unwrap();
    let topic = rand_test_topic("views");
    let e = bank_accounts::generate::envelope;
    produce(&topic, &[e("acc-v", 1, &AccountEvent::AccountOpened { owner: "v".into() })]).await;
    produce(&topic, &[e("acc-v", 2, &AccountEvent::MoneyDeposited { amount: 7 })]).await;
    assert!(run(Engine::new(pool.clone(), config()).register(Arc::new(Viewed), [topic.clone()]))
        .await
        .halts()
        .is_empty());
    for statement in [
        "CREATE VIEW rich_accounts AS SELECT account_id, balance FROM open_accounts WHERE balance > 0",
        "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'projectionist_view_reader') THEN \
         CREATE ROLE projectionist_view_reader; END IF; END $$",
        "GRANT SELECT ON bank_accounts, open_accounts, rich_accounts TO projectionist_view_reader",
        // Tampered by hand: the rebuild repairs it; the replaced table keeps it.
        "UPDATE bank_accounts SET balance = 1000 WHERE account_id = 'acc-v'",
    ] {
        sqlx::raw_sql(statement).execute(&pool).await.unwrap();
    }
    let seen = || async {
        let balance: i64 = sqlx::query_scalar("SELECT balance FROM rich_accounts WHERE account_id = 'acc-v'")
            .fetch_one(&pool)
            .await
            .unwrap();
        let granted: bool = sqlx::query_scalar(
            "SELECT bool_and(has_table_privilege('projectionist_view_reader', t, 'SELECT')) \
             FROM unnest(ARRAY['bank_accounts', 'open_accounts', 'rich_accounts']) AS t",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        (balance, granted)
    };
    assert_eq!(seen().await, (1000, true));
    let folded = std::sync::atomic::AtomicU64::default();
    let rebuild = || rebuild(&pool, config(), Arc::new(Viewed), vec![topic.clone()], &folded, std::future::pending());
    assert!(matches!(rebuild().await.unwrap(), Rebuilt::Swapped { .. }));
    assert_eq!(seen().await, (7, true), "the views read the rebuilt table, the grants carried");
    shadow::rollback(&pool, &Viewed).await.unwrap();
    assert_eq!(seen().await, (1000, true), "rolled back: the views read the restored table");
    assert!(matches!(rebuild().await.unwrap(), Rebuilt::Swapped { .. }));
    assert!(shadow::drop_old(&pool, "bank_accounts").await.unwrap());
    assert_eq!(seen().await, (7, true), "the replaced tables dropped, the views kept");
}

/// A dead letter discarded while a rebuild prepares its swap (after its discards were carried
/// over, before the swap) is not undone by the swap: the swap finds it still open in the
/// shadow and goes round again, carrying it first.
#[sqlx::test(migrations = false)]
async fn a_discard_made_while_a_rebuild_prepares_its_swap_is_not_undone(pool: PgPool) {
    use projectionist::postgres::park::{dead_letters, list, resolve, Resolve};
    use projectionist::postgres::rebuild as shadow;
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let topic = rand_test_topic("discard-swap");
    let e = bank_accounts::generate::envelope;
    let mut poison = e("acc-d", 2, &AccountEvent::MoneyDeposited { amount: 1 });
    poison.data = serde_json::json!({ "amount": "a lot" });
    let events = [
        e("acc-d", 1, &AccountEvent::AccountOpened { owner: "d".into() }),
        poison,
        e("acc-d", 3, &AccountEvent::MoneyDeposited { amount: 5 }),
    ];
    produce(&topic, &events).await;
    assert!(run(Engine::new(pool.clone(), config()).register(Arc::new(BankAccounts), [topic.clone()]))
        .await
        .halts()
        .is_empty());
    // The rebuild's shadow, read up to the live run, with the dead letter open in it.
    shadow::prepare(&pool, &BankAccounts).await.unwrap();
    let path = shadow::shadow_search_path(&mut pool.acquire().await.unwrap(), "bank_accounts").await.unwrap();
    let shadow_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .after_connect(move |conn, _| {
            let path = path.clone();
            Box::pin(async move {
                sqlx::query("SELECT set_config('search_path', $1, false)").bind(path).execute(conn).await?;
                Ok(())
            })
        })
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap();
    let engine = Engine::new(shadow_pool.clone(), config()).register(Arc::new(BankAccounts), [topic.clone()]);
    assert!(run(engine).await.halts().is_empty());
    assert_eq!(shadow::carry_discards(&pool, &shadow_pool, &BankAccounts).await.unwrap(), 0, "nothing discarded yet");
    // Now the operator discards it on the live side.
    let letter = dead_letters(&pool, None, false).await.unwrap()[0].id;
    resolve(&pool, &BankAccounts, letter, Resolve::Discard { reason: "by hand".into() }).await.unwrap();
    let mut rounds = 0;
    loop {
        match shadow::swap(&pool, &BankAccounts, std::slice::from_ref(&topic)).await.unwrap() {
            shadow::Swap::Done => break,
            shadow::Swap::Undiscarded(ids) => {
                assert_eq!(ids, [letter]);
                assert_eq!(shadow::carry_discards(&pool, &shadow_pool, &BankAccounts).await.unwrap(), 1);
            }
            other => panic!("{other:?}"),
        }
        rounds += 1;
        assert!(rounds < 3, "the swap went round more than once");
    }
    assert!(dead_letters(&pool, None, false).await.unwrap().is_empty(), "the discard holds after the swap");
    assert!(list(&pool, None).await.unwrap().is_empty(), "nothing parked behind it");
    let row: (i64, i64) = sqlx::query_as("SELECT balance, version FROM bank_accounts WHERE account_id = 'acc-d'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(row, (5, 3), "v2 skipped, v3 applied, in the swapped-in tables");
}

/// A rollback beside a running `run` (issue 39): the live run had written into the swapped-in
/// tables; the rollback restores the replaced ones with their older checkpoints; the live
/// run's next checkpoint finds the checkpoint moved, commits nothing past it and reads on from
/// it, so what it wrote after the swap is applied again to the restored tables, the dead
/// letter it met included, and nothing is lost.
#[sqlx::test(migrations = false)]
async fn a_rollback_beside_a_running_run_loses_nothing(pool: PgPool) {
    use projectionist::kafka::rebuild::{rebuild, Rebuilt};
    use projectionist::postgres::rebuild as shadow;
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let topic = rand_test_topic("rollback-live");
    let e = bank_accounts::generate::envelope;
    let open = |id: &str| e(id, 1, &AccountEvent::AccountOpened { owner: id.into() });
    let deposit = |id: &str, v, amount| e(id, v, &AccountEvent::MoneyDeposited { amount });
    produce(&topic, &[open("acc-1"), deposit("acc-1", 2, 100)]).await;
    let live = Live::start(&pool, &topic);
    let row = |id: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_as::<_, (i64, i64)>("SELECT balance, version FROM bank_accounts WHERE account_id = $1")
                .bind(id)
                .fetch_optional(&pool)
                .await
                .unwrap()
        }
    };
    let open_letters = || async { projectionist::postgres::park::dead_letters(&pool, None, false).await.unwrap() };
    let until = |what: &str, deadline: std::time::Instant| {
        assert!(std::time::Instant::now() < deadline, "{what} in time");
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while row("acc-1").await != Some((100, 2)) {
        until("the live run applied v2", deadline);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let folded = std::sync::atomic::AtomicU64::default();
    let rebuilt =
        rebuild(&pool, config(), Arc::new(BankAccounts), vec![topic.clone()], &folded, std::future::pending());
    let rebuilt = tokio::time::timeout(Duration::from_secs(120), rebuilt).await.expect("rebuilt in time").unwrap();
    assert!(matches!(rebuilt, Rebuilt::Swapped { .. }));

    // The live run writes into the swapped-in tables: v3, and a new account whose v2 is poison.
    let mut poison = deposit("acc-2", 2, 1);
    poison.data = serde_json::json!({ "amount": "a lot" });
    produce(&topic, &[deposit("acc-1", 3, 10), open("acc-2"), poison]).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while row("acc-1").await != Some((110, 3)) || open_letters().await.is_empty() {
        until("the live run applied v3 and dead-lettered acc-2 v2", deadline);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shadow::rollback(&pool, &BankAccounts).await.unwrap();
    produce(&topic, &[deposit("acc-1", 4, 1)]).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while row("acc-1").await != Some((111, 4)) {
        until("the live run read on from the rolled-back checkpoint (acc-1 at 111/v4)", deadline);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(row("acc-2").await, Some((0, 1)), "the account opened after the swap");
    let letters = open_letters().await;
    assert_eq!(letters.len(), 1, "{letters:#?}");
    assert_eq!((letters[0].aggregate_id.as_deref(), letters[0].version), (Some("acc-2"), Some(2)));
    assert!(projectionist::postgres::park::list(&pool, None).await.unwrap().iter().all(|p| p.aggregate_id == "acc-2"));
    let report = live.stop().await;
    assert!(report.halts().is_empty(), "{:?}", report.halts());
}

/// A table changed under a running `run` (a rollback restored an older table, or it was
/// changed by hand): the partition halts saying what is wrong and what to do, not with
/// PostgreSQL's message alone.
#[sqlx::test(migrations = false)]
async fn a_table_changed_under_a_running_run_halts_saying_what_to_do(pool: PgPool) {
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let topic = rand_test_topic("changed-under");
    let e = bank_accounts::generate::envelope;
    produce(&topic, &[e("acc-h", 1, &AccountEvent::AccountOpened { owner: "h".into() })]).await;
    let live = Live::start(&pool, &topic);
    let version = || async {
        sqlx::query_scalar::<_, i64>("SELECT version FROM bank_accounts WHERE account_id = 'acc-h'")
            .fetch_optional(&pool)
            .await
            .unwrap()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while version().await != Some(1) {
        assert!(std::time::Instant::now() < deadline, "the live run applied v1 in time");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sqlx::query("ALTER TABLE bank_accounts DROP COLUMN updated_at").execute(&pool).await.unwrap();
    produce(&topic, &[e("acc-h", 2, &AccountEvent::MoneyDeposited { amount: 1 })]).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let report = live.stop().await;
    let halts = report.halts();
    assert_eq!(halts.len(), 1, "{halts:?}");
    assert!(halts[0].contains("updated_at") && halts[0].contains("`rebuild`"), "{}", halts[0]);
}

/// A rebuild while a live `run` projects a stream that keeps growing: a reader polling the
/// live table never sees its row count or its sum of versions drop, nor an error; after the
/// swap the live run goes on in the rebuilt tables, which end exact over the whole stream.
#[sqlx::test(migrations = false)]
async fn a_rebuild_swaps_in_while_a_live_run_projects_a_growing_stream(pool: PgPool) {
    use projectionist::kafka::rebuild::{rebuild, Rebuilt};
    let folded = std::sync::atomic::AtomicU64::default();
    use std::sync::atomic::{AtomicBool, Ordering};
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let topic = rand_test_topic("rebuild-live");
    let events = bank_accounts::generate::stream(300, 20, 11);
    let (first, rest) = events.split_at(events.len() * 2 / 5);
    produce(&topic, first).await;
    let offsets = || async {
        sqlx::query_scalar::<_, Option<i64>>("SELECT sum(next_offset)::bigint FROM projectionist_checkpoints")
            .fetch_one(&pool)
            .await
            .unwrap()
            .unwrap_or(0)
    };
    let live = Live::start(&pool, &topic);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while offsets().await < first.len() as i64 {
        assert!(std::time::Instant::now() < deadline, "the live run applied the first part");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let stop = Arc::new(AtomicBool::new(false));
    let reader = tokio::spawn({
        let (pool, stop) = (pool.clone(), stop.clone());
        async move {
            let (mut polls, mut last, mut drops) = (0, (0_i64, 0_i64), Vec::new());
            while !stop.load(Ordering::SeqCst) {
                let now: (i64, i64) =
                    sqlx::query_as("SELECT count(*), coalesce(sum(version), 0)::bigint FROM bank_accounts")
                        .fetch_one(&pool)
                        .await
                        .expect("the reader never gets an error");
                if now.0 < last.0 || now.1 < last.1 {
                    drops.push((last, now));
                }
                (last, polls) = (now, polls + 1);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (polls, drops)
        }
    });
    // Events keep coming while the rebuild runs, up to its swap, and after it: the last
    // chunks wait for the swap.
    let swapped = Arc::new(AtomicBool::new(false));
    let producer = tokio::spawn({
        let (topic, rest, swapped) = (topic.clone(), rest.to_vec(), swapped.clone());
        async move {
            let chunks: Vec<&[RawEnvelope]> = rest.chunks(40).collect();
            for (i, chunk) in chunks.iter().enumerate() {
                while i + 5 >= chunks.len() && !swapped.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                produce(&topic, chunk).await;
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
        }
    });
    let rebuilt =
        rebuild(&pool, config(), Arc::new(BankAccounts), vec![topic.clone()], &folded, std::future::pending());
    let rebuilt = tokio::time::timeout(Duration::from_secs(180), rebuilt).await.expect("rebuilt in time").unwrap();
    assert!(matches!(rebuilt, Rebuilt::Swapped { .. }));
    swapped.store(true, Ordering::SeqCst);
    producer.await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while offsets().await < events.len() as i64 {
        assert!(std::time::Instant::now() < deadline, "the live run caught up after the swap");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let (polls, drops) = reader.await.unwrap();
    assert!(polls > 0 && drops.is_empty(), "the reader saw the read model shrink: {drops:?} ({polls} polls)");
    let report = live.stop().await;
    assert!(report.halts().is_empty(), "{:?}", report.halts());
    let rows: Vec<(String, String, i64, String, i64)> =
        sqlx::query_as("SELECT account_id, owner, balance, status, version FROM bank_accounts ORDER BY account_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let want: Vec<(String, String, i64, String, i64)> = bank_accounts::generate::expected(&events)
        .into_iter()
        .map(|(id, a)| (id, a.owner, a.balance, a.status, a.version))
        .collect();
    assert_eq!(rows, want, "the rebuilt tables, kept current by the live run, are exact");
}

/// The next release of `bank_accounts`: one more column, the deposits counted.
struct BankAccountsV2;

const ACCOUNTS_V2: Table =
    Table::transition("bank_accounts", "account_id").aggregate_type(bank_accounts::AGGREGATE_TYPE).columns(&[
        ("owner", "text"),
        ("balance", "bigint NOT NULL DEFAULT 0"),
        ("status", "text"),
        ("updated_at", "timestamptz"),
        ("deposits", "bigint NOT NULL DEFAULT 0"),
    ]);

impl Projection<PgConnection> for BankAccountsV2 {
    type Event = AccountEvent;

    fn name(&self) -> &str {
        "bank_accounts"
    }

    fn tables(&self) -> &[Table] {
        &[ACCOUNTS_V2]
    }

    fn schema(&self) -> &[&str] {
        &["CREATE INDEX IF NOT EXISTS bank_accounts_by_owner ON bank_accounts (owner)"]
    }

    fn project(&self, env: &Envelope<AccountEvent>) -> Writes {
        let row = ACCOUNTS_V2.write(env).set("updated_at", env.occurred_at);
        match &env.event {
            AccountEvent::AccountOpened { owner } => row.set("owner", owner).set("balance", 0).set("status", "open"),
            AccountEvent::MoneyDeposited { amount } => row.add("balance", amount).add("deposits", 1),
            AccountEvent::MoneyWithdrawn { amount } => row.add("balance", -amount),
            AccountEvent::AccountClosed {} => row.set("status", "closed"),
        }
        .into()
    }
}

/// A release that adds a column: its rebuild fills the column for every row; the live run
/// of the new release, started after the swap, keeps it filled; and an operator's discard
/// carries over into the rebuild.
#[sqlx::test(migrations = false)]
async fn a_rebuild_of_a_release_that_adds_a_column_fills_it_and_carries_discards_over(pool: PgPool) {
    use projectionist::kafka::rebuild::{rebuild, Rebuilt};
    let folded = std::sync::atomic::AtomicU64::default();
    use projectionist::postgres::park::{dead_letters, list, resolve, Resolve};
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let topic = rand_test_topic("rebuild-column");
    let e = bank_accounts::generate::envelope;
    let mut events = bank_accounts::generate::stream(40, 10, 5);
    events.push(e("acc-d", 1, &AccountEvent::AccountOpened { owner: "d".into() }));
    let mut poison = e("acc-d", 2, &AccountEvent::MoneyDeposited { amount: 1 });
    poison.data = serde_json::json!({ "amount": "a lot" });
    events.extend([poison, e("acc-d", 3, &AccountEvent::MoneyDeposited { amount: 7 })]);
    produce(&topic, &events).await;
    assert!(run(Engine::new(pool.clone(), config()).register(Arc::new(BankAccounts), [topic.clone()]))
        .await
        .halts()
        .is_empty());
    let letter = dead_letters(&pool, None, false).await.unwrap()[0].id;
    resolve(&pool, &BankAccounts, letter, Resolve::Discard { reason: "refunded by hand".into() }).await.unwrap();

    let rebuilt =
        rebuild(&pool, config(), Arc::new(BankAccountsV2), vec![topic.clone()], &folded, std::future::pending());
    let rebuilt = tokio::time::timeout(Duration::from_secs(120), rebuilt).await.expect("in time").unwrap();
    assert!(matches!(rebuilt, Rebuilt::Swapped { .. }));
    let deposits = |events: &[RawEnvelope]| {
        let mut counted: std::collections::BTreeMap<(String, i64), bool> = Default::default();
        for e in events.iter().filter(|e| e.event_type == "MoneyDeposited" && e.aggregate_id != "acc-d") {
            counted.insert((e.aggregate_id.clone(), e.version), true);
        }
        let mut per: std::collections::BTreeMap<String, i64> = Default::default();
        for (id, _) in counted.keys() {
            *per.entry(id.clone()).or_default() += 1;
        }
        per
    };
    let got = || async {
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT account_id, deposits FROM bank_accounts WHERE deposits > 0 AND account_id <> 'acc-d'",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        rows.into_iter().collect::<std::collections::BTreeMap<String, i64>>()
    };
    assert_eq!(got().await, deposits(&events), "every row's new column filled by the rebuild");
    let indexed: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_indexes WHERE schemaname = current_schema() AND tablename = \
         'bank_accounts' AND indexname = 'bank_accounts_by_owner')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(indexed, "the release's new index, created after the bulk load, is on the live table");
    let d: (i64, i64, i64) =
        sqlx::query_as("SELECT balance, version, deposits FROM bank_accounts WHERE account_id = 'acc-d'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(d, (7, 3, 1), "the discarded v2 skipped in the rebuild too, v3 applied");
    assert!(list(&pool, None).await.unwrap().is_empty(), "nothing parked");

    // The new release's live run keeps the column filled.
    let more = [e("acc-d", 4, &AccountEvent::MoneyDeposited { amount: 1 })];
    produce(&topic, &more).await;
    assert!(run(Engine::new(pool.clone(), config()).register(Arc::new(BankAccountsV2), [topic.clone()]))
        .await
        .halts()
        .is_empty());
    let d: (i64, i64, i64) =
        sqlx::query_as("SELECT balance, version, deposits FROM bank_accounts WHERE account_id = 'acc-d'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(d, (8, 4, 2));
}

/// Through the engine (its partitions read the checked tables once a minute rather than per
/// batch), a CHECK constraint still sees every state between: an overdraft a later deposit
/// of the same batch covers is dead-lettered, as one event at a time would have it.
#[sqlx::test(migrations = false)]
async fn the_engine_checks_every_state_between_against_a_check_constraint(pool: PgPool) {
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    sqlx::raw_sql("ALTER TABLE bank_accounts ADD CONSTRAINT no_overdraft CHECK (balance >= 0)")
        .execute(&pool)
        .await
        .unwrap();
    let e = bank_accounts::generate::envelope;
    let topic = rand_test_topic("overdraft");
    topics::create_topics(&brokers(), &[&topic], 1, 1).await.unwrap();
    produce(
        &topic,
        &[
            e("acc-o", 1, &AccountEvent::AccountOpened { owner: "o".into() }),
            e("acc-o", 2, &AccountEvent::MoneyWithdrawn { amount: 5 }),
            e("acc-o", 3, &AccountEvent::MoneyDeposited { amount: 10 }),
        ],
    )
    .await;
    let report = run(Engine::new(pool.clone(), config()).register(Arc::new(BankAccounts), [topic.clone()])).await;
    assert!(report.halts().is_empty(), "{:?}", report.halts());
    let row: (i64, i64) = sqlx::query_as("SELECT balance, version FROM bank_accounts WHERE account_id = 'acc-o'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(row, (0, 1), "the overdraft refused, the deposit held behind it");
    let letters = projectionist::postgres::park::dead_letters(&pool, None, false).await.unwrap();
    assert_eq!(letters.len(), 1);
    assert!(letters[0].reason == "value" && letters[0].error.contains("no_overdraft"), "{:?}", letters[0].error);
}

/// Produces `event` and returns the partition and offset its delivery report gives.
async fn produce_one(topic: &str, event: &RawEnvelope) -> (i32, i64) {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    topics::create_topics(&brokers(), &[topic], 2, 1).await.unwrap();
    let producer: FutureProducer = ClientConfig::new().set("bootstrap.servers", brokers()).create().unwrap();
    let payload = event.to_json();
    let record = FutureRecord::to(topic).key(&event.aggregate_id).payload(&payload);
    let delivered = producer.send(record, Duration::from_secs(10)).await.map_err(|(e, _)| e).unwrap();
    (delivered.partition, delivered.offset)
}

/// Reading your own writes: a wait for the offset of a produced event is pending until the
/// projection has applied it, and returns once the batch holding it commits, with the row
/// visible to another connection; a wait for the aggregate's version the same.
#[sqlx::test(migrations = false)]
async fn a_wait_for_an_event_returns_once_its_batch_commits_with_the_row_visible(pool: PgPool) {
    use projectionist::postgres::wait::{Position, Waiter};
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let topic = rand_test_topic("wait");
    let e = bank_accounts::generate::envelope;
    let (partition, offset) =
        produce_one(&topic, &e("acc-w", 1, &AccountEvent::AccountOpened { owner: "w".into() })).await;
    // No polling to speak of: only the batch's notification can wake these waits.
    let waiter = Waiter::with_poll(pool.clone(), Duration::from_secs(3600)).await.unwrap();
    let wait = {
        let (waiter, topic) = (waiter.clone(), topic.clone());
        tokio::spawn(async move {
            waiter.wait_for_offset("bank_accounts", &topic, partition, offset, Duration::from_secs(60)).await
        })
    };
    let version = {
        let waiter = waiter.clone();
        tokio::spawn(async move {
            waiter.wait_for_version(&BankAccounts, "account", "acc-w", 2, Duration::from_secs(60)).await
        })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!wait.is_finished() && !version.is_finished(), "nothing applied yet: both wait");
    assert_eq!(waiter.waiting(), 2);

    let engine =
        tokio::spawn(run(Engine::new(pool.clone(), config()).register(Arc::new(BankAccounts), [topic.clone()])));
    let reached = wait.await.unwrap().unwrap();
    let other = pool.acquire().await.unwrap();
    let mut other = other.detach();
    let row: Option<i64> = sqlx::query_scalar("SELECT version FROM bank_accounts WHERE account_id = 'acc-w'")
        .fetch_optional(&mut other)
        .await
        .unwrap();
    assert_eq!(row, Some(1), "the row is visible to another connection once the wait returns");
    assert!(matches!(reached, Position::Offset { next_offset: Some(n) } if n > offset), "{reached:?}");
    assert!(engine.await.unwrap().halts().is_empty());
    assert!(!version.is_finished(), "v2 not produced yet");

    let (_, offset2) = produce_one(&topic, &e("acc-w", 2, &AccountEvent::MoneyDeposited { amount: 5 })).await;
    assert!(offset2 > offset);
    let engine =
        tokio::spawn(run(Engine::new(pool.clone(), config()).register(Arc::new(BankAccounts), [topic.clone()])));
    let reached = version.await.unwrap().unwrap();
    assert_eq!(reached, Position::Version { version: Some(2) });
    let balance: i64 = sqlx::query_scalar("SELECT balance FROM bank_accounts WHERE account_id = 'acc-w'")
        .fetch_one(&mut other)
        .await
        .unwrap();
    assert_eq!(balance, 5);
    assert!(engine.await.unwrap().halts().is_empty());
    // Already there: at once.
    let at_once = waiter.wait_for_offset("bank_accounts", &topic, partition, offset, Duration::from_millis(1)).await;
    assert!(at_once.is_ok(), "{at_once:?}");
}

/// A wait for an event the checkpoint passed but the read model does not hold is never told
/// it is applied: a held event is `Parked` until its predecessor arrives (then applied), a
/// dead-lettered one `DeadLettered`.
#[sqlx::test(migrations = false)]
async fn a_wait_for_a_parked_or_dead_lettered_event_says_so(pool: PgPool) {
    use projectionist::postgres::wait::{Fate, Waiter};
    use projectionist::postgres::Error;
    use projectionist::postgres::WaitError;
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let topic = rand_test_topic("wait-fate");
    let e = bank_accounts::generate::envelope;
    produce_one(&topic, &e("acc-p", 1, &AccountEvent::AccountOpened { owner: "p".into() })).await;
    let (partition, held) = produce_one(&topic, &e("acc-p", 3, &AccountEvent::MoneyDeposited { amount: 3 })).await;
    let mut poison = e("acc-d", 1, &AccountEvent::AccountOpened { owner: "d".into() });
    poison.data = serde_json::json!({ "owner": 5 });
    let (poison_partition, poison_offset) = produce_one(&topic, &poison).await;
    let engine = || run(Engine::new(pool.clone(), config()).register(Arc::new(BankAccounts), [topic.clone()]));
    assert!(engine().await.halts().is_empty());
    let waiter = Waiter::new(pool.clone()).await.unwrap();
    let timeout = Duration::from_secs(10);
    match waiter.wait_for_offset("bank_accounts", &topic, partition, held, timeout).await {
        Err(Error::Wait(WaitError::NotApplied { fate: Fate::Parked { aggregate_id, version: 3, .. }, .. })) => {
            assert_eq!(aggregate_id, "acc-p");
        }
        other => panic!("expected the held event to be parked, got {other:?}"),
    }
    match waiter.wait_for_offset("bank_accounts", &topic, poison_partition, poison_offset, timeout).await {
        Err(Error::Wait(WaitError::NotApplied { fate: Fate::DeadLettered { error, .. }, .. })) => {
            assert!(error.contains("does not decode"), "{error}")
        }
        other => panic!("expected a dead letter, got {other:?}"),
    }
    // Its predecessor arrives: the held event applies, and the wait says so.
    produce_one(&topic, &e("acc-p", 2, &AccountEvent::MoneyDeposited { amount: 2 })).await;
    assert!(engine().await.halts().is_empty());
    let waited = waiter.wait_for_offset("bank_accounts", &topic, partition, held, timeout).await;
    assert!(waited.is_ok(), "{waited:?}");
    let balance: i64 = sqlx::query_scalar("SELECT balance FROM bank_accounts WHERE account_id = 'acc-p'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(balance, 5);
}

/// A waiter already following a partition learns what a batch kept out from the batch's own
/// notification (no query of its own): a held event and a dead letter are still reported so.
#[sqlx::test(migrations = false)]
async fn a_wait_told_by_its_batch_what_was_kept_out_says_so(pool: PgPool) {
    use projectionist::postgres::wait::{Fate, Waiter};
    use projectionist::postgres::Error;
    use projectionist::postgres::WaitError;
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let topic = rand_test_topic("wait-told");
    let e = bank_accounts::generate::envelope;
    let opened = |id: &str| e(id, 1, &AccountEvent::AccountOpened { owner: id.into() });
    let first = [produce_one(&topic, &opened("acc-p")).await, produce_one(&topic, &opened("acc-d")).await];
    let engine = || run(Engine::new(pool.clone(), config()).register(Arc::new(BankAccounts), [topic.clone()]));
    assert!(engine().await.halts().is_empty());
    // Followed from here on: each partition's checkpoint read once.
    let waiter = Waiter::new(pool.clone()).await.unwrap();
    let timeout = Duration::from_secs(10);
    for (partition, offset) in first {
        waiter.wait_for_offset("bank_accounts", &topic, partition, offset, timeout).await.unwrap();
    }
    let (held_partition, held) = produce_one(&topic, &e("acc-p", 3, &AccountEvent::MoneyDeposited { amount: 3 })).await;
    let mut poison = e("acc-d", 2, &AccountEvent::MoneyDeposited { amount: 2 });
    poison.data = serde_json::json!({ "amount": "two" });
    let (poison_partition, poison_offset) = produce_one(&topic, &poison).await;
    assert!(engine().await.halts().is_empty());
    match waiter.wait_for_offset("bank_accounts", &topic, held_partition, held, timeout).await {
        Err(Error::Wait(WaitError::NotApplied { fate: Fate::Parked { version: 3, .. }, .. })) => {}
        other => panic!("expected the held event to be parked, got {other:?}"),
    }
    match waiter.wait_for_offset("bank_accounts", &topic, poison_partition, poison_offset, timeout).await {
        Err(Error::Wait(WaitError::NotApplied { fate: Fate::DeadLettered { .. }, .. })) => {}
        other => panic!("expected a dead letter, got {other:?}"),
    }
}

/// A wait past where the projection stands returns when its timeout passes, with an error
/// saying where the projection stands.
#[sqlx::test(migrations = false)]
async fn a_wait_times_out_on_time_saying_where_the_projection_stands(pool: PgPool) {
    use projectionist::postgres::wait::{Position, Waiter};
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let topic = rand_test_topic("wait-timeout");
    let e = bank_accounts::generate::envelope;
    let (partition, offset) =
        produce_one(&topic, &e("acc-t", 1, &AccountEvent::AccountOpened { owner: "t".into() })).await;
    assert!(run(Engine::new(pool.clone(), config()).register(Arc::new(BankAccounts), [topic.clone()]))
        .await
        .halts()
        .is_empty());
    let waiter = Waiter::new(pool.clone()).await.unwrap();
    let started = std::time::Instant::now();
    let timeout = Duration::from_millis(700);
    let waited = waiter.wait_for_offset("bank_accounts", &topic, partition, offset + 10, timeout).await;
    let took = started.elapsed();
    match waited {
        Err(projectionist::postgres::Error::Wait(projectionist::postgres::WaitError::Timeout { position, .. })) => {
            assert_eq!(position, Position::Offset { next_offset: Some(offset + 1) });
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(took >= timeout && took < timeout + Duration::from_secs(5), "returned after {took:?}");
    let message = waiter
        .wait_for_version(&BankAccounts, "account", "acc-t", 3, Duration::from_millis(200))
        .await
        .unwrap_err()
        .to_string();
    assert!(message.contains("acc-t v3") && message.contains("version 1"), "{message}");
}

/// A thousand waits at once, over one listening connection and a pool of four, all return
/// once their events are applied.
#[sqlx::test(migrations = false)]
async fn a_thousand_waits_share_one_listening_connection_and_all_return(pool: PgPool) {
    use projectionist::postgres::wait::{Position, Waiter};
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let topic = rand_test_topic("wait-many");
    let e = bank_accounts::generate::envelope;
    let mut offsets = Vec::new();
    for n in 0..20 {
        let event = e(&format!("acc-{n}"), 1, &AccountEvent::AccountOpened { owner: "m".into() });
        offsets.push(produce_one(&topic, &event).await);
    }
    let small = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap();
    let waiter = Waiter::new(small.clone()).await.unwrap();
    let mut waits = tokio::task::JoinSet::new();
    for i in 0..1000 {
        let (waiter, topic) = (waiter.clone(), topic.clone());
        let (partition, offset) = offsets[i % offsets.len()];
        waits.spawn(async move {
            waiter.wait_for_offset("bank_accounts", &topic, partition, offset, Duration::from_secs(90)).await
        });
    }
    // And a thousand for versions, read together (one query per projection) as it moves.
    let accounts = offsets.len();
    for i in 0..1000 {
        let waiter = waiter.clone();
        waits.spawn(async move {
            let account = format!("acc-{}", i % accounts);
            let waited = waiter.wait_for_version(&BankAccounts, "account", &account, 1, Duration::from_secs(90)).await;
            assert_eq!(waited.as_ref().ok(), Some(&Position::Version { version: Some(1) }), "{account}");
            waited
        });
    }
    while waiter.waiting() < 2000 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let listening: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query ILIKE 'LISTEN%'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(listening, 1, "one listening connection for every wait");
    assert!(run(Engine::new(pool.clone(), config()).register(Arc::new(BankAccounts), [topic.clone()]))
        .await
        .halts()
        .is_empty());
    let mut returned = 0;
    while let Some(waited) = waits.join_next().await {
        waited.unwrap().unwrap();
        returned += 1;
    }
    assert_eq!(returned, 2000);
}
