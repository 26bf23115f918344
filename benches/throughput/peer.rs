//! The peer arm: projectionist against what a user would deploy instead for "events from
//! Kafka into PostgreSQL tables", Kafka Connect (standalone) with Debezium's JDBC sink in
//! upsert mode keyed by the account (issue 44). Both get the same deliveries of the bank
//! stream, duplicates and re-sends included, as state-transfer records (the account's row
//! after each event): projectionist as envelopes into `account_states` (upserts gated by the
//! version), the sink as JSON records with their schema into `accounts`. Then the same with
//! the stream's out-of-order re-sends removed. Each read model is compared with the oracle.
//! Both tables are made as a user would make a table each row of which is written over
//! many times: at fillfactor 50, so that an update finds room on its page.
//! Projectionist's `rebuild` of the same table from offset zero is timed too: the sink
//! builds its table from offset zero into an empty table, and building a read model from a
//! topic's beginning is what `rebuild` is for (the pipeline, `run`, is what keeps it fresh).
//!
//! `BENCH_PEER=0` skips it, `BENCH_PEER_ONLY=1` runs it alone; it takes the bench's stream
//! (`BENCH_DELIVERIES`). `scripts/bench.sh` fetches the jars (`scripts/services.sh
//! --kafka-connect`), or skips the arm saying why.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bank_accounts::states::AccountStates;
use projectionist::postgres::migrate;
use projectionist::RawEnvelope;
use sqlx::PgPool;

use super::{empty_database, publish_all, publish_records, Bin, Run};

const ACCOUNT_STATES: Bin = Bin {
    var: "ACCOUNT_STATES_BIN",
    default: "target/release/account-states",
    topic_var: "ACCOUNT_STATES_TOPIC",
    package: "bank-accounts",
};

/// Debezium's `batch.size` and the consumer's `max.poll.records` (both 500 by default): a
/// batch is never larger than one poll, so both are raised together, as Debezium's
/// documentation of `batch.size` and its post on batching advise. 2000 ran about twice as
/// fast as the defaults here. `BENCH_PEER_SINK_BATCH` sets another.
fn sink_batch() -> usize {
    super::env_usize("BENCH_PEER_SINK_BATCH", 2000)
}

/// Parameters added to the sink's JDBC URL (`BENCH_PEER_JDBC_PARAMS`, e.g.
/// `reWriteBatchedInserts=true`); none by default.
fn jdbc_params() -> Option<String> {
    std::env::var("BENCH_PEER_JDBC_PARAMS").ok()
}

/// Connector properties added to the sink's (`BENCH_PEER_SINK_PROPS`, comma-separated
/// `key=value`s, e.g. `use.reduction.buffer=true`); none by default.
fn sink_props() -> Vec<String> {
    std::env::var("BENCH_PEER_SINK_PROPS").map_or(Vec::new(), |p| p.split(',').map(str::to_owned).collect())
}

/// Projectionist's bound of a batch for this arm, `run` and `rebuild` alike
/// (`BENCH_PEER_BATCH`; 0: its defaults). Each side is tuned for a catch-up from offset zero:
/// the sink's batch raised from its default, projectionist's from 5,000 events, with its
/// bytes' bound raised to match.
fn projectionist_batch() -> Option<usize> {
    Some(super::env_usize("BENCH_PEER_BATCH", 50_000)).filter(|&n| n > 0)
}

/// One account's row: owner, balance, status, version.
type Row = (String, i64, String, i64);

/// What one side did with one stream.
struct Side {
    /// Deliveries per second, from its first assignment (projectionist) or its task
    /// running (the sink) to all rows written: projectionist's last batch committed (it says
    /// so as it stops), the sink's rows polled for; neither's exit counted.
    rate: f64,
    /// From the process's start to all rows written.
    start_to_done: Duration,
    rss_mib: f64,
    /// The process's CPU over its whole run, start-up included.
    cpu_seconds: f64,
    /// Of which after its start-up, where told apart (the sink's, after its task runs).
    cpu_after_start: Option<f64>,
    /// The machine's CPU from the start to all rows written: every process's (PostgreSQL's
    /// and the broker's too).
    machine_cpu_seconds: f64,
    /// Rows that are not the account's last state: an older state written over a newer one.
    wrong: usize,
}

