//! Against a real registry (Apicurio's Confluent-compatible API, `scripts/services.sh
//! --registry`), with bytes written by Confluent's own Python serializers
//! (`tools/serialize.py`). Needs SCHEMA_REGISTRY_URL and PROJECTIONIST_PYTHON; skips without.

use std::io::Write as _;

use projectionist_registry::{wire, Error, ReaderSchema, Registry, RegistryConfig};
use serde_json::json;

/// The registry's URL and the Python interpreter, or `None` after noting the skip.
fn environment(test: &str) -> Option<(String, String)> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let (url, python) = (var("SCHEMA_REGISTRY_URL"), var("PROJECTIONIST_PYTHON"));
    let reason = match (&url, &python) {
        (Some(url), Some(python)) => return Some((url.clone(), python.clone())),
        (None, _) => "SCHEMA_REGISTRY_URL is not set: scripts/services.sh --registry prints it",
        (_, None) => "PROJECTIONIST_PYTHON is not set: scripts/services.sh --python-producers makes it",
    };
    skip(test, reason);
    None
}

/// Says that `test` did not run, and why, here and in the test command's list of skips.
fn skip(test: &str, reason: &str) {
    eprintln!("SKIPPED {test}: {reason}");
    if let Ok(path) = std::env::var("PROJECTIONIST_SKIP_LOG") {
        let mut log = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
        writeln!(log, "SKIPPED {test}: {reason}").unwrap();
    }
}

/// A topic (and so a subject, `<topic>-value`) of this test run alone: the registry outlives
/// the tests.
fn topic(name: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("{name}-{}-{nanos}", std::process::id())
}

/// Bytes serialized by Confluent's Python serializer (`tools/serialize.py KIND`).
fn serialize(python: &str, url: &str, kind: &str, topic: &str) -> Vec<u8> {
    let tool = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tools/serialize.py");
    let output = std::process::Command::new(python).args([tool, url, kind, topic]).output().unwrap();
    assert!(output.status.success(), "serialize.py {kind}: {}", String::from_utf8_lossy(&output.stderr));
    let hex = String::from_utf8(output.stdout).unwrap();
    let hex = hex.trim();
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect()
}

async fn decode(registry: &Registry, bytes: &[u8]) -> Result<serde_json::Value, Error> {
    registry.prepare(wire::schema_id(bytes)).await?;
    registry.decode(bytes)
}

#[tokio::test]
async fn avro_protobuf_and_json_schema_from_confluents_serializers() {
    let Some((url, python)) = environment("avro_protobuf_and_json_schema_from_confluents_serializers") else { return };
    let registry = Registry::new(&RegistryConfig::new(&url)).unwrap();
    let avro = serialize(&python, &url, "avro-v1", &topic("avro"));
    let expected = json!({"id": 7, "owner": "ada", "at": "2024-01-02T03:04:05.678Z", "legacy": "old"});
    assert_eq!(decode(&registry, &avro).await.unwrap(), expected);
    // A nested message: its indexes are [0, 0].
    let protobuf = serialize(&python, &url, "protobuf", &topic("protobuf"));
    assert_eq!(decode(&registry, &protobuf).await.unwrap(), json!({"sku": "ab-1", "quantity": 3}));
    let json_schema = serialize(&python, &url, "jsonschema", &topic("json"));
    assert_eq!(decode(&registry, &json_schema).await.unwrap(), json!({"id": 1, "name": "ada"}));
}

#[tokio::test]
async fn an_evolved_avro_schema_read_with_a_reader_schema() {
    let Some((url, python)) = environment("an_evolved_avro_schema_read_with_a_reader_schema") else { return };
    let registry = Registry::new(&RegistryConfig::new(&url)).unwrap();
    let topic = topic("evolved");
    let v1 = serialize(&python, &url, "avro-v1", &topic);
    // v2 (accepted under BACKWARD): `currency` added with a default, `legacy` removed.
    let v2 = serialize(&python, &url, "avro-v2", &topic);
    registry.prepare(wire::schema_id(&v1).into_iter().chain(wire::schema_id(&v2))).await.unwrap();
    let subject = format!("{topic}-value");
    let latest = registry.reader(&ReaderSchema::Subject { subject: subject.clone(), version: None }).await.unwrap();
    let old = registry.decode_with(&v1, Some(&latest)).unwrap();
    assert_eq!(old, json!({"id": 7, "owner": "ada", "at": "2024-01-02T03:04:05.678Z", "currency": "EUR"}));
    let new = registry.decode_with(&v2, Some(&latest)).unwrap();
    assert_eq!(new["currency"], "USD");
    // Read with v1 (a pinned version), v2's bytes get `legacy`'s default and lose `currency`.
    let pinned = registry.reader(&ReaderSchema::Subject { subject, version: Some(1) }).await.unwrap();
    let back = registry.decode_with(&v2, Some(&pinned)).unwrap();
    assert_eq!(back, json!({"id": 7, "owner": "ada", "at": "2024-01-02T03:04:05.678Z", "legacy": ""}));
    let missing = ReaderSchema::Subject { subject: topic.clone() + "-nothing", version: None };
    assert!(matches!(registry.reader(&missing).await, Err(Error::UnknownSubject { .. })));
}

