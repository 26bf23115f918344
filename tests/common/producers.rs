//! The real producers of the formats projectionist reads (issue 68), shared by the format
//! tests of the root crate and of the bank-accounts example (`#[path]` modules).
#![allow(dead_code)] // each including test uses a part

use std::io::Write;
use std::path::{Path, PathBuf};

use projectionist::RawEnvelope;

/// Publishes `events` to `topic` as CloudEvents, through the official SDK
/// (`tests/tools/cloudevents_produce.py`: even messages structured, odd ones binary).
pub fn publish_cloudevents(python: &str, brokers: &str, topic: &str, events: &[RawEnvelope]) {
    pipe(python, "cloudevents_produce.py", &[brokers, topic], events);
}

/// Publishes `events` to `topic` as Axon Framework's Kafka extension writes them
/// (`DefaultKafkaMessageConverter` with a JSON serializer): the data as the value, keyed by
/// the aggregate id, and `axon-message-*` headers, the sequence and the timestamp as 8-byte
/// big-endian integers, the sequence counted from 0.
pub async fn publish_axon(brokers: &str, topic: &str, events: &[RawEnvelope]) {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .create()
        .unwrap();
    for e in events {
        let (id, class) = (e.id.to_string(), format!("com.example.bank.{}", e.event_type));
        let (millis, seq) = (e.occurred_at.timestamp_millis().to_be_bytes(), (e.version - 1).to_be_bytes());
        let headers = OwnedHeaders::new()
            .insert(text("axon-message-id", &id))
            .insert(text("axon-message-type", &class))
            .insert(Header { key: "axon-message-revision", value: None::<&[u8]> })
            .insert(Header { key: "axon-message-timestamp", value: Some(&millis[..]) })
            .insert(text("axon-message-aggregate-id", &e.aggregate_id))
            .insert(text("axon-message-aggregate-type", &e.aggregate_type))
            .insert(Header { key: "axon-message-aggregate-seq", value: Some(&seq[..]) })
            .insert(text("axon-metadata-traceId", "t-1"));
        let value = serde_json::to_vec(&e.data).unwrap();
        let record = FutureRecord::to(topic).key(&e.aggregate_id).payload(&value).headers(headers);
        producer.send(record, std::time::Duration::from_secs(30)).await.map_err(|(e, _)| e).unwrap();
    }
}

/// A text header.
fn text<'a>(key: &'a str, value: &'a str) -> rdkafka::message::Header<'a, &'a [u8]> {
    rdkafka::message::Header { key, value: Some(value.as_bytes()) }
}

/// The Python tool `name` in the repository's tests/tools, found from the including crate.
pub fn tool(name: &str) -> PathBuf {
    let dirs = Path::new(env!("CARGO_MANIFEST_DIR")).ancestors();
    let mut found = dirs.map(|dir| dir.join("tests/tools").join(name)).filter(|path| path.exists());
    found.next().unwrap_or_else(|| panic!("tests/tools/{name} above {}", env!("CARGO_MANIFEST_DIR")))
}

/// Publishes `events` to `topic` as Avro through Confluent's own `AvroSerializer`, with the
/// schema `version` (1, 2 or 3; each adds a field with a default) registered at `registry`
/// (`tests/tools/avro_produce.py`).
pub fn publish_avro(python: &str, brokers: &str, topic: &str, registry: &str, version: u8, events: &[RawEnvelope]) {
    pipe(python, "avro_produce.py", &[brokers, topic, registry, &version.to_string()], events);
}

/// Publishes `events` to `topic` as Protobuf through Confluent's own `ProtobufSerializer`,
/// its schema registered at `registry`, the keys as plain text
/// (`tests/tools/protobuf_produce.py`).
pub fn publish_protobuf(python: &str, brokers: &str, topic: &str, registry: &str, events: &[RawEnvelope]) {
    pipe(python, "protobuf_produce.py", &[brokers, topic, registry], events);
}

/// Publishes `events` to `topic`, each in a producer span of OpenTelemetry's Python SDK
/// exported to the collector at `otlp_http` as `service`, its trace context in the message's
/// headers (even events) or its envelope's metadata (odd ones)
/// (`tests/tools/traced_produce.py`). The trace id of each event's producer span, in order.
pub fn publish_traced(
    python: &str,
    brokers: &str,
    topic: &str,
    otlp_http: &str,
    service: &str,
    events: &[RawEnvelope],
) -> Vec<String> {
    let out = pipe(python, "traced_produce.py", &[brokers, topic, otlp_http, service], events);
    let lines = out.lines().map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap());
    lines.map(|sent| sent["trace_id"].as_str().unwrap().to_owned()).collect()
}

/// Runs the Python tool `name` with `args`, `events` on its stdin as JSON lines: what it
/// printed.
fn pipe(python: &str, name: &str, args: &[&str], events: &[RawEnvelope]) -> String {
    let mut child = std::process::Command::new(python)
        .arg(tool(name))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the Python producer starts");
    let mut stdout = child.stdout.take().unwrap();
    let printed = std::thread::spawn(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut text).map(|_| text)
    });
    let mut stdin = std::io::BufWriter::new(child.stdin.take().unwrap());
    for event in events {
        stdin.write_all(&event.to_json()).unwrap();
        stdin.write_all(b"\n").unwrap();
    }
    drop(stdin);
    assert!(child.wait().unwrap().success(), "{name} {args:?}");
    printed.join().unwrap().unwrap()
}
