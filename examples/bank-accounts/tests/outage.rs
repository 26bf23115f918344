//! A PostgreSQL outage longer than the retry budget, made real at the socket level by a
//! TCP proxy between the engine and PostgreSQL (the server itself is shared with other
//! tests and stays up): while "down", the proxy closes every open connection and closes
//! new ones as soon as they arrive. The engine must wait it out — no partition halts — and
//! end with the exact read model; `/ready` answers 503 meanwhile.

mod common;

use common::proxy::Proxy;
use common::{brokers, http_get, rand_test_topic, read_model, Serving, BIN};

use std::sync::Arc;
use std::time::{Duration, Instant};

use bank_accounts::generate;
use bank_accounts::BankAccounts;
use projectionist::kafka::{topics, Engine, EngineConfig};
use projectionist::postgres::migrate;
use projectionist::RawEnvelope;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

/// Longer than the retry budget the tests configure (2 retries, 50 ms then 100 ms) by far.
const OUTAGE: Duration = Duration::from_secs(6);

/// The test database's connection options, through `proxy`.
fn through(pool: &PgPool, proxy: &Proxy) -> PgConnectOptions {
    (*pool.connect_options()).clone().port(proxy.port)
}

async fn start_proxy(pool: &PgPool) -> Proxy {
    let options = pool.connect_options();
    Proxy::start(format!("{}:{}", options.get_host(), options.get_port())).await
}

