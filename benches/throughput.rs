//! Throughput, side by side on one generated stream, each arm on a fresh database:
//! the whole pipeline, PostgreSQL alone (the ceiling), Kafka alone, a naive inbox consumer,
//! a replay of the already-projected stream, a `rebuild` of it beside its tables (and its
//! ceiling: PostgreSQL folding the staged stream in one statement); peak RSS of the pipeline
//! and of a rebuild at a second, larger size (generated and published as a stream, in bounded
//! memory). Run with: `./scripts/bench.sh` (sizes: `BENCH_DELIVERIES`, default 1050000;
//! `BENCH_RSS_DELIVERIES`, default 10000000, 0 to skip; `BENCH_INBOX_DELIVERIES`, default 20000;
//! `BENCH_POISON=0`, `BENCH_REBUILD=0` and `BENCH_FRESHNESS=0` skip those arms, for builds
//! from before them; `BENCH_FRESHNESS_SECONDS`, default 30, is how long each freshness rate
//! runs; `BENCH_FRESHNESS_ONLY=<events/s>` runs the freshness arm alone at that rate). The
//! freshness arm: a transactional producer at 1k/s, 10k/s and half the pipeline's rate while
//! the projector runs at the head; per event, commit -> applied (through the library's
//! waiter) beside commit -> a `read_committed` consumer's receipt. The orders arm
//! (`throughput/orders.rs`; `BENCH_ORDERS=0` skips it, `BENCH_ORDERS_ONLY=1` runs it alone,
//! `BENCH_ORDERS_DELIVERIES`, default 200000; `BENCH_ORDERS_ROUNDS`, default 3): child rows
//! and deletes, the order-status projector against PostgreSQL alone doing the same gated writes.
//! `BENCH_KEEP_TOPICS=1` keeps the topics a run made (deleted at its end otherwise), to run a
//! projector over one again by hand.
//!
//! Figures depend on the machine; the ratios, measured in one run, are the point.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant};

use projectionist::kafka::topics;
use projectionist::postgres::migrate;
use projectionist::RawEnvelope;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};

#[path = "throughput/orders.rs"]
mod orders;
#[path = "throughput/peer.rs"]
mod peer;

const PARTITIONS: i32 = 4;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A bank-account stream of at least about `deliveries` deliveries: 1 to 45 events per
/// account (23 on average), 10 % of them delivered twice and 5 % re-sent under a fresh id
/// (26.4 per account).
fn stream(deliveries: usize) -> Vec<RawEnvelope> {
    let accounts = (deliveries / 26).max(10);
    let distinct = bank_accounts::generate::stream(accounts, 45, 7);
    projectionist_testing::with_redeliveries(&distinct, 0.10, 0.05, 11)
}

/// A fresh database with the bank-accounts tables.
async fn fresh_database(name: &str) -> (PgPool, String) {
    let (pool, url) = empty_database(name).await;
    migrate(&pool, &[&bank_accounts::BankAccounts]).await.unwrap();
    (pool, url)
}

/// A fresh, empty database: its pool and URL.
async fn empty_database(name: &str) -> (PgPool, String) {
    let (url, admin, mut conn) = admin_connection().await;
    drop_database(&mut conn, name).await;
    sqlx::raw_sql(&format!("CREATE DATABASE {name}")).execute(&mut conn).await.expect("fresh database");
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(admin.clone().database(name))
        .await
        .expect("connect bench database");
    let db_url = projectionist_testing::with_database(&url, name);
    (pool, db_url)
}

/// `DATABASE_URL`, its options and a connection to it: where databases are made and dropped.
async fn admin_connection() -> (String, PgConnectOptions, sqlx::PgConnection) {
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL (run ./scripts/bench.sh)");
    let admin = PgConnectOptions::from_str(&url).expect("valid DATABASE_URL");
    let conn = admin.connect().await.expect("connect");
    (url, admin, conn)
}

/// Drops database `name` if it is there. An autovacuum worker in it (the superuser's, which
/// `FORCE` may not end for this role: 42501) is waited out; it ends within seconds.
async fn drop_database(conn: &mut sqlx::PgConnection, name: &str) {
    for tries in 1.. {
        match sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).execute(&mut *conn).await {
            Ok(_) => break,
            Err(e) if tries < 60 && e.as_database_error().and_then(|d| d.code()).as_deref() == Some("42501") => {
                tokio::time::sleep(Duration::from_secs(1)).await
            }
            Err(e) => panic!("drop old database {name}: {e}"),
        }
    }
}

/// The topics this run made, deleted at its end ([`drop_topics`]): a broker that keeps
/// every run's topics (thousands of partitions) slows down, and the figures with it.
static MADE: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

async fn make_topic(topic: &str) {
    topics::create_topics(&brokers(), &[topic], PARTITIONS, 1).await.expect("topic");
    MADE.lock().unwrap().push(topic.to_owned());
}

async fn drop_topics() {
    let made = std::mem::take(&mut *MADE.lock().unwrap());
    if made.is_empty() || env_usize("BENCH_KEEP_TOPICS", 0) != 0 {
        return;
    }
    let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", brokers()).create().expect("admin client");
    let names: Vec<&str> = made.iter().map(String::as_str).collect();
    let options = rdkafka::admin::AdminOptions::new();
    for result in admin.delete_topics(&names, &options).await.expect("delete topics") {
        if let Err((topic, code)) = result {
            eprintln!("  could not delete topic {topic}: {code}");
        }
    }
}

fn brokers() -> String {
    std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "localhost:9092".into())
}

async fn publish(events: &[RawEnvelope]) -> (String, f64) {
    let (topic, _, rate) = publish_all("bench.accounts", events.iter().cloned()).await;
    (topic, rate)
}

/// Publishes `events` as they come (a stream generated on the fly stays out of memory) to a
/// new topic named from `prefix`, keyed by their aggregate ids: the topic, how many, and the
/// rate.
async fn publish_all(prefix: &str, events: impl Iterator<Item = RawEnvelope>) -> (String, usize, f64) {
    publish_records(prefix, events.map(|e| (e.aggregate_id.clone().into_bytes(), e.to_json()))).await
}

