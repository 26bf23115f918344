//! The transactional outbox, end to end (issue 68): an application writes its own row and an
//! outbox row in one transaction on a PostgreSQL cluster with `wal_level=logical`; Debezium's
//! PostgreSQL connector and its outbox event router, in Kafka Connect, relay the outbox to
//! the broker (`scripts/services.sh --outbox-postgres`, `--start-connect`); `bank-accounts
//! run --topic-format TOPIC=debezium` projects it. Connect and the projector are each
//! SIGKILLed mid-stream and started again: the relay's re-sends are absorbed, the read model
//! is exact, and a `rebuild` of the topic gives the same.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use bank_accounts::generate;
use common::cli::Env;
use common::{brokers, read_model, skip};
use projectionist::RawEnvelope;
use rdkafka::consumer::{BaseConsumer, Consumer};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

/// `scripts/services.sh ARGS…` with `env`: its stdout, or `None` when it fails.
fn services(args: &[&str], env: &[(&str, &str)]) -> Option<String> {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/services.sh");
    let mut command = std::process::Command::new(script);
    command.args(args).envs(env.iter().copied()).stderr(Stdio::inherit());
    let out = command.output().unwrap();
    out.status.success().then(|| String::from_utf8(out.stdout).unwrap())
}

/// A Connect worker and its replication slot, dropped at the end of the test however it ends
/// (a slot left behind keeps WAL forever).
struct Relay(String);

impl Drop for Relay {
    fn drop(&mut self) {
        services(&["--drop-connect", &self.0], &[]);
    }
}

/// The value of `name=` in a services.sh `export` line.
fn exported(out: &str, name: &str) -> Option<String> {
    out.split_whitespace().find_map(|w| w.strip_prefix(&format!("{name}="))).map(str::to_owned)
}

/// The application: a database of its own on the outbox cluster, with its `ledger` and the
/// `outbox` (scripts/services/outbox.sql).
async fn application(url: &str, name: &str) -> PgPool {
    let admin = PgPoolOptions::new().max_connections(1).connect(url).await.unwrap();
    sqlx::query(&format!("CREATE DATABASE {name}")).execute(&admin).await.unwrap();
    let options: PgConnectOptions = url.parse::<PgConnectOptions>().unwrap().database(name);
    let app = PgPoolOptions::new().max_connections(2).connect_with(options).await.unwrap();
    let ddl = include_str!("../../../scripts/services/outbox.sql");
    sqlx::raw_sql(ddl).execute(&app).await.unwrap();
    sqlx::raw_sql("CREATE TABLE ledger (event_id uuid PRIMARY KEY, account_id text NOT NULL, kind text NOT NULL)")
        .execute(&app)
        .await
        .unwrap();
    app
}

/// Writes each event as the application does: its ledger row and its outbox row in one
/// transaction.
async fn write(app: &PgPool, events: &[RawEnvelope]) {
    for e in events {
        let id: uuid::Uuid = e.id.to_string().parse().unwrap();
        let mut tx = app.begin().await.unwrap();
        sqlx::query("INSERT INTO ledger VALUES ($1, $2, $3)")
            .bind(id)
            .bind(&e.aggregate_id)
            .bind(&e.event_type)
            .execute(&mut *tx)
            .await
            .unwrap();
        sqlx::query(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, version, occurred_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(id)
        .bind(&e.aggregate_type)
        .bind(&e.aggregate_id)
        .bind(&e.event_type)
        .bind(&e.data)
        .bind(e.version)
        .bind(e.occurred_at)
        .execute(&mut *tx)
        .await
        .unwrap();
        tx.commit().await.unwrap();
    }
}

/// How many messages the topic holds: the sum of its partitions' high watermarks.
fn messages_on(topic: &str) -> i64 {
    let consumer: BaseConsumer = rdkafka::ClientConfig::new().set("bootstrap.servers", brokers()).create().unwrap();
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10)).unwrap();
    let partitions = metadata.topics()[0].partitions().len() as i32;
    (0..partitions).map(|p| consumer.fetch_watermarks(topic, p, Duration::from_secs(10)).unwrap().1).sum()
}

