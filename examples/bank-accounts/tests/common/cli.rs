//! A test's own database and topic, and the `bank-accounts` binary run against them.

use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use projectionist::RawEnvelope;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use sqlx::PgPool;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::{brokers, rand_test_topic, BIN};

/// What the runner processes need to reach this test's database and topic.
pub struct Env {
    pub database_url: String,
    pub topic: String,
    pub group: String,
    pub dir: std::path::PathBuf,
}

impl Env {
    pub async fn new(pool: &PgPool, name: &str) -> Self {
        let base = std::env::var("DATABASE_URL").expect("DATABASE_URL");
        let db = pool.connect_options().get_database().expect("test database").to_owned();
        let database_url = format!("{}/{db}", base.rsplit_once('/').expect("URL with a database").0);
        let dir = std::env::temp_dir().join(format!("projectionist-e2e-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let env = Self {
            database_url,
            topic: rand_test_topic(name),
            group: format!("e2e-{}", uuid::Uuid::new_v4().simple()),
            dir,
        };
        let out = env.cli(&["migrate"]).output().await.unwrap();
        assert!(out.status.success(), "migrate: {}", String::from_utf8_lossy(&out.stderr));
        env
    }

    pub fn cli(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args)
            .env("DATABASE_URL", &self.database_url)
            .env("KAFKA_BROKERS", brokers())
            .env("BANK_ACCOUNTS_TOPIC", &self.topic)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        c
    }

    pub fn run_args<'a>(&'a self, extra: &[&'a str]) -> Vec<&'a str> {
        let mut args = vec![
            "run",
            "--group-id",
            &self.group,
            "--kafka-property",
            "session.timeout.ms=6000",
            "--kafka-property",
            "heartbeat.interval.ms=500",
            "--kafka-property",
            "statistics.interval.ms=500",
        ];
        // Off unless a test asks for it (the last --metrics-addr wins): runners share the machine.
        if !extra.contains(&"--metrics-addr") {
            args.extend_from_slice(&["--metrics-addr", "off"]);
        }
        args.extend_from_slice(extra);
        args
    }

    /// Creates the topic with one partition and produces `payloads` to it as they are (not
    /// through `publish`, which refuses what is not an event), keyed by `key`.
    pub async fn produce_raw<const N: usize>(&self, key: &str, payloads: [Vec<u8>; N]) {
        let out = self.cli(&["create-topics", "--partitions", "1"]).output().await.unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let producer: ThreadedProducer<DefaultProducerContext> =
            ClientConfig::new().set("bootstrap.servers", brokers()).create().unwrap();
        for payload in payloads {
            producer.send(BaseRecord::to(&self.topic).key(key).payload(&payload)).map_err(|(e, _)| e).unwrap();
        }
        producer.flush(Duration::from_secs(10)).unwrap();
    }

    /// Publishes through the CLI's transactional producer.
    pub async fn publish(&self, events: &[RawEnvelope]) {
        let file = self.dir.join("events.ndjson");
        let text: String = events.iter().map(|e| String::from_utf8(e.to_json()).unwrap() + "\n").collect();
        std::fs::write(&file, text).unwrap();
        let out = self
            .cli(&[
                "publish",
                "--topic",
                &self.topic,
                "--chunk-size",
                "500",
                "--partitions",
                "4",
                file.to_str().unwrap(),
            ])
            .output()
            .await
            .unwrap();
        assert!(out.status.success(), "publish: {}", String::from_utf8_lossy(&out.stderr));
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(said.contains(&format!("Published {} events", events.len())), "{said}");
    }

    /// Runs to the high watermark; returns exit status, stdout, stderr.
    pub async fn run_until_caught_up(&self, extra: &[&str]) -> (ExitStatus, String, String) {
        let mut args = self.run_args(extra);
        args.push("--exit-when-caught-up");
        tokio::time::timeout(Duration::from_secs(120), self.output(&args)).await.expect("runner timed out")
    }

    /// Runs the binary with `args` to its exit: exit status, stdout, stderr.
    pub async fn output(&self, args: &[&str]) -> (ExitStatus, String, String) {
        let out = self.cli(args).output().await.unwrap();
        let text = |bytes: Vec<u8>| String::from_utf8_lossy(&bytes).into_owned();
        (out.status, text(out.stdout), text(out.stderr))
    }

    /// Starts a runner in the background, collecting its stderr.
    pub fn spawn(&self, extra: &[&str]) -> (Child, Arc<Mutex<String>>) {
        let mut child = self.cli(&self.run_args(extra)).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        for pipe in [
            Box::new(child.stderr.take().unwrap()) as Box<dyn tokio::io::AsyncRead + Unpin + Send>,
            Box::new(child.stdout.take().unwrap()),
        ] {
            let log = log.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(pipe).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    log.lock().unwrap().push_str(&(line + "\n"));
                }
            });
        }
        (child, log)
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