/// Publishes `records` (key, payload) to a new topic named from `prefix`: the topic, how
/// many, and the rate.
async fn publish_records(prefix: &str, records: impl Iterator<Item = (Vec<u8>, Vec<u8>)>) -> (String, usize, f64) {
    static TOPICS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = TOPICS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let topic = format!("{prefix}.{}.{n}", std::process::id());
    make_topic(&topic).await;
    let producer: ThreadedProducer<DefaultProducerContext> =
        ClientConfig::new().set("bootstrap.servers", brokers()).set("linger.ms", "5").create().expect("producer");
    let started = Instant::now();
    let mut count = 0;
    for (key, payload) in records {
        count += 1;
        while let Err((err, _)) = producer.send(BaseRecord::to(&topic).key(&key).payload(&payload)) {
            assert!(
                matches!(
                    err,
                    rdkafka::error::KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull)
                ),
                "{err}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    producer.flush(Duration::from_secs(120)).expect("flush");
    (topic, count, count as f64 / started.elapsed().as_secs_f64())
}

/// Kafka alone: a `read_committed` consumer draining every partition, no writes.
fn kafka_drain(topic: &str, expected: usize) -> f64 {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("group.id", format!("bench-drain-{}", std::process::id()))
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(topic, p, Offset::Beginning).unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let mut read = 0;
    let mut started = None;
    while read < expected {
        if let Some(message) = consumer.poll(Duration::from_secs(10)) {
            message.expect("message");
            started.get_or_insert_with(Instant::now);
            read += 1;
        }
    }
    read as f64 / started.expect("read something").elapsed().as_secs_f64()
}

/// CPU seconds (user + system) of this process's children that have been waited for, from
/// `/proc/self/stat` (`cutime`, `cstime`): around one projector run, its own CPU.
fn children_cpu_seconds() -> f64 {
    stat_seconds("self", 13).expect("/proc/self/stat (Linux)")
}

/// Two clock-tick counters of `/proc/<pid>/stat` added up, in seconds: from the field
/// `first` counted after the command name (11: `utime`, `stime`; 13: `cutime`, `cstime`).
fn stat_seconds(pid: &str, first: usize) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
    Some((ticks(first)? + ticks(first + 1)?) / clock_ticks())
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 where it cannot say).
fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        let out = Command::new("getconf").arg("CLK_TCK").output().ok();
        out.and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse::<f64>().ok()).unwrap_or(100.0)
    })
}

/// A process's peak resident set (`VmHWM`), in KiB.
fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find(|l| l.starts_with("VmHWM:"))?.split_whitespace().nth(1)?.parse().ok()
}

/// One projector run: deliveries/s, peak RSS in MiB, CPU seconds (user + system).
struct Run {
    rate: f64,
    rss_mib: f64,
    cpu_seconds: f64,
    /// A rebuild's swap, in milliseconds.
    swap_ms: Option<u64>,
    /// What a user waits for: from the process's start to its exit.
    start_to_exit: Duration,
    /// From the start to its first partition assignment (start-up, group join).
    to_assigned: Duration,
    /// From "caught up" (`run`) or "swapped in" (`rebuild`) to the exit (consumer close).
    closing: Duration,
}

impl Run {
    /// Start to exit, and where the time outside the reading went.
    fn timeline(&self) -> String {
        format!(
            "{:.2} s start to exit: {:.2} s to its assignment, {:.2} s from done to exit",
            self.start_to_exit.as_secs_f64(),
            self.to_assigned.as_secs_f64(),
            self.closing.as_secs_f64()
        )
    }
}

/// A projector binary of the examples: the variable naming it (else its path in the
/// release build), the variable naming its topic, its package.
#[derive(Debug, Clone, Copy)]
struct Bin {
    var: &'static str,
    default: &'static str,
    topic_var: &'static str,
    package: &'static str,
}

const BANK_ACCOUNTS: Bin = Bin {
    var: "BANK_ACCOUNTS_BIN",
    default: "target/release/bank-accounts",
    topic_var: "BANK_ACCOUNTS_TOPIC",
    package: "bank-accounts",
};

impl Bin {
    fn path(&self) -> String {
        std::env::var(self.var).unwrap_or_else(|_| self.default.into())
    }
}

/// The whole pipeline: the bank-accounts projector binary, from its first partition
/// assignment to caught up: deliveries/s, the process's peak RSS, and its CPU time (from
/// start to exit, connections and start-up included).
fn pipeline(db_url: &str, topic: &str, deliveries: usize, args: &[&str]) -> Run {
    BANK_ACCOUNTS.projector("run", db_url, topic, deliveries, &[&["--exit-when-caught-up"], args].concat())
}

/// A `rebuild` of the projected stream beside its tables, swapped in at the end: as
/// [`pipeline`], and how long the swap took (its log line says).
fn rebuild(db_url: &str, topic: &str, deliveries: usize) -> Run {
    BANK_ACCOUNTS.projector("rebuild", db_url, topic, deliveries, &[])
}

/// `rebuild --drop-old`: removes the tables the last rebuild replaced, so that another can run.
fn drop_old(db_url: &str) {
    let bin = BANK_ACCOUNTS.path();
    let status = Command::new(&bin)
        .args(["rebuild", "--drop-old"])
        .env("DATABASE_URL", db_url)
        .stdout(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("cannot start {bin}: {e}"));
    assert!(status.success(), "rebuild --drop-old failed: {status}");
}