/// Waits until the read model is `want`, or panics after `within` naming what it shows.
async fn until_exact(pool: &PgPool, want: &std::collections::BTreeMap<String, generate::ExpectedAccount>) {
    let started = Instant::now();
    loop {
        let now = read_model(pool).await;
        if &now == want {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "not exact after 120 s: {} rows of {}",
            now.len(),
            want.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[sqlx::test(migrations = false)]
async fn an_outbox_relayed_by_debezium_projects_exactly_through_kills_of_connect_and_the_projector(pool: PgPool) {
    const TEST: &str = "an_outbox_relayed_by_debezium_projects_exactly_through_kills_of_connect_and_the_projector";
    if !std::env::var("PROJECTIONIST_BROKER").unwrap_or_default().starts_with("apache-kafka-") {
        return skip(
            TEST,
            "needs Apache Kafka started by scripts/services.sh (Kafka Connect's worker runs against it)",
        );
    }
    let Some(url) = services(&["--outbox-postgres"], &[]).and_then(|out| exported(&out, "OUTBOX_PG_URL")) else {
        return skip(TEST, "scripts/services.sh --outbox-postgres could not make the wal_level=logical cluster");
    };
    let env = Env::new(&pool, "outbox").await;
    env.publish(&[]).await; // the topic, four partitions
    let name = format!("obx{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let app = application(&url, &name).await;
    // Offsets flushed only at a clean stop: a SIGKILL re-sends everything since the start.
    let connect_env = [
        ("OUTBOX_DB", name.as_str()),
        ("OUTBOX_TOPIC", env.topic.as_str()),
        ("OUTBOX_OFFSET_FLUSH_MS", "600000"),
        ("KAFKA_BROKERS", &brokers()),
    ];
    let relay = Relay(name.clone());
    let start = || services(&["--start-connect", &name], &connect_env).expect("Kafka Connect starts (its log above)");
    start();

    let events = generate::stream(60, 20, 683);
    let (first, rest) = events.split_at(events.len() / 3);
    let (second, third) = rest.split_at(rest.len() / 2);
    let flag = format!("{}=debezium", env.topic);
    let (mut projector, log) = env.spawn(&["--topic-format", &flag, "--batch-size", "10", "--batch-wait-ms", "5"]);
    write(&app, first).await;
    until_exact(&pool, &generate::expected(first)).await;

    // Connect killed with the first third relayed and its offsets never flushed: it sends them
    // again once started. The projector is killed too, and writes go on meanwhile.
    services(&["--kill-connect", &name], &[]).expect("--kill-connect");
    projector.start_kill().unwrap(); // SIGKILL
    projector.wait().await.unwrap();
    write(&app, second).await;
    start();
    let (_projector, log2) = env.spawn(&["--topic-format", &flag, "--batch-size", "10", "--batch-wait-ms", "5"]);
    write(&app, third).await;
    until_exact(&pool, &generate::expected(&events)).await;
    services(&["--stop-connect", &name], &[]).expect("--stop-connect");
    let on_topic = messages_on(&env.topic);
    assert!(
        on_topic > events.len() as i64,
        "the relay re-sent after its kill: {on_topic} messages, {} events",
        events.len()
    );
    let letters = projectionist::postgres::park::dead_letters(&pool, None, false).await.unwrap();
    assert!(letters.is_empty(), "{letters:#?}\n{}{}", log.lock().unwrap(), log2.lock().unwrap());
    drop(_projector);

    let mut args = env.run_args(&["--topic-format", &flag]);
    args[0] = "rebuild";
    let (status, _, stderr) = tokio::time::timeout(Duration::from_secs(120), env.output(&args)).await.expect("in time");
    assert!(status.success(), "{stderr}");
    assert_eq!(read_model(&pool).await, generate::expected(&events), "the rebuilt read model");

    drop(relay);
    app.close().await;
    let admin = PgPoolOptions::new().max_connections(1).connect(&url).await.unwrap();
    sqlx::query(&format!("DROP DATABASE {name}")).execute(&admin).await.unwrap();
}
