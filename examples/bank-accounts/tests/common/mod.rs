//! What the bank-accounts integration tests share: the broker's address, fresh topic names,
//! the read model as the generator's expectation, a plain HTTP GET, and the skip record.
#![allow(dead_code)] // each test binary uses a part

pub mod cli;
pub mod proxy;

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bank_accounts::generate::ExpectedAccount;
use sqlx::PgPool;

/// The projector binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_bank-accounts");

/// The broker: KAFKA_BROKERS, default localhost:9092.
pub fn brokers() -> String {
    std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "localhost:9092".into())
}

/// A topic name no other test uses.
pub fn rand_test_topic(name: &str) -> String {
    format!("test.{name}.{}", uuid::Uuid::new_v4().simple())
}

/// The `bank_accounts` table, as the generator's expectation reads it.
pub async fn read_model(pool: &PgPool) -> BTreeMap<String, ExpectedAccount> {
    try_read_model(pool).await.expect("the bank_accounts table read")
}

/// [`read_model`], or `None` while PostgreSQL does not answer (a fault test's).
pub async fn try_read_model(pool: &PgPool) -> Option<BTreeMap<String, ExpectedAccount>> {
    let rows: Vec<(String, String, i64, String, i64)> =
        sqlx::query_as("SELECT account_id, owner, balance, status, version FROM bank_accounts ORDER BY account_id")
            .fetch_all(pool)
            .await
            .ok()?;
    let accounts = rows
        .into_iter()
        .map(|(id, owner, balance, status, version)| (id, ExpectedAccount { owner, balance, status, version }));
    Some(accounts.collect())
}

/// `GET path` on `addr`: the status and the body.
pub async fn http_get(addr: &str, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let status = response.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default())
}

/// `scripts/services.sh ARGS…` (`--start-broker faults`, `--crash-postgres`, …): its stdout.
pub fn services(args: &[&str]) -> String {
    try_services(args).unwrap_or_else(|| panic!("services.sh {args:?} failed"))
}

/// [`services`], `None` when the script fails.
fn try_services(args: &[&str]) -> Option<String> {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/services.sh");
    let out = std::process::Command::new(script).args(args).stderr(Stdio::inherit()).output().unwrap();
    out.status.success().then(|| String::from_utf8(out.stdout).unwrap())
}

/// The `faults` broker's address (a second Apache Kafka broker that fault tests stop and
/// start), started if needed; `None` (and a skip line) off Apache Kafka.
pub fn faults_broker(test: &str) -> Option<String> {
    let broker = std::env::var("PROJECTIONIST_BROKER").unwrap_or_default();
    if !broker.starts_with("apache-kafka-") {
        skip(test, "needs Apache Kafka started by scripts/services.sh (PROJECTIONIST_BROKER unset or another broker)");
        return None;
    }
    let env = services(&["--start-broker", "faults"]);
    let brokers =
        env.split_whitespace().find_map(|w| w.strip_prefix("KAFKA_FAULTS_BROKERS=")).expect("address printed");
    Some(brokers.to_owned())
}

/// The addresses of the fault suite's three-node KRaft cluster (`scripts/services.sh
/// --start-cluster`), started if needed; `None` (and a skip line saying why) off Apache Kafka
/// or where the cluster does not start.
pub fn cluster_brokers(test: &str) -> Option<String> {
    let broker = std::env::var("PROJECTIONIST_BROKER").unwrap_or_default();
    if !broker.starts_with("apache-kafka-") {
        skip(test, "needs Apache Kafka started by scripts/services.sh (PROJECTIONIST_BROKER unset or another broker)");
        return None;
    }
    let env = try_services(&["--start-cluster"]).unwrap_or_default();
    let brokers = env.split_whitespace().find_map(|w| w.strip_prefix("KAFKA_CLUSTER_BROKERS="));
    if brokers.is_none() {
        skip(test, "the three-node cluster did not start here (its log above says why)");
    }
    brokers.map(str::to_owned)
}

/// The URL of the fault suite's own PostgreSQL cluster (`postgres` database), started if
/// needed; `None` (and a skip line) where PostgreSQL is not a local cluster we administer.
pub fn faults_postgres(test: &str) -> Option<String> {
    let env = try_services(&["--start-postgres"]).unwrap_or_default();
    let url = env.split_whitespace().find_map(|w| w.strip_prefix("PG_FAULTS_URL="));
    if url.is_none() {
        skip(
            test,
            "needs a local PostgreSQL cluster of its own (scripts/services.sh --start-postgres could not make one)",
        );
    }
    url.map(str::to_owned)
}