/// The arm: prints its figures and returns projectionist / sink for the stream with re-sends
/// and in order, with each side's wrong rows on the first.
pub(super) async fn arm(events: &[RawEnvelope]) -> Option<Compared> {
    let (Ok(libs), Ok(plugins)) = (std::env::var("KAFKA_CONNECT_LIBS"), std::env::var("KAFKA_CONNECT_PLUGINS")) else {
        println!(
            "peer (Kafka Connect + Debezium JDBC sink): skipped, its jars are not fetched (scripts/bench.sh does)"
        );
        return None;
    };
    let versions = std::env::var("KAFKA_CONNECT_VERSIONS").unwrap_or_default();
    println!(
        "peer: projectionist against Kafka Connect with Debezium's JDBC sink ({versions}; upsert keyed by account_id, \
         both tables at fillfactor 50, batch.size and max.poll.records {}{}{}; projectionist {}), {} partitions, one task each",
        sink_batch(),
        jdbc_params().map_or(String::new(), |p| format!(", JDBC URL ?{p}")),
        sink_props().iter().map(|kv| format!(", {kv}")).collect::<String>(),
        projectionist_batch().map_or("its default batches".to_owned(), |n| format!("batches of up to {n} events")),
        super::PARTITIONS
    );
    let mut results = Vec::new();
    for (label, deliveries) in [("with re-sends", events.to_vec()), ("in order", in_order(events))] {
        let states = bank_accounts::generate::state_transfer(&deliveries);
        let oracle = last_states(&states);
        let (ours, rebuilt) = projectionist(&states, &oracle).await;
        let sink = sink(&states, &oracle, &libs, &plugins).await;
        println!(
            "  {label:<14} {} deliveries: projectionist {:>8.0}/s, {} wrong rows of {}; its rebuild {:>8.0}/s, {} wrong \
             rows; sink {:>8.0}/s, {} wrong rows",
            states.len(),
            ours.rate,
            ours.wrong,
            oracle.len(),
            rebuilt.rate,
            rebuilt.wrong,
            sink.rate,
            sink.wrong
        );
        for (who, side) in [("projectionist", &ours), ("its rebuild", &rebuilt), ("sink (its JVM)", &sink)] {
            let per_delivery = |cpu: f64| cpu / states.len() as f64 * 1e6;
            let after_start = side
                .cpu_after_start
                .map_or(String::new(), |cpu| format!(" ({:.2} us after its start-up)", per_delivery(cpu)));
            println!(
                "    {who:<15} start to done {:>6.1} s, peak RSS {:>6.1} MiB, CPU per delivery {:>6.2} us{after_start}; \
                 the machine's {:>6.2} us",
                side.start_to_done.as_secs_f64(),
                side.rss_mib,
                per_delivery(side.cpu_seconds),
                per_delivery(side.machine_cpu_seconds)
            );
        }
        results.push((ours, rebuilt, sink));
    }
    let [(ours, rebuilt, sink), (ours_in_order, rebuilt_in_order, sink_in_order)] = <[_; 2]>::try_from(results).ok()?;
    Some(Compared {
        with_resends: ours.rate / sink.rate,
        in_order: ours_in_order.rate / sink_in_order.rate,
        rebuild: (rebuilt.rate / sink.rate, rebuilt_in_order.rate / sink_in_order.rate),
        wrong: (ours.wrong.max(rebuilt.wrong), sink.wrong),
    })
}

/// The arm's ratios, for the summary.
pub(super) struct Compared {
    pub with_resends: f64,
    pub in_order: f64,
    /// Projectionist's `rebuild` / sink, with re-sends and in order.
    pub rebuild: (f64, f64),
    /// Wrong rows of projectionist (the more of its run's and its rebuild's) and of the
    /// sink, on the stream with re-sends.
    pub wrong: (usize, usize),
}

/// `events` without the deliveries that come after a newer version of their account (late
/// re-sends and duplicates): each account's deliveries in version order.
fn in_order(events: &[RawEnvelope]) -> Vec<RawEnvelope> {
    let mut newest: HashMap<&str, i64> = HashMap::new();
    let kept = events.iter().filter(|e| {
        let at = newest.entry(&e.aggregate_id).or_insert(0);
        let keep = e.version >= *at;
        *at = (*at).max(e.version);
        keep
    });
    kept.cloned().collect()
}