async fn produce(topic: &str, events: &[RawEnvelope]) {
    let producer: ThreadedProducer<DefaultProducerContext> =
        ClientConfig::new().set("bootstrap.servers", brokers()).create().unwrap();
    for e in events {
        let payload = e.to_json();
        producer.send(BaseRecord::to(topic).key(&e.aggregate_id).payload(&payload)).map_err(|(e, _)| e).unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();
}

/// A stream of a few thousand events in two halves: one applied before the outage, one
/// arriving during it.
fn two_halves(seed: u64) -> (Vec<RawEnvelope>, Vec<RawEnvelope>) {
    let mut events = generate::stream(500, 12, seed);
    let second = events.split_off(events.len() / 2);
    (events, second)
}

#[sqlx::test(migrations = false)]
async fn an_outage_longer_than_the_retry_budget_is_waited_out(pool: PgPool) {
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let proxy = start_proxy(&pool).await;
    let engine_pool = PgPoolOptions::new()
        .max_connections(6)
        .acquire_timeout(Duration::from_secs(2))
        .connect_with(through(&pool, &proxy))
        .await
        .unwrap();
    let topic = rand_test_topic("outage");
    topics::create_topics(&brokers(), &[topic.as_str()], 4, 1).await.unwrap();
    let (first, second) = two_halves(11);
    let all: Vec<RawEnvelope> = first.iter().chain(&second).cloned().collect();
    produce(&topic, &first).await;

    let mut config = EngineConfig::new(brokers())
        .with_group_id(format!("outage-{}", uuid::Uuid::new_v4().simple()))
        .with_batch(50, 1 << 20, Duration::from_millis(10))
        .with_kafka_property("session.timeout.ms", "6000")
        .with_kafka_property("heartbeat.interval.ms", "500");
    config.max_retries = 2;
    config.retry_backoff_ms = 50;
    let engine = Engine::new(engine_pool, config).register(Arc::new(BankAccounts), [topic.clone()]);
    let (stats, readiness) = (engine.stats().remove(0), engine.readiness());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(engine.run(async {
        let _ = stopped.await;
    }));
    let halts = || stats.halts.lock().unwrap().clone();

    let started = Instant::now();
    let want_first = generate::expected(&first);
    while read_model(&pool).await != want_first {
        assert!(started.elapsed() < Duration::from_secs(60), "the first half was never applied");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Down mid-stream: the second half arrives while PostgreSQL is away.
    proxy.set_down(true);
    produce(&topic, &second).await;
    let down_at = Instant::now();
    let mut waited = false;
    while down_at.elapsed() < OUTAGE {
        let state = readiness.state().await;
        assert!(!state.is_ready(), "ready during the outage: {state}");
        waited |= state.waiting_for_postgres;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(halts().is_empty(), "a partition halted during the outage: {:?}", halts());
    assert!(waited, "the engine never said it waits for PostgreSQL");
    proxy.set_down(false);

    let want = generate::expected(&all);
    let up_at = Instant::now();
    while read_model(&pool).await != want {
        assert!(halts().is_empty(), "a partition halted: {:?}", halts());
        assert!(up_at.elapsed() < Duration::from_secs(30), "the second half was never applied after the outage");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    while !readiness.is_ready().await {
        let state = readiness.state().await;
        assert!(up_at.elapsed() < Duration::from_secs(30), "never ready again: {state}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    stop.send(()).unwrap();
    let report = tokio::time::timeout(Duration::from_secs(30), running).await.expect("stops in time").unwrap().unwrap();
    assert!(report.halts().is_empty(), "{:?}", report.halts());
    let next: i64 =
        sqlx::query_scalar("SELECT sum(next_offset)::bigint FROM projectionist_checkpoints WHERE topic = $1")
            .bind(&topic)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(next, all.len() as i64, "every partition checkpointed to its end");
}

#[sqlx::test(migrations = false)]
async fn checkpoints_are_read_at_assignment_once_postgres_is_back(pool: PgPool) {
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let proxy = start_proxy(&pool).await;
    let topic = rand_test_topic("outage-assign");
    topics::create_topics(&brokers(), &[topic.as_str()], 4, 1).await.unwrap();
    let events = generate::stream(200, 12, 13);
    produce(&topic, &events).await;

    // Away from the start: the partitions' checkpoints cannot be read when they are assigned.
    proxy.set_down(true);
    let engine_pool = PgPoolOptions::new()
        .max_connections(6)
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy_with(through(&pool, &proxy));
    let mut config = EngineConfig::new(brokers())
        .with_group_id(format!("outage-assign-{}", uuid::Uuid::new_v4().simple()))
        .with_exit_when_caught_up(true)
        .with_kafka_property("session.timeout.ms", "6000")
        .with_kafka_property("heartbeat.interval.ms", "500");
    config.max_retries = 2;
    config.retry_backoff_ms = 50;
    let engine = Engine::new(engine_pool, config).register(Arc::new(BankAccounts), [topic.clone()]);
    let (stats, readiness) = (engine.stats().remove(0), engine.readiness());
    let running = tokio::spawn(engine.run(std::future::pending()));
    let down_at = Instant::now();
    let mut waited = false;
    while down_at.elapsed() < OUTAGE {
        let state = readiness.state().await;
        assert!(!state.is_ready(), "ready during the outage: {state}");
        waited |= state.waiting_for_postgres;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let halts = stats.halts.lock().unwrap().clone();
    assert!(halts.is_empty(), "a partition halted during the outage: {halts:?}");
    assert!(waited, "the engine never said it waits for PostgreSQL");
    proxy.set_down(false);

    let report =
        tokio::time::timeout(Duration::from_secs(40), running).await.expect("caught up in time").unwrap().unwrap();
    assert!(report.halts().is_empty(), "{:?}", report.halts());
    assert_eq!(read_model(&pool).await, generate::expected(&events));
}

/// One GET over plain HTTP/1.1; returns status code and body.
#[sqlx::test(migrations = false)]
async fn ready_answers_503_while_the_runner_waits_for_postgres(pool: PgPool) {
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let proxy = start_proxy(&pool).await;
    let topic = rand_test_topic("outage-ready");
    topics::create_topics(&brokers(), &[topic.as_str()], 4, 1).await.unwrap();
    let (first, second) = two_halves(12);
    let all: Vec<RawEnvelope> = first.iter().chain(&second).cloned().collect();
    produce(&topic, &first).await;

    // The test database, through the proxy: DATABASE_URL's server with the proxy's port.
    let o = pool.connect_options();
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let server = base.rsplit_once('/').expect("URL with a database").0;
    let server = server.replacen(&format!(":{}", o.get_port()), &format!(":{}", proxy.port), 1);
    let url = format!("{server}/{}", o.get_database().expect("test database"));
    assert!(url.contains(&format!(":{}/", proxy.port)), "DATABASE_URL names its port");
    let group = format!("outage-ready-{}", uuid::Uuid::new_v4().simple());
    let mut run = tokio::process::Command::new(BIN);
    run.args(["run", "--group-id", &group, "--metrics-addr", "127.0.0.1:0", "--max-retries", "2"])
        .args(["--retry-backoff-ms", "50", "--batch-max-events", "50", "--kafka-property", "session.timeout.ms=6000"])
        .env("DATABASE_URL", &url)
        .env("KAFKA_BROKERS", brokers())
        .env("BANK_ACCOUNTS_TOPIC", &topic)
        .env("RUST_LOG", "info");
    let Serving { mut child, log, addr } = Serving::spawn(run).await;
    let started = Instant::now();
    let want_first = generate::expected(&first);
    while read_model(&pool).await != want_first || http_get(&addr, "/ready").await.0 != 200 {
        assert!(started.elapsed() < Duration::from_secs(60), "never caught up and ready:\n{}", log.lock().unwrap());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    proxy.set_down(true);
    produce(&topic, &second).await;
    let down_at = Instant::now();
    let mut said_waiting = None;
    while down_at.elapsed() < OUTAGE {
        let (status, body) = http_get(&addr, "/ready").await;
        assert_eq!(status, 503, "ready during the outage: {body}");
        if body.contains("waiting for postgres: true") {
            said_waiting.get_or_insert(body);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let said_waiting = said_waiting.unwrap_or_else(|| panic!("/ready never said why:\n{}", log.lock().unwrap()));
    assert!(said_waiting.contains("partitions halted: 0"), "{said_waiting}");
    proxy.set_down(false);

    let want = generate::expected(&all);
    let up_at = Instant::now();
    while read_model(&pool).await != want || http_get(&addr, "/ready").await.0 != 200 {
        assert!(
            up_at.elapsed() < Duration::from_secs(30),
            "not applied and ready after the outage:\n{}",
            log.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    std::process::Command::new("kill").args(["-TERM", &child.id().unwrap().to_string()]).status().unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait()).await.expect("stops in time").unwrap();
    let log = log.lock().unwrap().clone();
    assert!(status.success(), "exit 0, nothing halted: {status}\n{log}");
    assert!(log.contains("Waiting for PostgreSQL; applying resumes by itself."), "{log}");
    assert!(!log.contains("Partition halted"), "{log}");
    assert!(!log.contains(&server), "no connection string in the log");
}

/// A wait whose listening connection is lost (PostgreSQL unreachable through the proxy)
/// while its event is applied, its notification lost with it, returns once the connection
/// is back: the waiter reads the checkpoints again on reconnecting (its periodic poll is set
/// to an hour here, so that nothing else can wake it).
#[sqlx::test(migrations = false)]
async fn a_wait_survives_losing_its_connection_while_its_event_is_applied(pool: PgPool) {
    use projectionist::postgres::wait::Waiter;
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let proxy = start_proxy(&pool).await;
    let through_proxy = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(2))
        .connect_with(through(&pool, &proxy))
        .await
        .unwrap();
    let waiter = Waiter::with_poll(through_proxy, Duration::from_secs(3600)).await.unwrap();
    let topic = rand_test_topic("wait-outage");
    topics::create_topics(&brokers(), &[topic.as_str()], 1, 1).await.unwrap();
    let opened = bank_accounts::AccountEvent::AccountOpened { owner: "o".into() };
    produce(&topic, &[generate::envelope("acc-o", 1, &opened)]).await;
    let wait = {
        let (waiter, topic) = (waiter.clone(), topic.clone());
        tokio::spawn(
            async move { waiter.wait_for_offset("bank_accounts", &topic, 0, 0, Duration::from_secs(90)).await },
        )
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!wait.is_finished(), "nothing applied yet");

    proxy.set_down(true);
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Applied through PostgreSQL directly while the waiter cannot hear it.
    let config = EngineConfig::new(brokers())
        .with_group_id(format!("wait-outage-{}", uuid::Uuid::new_v4().simple()))
        .with_exit_when_caught_up(true)
        .with_kafka_property("session.timeout.ms", "6000");
    let engine = Engine::new(pool.clone(), config).register(Arc::new(BankAccounts), [topic.clone()]);
    let report = tokio::time::timeout(Duration::from_secs(60), engine.run(std::future::pending())).await;
    assert!(report.expect("caught up in time").unwrap().halts().is_empty());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!wait.is_finished(), "its notification was lost with the connection");

    proxy.set_down(false);
    let reached = tokio::time::timeout(Duration::from_secs(30), wait).await.expect("returned once reconnected");
    assert!(reached.unwrap().is_ok());
}