impl Bin {
    /// The projector running `command` (`run` with `--exit-when-caught-up` in `args`, up to
    /// caught up; `rebuild`, up to its swap), from its first partition assignment to its exit.
    fn projector(&self, command: &str, db_url: &str, topic: &str, deliveries: usize, args: &[&str]) -> Run {
        let cpu_before = children_cpu_seconds();
        let bin = self.path();
        static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let group = format!("bench-{}-{}", std::process::id(), RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let started = Instant::now();
        let child = Command::new(&bin)
            .arg(command)
            .args(["--metrics-addr", "off", "--kafka-property", "session.timeout.ms=6000", "--group-id", &group])
            .args(args)
            .env("DATABASE_URL", db_url)
            .env(self.topic_var, topic)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start {bin}: {e} (build it: cargo build --release -p {})", self.package)
            });
        watch(child, started, deliveries, cpu_before)
    }
}

/// Follows a projector `child` started at `started` to its exit: its peak RSS, when it was
/// assigned, done and exited.
fn watch(mut child: std::process::Child, started: Instant, deliveries: usize, cpu_before: f64) -> Run {
    let pid = child.id();
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let watcher = {
        let peak = peak.clone();
        std::thread::spawn(move || loop {
            let Some(kb) = peak_rss_kib(pid) else { return };
            peak.fetch_max(kb, std::sync::atomic::Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(20));
        })
    };
    let (mut assigned, mut swap_ms, mut done) = (None, None, None);
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap_or_default();
        if assigned.is_none() && line.contains("Partition assigned") {
            assigned = Some(Instant::now());
        }
        if line.contains("Caught up with the high watermarks; stopping.") || line.contains("Rebuild swapped in") {
            done = Some(Instant::now());
        }
        if let Some((_, ms)) = line.split_once("swap_ms=") {
            swap_ms = ms.split_whitespace().next().and_then(|ms| ms.parse::<u64>().ok());
        }
        if line.contains("ERROR") || line.contains("error:") {
            eprintln!("  pipeline: {line}");
        }
    }
    let status = child.wait().unwrap();
    let exited = Instant::now();
    let assigned = assigned.expect("the projector was assigned partitions");
    let took = assigned.elapsed();
    assert!(status.success(), "the projector failed: {status}");
    let _ = watcher.join();
    Run {
        rate: deliveries as f64 / took.as_secs_f64(),
        rss_mib: peak.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1024.0,
        cpu_seconds: children_cpu_seconds() - cpu_before,
        swap_ms,
        start_to_exit: exited - started,
        to_assigned: assigned - started,
        closing: done.map_or(Duration::ZERO, |done| exited - done),
    }
}

/// PostgreSQL alone: the deliveries staged in a table, then applied server-side by
/// version-gated set-based statements, one per wave (the k-th delivery of every account),
/// no client in the loop. Written for the bench, not the product's code path.
async fn ceiling(pool: &PgPool, events: &[RawEnvelope]) -> f64 {
    sqlx::raw_sql(
        "CREATE UNLOGGED TABLE staged (seq bigint, account_id text, version bigint, kind text, owner text, amount \
        bigint, at timestamptz); \
         TRUNCATE bank_accounts",
    )
    .execute(pool)
    .await
    .unwrap();
    for (n, chunk) in events.chunks(10_000).enumerate() {
        let seq: Vec<i64> = (0..chunk.len()).map(|i| (n * 10_000 + i) as i64).collect();
        let ids: Vec<&str> = chunk.iter().map(|e| e.aggregate_id.as_str()).collect();
        let versions: Vec<i64> = chunk.iter().map(|e| e.version).collect();
        let kinds: Vec<&str> = chunk.iter().map(|e| e.event_type.as_str()).collect();
        let owners: Vec<Option<&str>> = chunk.iter().map(|e| e.data.get("owner").and_then(|v| v.as_str())).collect();
        let amounts: Vec<Option<i64>> = chunk.iter().map(|e| e.data.get("amount").and_then(|v| v.as_i64())).collect();
        let at: Vec<chrono::DateTime<chrono::Utc>> = chunk.iter().map(|e| e.occurred_at).collect();
        sqlx::query(
            "INSERT INTO staged SELECT * FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::text[], \
            $5::text[], $6::bigint[], $7::timestamptz[])",
        )
        .bind(seq)
        .bind(ids)
        .bind(versions)
        .bind(kinds)
        .bind(owners)
        .bind(amounts)
        .bind(at)
        .execute(pool)
        .await
        .unwrap();
    }
    let waves = waves(pool, "account_id").await;
    let started = Instant::now();
    for wave in 1..=waves {
        let mut tx = pool.begin().await.unwrap();
        sqlx::query(
            "INSERT INTO bank_accounts (account_id, owner, balance, status, updated_at, version) \
             SELECT account_id, owner, 0, 'open', at, 1 FROM waves WHERE wave = $1 AND version = 1 ON CONFLICT \
             (account_id) DO NOTHING",
        )
        .bind(wave)
        .execute(&mut *tx)
        .await
        .unwrap();
        sqlx::query(
            "UPDATE bank_accounts t SET balance = t.balance + CASE w.kind WHEN 'MoneyDeposited' THEN w.amount WHEN \
            'MoneyWithdrawn' THEN -w.amount ELSE 0 END, \
             status = CASE w.kind WHEN 'AccountClosed' THEN 'closed' ELSE t.status END, updated_at = w.at, version = \
             w.version \
             FROM waves w WHERE w.wave = $1 AND w.version > 1 AND t.account_id = w.account_id AND t.version = \
             w.version - 1",
        )
        .bind(wave)
        .execute(&mut *tx)
        .await
        .unwrap();
        tx.commit().await.unwrap();
    }
    events.len() as f64 / started.elapsed().as_secs_f64()
}

/// Numbers the staged deliveries of each aggregate (`key`) in stream order into the table
/// `waves`: the k-th delivery of every aggregate is wave k, which a ceiling applies with one
/// set-based statement. Returns how many waves there are.
async fn waves(pool: &PgPool, key: &str) -> i64 {
    let sql = format!(
        "CREATE UNLOGGED TABLE waves AS SELECT *, row_number() OVER (PARTITION BY {key} ORDER BY seq) AS wave FROM \
         staged; CREATE INDEX ON waves (wave); ANALYZE waves"
    );
    sqlx::raw_sql(&sql).execute(pool).await.unwrap();
    sqlx::query_scalar("SELECT max(wave) FROM waves").fetch_one(pool).await.unwrap()
}