/// Each account's row at its newest version: the oracle.
fn last_states(states: &[RawEnvelope]) -> BTreeMap<String, Row> {
    let mut rows: BTreeMap<String, Row> = BTreeMap::new();
    for s in states {
        let row = row(s);
        let at = rows.entry(s.aggregate_id.clone()).or_insert_with(|| row.clone());
        if row.3 > at.3 {
            *at = row;
        }
    }
    rows
}

fn row(state: &RawEnvelope) -> Row {
    let text = |f: &str| state.data[f].as_str().expect("a text field").to_owned();
    (text("owner"), state.data["balance_cents"].as_i64().expect("cents"), text("status"), state.version)
}

/// Rows of `table` (`account_id` and the row's four columns) that are not the oracle's.
async fn wrong_rows(pool: &PgPool, table: &str, oracle: &BTreeMap<String, Row>) -> usize {
    let sql = format!("SELECT account_id, owner, balance_cents, status, version FROM {table}");
    let rows: Vec<(String, String, i64, String, i64)> = sqlx::query_as(&sql).fetch_all(pool).await.unwrap();
    let found: BTreeMap<String, Row> = rows.into_iter().map(|(id, o, b, s, v)| (id, (o, b, s, v))).collect();
    oracle.iter().filter(|(id, want)| found.get(*id) != Some(want)).count()
}

/// Projectionist's side: its pipeline (`run`) from offset zero to the head, then its
/// `rebuild` of the same table from offset zero, swapped in beside the live one.
async fn projectionist(states: &[RawEnvelope], oracle: &BTreeMap<String, Row>) -> (Side, Side) {
    let (topic, _, _) = publish_all("bench.peer.states", states.iter().cloned()).await;
    let (pool, url) = empty_database("projectionist_bench_peer").await;
    migrate(&pool, &[&AccountStates]).await.unwrap();
    let mut sides = Vec::new();
    let batch: Vec<String> = projectionist_batch().map_or(Vec::new(), |n| {
        vec!["--batch-max-events".into(), n.to_string(), "--batch-max-bytes".into(), (32 << 20).to_string()]
    });
    let batch: Vec<&str> = batch.iter().map(String::as_str).collect();
    let run_args = [&["--reset", "--exit-when-caught-up"][..], &batch].concat();
    for (command, args) in [("run", &run_args), ("rebuild", &batch)] {
        let busy = machine_cpu_seconds();
        let run: Run = ACCOUNT_STATES.projector(command, &url, &topic, states.len(), args);
        let machine_cpu_seconds = machine_cpu_seconds() - busy;
        sides.push(Side {
            // Both sides to all rows written (the sink's is polled for), the exit left out.
            rate: states.len() as f64 / (run.start_to_exit - run.to_assigned - run.closing).as_secs_f64(),
            start_to_done: run.start_to_exit - run.closing,
            rss_mib: run.rss_mib,
            cpu_seconds: run.cpu_seconds,
            cpu_after_start: None,
            machine_cpu_seconds,
            wrong: wrong_rows(&pool, "account_states", oracle).await,
        });
    }
    let rebuilt = sides.pop().expect("the rebuild's side");
    (sides.pop().expect("the run's side"), rebuilt)
}

