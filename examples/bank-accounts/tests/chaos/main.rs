//! The fault suite (docs/testing.md): faults a production cluster sees, each against the real
//! services, each ending exact. Every scenario checks the read model against the oracle
//! computed from the published stream (every account exact: none with an event lost, none
//! with one applied twice), every partition checkpointed to its high watermark, nothing
//! dead-lettered or left parked, and then `rebuild --verify` (the read model built again from
//! the stream and compared row by row) as a second oracle. Each prints one row of the suite's
//! table (and appends it to `CHAOS_REPORT`, which `scripts/chaos.sh` prints at the end).
//!
//! Built only with the `fault-hooks` feature: the projector's kill points (see
//! `projectionist-postgres`'s `fault` module). The test command runs a short version (fewer
//! kills, shorter absences; the scenarios marked `ignore` left out); `CHAOS_FULL=1
//! --include-ignored` (`scripts/chaos.sh`) runs all of it at full strength.

mod accounting;
mod cluster;
#[path = "../common/mod.rs"]
mod common;
mod net;
mod supervision;

use accounting::{Account, Expect};

use common::{brokers, rand_test_topic, read_model};

use std::collections::BTreeMap;
use std::process::{ExitStatus, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant};

use bank_accounts::generate::{self, ExpectedAccount};
use projectionist::kafka::topics;
use projectionist::RawEnvelope;
use rdkafka::config::ClientConfig;
use sqlx::PgPool;
use tokio::process::{Child, Command};

const PARTITIONS: i32 = 4;

/// Whether the suite runs at full strength (`CHAOS_FULL=1`) or its short version.
fn full() -> bool {
    std::env::var("CHAOS_FULL").is_ok_and(|v| v == "1")
}

/// The processes of one scenario: its database, brokers, topic and group.
struct Scene {
    database_url: String,
    brokers: String,
    topic: String,
    group: String,
    /// The partition accounts of every member that stopped cleanly (see [`accounting`]).
    accounts: std::sync::Mutex<Vec<Account>>,
}

impl Scene {
    /// On the test's database (`pool`'s) and the main broker.
    async fn new(pool: &PgPool, name: &str) -> Self {
        let db = pool.connect_options().get_database().expect("test database").to_owned();
        Self::at(&std::env::var("DATABASE_URL").expect("DATABASE_URL"), &db, brokers(), name).await
    }

    /// On database `db` of the server of `url` (its parameters kept), through `brokers`: its
    /// topic replicated on each broker listed (up to three).
    async fn at(url: &str, db: &str, brokers: String, name: &str) -> Self {
        let database_url = projectionist_testing::with_database(url, db);
        let group = format!("chaos-{}", uuid::Uuid::new_v4().simple());
        let accounts = Default::default();
        let scene = Self { database_url, brokers, topic: rand_test_topic(name), group, accounts };
        let replicas = scene.brokers.split(',').count().min(3) as i32;
        topics::create_topics(&scene.brokers, &[scene.topic.as_str()], PARTITIONS, replicas).await.unwrap();
        let out = scene.cli(&["migrate"]).output().await.unwrap();
        assert!(out.status.success(), "migrate: {}", String::from_utf8_lossy(&out.stderr));
        scene
    }

    /// The projector with `args`, in the scenario's environment.
    fn cli(&self, args: &[&str]) -> Command {
        self.environment(Command::new(common::BIN), args)
    }

    /// The projector with `args`, in the scenario's environment, in network namespace `netns`.
    fn cli_in(&self, netns: &str, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", netns, common::BIN]);
        self.environment(c, args)
    }

    fn environment(&self, mut c: Command, args: &[&str]) -> Command {
        c.args(args)
            .env("DATABASE_URL", &self.database_url)
            .env("KAFKA_BROKERS", &self.brokers)
            .env("BANK_ACCOUNTS_TOPIC", &self.topic)
            .env("RUST_LOG", "info")
            .env_remove("PROJECTIONIST_FAULT")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        c
    }

    /// A `run` member of the scenario's group, small batches, killed by `fault` if given
    /// (then its log is piped).
    fn run(&self, fault: Option<&str>) -> Child {
        self.member(self.cli(&[]), fault, "off")
    }

