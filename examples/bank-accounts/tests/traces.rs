//! Traces (issue 69), against a real Jaeger (`scripts/services.sh --jaeger`): a producer's
//! span (OpenTelemetry's Python SDK) is linked from the batch span that applied its event,
//! over OTLP gRPC and HTTP; a rebuild's rounds and swap are spans; a collector that is away
//! costs the read model nothing.

mod common;
#[path = "../../../tests/common/producers.rs"]
mod producers;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use bank_accounts::generate;
use common::cli::Env;
use common::{brokers, read_model, skip};
use serde_json::Value;
use sqlx::PgPool;

/// Jaeger's OTLP endpoints (gRPC, HTTP), its query API's address and the Python producers'
/// interpreter, or `None` and a skip line.
fn jaeger(test: &str) -> Option<(String, String, String, String)> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let found = (var("OTLP_GRPC_ENDPOINT"), var("OTLP_HTTP_ENDPOINT"), var("JAEGER_QUERY_URL"));
    let (Some(grpc), Some(http), Some(query)) = found else {
        skip(
            test,
            "OTLP_GRPC_ENDPOINT, OTLP_HTTP_ENDPOINT or JAEGER_QUERY_URL is not set: scripts/services.sh --jaeger",
        );
        return None;
    };
    let Some(python) = var("PROJECTIONIST_PYTHON") else {
        skip(test, "PROJECTIONIST_PYTHON is not set: scripts/services.sh --python-producers makes it");
        return None;
    };
    Some((grpc, http, query.trim_start_matches("http://").to_owned(), python))
}