#[tokio::test]
async fn an_unknown_id_and_bytes_cut_short_are_dead_letters() {
    let Some((url, python)) = environment("an_unknown_id_and_bytes_cut_short_are_dead_letters") else { return };
    let registry = Registry::new(&RegistryConfig::new(&url)).unwrap();
    let avro = serialize(&python, &url, "avro-v1", &topic("faults"));
    let id = wire::schema_id(&avro).unwrap();
    let mut unknown = avro.clone();
    unknown[1..5].copy_from_slice(&999_999u32.to_be_bytes());
    let error = decode(&registry, &unknown).await.unwrap_err();
    assert!(error.is_dead_letter(), "{error}");
    assert_eq!(error.to_string(), format!("schema id 999999 is not in the registry at {url}"));
    let error = decode(&registry, &avro[..avro.len() - 3]).await.unwrap_err();
    assert!(error.is_dead_letter(), "{error}");
    let text = error.to_string();
    assert!(text.starts_with(&format!("the bytes do not fit schema id {id}: field `legacy`")), "{text}");
}

#[tokio::test]
async fn a_registry_nobody_listens_on_is_unavailable() {
    // A port nobody listens on: refused at once.
    let registry = Registry::new(&RegistryConfig::new("http://127.0.0.1:9/apis/ccompat/v7")).unwrap();
    let error = registry.prepare([1]).await.unwrap_err();
    assert!(error.is_retryable() && !error.is_dead_letter(), "{error}");
    assert!(error.to_string().starts_with("the schema registry at http://127.0.0.1:9/apis/ccompat/v7 is unavailable"));
}

/// The registry behind an HTTPS front that asks for basic auth (`tools/tls_front.py`, with
/// the test CA's server certificate from `scripts/services.sh --tls`): read with the CA file
/// and the credentials; a wrong password, or a CA that did not sign the certificate, is an
/// outage saying what to check (waited out, never a dead letter), the password never shown.
#[tokio::test]
async fn through_tls_with_basic_auth() {
    let test = "through_tls_with_basic_auth";
    let Some((url, python)) = environment(test) else { return };
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let (Some(ca), Some(wrong_ca)) = (var("KAFKA_TLS_CA"), var("KAFKA_TLS_WRONG_CA")) else {
        return skip(test, "KAFKA_TLS_CA is not set: scripts/services.sh --tls makes the test CA");
    };
    // The server certificate the test CA signed for 127.0.0.1, beside the CA.
    let dir = std::path::Path::new(&ca).parent().unwrap();
    let (cert, key) = (dir.join("broker.pem"), dir.join("broker.key"));
    let tool = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tools/tls_front.py");
    let (upstream, path) = url.trim_start_matches("http://").split_once('/').unwrap();
    let mut front = std::process::Command::new(&python)
        .args([tool, &format!("http://{upstream}"), cert.to_str().unwrap(), key.to_str().unwrap()])
        .args(["reader", "s3cret-registry"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut port = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(front.stdout.take().unwrap()), &mut port).unwrap();
    let https = format!("https://127.0.0.1:{}/{path}", port.trim());

    let avro = serialize(&python, &url, "avro-v1", &topic("tls"));
    let config = RegistryConfig::new(&https).with_ca_file(&ca);
    let registry = Registry::new(&config.clone().with_basic_auth("reader", "s3cret-registry")).unwrap();
    let expected = json!({"id": 7, "owner": "ada", "at": "2024-01-02T03:04:05.678Z", "legacy": "old"});
    let read = decode(&registry, &avro).await;
    let wrong_password = Registry::new(&config.with_basic_auth("reader", "not-it")).unwrap();
    let refused = decode(&wrong_password, &avro).await.unwrap_err();
    let untrusted = RegistryConfig::new(&https).with_ca_file(&wrong_ca).with_basic_auth("reader", "s3cret-registry");
    let unverified = decode(&Registry::new(&untrusted).unwrap(), &avro).await.unwrap_err();
    front.kill().unwrap();
    front.wait().unwrap();

    assert_eq!(read.unwrap(), expected);
    assert!(refused.is_retryable() && !refused.is_dead_letter(), "{refused}");
    assert!(refused.to_string().contains("HTTP 401: check the registry's credentials"), "{refused}");
    assert!(unverified.is_retryable() && !unverified.is_dead_letter(), "{unverified}");
    for error in [&refused, &unverified] {
        assert!(!error.to_string().contains("s3cret") && !error.to_string().contains("not-it"), "{error}");
    }
}