    /// A member as [`run`](Self::run) makes one, started by `command` (the projector, or a
    /// command that runs it, with the scenario's environment) with `run`'s arguments.
    fn member(&self, mut run: Command, fault: Option<&str>, metrics_addr: &str) -> Child {
        run.args(["run", "--group-id", &self.group, "--metrics-addr", metrics_addr]);
        run.args(["--batch-max-events", "20", "--kafka-property", "session.timeout.ms=6000"])
            .args(["--kafka-property", "heartbeat.interval.ms=500"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        if let Some(fault) = fault {
            // Its log is read (by `exited`) to see where it was killed.
            run.env("PROJECTIONIST_FAULT", fault).stderr(Stdio::piped());
        }
        run.spawn().unwrap()
    }

    /// Runs one member to the high watermarks: how long it took.
    async fn run_to_the_end(&self) -> Duration {
        let started = Instant::now();
        let mut run = self.cli(&["run", "--group-id", &self.group, "--metrics-addr", "off", "--exit-when-caught-up"]);
        let out =
            tokio::time::timeout(Duration::from_secs(180), run.output()).await.expect("caught up in time").unwrap();
        assert!(out.status.success(), "run to the end: {}", String::from_utf8_lossy(&out.stderr));
        self.counted(&out.stdout);
        started.elapsed()
    }

    /// Keeps the partition accounts of a run's summary, `stdout`.
    fn counted(&self, stdout: &[u8]) {
        let accounts = accounting::parse(&String::from_utf8_lossy(stdout), &self.topic);
        self.accounts.lock().unwrap().extend(accounts);
    }

    /// SIGTERM: `member` exits 0 within a minute; its partition accounts are kept.
    async fn stop(&self, member: Child) {
        let pid = member.id().unwrap().to_string();
        std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        let out = tokio::time::timeout(Duration::from_secs(60), member.wait_with_output());
        let out = out.await.expect("stops in time").unwrap();
        assert!(out.status.success(), "exit 0 after SIGTERM: {}", out.status);
        self.counted(&out.stdout);
    }

    /// Publishes `events` keyed by aggregate, `pace` apart, in the background (an idempotent
    /// producer waiting up to five minutes for each, as a real one would through a fault).
    fn publish(&self, events: &[RawEnvelope], pace: Duration) -> tokio::task::JoinHandle<()> {
        tokio::spawn(common::publish(self.brokers.clone(), self.topic.clone(), events.to_vec(), pace))
    }

    /// Waits (up to `within`) until the read model is the oracle's for `events`, `member`
    /// running all along: how long it took.
    async fn until_exact(
        &self,
        pool: &PgPool,
        member: &mut Child,
        events: &[RawEnvelope],
        within: Duration,
    ) -> Duration {
        let (want, since) = (generate::expected(events), Instant::now());
        loop {
            assert!(member.try_wait().unwrap().is_none(), "the projector exited");
            if common::try_read_model(pool).await.as_ref() == Some(&want) {
                return since.elapsed();
            }
            assert!(since.elapsed() < within, "not exact within {within:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// From now (a fault just over): waits for `publishing`, then until the read model is
    /// the oracle's for `events`, `member` running: when all was published and when the read
    /// model was exact, both counted from now.
    async fn recovered(
        &self,
        pool: &PgPool,
        member: &mut Child,
        publishing: tokio::task::JoinHandle<()>,
        events: &[RawEnvelope],
    ) -> (Duration, Duration) {
        let back = Instant::now();
        tokio::time::timeout(Duration::from_secs(300), publishing).await.expect("published").unwrap();
        let published = back.elapsed();
        self.until_exact(pool, member, events, Duration::from_secs(180)).await;
        (published, back.elapsed())
    }
}

/// An account stream with the bank stream's duplicates and re-sends.
fn stream(accounts: usize, seed: u64) -> Vec<RawEnvelope> {
    generate::with_redeliveries(&generate::stream(accounts, 20, seed), 0.1, 0.05, seed)
}

/// Accounts with an event lost (a version behind the oracle's, or missing) and with one
/// applied twice (the oracle's version, another balance; or a version past it).
fn judge(got: &BTreeMap<String, ExpectedAccount>, want: &BTreeMap<String, ExpectedAccount>) -> (usize, usize) {
    let lost = want.iter().filter(|(id, w)| got.get(*id).is_none_or(|g| g.version < w.version)).count();
    let doubled = want
        .iter()
        .filter(|(id, w)| got.get(*id).is_some_and(|g| g.version > w.version || (g.version == w.version && g != *w)))
        .count();
    (lost, doubled + got.keys().filter(|id| !want.contains_key(*id)).count())
}

/// Ends a scenario: the oracle's checks, the partition accounts of the members that
/// stopped cleanly as `expect` says (see [`accounting`]) and `rebuild --verify`, then its row
/// of the table. Panics (after printing the row) when a check fails.
async fn conclude(
    pool: &PgPool,
    scene: &Scene,
    scenario: &str,
    done: &str,
    recovery: Duration,
    events: &[RawEnvelope],
    expect: Expect,
) {
    let (lost, doubled) = judge(&read_model(pool).await, &generate::expected(events));
    let (letters, held): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM projectionist_dead_letters), (SELECT count(*) FROM projectionist_held)",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    let checkpoints: Vec<(i32, i64)> =
        sqlx::query_as("SELECT partition, next_offset FROM projectionist_checkpoints WHERE topic = $1 ORDER BY 1")
            .bind(&scene.topic)
            .fetch_all(pool)
            .await
            .unwrap();
    let highs = high_watermarks(&scene.brokers, &scene.topic);
    let at_the_end = checkpoints.iter().all(|(p, next)| highs.get(p) == Some(next)) && checkpoints.len() == highs.len();
    let verify = scene.cli(&["rebuild", "--verify", "--metrics-addr", "off"]).output().await.unwrap();
    let verified = verify.status.success();
    let accounts = scene.accounts.lock().unwrap().clone();
    let distinct = accounting::distinct_events(&scene.brokers, &scene.topic, PARTITIONS);
    let miscounted = accounting::judge(&accounts, &distinct, expect);
    let counted = if miscounted.is_some() { "FAIL".to_owned() } else { format!("{expect:?}") };
    let pass = lost == 0 && doubled == 0 && letters == 0 && held == 0 && at_the_end && verified && miscounted.is_none();
    let row = format!(
        "{scenario:<40} | {done:<50} | {:>7.1} s | {lost:>4} | {doubled:>7} | {counted:<7} | {}",
        recovery.as_secs_f64(),
        if pass { "pass" } else { "FAIL" }
    );
    eprintln!("CHAOS {row}");
    if let Ok(path) = std::env::var("CHAOS_REPORT") {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
        writeln!(f, "{row}").unwrap();
    }
    assert_eq!((lost, doubled), (0, 0), "{scenario}: accounts with an event lost, doubled");
    assert_eq!((letters, held), (0, 0), "{scenario}: dead letters, held events");
    assert!(at_the_end, "{scenario}: checkpoints {checkpoints:?}, high watermarks {highs:?}");
    assert!(!accounts.is_empty(), "{scenario}: no member stopped cleanly with its partition accounts");
    assert_eq!(miscounted, None, "{scenario}: the partition accounts {accounts:?}");
    assert!(
        verified,
        "{scenario}: rebuild --verify: {}{}",
        String::from_utf8_lossy(&verify.stdout),
        String::from_utf8_lossy(&verify.stderr)
    );
}

/// Each partition's high watermark.
fn high_watermarks(brokers: &str, topic: &str) -> BTreeMap<i32, i64> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = ClientConfig::new().set("bootstrap.servers", brokers).create().unwrap();
    (0..PARTITIONS)
        .map(|p| (p, consumer.fetch_watermarks(topic, p, Duration::from_secs(10)).expect("watermarks").1))
        .collect()
}

/// Waits for `child` to exit (within `within`): its status and its log.
async fn exited(mut child: Child, within: Duration) -> (ExitStatus, String) {
    use tokio::io::AsyncReadExt;
    let mut stderr = child.stderr.take().unwrap();
    let mut log = String::new();
    let read = async {
        let _ = stderr.read_to_string(&mut log).await;
        child.wait().await.unwrap()
    };
    let status = tokio::time::timeout(within, read).await.expect("the projector exits in time");
    (status, log)
}

/// SIGKILLs placed by the fault hooks at a batch's commit boundaries: right before its
/// PostgreSQL commit (the transaction is lost: its events are read again) and right after it,
/// before the offsets reach Kafka (the events are applied and read again: the gates must
/// make them no-ops). Each member is killed at its n-th batch (n from 1 to 6) while the
/// stream is still being published; then one runs to the end.
#[sqlx::test(migrations = false)]
async fn sigkills_at_each_commit_boundary(pool: PgPool) {
    use std::os::unix::process::ExitStatusExt;
    let scene = Scene::new(&pool, "chaos-commit-boundaries").await;
    let kills = if full() { 40 } else { 10 };
    let events = stream(if full() { 1_500 } else { 400 }, 31);
    let (first, rest) = events.split_at(events.len() / 2);
    scene.publish(first, Duration::ZERO).await.unwrap();
    let publishing = scene.publish(rest, Duration::from_millis(2));
    for kill in 0..kills {
        let point = if kill % 2 == 0 { "after-postgres-commit" } else { "before-postgres-commit" };
        let fault = format!("{point}:{}", 1 + (kill * 7) % 6);
        let (status, log) = exited(scene.run(Some(&fault)), Duration::from_secs(120)).await;
        assert_eq!(status.signal(), Some(9), "killed at {fault}: {status}\n{log}");
        assert!(log.contains(&format!("fault point {point} reached")), "{log}");
    }
    tokio::time::timeout(Duration::from_secs(300), publishing).await.expect("published").unwrap();
    let recovery = scene.run_to_the_end().await;
    let done = format!("{kills} SIGKILLs at the commit boundaries");
    conclude(&pool, &scene, "crash at each commit boundary", &done, recovery, &events, Expect::AtMost).await;
}

/// A rebuild killed in its swap (everything done but the commit): the live tables are as they
/// were, the next `rebuild` resumes the shadow and swaps it in.
#[sqlx::test(migrations = false)]
async fn a_rebuild_killed_during_its_swap(pool: PgPool) {
    use std::os::unix::process::ExitStatusExt;
    let scene = Scene::new(&pool, "chaos-killed-swap").await;
    let events = stream(if full() { 1_000 } else { 300 }, 32);
    scene.publish(&events, Duration::ZERO).await.unwrap();
    scene.run_to_the_end().await;
    let before = read_model(&pool).await;
    let mut rebuild = scene.cli(&["rebuild", "--metrics-addr", "off"]);
    rebuild.env("PROJECTIONIST_FAULT", "before-swap-commit:1").stdout(Stdio::null()).stderr(Stdio::piped());
    let (status, log) = exited(rebuild.spawn().unwrap(), Duration::from_secs(180)).await;
    assert_eq!(status.signal(), Some(9), "killed in its swap: {status}\n{log}");
    assert_eq!(read_model(&pool).await, before, "the live tables untouched by the swap that did not commit");
    let started = Instant::now();
    let again = scene.cli(&["rebuild", "--metrics-addr", "off"]).output().await.unwrap();
    let said = String::from_utf8_lossy(&again.stdout);
    assert!(again.status.success() && said.contains("(resumed)"), "{said}{}", String::from_utf8_lossy(&again.stderr));
    let done = "rebuild SIGKILLed before its swap's commit, re-run";
    let recovery = started.elapsed();
    conclude(&pool, &scene, "a rebuild killed during its swap", done, recovery, &events, Expect::AtMost).await;
}

/// A group of three `run` processes, members SIGKILLed one after another (and started again)
/// while the stream is published: every rebalance takes partitions from a member that died
/// mid-batch.
#[sqlx::test(migrations = false)]
async fn sigkills_of_a_group_while_publishing(pool: PgPool) {
    let scene = Scene::new(&pool, "chaos-group-kills").await;
    let kills = if full() { 50 } else { 8 };
    let events = stream(if full() { 2_000 } else { 400 }, 33);
    // Published over about as long as the kills take (0.3 to 1.2 s apart).
    let pace = Duration::from_millis(750) * kills as u32 / events.len() as u32;
    let publishing = scene.publish(&events, pace);
    let mut members: Vec<Child> = (0..3).map(|_| scene.run(None)).collect();
    for kill in 0..kills {
        tokio::time::sleep(Duration::from_millis(300 + (kill as u64 * 211) % 900)).await;
        let member = &mut members[kill % 3];
        member.start_kill().unwrap(); // SIGKILL
        member.wait().await.unwrap();
        *member = scene.run(None);
    }
    tokio::time::timeout(Duration::from_secs(300), publishing).await.expect("published").unwrap();
    for mut member in members {
        member.start_kill().unwrap();
        member.wait().await.unwrap();
    }
    let recovery = scene.run_to_the_end().await;
    let done = format!("{kills} SIGKILLs of a 3-member group");
    let scenario = "SIGKILLs of a group while publishing";
    conclude(&pool, &scene, scenario, &done, recovery, &events, Expect::AtMost).await;
}

/// The broker stopped (by its recorded pid, the `faults` instance) under load and started
/// again on its durable log while a producer keeps publishing: the running member waits it
/// out.
#[sqlx::test(migrations = false)]
#[ignore = "the full fault suite only (scripts/chaos.sh); the test command restarts the broker in broker_faults.rs"]
async fn a_broker_bounced_under_load(pool: PgPool) {
    let test = "a_broker_bounced_under_load";
    let Some(brokers) = common::faults_broker(test) else { return };
    let db = pool.connect_options().get_database().expect("test database").to_owned();
    let scene = Scene::at(&std::env::var("DATABASE_URL").unwrap(), &db, brokers, "chaos-broker-bounce").await;
    let away = Duration::from_secs(if full() { 30 } else { 8 });
    // PostgreSQL up throughout: no commit's acknowledgement is lost, each event applied once.
    bounced(&pool, &scene, "a broker bounced under load", away, Expect::Exact, |up| {
        common::services(&[if up { "--start-broker" } else { "--stop-broker" }, "faults"]);
    })
    .await;
}

/// PostgreSQL crashed under load (the fault suite's own cluster, stopped `-m immediate`: no
/// clean shutdown, its committed transactions recovered from the WAL at start) and started
/// again: the running member waits it out.
#[tokio::test]
async fn postgresql_crashed_under_load() {
    let test = "postgresql_crashed_under_load";
    let Some(server) = common::faults_postgres(test) else { return };
    let db = format!("chaos_{}", uuid::Uuid::new_v4().simple());
    let admin = PgPool::connect(&server).await.unwrap();
    sqlx::query(&format!("CREATE DATABASE {db}")).execute(&admin).await.unwrap();
    let scene = Scene::at(&server, &db, brokers(), "chaos-pg-crash").await;
    let pool = PgPool::connect(&scene.database_url).await.unwrap();
    let away = Duration::from_secs(if full() { 30 } else { 8 });
    bounced(&pool, &scene, "PostgreSQL crashed under load", away, Expect::AtMost, |up| {
        common::services(&[if up { "--start-postgres" } else { "--crash-postgres" }]);
    })
    .await;
    pool.close().await;
    let admin = PgPool::connect(&server).await.unwrap();
    sqlx::query(&format!("DROP DATABASE {db} WITH (FORCE)")).execute(&admin).await.unwrap();
}

/// A service taken `away` (`toggle(false)`) under load and back (`toggle(true)`): a member
/// runs throughout, a producer publishes while the service is away (its records wait in its
/// queue when the broker is away); the member must bring the read model to the end of the stream without exiting,
/// and stop cleanly. The recovery: from the service's return to the read model exact.
async fn bounced(pool: &PgPool, scene: &Scene, scenario: &str, away: Duration, expect: Expect, toggle: impl Fn(bool)) {
    let events = stream(if full() { 1_000 } else { 300 }, 34);
    let (first, rest) = events.split_at(events.len() / 3);
    scene.publish(first, Duration::ZERO).await.unwrap();
    let mut member = scene.run(None);
    scene.until_exact(pool, &mut member, first, Duration::from_secs(60)).await;
    let publishing = scene.publish(rest, away * 3 / 4 / rest.len() as u32);
    toggle(false);
    tokio::time::sleep(away).await;
    assert!(member.try_wait().unwrap().is_none(), "the projector exited while {scenario}");
    toggle(true);
    let (published, recovery) = scene.recovered(pool, &mut member, publishing, &events).await;
    scene.stop(member).await;
    let done = format!("away {} s; all published {:.1} s after", away.as_secs(), published.as_secs_f64());
    conclude(pool, scene, scenario, &done, recovery, &events, expect).await;
}

/// A rebuild swapped in and then rolled back beside a live member, a producer publishing
/// throughout: the member writes into the swapped-in tables, then into the restored ones
/// (whose checkpoints are older: it reads again what they lack).
#[sqlx::test(migrations = false)]
async fn a_swap_and_a_rollback_beside_a_live_run(pool: PgPool) {
    let scene = Scene::new(&pool, "chaos-swap-rollback").await;
    let events = stream(if full() { 1_000 } else { 300 }, 35);
    let third = events.len() / 3;
    scene.publish(&events[..third], Duration::ZERO).await.unwrap();
    let mut member = scene.run(None);
    scene.until_exact(&pool, &mut member, &events[..third], Duration::from_secs(60)).await;
    let publishing = scene.publish(&events[third..], Duration::from_secs(6) / (events.len() - third) as u32);
    let rebuilt = scene.cli(&["rebuild", "--metrics-addr", "off"]).output().await.unwrap();
    assert!(rebuilt.status.success(), "rebuild: {}", String::from_utf8_lossy(&rebuilt.stderr));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rolled = scene.cli(&["rebuild", "--rollback"]).output().await.unwrap();
    assert!(rolled.status.success(), "rollback: {}", String::from_utf8_lossy(&rolled.stderr));
    let (_, recovery) = scene.recovered(&pool, &mut member, publishing, &events).await;
    scene.stop(member).await;
    let done = "rebuild swapped in, then rolled back, a member live";
    let scenario = "a swap and a rollback beside a live run";
    // Rolled back under the member: it applies again what the restored tables lack.
    conclude(&pool, &scene, scenario, done, recovery, &events, Expect::AddsUp).await;
}

/// The projector in a network namespace of its own (see `net`), its link to the broker cut,
/// then its link to PostgreSQL, then both, each for 30 s while a producer publishes; then
/// restored. It must wait each cut out, not exit, and end exact.
#[sqlx::test(migrations = false)]
#[ignore = "the full fault suite only (scripts/chaos.sh)"]
async fn network_cuts_under_load(pool: PgPool) {
    use net::{Link, Net};
    let test = "network_cuts_under_load";
    let scene = Scene::new(&pool, "chaos-network-cuts").await;
    let url = sqlx::postgres::PgConnectOptions::from_str(&scene.database_url).unwrap();
    let postgres = format!("{}:{}", url.get_host(), url.get_port());
    let net = match Net::new(&scene.brokers, &postgres) {
        Ok(net) => net,
        Err(lacking) => return common::skip(test, &format!("no network namespace of its own here: {lacking}")),
    };
    let events = stream(if full() { 1_000 } else { 300 }, 36);
    let cut = Duration::from_secs(if full() { 30 } else { 8 });
    let parts: Vec<&[RawEnvelope]> = events.chunks(events.len().div_ceil(4)).collect();
    scene.publish(parts[0], Duration::ZERO).await.unwrap();
    let mut member = scene.member(scene.cli_in(&net.namespace, &[]), None, "127.0.0.1:9898");
    scene.until_exact(&pool, &mut member, parts[0], Duration::from_secs(60)).await;
    let ready = || net.http_status("127.0.0.1:9898", "/ready");
    assert_eq!(ready(), Some(200), "ready before the cuts");
    let mut recoveries = Vec::new();
    for (k, links) in [vec![Link::Broker], vec![Link::Postgres], vec![Link::Broker, Link::Postgres]].iter().enumerate()
    {
        let publishing = scene.publish(parts[k + 1], cut * 3 / 4 / parts[k + 1].len() as u32);
        links.iter().for_each(|link| net.set(*link, false));
        let (cut_at, mut unready) = (Instant::now(), None);
        while cut_at.elapsed() < cut {
            if unready.is_none() && ready() == Some(503) {
                unready = Some(cut_at.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let unready = unready.unwrap_or_else(|| panic!("/ready never answered 503 during the cut of {links:?}"));
        eprintln!("{test}: /ready answered 503 {unready:?} into the cut of {links:?}");
        assert!(member.try_wait().unwrap().is_none(), "the projector exited during the cut of {links:?}");
        // The cut is real: what was published meanwhile is not in the read model.
        let so_far: Vec<RawEnvelope> = parts[..k + 2].concat();
        assert_ne!(read_model(&pool).await, generate::expected(&so_far), "applied through the cut of {links:?}");
        links.iter().for_each(|link| net.set(*link, true));
        recoveries.push(scene.recovered(&pool, &mut member, publishing, &so_far).await.1);
        let since = Instant::now();
        while ready() != Some(200) {
            assert!(since.elapsed() < Duration::from_secs(30), "/ready not 200 again after the cut of {links:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    scene.stop(member).await;
    drop(net);
    let each: Vec<String> = recoveries.iter().map(|r| format!("{:.1}", r.as_secs_f64())).collect();
    let done = format!("{} s cuts: broker, PG, both; back {} s", cut.as_secs(), each.join("/"));
    let slowest = recoveries.into_iter().max().unwrap();
    conclude(&pool, &scene, "network cuts under load", &done, slowest, &events, Expect::AtMost).await;
}

/// A second `run` process started while a rebuild's swap holds the live writers back (the
/// swap held 5 s before its commit by a fault point), a first member running and a producer
/// publishing: the newcomer joins the group, its batches wait for the swap, then write the
/// swapped-in tables.
#[sqlx::test(migrations = false)]
async fn a_second_run_started_during_a_swap(pool: PgPool) {
    let scene = Scene::new(&pool, "chaos-run-in-swap").await;
    let events = stream(if full() { 1_000 } else { 300 }, 37);
    let half = events.len() / 2;
    scene.publish(&events[..half], Duration::ZERO).await.unwrap();
    let mut first = scene.run(None);
    scene.until_exact(&pool, &mut first, &events[..half], Duration::from_secs(60)).await;
    let publishing = scene.publish(&events[half..], Duration::from_secs(10) / (events.len() - half) as u32);
    let mut rebuild = scene.cli(&["rebuild", "--metrics-addr", "off"]);
    rebuild.env("PROJECTIONIST_FAULT", "before-swap-commit:1:sleep-5000").stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut rebuild = rebuild.spawn().unwrap();
    let mut log = tokio::io::BufReader::new(rebuild.stderr.take().unwrap());
    let mut said = String::new();
    loop {
        use tokio::io::AsyncBufReadExt;
        let from = said.len();
        let read = tokio::time::timeout(Duration::from_secs(180), log.read_line(&mut said)).await;
        let read = read.expect("the rebuild reaches its swap in time").unwrap();
        assert!(read > 0, "the rebuild ended before its swap:\n{said}");
        if said[from..].contains("fault point before-swap-commit reached") {
            break;
        }
    }
    let mut second = scene.run(None);
    let swapped = tokio::time::timeout(Duration::from_secs(60), rebuild.wait()).await.expect("swapped").unwrap();
    assert!(swapped.success(), "the rebuild swapped in: {swapped}");
    let (_, recovery) = scene.recovered(&pool, &mut first, publishing, &events).await;
    assert!(second.try_wait().unwrap().is_none(), "the second member runs on");
    scene.stop(first).await;
    scene.stop(second).await;
    let done = "a 2nd run joined while the swap held writers 5 s";
    let scenario = "a second run started during a swap";
    conclude(&pool, &scene, scenario, done, recovery, &events, Expect::AtMost).await;
}
