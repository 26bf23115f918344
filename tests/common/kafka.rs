//! What the tests of a running engine share: the broker, a topic and a group of their own,
//! messages produced as given, and a run that stops when caught up.

// Each test file that includes this module uses a part of it.
#![allow(dead_code)]

use std::time::Duration;

use projectionist::kafka::{topics, Engine, EngineConfig, RunReport};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

pub fn brokers() -> String {
    std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "localhost:9092".into())
}

pub fn rand_test_topic(name: &str) -> String {
    format!("test.{name}.{}", uuid::Uuid::new_v4().simple())
}

/// A run of its own group that exits when caught up.
pub fn config() -> EngineConfig {
    EngineConfig::new(brokers())
        .with_group_id(format!("engine-{}", uuid::Uuid::new_v4().simple()))
        .with_exit_when_caught_up(true)
        .with_kafka_property("session.timeout.ms", "6000")
}

/// A message as produced: a partition (else the key's), a key, a payload (else a tombstone).
pub type Message<'a> = (Option<i32>, Option<&'a str>, Option<Vec<u8>>);

/// Produces messages as given to `topic` (made with `partitions` if new): a partition or
/// the key's, a key or none, a payload or none (a tombstone).
pub async fn produce_to(topic: &str, partitions: i32, messages: &[Message<'_>]) {
    topics::create_topics(&brokers(), &[topic], partitions, 1).await.unwrap();
    let producer: ThreadedProducer<DefaultProducerContext> =
        ClientConfig::new().set("bootstrap.servers", brokers()).create().unwrap();
    for (partition, key, payload) in messages {
        let mut record: BaseRecord<'_, str, Vec<u8>> = BaseRecord::to(topic);
        if let Some(partition) = partition {
            record = record.partition(*partition);
        }
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

/// Runs `engine` until it is caught up (two minutes at most).
pub async fn run(engine: Engine) -> RunReport {
    tokio::time::timeout(Duration::from_secs(120), engine.run(std::future::pending()))
        .await
        .expect("engine caught up in time")
        .unwrap()
}

/// Produces one record to `topic`'s `partition` byte for byte, header names included, with
/// franz-go (`tests/tools/raw-produce`, built once per test binary): rdkafka's safe API
/// cannot write a header name that is not UTF-8, as librdkafka and Go producers can.
pub fn raw_produce(topic: &str, partition: i32, key: &[u8], value: &[u8], headers: &[(&[u8], &[u8])]) {
    static TOOL: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    let tool = TOOL.get_or_init(|| {
        let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("raw-produce");
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tools/raw-produce");
        let built = std::process::Command::new("go").args(["build", "-o"]).arg(&out).current_dir(dir).status();
        assert!(built.is_ok_and(|s| s.success()), "go build in {dir} (Go and its module proxy)");
        out
    });
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let mut command = std::process::Command::new(tool);
    command.args(["-brokers", &brokers(), "-topic", topic, "-partition", &partition.to_string()]);
    command.args(["-key", &hex(key), "-value", &hex(value)]);
    for (name, value) in headers {
        command.args(["-header", &format!("{}={}", hex(name), hex(value))]);
    }
    let status = command.status().expect("raw-produce runs");
    assert!(status.success(), "raw-produce to {topic}: {status}");
}