/// PostgreSQL alone building the final state of the stream staged by [`ceiling`] with one
/// `INSERT … SELECT` of the stream folded per account (duplicates dropped): what a rebuild
/// from offset zero could at best be. Written for the bench, not the product's code path.
async fn folded_ceiling(pool: &PgPool, deliveries: usize) -> f64 {
    sqlx::raw_sql("TRUNCATE bank_accounts").execute(pool).await.unwrap();
    let started = Instant::now();
    sqlx::raw_sql(
        "INSERT INTO bank_accounts (account_id, owner, balance, status, updated_at, version) \
         SELECT account_id, max(owner) FILTER (WHERE kind = 'AccountOpened'), \
         coalesce(sum(CASE kind WHEN 'MoneyDeposited' THEN amount WHEN 'MoneyWithdrawn' THEN -amount ELSE 0 END), 0), \
         CASE WHEN bool_or(kind = 'AccountClosed') THEN 'closed' ELSE 'open' END, \
         (array_agg(at ORDER BY version DESC))[1], max(version) \
         FROM (SELECT DISTINCT ON (account_id, version) * FROM staged ORDER BY account_id, version, seq) d \
         GROUP BY account_id",
    )
    .execute(pool)
    .await
    .unwrap();
    deliveries as f64 / started.elapsed().as_secs_f64()
}

/// The pattern the gate replaces: per event, a transaction inserting the event id into a
/// processed-messages table, then an unguarded write when the id was new.
async fn inbox(pool: &PgPool, events: &[RawEnvelope]) -> f64 {
    sqlx::raw_sql(
        "CREATE TABLE processed_messages (id uuid PRIMARY KEY, processed_at timestamptz NOT NULL DEFAULT \
        now()); TRUNCATE bank_accounts",
    )
    .execute(pool)
    .await
    .unwrap();
    let started = Instant::now();
    for e in events {
        let mut tx = pool.begin().await.unwrap();
        let fresh = sqlx::query("INSERT INTO processed_messages (id) VALUES ($1) ON CONFLICT DO NOTHING")
            .bind(e.id)
            .execute(&mut *tx)
            .await
            .unwrap();
        if fresh.rows_affected() == 1 {
            let amount = e.data.get("amount").and_then(|v| v.as_i64()).unwrap_or(0);
            let delta = if e.event_type == "MoneyWithdrawn" { -amount } else { amount };
            sqlx::query(
                "INSERT INTO bank_accounts (account_id, balance, version) VALUES ($1, $2, $3) \
                 ON CONFLICT (account_id) DO UPDATE SET balance = bank_accounts.balance + $2, version = $3",
            )
            .bind(&e.aggregate_id)
            .bind(delta)
            .bind(e.version)
            .execute(&mut *tx)
            .await
            .unwrap();
        }
        tx.commit().await.unwrap();
    }
    events.len() as f64 / started.elapsed().as_secs_f64()
}

/// How long each freshness rate is measured by default, in seconds. A p99 is the worst
/// hundredth of the events: over 5 s at 10k/s, the events of 50 ms of traffic, what one slow
/// batch or broker fetch delays, so that five such runs of one build gave 15.4 to 29.9 ms over
/// the broker's p99; over 30 s (300 ms of traffic), four gave 8.8 to 14.7 ms.
const FRESHNESS_SECONDS: usize = 30;

/// Latencies of one freshness run, in milliseconds, sorted.
struct Latencies(Vec<f64>);

impl Latencies {
    fn at(&self, q: f64) -> f64 {
        if self.0.is_empty() {
            return f64::NAN;
        }
        self.0[((self.0.len() - 1) as f64 * q).round() as usize]
    }

    fn show(&self) -> String {
        format!("p50 {:>6.1} ms  p99 {:>6.1} ms  max {:>6.1} ms", self.at(0.5), self.at(0.99), self.at(1.0))
    }
}