/// The sink's side: its records published, Kafka Connect started on them, and its table
/// polled until it holds, for every account, the last record the topic has for it (what an
/// upsert that overwrites leaves: per key, the last in offset order).
async fn sink(states: &[RawEnvelope], oracle: &BTreeMap<String, Row>, libs: &str, plugins: &str) -> Side {
    let (topic, _, _) = publish_records("bench.peer.sink", states.iter().map(sink_record)).await;
    let (pool, url) = empty_database("projectionist_bench_peer_sink").await;
    sqlx::raw_sql(
        "CREATE TABLE accounts (account_id text PRIMARY KEY, owner text, balance_cents bigint, status text, \
         version bigint) WITH (fillfactor = 50)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut last: HashMap<&str, i64> = HashMap::new();
    for s in states {
        last.insert(&s.aggregate_id, s.version);
    }
    let want: i64 = last.values().sum();
    let busy = machine_cpu_seconds();
    let mut connect = Connect::start(&topic, &url, libs, plugins);
    let ready = connect.wait_running();
    let cpu_at_ready = connect.cpu_seconds();
    loop {
        let (rows, sum): (i64, Option<i64>) =
            sqlx::query_as("SELECT count(*), sum(version)::bigint FROM accounts").fetch_one(&pool).await.unwrap();
        if rows == last.len() as i64 && sum == Some(want) {
            break;
        }
        connect.check_running();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let done = Instant::now();
    let machine_cpu_seconds = machine_cpu_seconds() - busy;
    let (cpu_seconds, rss_mib) = (connect.cpu_seconds(), connect.peak_rss_mib());
    connect.stop();
    Side {
        rate: states.len() as f64 / (done - ready).as_secs_f64(),
        start_to_done: done - connect.started,
        rss_mib,
        cpu_seconds,
        cpu_after_start: Some(cpu_seconds - cpu_at_ready),
        machine_cpu_seconds,
        wrong: wrong_rows(&pool, "accounts", oracle).await,
    }
}

/// A state-transfer record as Kafka Connect's JSON converter reads it, schema included (the
/// sink maps fields to columns by it, and finds the primary key in the record key's struct).
fn sink_record(state: &RawEnvelope) -> (Vec<u8>, Vec<u8>) {
    let field =
        |name: &str, ty: &str| serde_json::json!({ "field": name, "type": ty, "optional": name != "account_id" });
    let key = serde_json::json!({
        "schema": { "type": "struct", "name": "bench.AccountKey", "optional": false,
                    "fields": [field("account_id", "string")] },
        "payload": { "account_id": state.aggregate_id },
    });
    let (owner, balance, status, version) = row(state);
    let value = serde_json::json!({
        "schema": { "type": "struct", "name": "bench.Account", "optional": false, "fields": [
            field("account_id", "string"), field("owner", "string"), field("balance_cents", "int64"),
            field("status", "string"), field("version", "int64"),
        ] },
        "payload": { "account_id": state.aggregate_id, "owner": owner, "balance_cents": balance,
                     "status": status, "version": version },
    });
    (serde_json::to_vec(&key).unwrap(), serde_json::to_vec(&value).unwrap())
}

/// A Kafka Connect worker in standalone mode with one JDBC sink connector, started by this
/// bench (and stopped by its pid, as a child of this process).
struct Connect {
    child: Child,
    dir: std::path::PathBuf,
    rest: String,
    name: String,
    started: Instant,
}

impl Connect {
    fn start(topic: &str, database_url: &str, libs: &str, plugins: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("projectionist-bench-connect-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let rest = free_port();
        let name = format!("bench-sink-{}", uuid::Uuid::new_v4().simple());
        // The database, its user and password: the bench's own (the URL it was given).
        let (jdbc, user, password) = jdbc(database_url);
        let brokers = super::brokers();
        let write = |file: &str, text: String| std::fs::write(dir.join(file), text).unwrap();
        write(
            "worker.properties",
            format!(
                "bootstrap.servers={brokers}\n\
                 key.converter=org.apache.kafka.connect.json.JsonConverter\n\
                 value.converter=org.apache.kafka.connect.json.JsonConverter\n\
                 key.converter.schemas.enable=true\nvalue.converter.schemas.enable=true\n\
                 offset.storage.file.filename={}\noffset.flush.interval.ms=5000\n\
                 plugin.path={plugins}\nlisteners=http://127.0.0.1:{rest}\n\
                 connector.client.config.override.policy=All\n",
                dir.join("connect.offsets").display()
            ),
        );
        write(
            "sink.properties",
            format!(
                "name={name}\nconnector.class=io.debezium.connector.jdbc.JdbcSinkConnector\n\
                 tasks.max={}\ntopics={topic}\nconnection.url={jdbc}\n\
                 connection.username={user}\nconnection.password={password}\n\
                 insert.mode=upsert\nprimary.key.mode=record_key\nprimary.key.fields=account_id\n\
                 collection.name.format=accounts\nschema.evolution=none\ndelete.enabled=false\n\
                 batch.size={batch}\nconsumer.override.max.poll.records={batch}\n{props}\n",
                super::PARTITIONS,
                batch = sink_batch(),
                props = sink_props().join("\n")
            ),
        );
        write(
            "log4j.properties",
            format!(
                "log4j.rootLogger=WARN, file\nlog4j.appender.file=org.apache.log4j.FileAppender\n\
                 log4j.appender.file.File={}\nlog4j.appender.file.layout=org.apache.log4j.PatternLayout\n\
                 log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n\n",
                dir.join("connect.log").display()
            ),
        );
        let started = Instant::now();
        let child = Command::new("java")
            .args(["-Xms64m", "-Xmx512m", "-XX:+UseG1GC", "-XX:MaxMetaspaceSize=256m"])
            .arg(format!("-Dlog4j.configuration=file:{}", dir.join("log4j.properties").display()))
            .args(["-cp", &format!("{libs}/*"), "org.apache.kafka.connect.cli.ConnectStandalone"])
            .arg(dir.join("worker.properties"))
            .arg(dir.join("sink.properties"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("connect.err")).unwrap())
            .spawn()
            .expect("java (Kafka Connect)");
        Self { child, dir, rest: format!("127.0.0.1:{rest}"), name, started }
    }

    /// Waits for the connector's task to run: when it does.
    fn wait_running(&mut self) -> Instant {
        let deadline = Instant::now() + Duration::from_secs(180);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                self.fail(&format!("its JVM exited ({status})"));
            }
            if let Some(state) = self.task_state() {
                match state.as_str() {
                    "RUNNING" => return Instant::now(),
                    "FAILED" => self.fail("its task failed"),
                    _ => {}
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        self.fail("its task did not run within 180 s")
    }

    /// Panics if the task failed (the JVM stays up when only the task fails).
    fn check_running(&mut self) {
        if self.task_state().as_deref() == Some("FAILED") {
            self.fail("its task failed");
        }
    }

    /// The first task's state, from the worker's REST API.
    fn task_state(&self) -> Option<String> {
        let body = http_get(&self.rest, &format!("/connectors/{}/status", self.name))?;
        let status: serde_json::Value = serde_json::from_str(&body).ok()?;
        status["tasks"][0]["state"].as_str().map(str::to_owned)
    }

    fn fail(&mut self, what: &str) -> ! {
        let status = http_get(&self.rest, &format!("/connectors/{}/status", self.name)).unwrap_or_default();
        let log = std::fs::read_to_string(self.dir.join("connect.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(20).collect();
        self.stop();
        panic!("Kafka Connect: {what}; status {status}; its log ends:\n{}", tail.join("\n"));
    }

    /// The worker's CPU so far (`utime`, `stime`).
    fn cpu_seconds(&self) -> f64 {
        super::stat_seconds(&self.child.id().to_string(), 11).unwrap_or(0.0)
    }

    fn peak_rss_mib(&self) -> f64 {
        super::peak_rss_kib(self.child.id()).unwrap_or(0) as f64 / 1024.0
    }

    /// Stops the worker by its pid (our child) and removes its files.
    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Seconds of CPU the whole machine has spent (every core, every process), from /proc/stat.
fn machine_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").expect("/proc/stat (Linux)");
    let cpu = stat.lines().next().expect("the cpu line");
    // user nice system idle iowait irq softirq steal: busy is all but idle and iowait.
    let ticks: Vec<f64> = cpu.split_whitespace().skip(1).filter_map(|t| t.parse().ok()).collect();
    let busy: f64 = ticks.iter().take(8).enumerate().filter(|(i, _)| *i != 3 && *i != 4).map(|(_, t)| t).sum();
    busy / super::clock_ticks()
}

/// A port free on 127.0.0.1 now, for the worker's REST listener.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A PostgreSQL URL as JDBC takes it: the JDBC URL, the user and the password.
fn jdbc(url: &str) -> (String, String, String) {
    let parsed: sqlx::postgres::PgConnectOptions = url.parse().expect("a PostgreSQL URL");
    let database = parsed.get_database().expect("a database in the URL");
    let params = jdbc_params().map_or(String::new(), |p| format!("?{p}"));
    let jdbc = format!("jdbc:postgresql://{}:{}/{database}{params}", parsed.get_host(), parsed.get_port());
    let password = url
        .split_once("://")
        .and_then(|(_, rest)| rest.split_once('@'))
        .and_then(|(userinfo, _)| userinfo.split_once(':'))
        .map_or(String::new(), |(_, p)| p.to_owned());
    (jdbc, parsed.get_username().to_owned(), password)
}

/// `GET path` on `addr` (HTTP/1.0, so that the server closes): the body of a 200.
fn http_get(addr: &str, path: &str) -> Option<String> {
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
}