/// Publishes `events` to `topic` on `brokers`, keyed by aggregate, `pace` apart (an
/// idempotent producer waiting up to five minutes for each: long enough to outlast a fault,
/// as a real producer would).
pub async fn publish(brokers: String, topic: String, events: Vec<projectionist::RawEnvelope>, pace: Duration) {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("enable.idempotence", "true")
        .set("message.timeout.ms", "300000")
        .create()
        .unwrap();
    let mut sends = Vec::new();
    for e in events {
        let payload = e.to_json();
        let record = FutureRecord::to(&topic).key(&e.aggregate_id).payload(&payload);
        sends.push(producer.send_result(record).map_err(|(e, _)| e).unwrap());
        if !pace.is_zero() {
            tokio::time::sleep(pace).await;
        }
    }
    for sent in sends {
        sent.await.unwrap().map_err(|(e, _)| e).expect("delivered (within five minutes)");
    }
}

/// Records a skipped test where `scripts/test.sh` reports it.
pub fn skip(test: &str, reason: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "SKIPPED {test}: {reason}");
    if let Ok(path) = std::env::var("PROJECTIONIST_SKIP_LOG") {
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
        writeln!(f, "{test}: {reason}").unwrap();
    }
}

/// A `bank-accounts` process started with `--metrics-addr 127.0.0.1:0`: its stderr collected,
/// and the address its HTTP listener took.
pub struct Serving {
    pub child: tokio::process::Child,
    pub log: Arc<Mutex<String>>,
    pub addr: String,
}

impl Serving {
    /// Spawns `command` (stderr piped, killed on drop) and waits for its listener's address.
    pub async fn spawn(mut command: tokio::process::Command) -> Self {
        use tokio::io::{AsyncBufReadExt, BufReader};
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let collected = log.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                collected.lock().unwrap().push_str(&(line + "\n"));
            }
        });
        let started = Instant::now();
        let addr = loop {
            let found = log
                .lock()
                .unwrap()
                .lines()
                .find_map(|l| l.split("address=").nth(1).map(|a| a.split_whitespace().next().unwrap().to_owned()));
            if let Some(addr) = found {
                break addr;
            }
            assert!(started.elapsed() < Duration::from_secs(30), "no metrics listener:\n{}", log.lock().unwrap());
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        Self { child, log, addr }
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }
}

/// One partition's line of a run's summary: `read R = applied A + duplicates D + stale S +
/// ignored I + parked P + dead-lettered L + not applied U`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionAccount {
    pub partition: i32,
    /// read, applied, duplicates, stale, ignored, parked, dead-lettered, not applied.
    pub counts: [u64; 8],
}

impl PartitionAccount {
    pub fn adds_up(&self) -> bool {
        self.counts[0] == self.counts[1..].iter().sum::<u64>()
    }

    pub fn applied(&self) -> u64 {
        self.counts[1]
    }
}

/// The partition lines of `topic` in a run's summary (`stdout`).
pub fn partition_accounts(stdout: &str, topic: &str) -> Vec<PartitionAccount> {
    let prefix = format!("{topic}/");
    stdout
        .lines()
        .filter_map(|line| line.trim().strip_prefix(&prefix))
        .map(|rest| {
            let (partition, counts) = rest.split_once(": ").unwrap_or_else(|| panic!("a partition line: {rest}"));
            // The projector says so too when they do not add up; `adds_up` tells.
            let counts = counts.trim_end_matches(" (does not add up)");
            let numbers: Vec<u64> = counts
                .split(['=', '+'])
                .map(|part| {
                    let n = part.split_whitespace().last().unwrap_or_else(|| panic!("a count in {rest}"));
                    n.parse().unwrap_or_else(|e| panic!("{rest}: {e}"))
                })
                .collect();
            let counts = numbers.try_into().unwrap_or_else(|n| panic!("eight counts in {rest}: {n:?}"));
            PartitionAccount { partition: partition.parse().expect("a partition number"), counts }
        })
        .collect()
}