/// Freshness at `rate` events/s for `seconds` (after a second of warm-up, not counted: the
/// projector's first connections and batches): a transactional producer publishes `stream`
/// from its start (a transaction per loop, of what is due by then; the same mix of new
/// accounts, deposits, duplicates and re-sends the pipeline's maximum was measured on) while
/// the projector runs at the head, stopping early if the stream runs out;
/// for each event, the time from its transaction's commit to the moment a [`Waiter`] reports
/// it applied (its row visible; an upper bound: the wait is for the transaction's last event
/// on the partition), and, beside it on the same events, to the moment a
/// `read_committed` consumer receives it (the broker alone). Returns the achieved rate and
/// both latencies.
///
/// [`Waiter`]: projectionist::postgres::wait::Waiter
async fn freshness(rate: f64, seconds: f64, stream: &[RawEnvelope]) -> (f64, Latencies, Latencies) {
    use projectionist::postgres::wait::Waiter;
    use rdkafka::producer::FutureProducer;
    use rdkafka::Message;
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let topic = format!("bench.fresh.{}.{n}", std::process::id());
    make_topic(&topic).await;
    let (pool, url) = fresh_database(&format!("projectionist_bench_fresh_{n}")).await;

    // The projector, at the head of an empty topic.
    let bin = BANK_ACCOUNTS.path();
    let mut child = Command::new(&bin)
        .args(["run", "--metrics-addr", "127.0.0.1:0", "--kafka-property", "session.timeout.ms=6000"])
        .args(["--group-id", &format!("bench-fresh-{}-{n}", std::process::id())])
        .env("DATABASE_URL", &url)
        .env("BANK_ACCOUNTS_TOPIC", &topic)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the projector starts");
    let (assigned_tx, assigned_rx) = std::sync::mpsc::channel();
    let metrics_addr: Arc<Mutex<Option<String>>> = Arc::default();
    let stderr = child.stderr.take().unwrap();
    let addr_seen = metrics_addr.clone();
    std::thread::spawn(move || {
        let mut told = false;
        for line in BufReader::new(stderr).lines() {
            let line = line.unwrap_or_default();
            if !told && line.contains("Partition assigned") {
                told = assigned_tx.send(()).is_ok();
            }
            if let Some(addr) = line.split("address=").nth(1).and_then(|a| a.split_whitespace().next()) {
                *addr_seen.lock().unwrap() = Some(addr.to_owned());
            }
            // What went wrong, if anything, said beside the figures it explains.
            if line.contains("ERROR") || line.contains("WARN") {
                eprintln!("  freshness projector: {line}");
            }
        }
    });
    assigned_rx.recv_timeout(Duration::from_secs(60)).expect("the projector was assigned partitions");

    // The broker alone: a read_committed consumer of the same topic.
    let received: Arc<Mutex<HashMap<(i32, i64), Instant>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (received, stop, topic) = (received.clone(), stop.clone(), topic.clone());
        std::thread::spawn(move || {
            let consumer: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", brokers())
                .set("group.id", format!("bench-fresh-reader-{}", std::process::id()))
                .set("isolation.level", "read_committed")
                .set("enable.auto.commit", "false")
                .set("fetch.wait.max.ms", "10")
                .create()
                .expect("consumer");
            let mut tpl = TopicPartitionList::new();
            for p in 0..PARTITIONS {
                tpl.add_partition_offset(&topic, p, Offset::Beginning).unwrap();
            }
            consumer.assign(&tpl).unwrap();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Some(Ok(m)) = consumer.poll(Duration::from_millis(20)) {
                    received.lock().unwrap().insert((m.partition(), m.offset()), Instant::now());
                }
            }
        })
    };
    // Let the reader join before the first commit.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let waiter = Waiter::new(pool.clone()).await.expect("waiter");
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("enable.idempotence", "true")
        .set("transactional.id", format!("bench-fresh-{}-{n}", std::process::id()))
        .set("linger.ms", "0")
        .create()
        .expect("producer");
    let init = producer.clone();
    tokio::task::spawn_blocking(move || init.init_transactions(Duration::from_secs(30))).await.unwrap().unwrap();
    // A projector at the head has been running: its first batches, which open its PostgreSQL
    // connections (a TLS set-up each, tens of milliseconds of CPU), are a cold start, not its
    // freshness. A first transaction, applied before the measured traffic starts, takes them.
    let primed = stream.len().min(100);
    for (partition, offset) in transaction(&producer, &topic, &stream[..primed]).await {
        let applied = waiter.wait_for_offset("bank_accounts", &topic, partition, offset, Duration::from_secs(30)).await;
        applied.expect("the projector applied the first transaction");
    }

    let mut commits: Vec<((i32, i64), Instant)> = Vec::new();
    let mut waits = tokio::task::JoinSet::new();
    let started = Instant::now();
    let counted_from = started + Duration::from_secs(1);
    let mut sent = primed;
    while started.elapsed().as_secs_f64() < seconds + 1.0 && sent < stream.len() {
        let due = (primed + (started.elapsed().as_secs_f64() * rate) as usize).min(stream.len());
        if due <= sent {
            tokio::time::sleep(Duration::from_micros(500)).await;
            continue;
        }
        let delivered = transaction(&producer, &topic, &stream[sent..due]).await;
        let committed = Instant::now();
        // One wait per partition of the transaction, for its last offset there: the events
        // before it on the partition are applied no later (a partition applies in order),
        // so its time is an upper bound of theirs, counted for each of them. (A wait per
        // event costs the bench's process a quarter of a core at 10k/s, taken from the
        // projector's two.)
        let mut last: HashMap<i32, (i64, usize)> = HashMap::new();
        for at in delivered {
            commits.push((at, committed));
            let (offset, events) = last.entry(at.0).or_insert((at.1, 0));
            *offset = (*offset).max(at.1);
            *events += 1;
        }
        for (partition, (offset, events)) in last {
            let (waiter, topic) = (waiter.clone(), topic.clone());
            waits.spawn(async move {
                match waiter.wait_for_offset("bank_accounts", &topic, partition, offset, Duration::from_secs(30)).await
                {
                    Ok(_) => Ok((committed >= counted_from).then(|| (committed.elapsed(), events))),
                    Err(e) => Err(((partition, offset), e.to_string())),
                }
            });
        }
        sent = due;
    }
    let achieved = (sent - primed) as f64 / started.elapsed().as_secs_f64();
    let mut projector = Vec::with_capacity(sent);
    let mut unapplied = Vec::new();
    while let Some(took) = waits.join_next().await {
        match took.unwrap() {
            Ok(Some((took, events))) => projector.extend(std::iter::repeat_n(took.as_secs_f64() * 1000.0, events)),
            Ok(None) => {}
            Err(timed_out) => unapplied.push(timed_out),
        }
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while received.lock().unwrap().len() < sent && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = reader.join();
    let received = std::mem::take(&mut *received.lock().unwrap());
    // A wait that timed out: the projector's, or the broker's (a read_committed reader that
    // never got the event either: the broker held it back)?
    if let Some((at, error)) = unapplied.first() {
        let reader_too = unapplied.iter().filter(|(at, _)| !received.contains_key(at)).count();
        panic!(
            "{} waits (a transaction's last event on a partition) of {sent} events saw it not applied within 30 s of \
             its commit, the first {at:?}: {error}; the read_committed reader never received {reader_too} of them",
            unapplied.len()
        );
    }
    assert!(commits.iter().all(|(at, _)| received.contains_key(at)), "the read_committed reader received every event");
    let mut broker: Vec<f64> = commits
        .iter()
        .filter(|(_, committed)| *committed >= counted_from)
        .map(|(at, committed)| received[at].saturating_duration_since(*committed).as_secs_f64() * 1000.0)
        .collect();
    let batches = metrics_addr.lock().unwrap().clone().map(|addr| batch_summary(&addr)).unwrap_or_default();
    println!("  freshness at {rate:.0}/s: {batches}");
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let _ = child.wait();
    // Each account's versions arrive in order, redeliveries after them: the prefix sent
    // applies up to each account's highest version in it.
    let mut highest: HashMap<&str, i64> = HashMap::new();
    for e in &stream[..sent] {
        let v = highest.entry(e.aggregate_id.as_str()).or_default();
        *v = (*v).max(e.version);
    }
    assert_eq!(versions(&pool).await, highest.values().sum::<i64>(), "the projector applied every event");
    projector.sort_by(f64::total_cmp);
    broker.sort_by(f64::total_cmp);
    (achieved, Latencies(projector), Latencies(broker))
}

