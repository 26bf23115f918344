//! Throughput of the version gate and of the whole pipeline, printed as figures and ratios.
//! Run with: `./scripts/bench.sh` (needs DATABASE_URL and KAFKA_BROKERS; makes its own
//! database `projectionist_bench` and a fresh topic).
//!
//! Figures depend on the machine; the ratios are the point: a replay (every event a
//! duplicate) should cost no more than the first pass, and Kafka should not be the limit.

use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bank_accounts::BankAccounts;
use projectionist::kafka::{topics, Engine, EngineConfig};
use projectionist::postgres::{apply_batch, migrate, reset};
use projectionist::RawEnvelope;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};

const ACCOUNTS: usize = 2_000;
const MAX_EVENTS: i64 = 20;
const BATCH: usize = 500;

async fn database() -> PgPool {
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL (run ./scripts/bench.sh)");
    let admin = PgConnectOptions::from_str(&url).expect("valid DATABASE_URL");
    let mut conn = admin.connect().await.expect("connect");
    sqlx::raw_sql("DROP DATABASE IF EXISTS projectionist_bench WITH (FORCE)").execute(&mut conn).await.expect("drop old database");
    sqlx::raw_sql("CREATE DATABASE projectionist_bench").execute(&mut conn).await.expect("fresh database");
    PgPoolOptions::new().max_connections(4).connect_with(admin.database("projectionist_bench")).await.expect("connect bench database")
}

async fn gate_pass(pool: &PgPool, events: &[RawEnvelope]) -> f64 {
    let started = Instant::now();
    for batch in events.chunks(BATCH) {
        apply_batch(pool, &BankAccounts, batch).await.expect("batch applies");
    }
    events.len() as f64 / started.elapsed().as_secs_f64()
}

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)).and_then(|kb| kb.parse::<f64>().ok()).unwrap_or(0.0) / 1024.0
}

#[tokio::main]
async fn main() {
    let pool = database().await;
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let events = bank_accounts::generate::stream(ACCOUNTS, MAX_EVENTS, 7);
    println!("projectionist throughput: {} events over {ACCOUNTS} accounts, batches of {BATCH}", events.len());

    // 1. The gate alone: first pass, then the same events again (all duplicates).
    let first = gate_pass(&pool, &events).await;
    let replay = gate_pass(&pool, &events).await;
    println!("  gate, first pass (guarded transitions):   {first:>10.0} events/s");
    println!("  gate, replay (every event a duplicate):   {replay:>10.0} events/s   ratio replay/first {:.2}", replay / first);

    // 2. Kafka: produce, then drain through the engine from offset zero.
    let brokers = std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "localhost:9092".into());
    let topic = format!("bench.accounts.{}", std::process::id());
    topics::create_topics(&brokers, &[&topic], 4, 1).await.expect("topic");
    let producer: ThreadedProducer<DefaultProducerContext> =
        ClientConfig::new().set("bootstrap.servers", &brokers).set("linger.ms", "5").create().expect("producer");
    let started = Instant::now();
    for e in &events {
        let payload = e.to_json();
        while let Err((err, _)) = producer.send(BaseRecord::to(&topic).key(&e.aggregate_id).payload(&payload)) {
            assert!(matches!(err, rdkafka::error::KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull)), "{err}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    producer.flush(Duration::from_secs(60)).expect("flush");
    let produce = events.len() as f64 / started.elapsed().as_secs_f64();
    println!("  kafka produce (idempotent off, acks=all): {produce:>10.0} events/s");

    reset(&pool, &BankAccounts).await.unwrap();
    let config = EngineConfig::new(&brokers)
        .with_group_id(format!("bench-{}", std::process::id()))
        .with_exit_when_caught_up(true)
        .with_kafka_property("session.timeout.ms", "6000");
    let engine = Engine::new(pool.clone(), config).register(Arc::new(BankAccounts), [topic.clone()]);
    let stats = engine.stats()[0].clone();
    let started = Instant::now();
    let watcher = tokio::spawn(async move {
        // The group join is not throughput: time from the first event read.
        loop {
            if stats.read.load(std::sync::atomic::Ordering::Relaxed) > 0 {
                return Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    engine.run(std::future::pending()).await.expect("engine run");
    let first_read = watcher.await.unwrap();
    let pipeline = events.len() as f64 / first_read.elapsed().as_secs_f64();
    println!("  pipeline (kafka -> gate -> checkpoint):  {pipeline:>10.0} events/s   ratio pipeline/gate {:.2}", pipeline / first);
    println!("  group join and assignment took            {:>10.1} s", (first_read - started).as_secs_f64());
    println!("  peak RSS of this process                  {:>10.1} MiB", peak_rss_mib());

    let rows: i64 = sqlx::query_scalar("SELECT sum(version)::bigint FROM bank_accounts").fetch_one(&pool).await.unwrap();
    assert_eq!(rows, events.len() as i64, "the pipeline applied every event");
}