/// The spans Jaeger holds of `service` (every trace's), once it holds at least `least`
/// matching `wanted` (it indexes what it receives within a moment), or a panic after 30 s.
async fn spans(query: &str, service: &str, least: usize, wanted: impl Fn(&Value) -> bool) -> Vec<Value> {
    let started = Instant::now();
    loop {
        let (status, body) = http_get(query, &format!("/api/traces?service={service}&limit=1000")).await;
        let found: Vec<Value> = match (status, serde_json::from_str::<Value>(&body)) {
            (200, Ok(traces)) => traces["data"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|t| t["spans"].as_array().cloned().unwrap_or_default())
                .collect(),
            _ => Vec::new(),
        };
        if found.iter().filter(|s| wanted(s)).count() >= least {
            return found;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{service}: {status} {body:.2000}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `GET path` of Jaeger's query API at `addr` (HTTP/1.0: the body is not chunked): the
/// status and the body.
async fn http_get(addr: &str, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let status = response.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default())
}

/// A span's tag `key`, as Jaeger gives it.
fn tag<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    span["tags"].as_array()?.iter().find(|t| t["key"] == key).map(|t| &t["value"])
}

/// The trace ids a span links to.
fn links(span: &Value) -> BTreeSet<String> {
    let references = span["references"].as_array().into_iter().flatten();
    references
        .filter(|r| r["refType"] == "FOLLOWS_FROM")
        .filter_map(|r| r["traceID"].as_str().map(str::to_owned))
        .collect()
}

/// Each producer's trace (headers and envelope metadata alike) reaches the batch span that
/// applied its event, with the messaging conventions' attributes, over gRPC; a poison message
/// is a span event of its batch; then `rebuild`, over HTTP, shows its rounds and its swap.
#[sqlx::test(migrations = false)]
async fn a_producers_trace_reaches_the_batch_span_that_wrote_its_row(pool: PgPool) {
    let test = "a_producers_trace_reaches_the_batch_span_that_wrote_its_row";
    let Some((grpc, http, query, python)) = jaeger(test) else { return };
    let env = Env::new(&pool, "traced").await;
    env.publish(&[]).await;
    let events = generate::stream(24, 6, 691);
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (producer, projector) = (format!("producer-{id}"), format!("projector-{id}"));
    let traces = producers::publish_traced(&python, &brokers(), &env.topic, &http, &producer, &events);
    assert_eq!(traces.len(), events.len());
    env.produce_raw("acc-poison", [b"{not an envelope".to_vec()]).await;

    let otel = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", grpc.as_str()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_SERVICE_NAME", projector.as_str()),
    ];
    let mut args = env.run_args(&["--batch-size", "10", "--batch-wait-ms", "5", "--exit-when-caught-up"]);
    let out = env.cli(&args).envs(otel).output().await.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(read_model(&pool).await, generate::expected(&events), "the read model, traced");

    let process = format!("process {}", env.topic);
    let is_batch = |s: &Value| s["operationName"] == process.as_str();
    let linked = |spans: &[Value]| spans.iter().filter(|s| is_batch(s)).flat_map(links).collect::<BTreeSet<_>>();
    let started = Instant::now();
    let mut batches = spans(&query, &projector, 1, is_batch).await;
    while !traces.iter().all(|t| linked(&batches).contains(t)) {
        let missing: Vec<&String> = traces.iter().filter(|t| !linked(&batches).contains(*t)).collect();
        assert!(started.elapsed() < Duration::from_secs(30), "producers' traces not linked: {missing:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
        batches = spans(&query, &projector, 1, is_batch).await;
    }
    // The producer's own trace is in Jaeger too, by the id the batch links to.
    let (status, body) = http_get(&query, &format!("/api/traces/{}", traces[1])).await;
    assert!(status == 200 && body.contains(&format!("send {}", env.topic)), "{status} {body:.2000}");

    let batch = batches.iter().find(|s| is_batch(s)).unwrap();
    assert_eq!(tag(batch, "messaging.system"), Some(&Value::from("kafka")), "{batch}");
    assert_eq!(tag(batch, "messaging.destination.name"), Some(&Value::from(env.topic.as_str())), "{batch}");
    assert_eq!(tag(batch, "messaging.consumer.group.name"), Some(&Value::from(format!("{}.bank_accounts", env.group))));
    assert_eq!(tag(batch, "span.kind"), Some(&Value::from("consumer")), "{batch}");
    assert!(tag(batch, "messaging.batch.message_count").is_some_and(|n| n.as_i64() > Some(0)), "{batch}");
    let poisoned =
        batches.iter().find(|s| tag(s, "dead_letters") == Some(&Value::from(1))).expect("the poison's batch");
    let logs = poisoned["logs"].as_array().unwrap();
    assert!(logs.iter().any(|e| e.to_string().contains("Parking")), "a span event says so: {poisoned}");

    args[0] = "rebuild";
    args.retain(|a| *a != "--exit-when-caught-up");
    let rebuilder = format!("rebuilder-{id}");
    let otel = [("OTEL_EXPORTER_OTLP_ENDPOINT", http.as_str()), ("OTEL_SERVICE_NAME", rebuilder.as_str())];
    let out = env.cli(&args).envs(otel).output().await.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let names = ["rebuild bank_accounts", "rebuild round", "rebuild swap"];
    let rebuild = spans(&query, &rebuilder, 3, |s| names.iter().any(|n| s["operationName"] == *n)).await;
    for name in names {
        assert!(rebuild.iter().any(|s| s["operationName"] == name), "{name} over HTTP");
    }
    assert_eq!(read_model(&pool).await, generate::expected(&events), "the rebuilt read model");
}

/// A collector that is away: the read model is exact, the run ends as usual, and a warning
/// says spans were dropped (the pipeline never waits for the exporter).
#[sqlx::test(migrations = false)]
async fn a_collector_that_is_away_costs_the_read_model_nothing(pool: PgPool) {
    let env = Env::new(&pool, "untraced").await;
    let events = generate::stream(40, 8, 692);
    env.publish(&events).await;
    // A port nothing listens on: taken, then let go.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    for (protocol, port) in [("grpc", closed.port()), ("http/protobuf", closed.port())] {
        let endpoint = format!("http://127.0.0.1:{port}");
        let otel = [("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()), ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)];
        let args = env.run_args(&["--batch-size", "10", "--from-beginning", "--exit-when-caught-up"]);
        let started = Instant::now();
        let out = env.cli(&args).envs(otel).output().await.unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{protocol}: {stderr}");
        assert_eq!(read_model(&pool).await, generate::expected(&events), "{protocol}");
        assert!(stderr.contains("Trace spans dropped"), "{protocol}: the drops are said:\n{stderr}");
        assert!(stderr.matches("Trace spans dropped").count() == 1, "{protocol}: once, throttled:\n{stderr}");
        assert!(started.elapsed() < Duration::from_secs(60), "{protocol}: the exit did not wait for the collector");
    }
}
