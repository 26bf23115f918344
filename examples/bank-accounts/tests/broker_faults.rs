//! The broker itself going away under a running projector, on Apache Kafka: the `faults`
//! instance of `scripts/services.sh` (a second one-node KRaft broker on its own log, so that
//! every other test goes on against the main one) stopped by its recorded pid and started
//! again on the same log, while events keep being published. The projector must wait it
//! out — no partition halts, nothing dead-lettered — say why on `/ready` meanwhile, and end
//! with the exact read model.
//!
//! They need Apache Kafka (`PROJECTIONIST_BROKER=apache-kafka-*`, set by scripts/test.sh);
//! elsewhere each reports itself skipped.

mod common;

use common::{faults_broker, http_get, publish, rand_test_topic, read_model, services, Serving, BIN};

use std::time::{Duration, Instant};

use bank_accounts::generate;
use bank_accounts::BankAccounts;
use projectionist::kafka::topics;
use projectionist::postgres::migrate;
use projectionist::RawEnvelope;
use sqlx::PgPool;

/// The fault tests share one broker: one at a time.
static BROKER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A `bank-accounts run` against `brokers`, serving /ready; its log collected.
struct Runner(Serving);

impl Runner {
    async fn start(pool: &PgPool, brokers: &str, topic: &str) -> Self {
        let base = std::env::var("DATABASE_URL").expect("DATABASE_URL");
        let db = pool.connect_options().get_database().expect("test database").to_owned();
        let url = format!("{}/{db}", base.split('?').next().unwrap().rsplit_once('/').unwrap().0);
        let group = format!("faults-{}", uuid::Uuid::new_v4().simple());
        let mut run = tokio::process::Command::new(BIN);
        run.args(["run", "--group-id", &group, "--metrics-addr", "127.0.0.1:0", "--batch-max-events", "100"])
            .args(["--kafka-property", "statistics.interval.ms=1000"])
            .env("DATABASE_URL", &url)
            .env("KAFKA_BROKERS", brokers)
            .env("BANK_ACCOUNTS_TOPIC", topic)
            .env("RUST_LOG", "info");
        Self(Serving::spawn(run).await)
    }

    fn log(&self) -> String {
        self.0.log()
    }

    fn assert_running(&mut self) {
        assert!(self.0.child.try_wait().unwrap().is_none(), "the runner exited:\n{}", self.log());
    }

    /// Waits until the read model is `want` and /ready answers 200.
    async fn until_exact_and_ready(&mut self, pool: &PgPool, events: &[RawEnvelope], within: Duration) {
        let want = generate::expected(events);
        let since = Instant::now();
        while read_model(pool).await != want || http_get(&self.0.addr, "/ready").await.0 != 200 {
            self.assert_running();
            assert!(since.elapsed() < within, "not exact and ready in {within:?}:\n{}", self.log());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// SIGTERM: exits 0, nothing halted.
    async fn stop(mut self) -> String {
        std::process::Command::new("kill").args(["-TERM", &self.0.child.id().unwrap().to_string()]).status().unwrap();
        let status =
            tokio::time::timeout(Duration::from_secs(60), self.0.child.wait()).await.expect("stops in time").unwrap();
        let log = self.log();
        assert!(status.success(), "exit 0: {status}\n{log}");
        assert!(!log.contains("Partition halted"), "{log}");
        log
    }
}

/// Three parts of a stream: applied before the broker goes, published while it is away,
/// published after it is back.
fn three_parts(seed: u64) -> [Vec<RawEnvelope>; 3] {
    let events = generate::with_redeliveries(&generate::stream(300, 15, seed), 0.1, 0.05, seed);
    let n = events.len() / 3;
    [events[..n].to_vec(), events[n..2 * n].to_vec(), events[2 * n..].to_vec()]
}

/// The broker stopped (by its pid) for `away` while a third of the stream is being
/// published, then started again on its log; the projector must end exact.
async fn broker_away(pool: PgPool, test: &str, away: Duration, seed: u64) {
    let _one_at_a_time = BROKER.lock().await;
    let Some(brokers) = faults_broker(test) else { return };
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let topic = rand_test_topic("broker-faults");
    topics::create_topics(&brokers, &[topic.as_str()], 4, 1).await.unwrap();
    let [before, during, after] = three_parts(seed);
    publish(brokers.clone(), topic.clone(), before.clone(), Duration::ZERO).await;
    let mut runner = Runner::start(&pool, &brokers, &topic).await;
    runner.until_exact_and_ready(&pool, &before, Duration::from_secs(60)).await;

    // Away under load: a publisher keeps sending (its records wait in its queue).
    let pace = away / (during.len() as u32 * 2);
    let publishing = tokio::spawn(publish(brokers.clone(), topic.clone(), during.clone(), pace));
    services(&["--stop-broker", "faults"]);
    let down_at = Instant::now();
    let mut said = None;
    while down_at.elapsed() < away {
        runner.assert_running();
        let (status, body) = http_get(&runner.0.addr, "/ready").await;
        if status == 503 && body.contains("broker answers: false") {
            said.get_or_insert((down_at.elapsed(), body));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let (after_secs, body) = said.unwrap_or_else(|| panic!("/ready never said the broker is away:\n{}", runner.log()));
    assert!(body.contains("partitions halted: 0"), "{body}");
    eprintln!("{test}: /ready said why {after_secs:?} after the stop: {body}");
    services(&["--start-broker", "faults"]);
    let up_at = Instant::now();
    publish(brokers.clone(), topic.clone(), after.clone(), Duration::ZERO).await;
    tokio::time::timeout(Duration::from_secs(300), publishing).await.expect("published").unwrap();

    let all: Vec<RawEnvelope> = [before, during, after].concat();
    runner.until_exact_and_ready(&pool, &all, Duration::from_secs(120)).await;
    eprintln!("{test}: exact and ready {:?} after the broker's start", up_at.elapsed());
    runner.stop().await;
    let dead: i64 =
        sqlx::query_scalar("SELECT count(*) FROM projectionist_dead_letters").fetch_one(&pool).await.unwrap();
    assert_eq!(dead, 0, "nothing dead-lettered");
    let (next, held): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT sum(next_offset)::bigint FROM projectionist_checkpoints WHERE topic = $1), \
         (SELECT count(*) FROM projectionist_held)",
    )
    .bind(&topic)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(held, 0, "nothing left parked");
    assert_eq!(next, all.len() as i64, "every partition checkpointed to its end");
}

#[sqlx::test(migrations = false)]
async fn a_broker_restarted_mid_stream_is_waited_out(pool: PgPool) {
    broker_away(pool, "a_broker_restarted_mid_stream_is_waited_out", Duration::from_secs(8), 21).await;
}

#[sqlx::test(migrations = false)]
async fn a_broker_away_for_a_minute_under_load_is_waited_out(pool: PgPool) {
    broker_away(pool, "a_broker_away_for_a_minute_under_load_is_waited_out", Duration::from_secs(60), 22).await;
}