/// The projector's batches, from its `/metrics`: how many, their mean size and mean time
/// to apply and commit, and the share of them over 10, 25 and 50 ms.
fn batch_summary(addr: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(addr) else { return String::new() };
    let _ = stream.write_all(format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes());
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    let value =
        |name: &str| text.lines().find(|l| l.starts_with(name)).and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
    let (Some(count), Some(size), Some(took)) = (
        value("projectionist_batch_size_events_count"),
        value("projectionist_batch_size_events_sum"),
        value("projectionist_batch_duration_seconds_sum"),
    ) else {
        return "batch metrics not found".to_owned();
    };
    // The share of batches over 10, 25 and 50 ms, from the exporter's histogram buckets.
    let within = |le: &str| {
        let bucket = format!("le=\"{le}\"");
        let line =
            text.lines().find(|l| l.starts_with("projectionist_batch_duration_seconds_bucket") && l.contains(&bucket));
        line.and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).map_or(f64::NAN, |n| 100.0 * (1.0 - n / count))
    };
    format!(
        "{count:.0} batches, {:.1} events and {:.2} ms to apply and commit each on average; over 10 ms {:.1} %, \
         over 25 ms {:.2} %, over 50 ms {:.2} %",
        size / count,
        took / count * 1000.0,
        within("0.01"),
        within("0.025"),
        within("0.05"),
    )
}

/// Publishes `events` in one producer transaction, committed: where each went.
async fn transaction(
    producer: &rdkafka::producer::FutureProducer,
    topic: &str,
    events: &[RawEnvelope],
) -> Vec<(i32, i64)> {
    use rdkafka::producer::FutureRecord;
    producer.begin_transaction().unwrap();
    let payloads: Vec<Vec<u8>> = events.iter().map(RawEnvelope::to_json).collect();
    let sends = events.iter().zip(&payloads).map(|(e, p)| {
        producer.send(FutureRecord::to(topic).key(&e.aggregate_id).payload(p.as_slice()), Duration::from_secs(30))
    });
    let delivered: Vec<(i32, i64)> = futures_util::future::join_all(sends)
        .await
        .into_iter()
        .map(|d| d.map(|d| (d.partition, d.offset)).map_err(|(e, _)| e).expect("delivered"))
        .collect();
    let p = producer.clone();
    tokio::task::spawn_blocking(move || p.commit_transaction(Duration::from_secs(30))).await.unwrap().unwrap();
    delivered
}

async fn versions(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT coalesce(sum(version), 0)::bigint FROM bank_accounts").fetch_one(pool).await.unwrap()
}

#[tokio::main]
async fn main() {
    // The size issue 19 set the rebuild's targets on (1.05M deliveries): at 500k a rebuild
    // lasts about a second, a fifth of it what it spends whatever its size (docs/benchmark.md).
    let deliveries = env_usize("BENCH_DELIVERIES", 1_050_000);
    let rss_deliveries = env_usize("BENCH_RSS_DELIVERIES", 10_000_000);
    let events = stream(deliveries);
    // The orders arm alone (child rows and deletes): what to run while working on it.
    if env_usize("BENCH_ORDERS_ONLY", 0) != 0 {
        let (of_ceiling, rebuild) = orders::arm().await;
        println!("  orders: pipeline / PostgreSQL ceiling {of_ceiling:>6.2}   (>= 0.7; median of the rounds)");
        println!("  orders: rebuild / pipeline            {rebuild:>6.2}   (>= 2; median of the rounds)");
        drop_topics().await;
        return;
    }
    // The peer arm alone (Kafka Connect with Debezium's JDBC sink).
    if env_usize("BENCH_PEER_ONLY", 0) != 0 {
        if let Some(compared) = peer::arm(&events).await {
            print_peer(&compared);
        }
        drop_topics().await;
        return;
    }
    // The freshness arm alone, at one rate: what to run while working on it, without the
    // other arms' minutes.
    if let Some(rate) = std::env::var("BENCH_FRESHNESS_ONLY").ok().and_then(|r| r.parse::<f64>().ok()) {
        let seconds = env_usize("BENCH_FRESHNESS_SECONDS", FRESHNESS_SECONDS) as f64;
        let (achieved, projector, broker) = freshness(rate, seconds, &events).await;
        println!("  freshness ({achieved:>6.0}/s): projector {}; broker alone {}", projector.show(), broker.show());
        println!("  freshness p99 over the broker's {:>6.1} ms", projector.at(0.99) - broker.at(0.99));
        drop_topics().await;
        return;
    }
    let distinct: std::collections::HashMap<&str, i64> =
        events.iter().fold(std::collections::HashMap::new(), |mut m, e| {
            let v = m.entry(e.aggregate_id.as_str()).or_insert(0);
            *v = (*v).max(e.version);
            m
        });
    let want: i64 = distinct.values().sum();
    println!(
        "projectionist throughput: {} deliveries ({} distinct events, {} accounts), {PARTITIONS} partitions",
        events.len(),
        want,
        distinct.len()
    );

    let (topic, produce) = publish(&events).await;
    println!("  produce (setup, not compared)               {produce:>10.0} deliveries/s");
    let drain = kafka_drain(&topic, events.len());
    println!("  Kafka alone (read_committed drain)          {drain:>10.0} deliveries/s");

    let (pool, url) = fresh_database("projectionist_bench_pipeline").await;
    let first_run = pipeline(&url, &topic, events.len(), &["--reset"]);
    let (first, rss_small) = (first_run.rate, first_run.rss_mib);
    assert_eq!(versions(&pool).await, want, "the pipeline applied every event");
    println!("  pipeline (Kafka -> gate -> checkpoint)      {first:>10.0} deliveries/s");
    let replay_run = pipeline(&url, &topic, events.len(), &["--from-beginning"]);
    let replay = replay_run.rate;
    assert_eq!(versions(&pool).await, want, "the replay changed nothing");
    println!("  replay of the projected stream (all dups)   {replay:>10.0} deliveries/s");

    // The same stream with 0.1 % of its deliveries poison (data that does not decode), spread
    // over the aggregates: each is dead-lettered and parks its aggregate; the rest flows.
    // BENCH_POISON=0 skips it (a build from before dead letters halts on poison).
    let poison = if env_usize("BENCH_POISON", 1) == 0 {
        None
    } else {
        let mut poisoned = events.clone();
        for e in poisoned.iter_mut().skip(500).step_by(1000) {
            e.data = serde_json::json!({ "amount": "poison", "owner": 0 });
        }
        let (poison_topic, _) = publish(&poisoned).await;
        let (poison_pool, poison_url) = fresh_database("projectionist_bench_poison").await;
        let poison_run = pipeline(&poison_url, &poison_topic, poisoned.len(), &["--reset"]);
        let (dead, parked): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM projectionist_dead_letters), (SELECT count(*) FROM projectionist_parked)",
        )
        .fetch_one(&poison_pool)
        .await
        .unwrap();
        assert!(dead > 0, "the poison events were dead-lettered");
        let poison = poison_run.rate;
        println!(
        "  pipeline, 0.1 % of deliveries poison        {poison:>10.0} deliveries/s   ({dead} dead letters, {parked} \
        aggregates parked)"
    );
        Some(poison)
    };

    // A rebuild of the projected stream beside the pipeline's tables, swapped in at the end.
    // BENCH_REBUILD=0 skips it (a build from before `rebuild`).
    let rebuilt = if env_usize("BENCH_REBUILD", 1) == 0 {
        None
    } else {
        // Its rate, measured as the pipeline's and the ceilings' are: with nothing else
        // querying PostgreSQL.
        let (rebuild_url, rebuild_topic, n) = (url.clone(), topic.clone(), events.len());
        let alone = tokio::task::spawn_blocking(move || rebuild(&rebuild_url, &rebuild_topic, n)).await.unwrap();
        assert_eq!(versions(&pool).await, want, "the rebuild built every event");
        drop_old(&url);
        // Then again with readers on the live table all along, as an application's (a query
        // every 10 ms each, each a scan of the whole table): the swap is measured with them
        // running, and none may see the read model shrink.
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (pool, stop) = (pool.clone(), stop.clone());
                tokio::spawn(async move {
                    let (mut last, mut reads) = ((0_i64, 0_i64), 0_u64);
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let now: (i64, i64) =
                            sqlx::query_as("SELECT count(*), coalesce(sum(version), 0)::bigint FROM bank_accounts")
                                .fetch_one(&pool)
                                .await
                                .expect("a reader never gets an error");
                        assert!(now.0 >= last.0 && now.1 >= last.1, "a reader saw the read model shrink");
                        (last, reads) = (now, reads + 1);
                        // An application's pace, not a load test: the pipeline ran without them.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    reads
                })
            })
            .collect();
        let (rebuild_url, rebuild_topic, n) = (url.clone(), topic.clone(), events.len());
        let run = tokio::task::spawn_blocking(move || rebuild(&rebuild_url, &rebuild_topic, n)).await.unwrap();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut reads = 0;
        for reader in readers {
            reads += reader.await.unwrap();
        }
        assert_eq!(versions(&pool).await, want, "the rebuild built every event");
        let swap = run.swap_ms.map_or("?".to_owned(), |ms| ms.to_string());
        println!(
            "  rebuild beside the live tables, swapped     {:>10.0} deliveries/s   (peak RSS {:.1} MiB)",
            alone.rate, alone.rss_mib
        );
        println!(
            "  rebuild again, 2 readers on the live table  {:>10.0} deliveries/s   (swap {swap} ms, {reads} reads, \
             none saw it shrink)",
            run.rate
        );
        println!("  start to exit: run --reset {}", first_run.timeline());
        println!("                 rebuild     {}", alone.timeline());
        Some((alone.rate, alone.start_to_exit))
    };

    let (ceiling_pool, _) = fresh_database("projectionist_bench_ceiling").await;
    let ceiling = ceiling(&ceiling_pool, &events).await;
    assert_eq!(versions(&ceiling_pool).await, want, "the ceiling applied every event");
    println!("  PostgreSQL alone (staged, set-based waves)  {ceiling:>10.0} deliveries/s");
    let folded = folded_ceiling(&ceiling_pool, events.len()).await;
    assert_eq!(versions(&ceiling_pool).await, want, "the folded ceiling built every account");
    println!("  PostgreSQL alone, folded (one INSERT…SELECT) {folded:>9.0} deliveries/s");

    let inbox_n = env_usize("BENCH_INBOX_DELIVERIES", 20_000).min(events.len());
    let (inbox_pool, _) = fresh_database("projectionist_bench_inbox").await;
    let inbox = inbox(&inbox_pool, &events[..inbox_n]).await;
    println!("  naive inbox (tx + processed_messages/event) {inbox:>10.0} deliveries/s   (first {inbox_n} deliveries)");

    // Freshness: commit -> row visible through the waiter, beside commit -> read_committed
    // receipt, at fixed rates. BENCH_FRESHNESS=0 skips it (a build from before the waits).
    let mut fresh = Vec::new();
    if env_usize("BENCH_FRESHNESS", 1) != 0 {
        let seconds = env_usize("BENCH_FRESHNESS_SECONDS", FRESHNESS_SECONDS) as f64;
        for (label, rate, target) in
            [("1k/s", 1_000.0, 20.0), ("10k/s", 10_000.0, 20.0), ("half max", first / 2.0, 100.0)]
        {
            let (achieved, projector, broker) = freshness(rate, seconds, &events).await;
            println!(
                "  freshness at {label:<8} ({achieved:>6.0}/s): projector {}; broker alone {}",
                projector.show(),
                broker.show()
            );
            fresh.push((label, projector.at(0.99) - broker.at(0.99), target));
        }
    }

    println!("  peak RSS of the pipeline                    {rss_small:>10.1} MiB   at {} deliveries", events.len());
    if rss_deliveries > 0 {
        // Generated and published as it goes: the stream never in memory as a whole.
        let accounts = (rss_deliveries / 26).max(10);
        let big = bank_accounts::generate::deliveries(accounts, 45, 0.10, 0.05, 7);
        let (big_topic, big_len, _) = publish_all("bench.accounts", big).await;
        let big_want = bank_accounts::generate::expectation(accounts, 45, 7).version_sum;
        let (big_pool, big_url) = fresh_database("projectionist_bench_rss").await;
        let big_run = pipeline(&big_url, &big_topic, big_len, &["--reset"]);
        assert_eq!(versions(&big_pool).await, big_want, "the pipeline applied every event of the large stream");
        let (big_rate, rss_big) = (big_run.rate, big_run.rss_mib);
        let cpu_us = big_run.cpu_seconds / big_len as f64 * 1e6;
        println!(
            "  peak RSS of the pipeline                    {rss_big:>10.1} MiB   at {big_len} deliveries \
            ({big_rate:.0} deliveries/s, {cpu_us:.2} us CPU per delivery)"
        );
        if env_usize("BENCH_REBUILD", 1) != 0 {
            let big_rebuild = rebuild(&big_url, &big_topic, big_len);
            assert_eq!(versions(&big_pool).await, big_want, "the rebuild built every event of the large stream");
            let cpu_us = big_rebuild.cpu_seconds / big_len as f64 * 1e6;
            println!(
                "  peak RSS of a rebuild                       {:>10.1} MiB   at {big_len} deliveries ({:.0} \
                deliveries/s, {cpu_us:.2} us CPU per delivery, {:.2} x the pipeline)",
                big_rebuild.rss_mib,
                big_rebuild.rate,
                big_rebuild.rate / big_rate
            );
        }
        // Its database is done with: dropped now, with the gigabytes of page cache it holds.
        big_pool.close().await;
        drop_database(&mut admin_connection().await.2, "projectionist_bench_rss").await;
    }
    // So are the topics so far (the larger stream's 10M deliveries among them): deleted now,
    // not at the end, so that the arms after run on a machine that does not hold them.
    drop_topics().await;
    let per_delivery = |run: &Run| run.cpu_seconds / events.len() as f64 * 1e6;
    println!(
        "  projector CPU per delivery (user+sys)      {:>10.2} us   first pass ({:.2} s); replay {:.2} us ({:.2} s)",
        per_delivery(&first_run),
        first_run.cpu_seconds,
        per_delivery(&replay_run),
        replay_run.cpu_seconds
    );
    // The arms below print as they go: the bank stream's own figures come first.
    // Against Kafka Connect with Debezium's JDBC sink: BENCH_PEER=0 skips it.
    let peer = if env_usize("BENCH_PEER", 1) == 0 { None } else { peer::arm(&events).await };
    // Child rows and deletes: BENCH_ORDERS=0 skips it (a build from before them).
    let orders = if env_usize("BENCH_ORDERS", 1) == 0 { None } else { Some(orders::arm().await) };
    println!("ratios (targets in parentheses):");
    println!("  pipeline / PostgreSQL ceiling  {:>6.2}   (>= 0.7)", first / ceiling);
    println!("  pipeline / naive inbox         {:>6.1}   (>= 30)", first / inbox);
    println!("  replay / first pass            {:>6.2}   (>= 1.0)", replay / first);
    if let Some(poison) = poison {
        println!("  0.1 % poison / clean pipeline  {:>6.2}   (>= 0.9)", poison / first);
    }
    if let Some((rebuilt, rebuild_took)) = rebuilt {
        println!("  rebuild / folded ceiling       {:>6.2}   (>= 0.5)", rebuilt / folded);
        println!("  rebuild / pipeline             {:>6.2}   (>= 2.5)", rebuilt / first);
        let (run_took, rebuild_took) = (first_run.start_to_exit.as_secs_f64(), rebuild_took.as_secs_f64());
        println!("  run --reset / rebuild, start to exit {:>6.2}   (>= 2.5)", run_took / rebuild_took);
    }
    for (label, over, target) in fresh {
        println!("  freshness p99 over the broker's, {label:<8} {over:>6.1} ms   (<= {target} ms)");
    }
    if let Some((of_ceiling, rebuild)) = orders {
        println!("  orders: pipeline / PostgreSQL ceiling {of_ceiling:>6.2}   (>= 0.7; median of the rounds)");
        println!("  orders: rebuild / pipeline            {rebuild:>6.2}   (>= 2; median of the rounds)");
    }
    if let Some(compared) = &peer {
        print_peer(compared);
    }
    println!("  pipeline / Kafka drain         {:>6.2}", first / drain);
    drop_topics().await;
}

fn print_peer(compared: &peer::Compared) {
    let (ours, sink) = compared.wrong;
    println!(
        "  projectionist / Kafka Connect JDBC sink, with re-sends {:>6.2}   (>= 10; wrong rows {ours} against {sink})",
        compared.with_resends
    );
    println!("  projectionist / Kafka Connect JDBC sink, in order      {:>6.2}", compared.in_order);
    println!(
        "  projectionist rebuild / the sink, with re-sends        {:>6.2}   (in order {:.2}; each from offset zero)",
        compared.rebuild.0, compared.rebuild.1
    );
}
