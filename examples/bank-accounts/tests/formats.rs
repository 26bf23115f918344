//! Topics in another format than projectionist's own, through the `bank-accounts` binary
//! (issue 68): each written by its real producer, with duplicates and re-sends; read by
//! `run --topic-format`, SIGKILLed mid-stream and run again to the end, then by `rebuild`.

mod common;
#[path = "../../../tests/common/producers.rs"]
mod producers;

use std::time::{Duration, Instant};

use bank_accounts::generate;
use common::cli::Env;
use common::proxy::Proxy;
use common::{brokers, http_get, partition_accounts, read_model, skip, Serving};
use projectionist::RawEnvelope;
use sqlx::PgPool;

/// The interpreter of the Python producers, or `None` and a skip line.
fn python(test: &str) -> Option<String> {
    let python = std::env::var("PROJECTIONIST_PYTHON").ok().filter(|p| !p.is_empty());
    if python.is_none() {
        skip(test, "PROJECTIONIST_PYTHON is not set: scripts/services.sh --python-producers makes it");
    }
    python
}

/// The bank stream with duplicates and re-sends (what is published) and the stream itself
/// (what the read model must show).
fn stream(seed: u64) -> (Vec<RawEnvelope>, Vec<RawEnvelope>) {
    let events = generate::stream(120, 30, seed);
    (generate::with_redeliveries(&events, 0.1, 0.1, seed), events)
}

/// Runs `run FLAGS…` (how the topic is read) over the published topic, SIGKILLs it once a
/// tenth of the stream is applied, runs again to the end, then rebuilds: the oracle's read
/// model each time.
async fn killed_mid_stream_then_rebuilt(pool: &PgPool, env: &Env, flags: &[&str], events: &[RawEnvelope]) {
    let want = generate::expected(events);
    let total: i64 = want.values().map(|a| a.version).sum();
    let format = flags.join(" ");
    let (mut child, log) = env.spawn(&[flags, &["--batch-size", "10", "--batch-wait-ms", "5"]].concat());
    let started = Instant::now();
    let at_kill = loop {
        let so_far: i64 = sqlx::query_scalar("SELECT coalesce(sum(version), 0)::bigint FROM bank_accounts")
            .fetch_one(pool)
            .await
            .unwrap();
        if so_far > total / 10 {
            break so_far;
        }
        assert!(started.elapsed() < Duration::from_secs(90), "no progress:\n{}", log.lock().unwrap());
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    child.start_kill().unwrap(); // SIGKILL
    child.wait().await.unwrap();
    assert!(at_kill < total, "killed after the end ({at_kill} of {total}); the test needs a mid-stream kill");

    let (status, stdout, stderr) = env.run_until_caught_up(flags).await;
    assert!(status.success(), "{stderr}");
    let partitions = partition_accounts(&stdout, &env.topic);
    assert!(!partitions.is_empty() && partitions.iter().all(|p| p.adds_up() && p.counts[6] == 0), "{stdout}");
    assert_eq!(read_model(pool).await, want, "{format}: exact after a SIGKILL, duplicates and re-sends");

    let mut args = env.run_args(flags);
    args[0] = "rebuild";
    let (status, _, stderr) = tokio::time::timeout(Duration::from_secs(120), env.output(&args)).await.expect("in time");
    assert!(status.success(), "{stderr}");
    assert_eq!(read_model(pool).await, want, "{format}: the rebuilt read model");
}

/// CloudEvents written by the official SDK, in both modes of its Kafka binding.
#[sqlx::test(migrations = false)]
async fn cloudevents_survive_a_sigkill_and_rebuild_exactly(pool: PgPool) {
    let Some(python) = python("cloudevents_survive_a_sigkill_and_rebuild_exactly") else { return };
    let env = Env::new(&pool, "ce-kill").await;
    env.publish(&[]).await;
    let (published, events) = stream(681);
    producers::publish_cloudevents(&python, &brokers(), &env.topic, &published);
    let flag = format!("{}=cloudevents", env.topic);
    killed_mid_stream_then_rebuilt(&pool, &env, &["--topic-format", &flag], &events).await;
}

/// Axon Framework's Kafka messages (its sequence counted from 0).
#[sqlx::test(migrations = false)]
async fn axon_messages_survive_a_sigkill_and_rebuild_exactly(pool: PgPool) {
    let env = Env::new(&pool, "axon-kill").await;
    env.publish(&[]).await;
    let (published, events) = stream(682);
    producers::publish_axon(&brokers(), &env.topic, &published).await;
    let flag = format!("{}=axon", env.topic);
    killed_mid_stream_then_rebuilt(&pool, &env, &["--topic-format", &flag], &events).await;
}

/// The schema registry (`scripts/services.sh --registry`: SCHEMA_REGISTRY_URL, Confluent's
/// API) and the Python producers, or `None` and a skip line.
fn registry(test: &str) -> Option<(String, String)> {
    let url = std::env::var("SCHEMA_REGISTRY_URL").ok().filter(|u| !u.is_empty());
    if url.is_none() {
        skip(test, "SCHEMA_REGISTRY_URL is not set: scripts/services.sh --registry starts one");
    }
    Some((url?, python(test)?))
}

/// The id the registry gave `subject`'s version `version`.
async fn schema_id(url: &str, subject: &str, version: u32) -> u32 {
    let (addr, base) = url.trim_start_matches("http://").split_once('/').unwrap();
    let (status, body) = http_get(addr, &format!("/{base}/subjects/{subject}/versions/{version}")).await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str::<serde_json::Value>(&body).unwrap()["id"].as_u64().unwrap() as u32
}

/// Avro written by Confluent's own serializer against a real registry (Apicurio), keys and
/// values; the schema evolves mid-stream (a field added with a default) and the same run
/// reads on. A SIGKILL, a rebuild: exact. Then a value naming a schema the registry does not
/// have, and bytes cut short, are dead letters naming the schema id (and the field).
#[sqlx::test(migrations = false)]
async fn avro_through_a_registry_survives_a_sigkill_evolves_and_rebuilds_exactly(pool: PgPool) {
    let test = "avro_through_a_registry_survives_a_sigkill_evolves_and_rebuilds_exactly";
    let Some((url, python)) = registry(test) else { return };
    let env = Env::new(&pool, "avro-kill").await;
    env.publish(&[]).await;
    let (published, events) = stream(684);
    let (v1, v2) = published.split_at(published.len() / 2);
    producers::publish_avro(&python, &brokers(), &env.topic, &url, 1, v1);
    producers::publish_avro(&python, &brokers(), &env.topic, &url, 2, v2);
    killed_mid_stream_then_rebuilt(&pool, &env, &["--schema-registry-url", &url], &events).await;

    let known = schema_id(&url, &format!("{}-value", env.topic), 1).await;
    let unknown = [&[0][..], &999_999u32.to_be_bytes(), b"\x02"].concat();
    let cut = [&[0][..], &known.to_be_bytes(), b"\x48"].concat();
    env.produce_raw("acc-bad", [unknown, cut]).await;
    let (status, _, stderr) = env.run_until_caught_up(&["--schema-registry-url", &url]).await;
    assert!(status.success(), "{stderr}");
    let letters = projectionist::postgres::park::dead_letters(&pool, None, false).await.unwrap();
    let errors: Vec<&str> = letters.iter().map(|l| l.error.as_str()).collect();
    assert_eq!(errors.len(), 2, "{letters:#?}");
    assert!(errors[0].contains("schema id 999999") && errors[0].contains("not in the registry"), "{errors:?}");
    assert!(errors[1].contains(&format!("schema id {known}")) && errors[1].contains("field"), "{errors:?}");
    assert_eq!(read_model(&pool).await, generate::expected(&events), "the rest untouched");
}

/// Protobuf written by Confluent's own serializer against a real registry (Apicurio), the
/// keys plain text: a SIGKILL, duplicates and re-sends, a rebuild: exact.
#[sqlx::test(migrations = false)]
async fn protobuf_through_a_registry_survives_a_sigkill_and_rebuilds_exactly(pool: PgPool) {
    let test = "protobuf_through_a_registry_survives_a_sigkill_and_rebuilds_exactly";
    let Some((url, python)) = registry(test) else { return };
    let env = Env::new(&pool, "protobuf-kill").await;
    env.publish(&[]).await;
    let (published, events) = stream(686);
    producers::publish_protobuf(&python, &brokers(), &env.topic, &url, &published);
    killed_mid_stream_then_rebuilt(&pool, &env, &["--schema-registry-url", &url], &events).await;
}

/// A registry that stops answering while `run` reads a schema it has not fetched yet: the
/// partition waits (`/ready` 503, saying so), nothing is dead-lettered, and it reads on once
/// the registry answers again.
#[sqlx::test(migrations = false)]
async fn a_registry_that_does_not_answer_is_waited_out(pool: PgPool) {
    let test = "a_registry_that_does_not_answer_is_waited_out";
    let Some((url, python)) = registry(test) else { return };
    let upstream = url.trim_start_matches("http://").split_once('/').unwrap().0.to_owned();
    let proxy = Proxy::start(upstream.clone()).await;
    let proxied = url.replacen(&upstream, &format!("127.0.0.1:{}", proxy.port), 1);
    let env = Env::new(&pool, "avro-outage").await;
    env.publish(&[]).await;
    let events = generate::stream(20, 8, 685);
    let (first, second) = events.split_at(events.len() / 2);
    producers::publish_avro(&python, &brokers(), &env.topic, &url, 1, first);
    let args = env.run_args(&["--schema-registry-url", &proxied, "--metrics-addr", "127.0.0.1:0"]);
    let serving = Serving::spawn(env.cli(&args)).await;
    until(&pool, &generate::expected(first), &serving).await;

    proxy.set_down(true);
    producers::publish_avro(&python, &brokers(), &env.topic, &url, 3, second);
    let started = Instant::now();
    loop {
        let (status, body) = http_get(&serving.addr, "/ready").await;
        if status == 503 && body.contains("waiting for the schema registry: true") {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "no wait seen: {status} {body}\n{}", serving.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let letters = projectionist::postgres::park::dead_letters(&pool, None, false).await.unwrap();
    assert!(letters.is_empty(), "{letters:#?}");
    assert_eq!(read_model(&pool).await, generate::expected(first), "nothing of the unread schema applied");
    proxy.set_down(false);
    until(&pool, &generate::expected(&events), &serving).await;
    assert!(serving.log().contains("Waiting for the schema registry"), "{}", serving.log());
}

/// Waits until the read model is `want`, or panics after a minute with the runner's log.
async fn until(pool: &PgPool, want: &std::collections::BTreeMap<String, generate::ExpectedAccount>, serving: &Serving) {
    let started = Instant::now();
    while &read_model(pool).await != want {
        assert!(started.elapsed() < Duration::from_secs(60), "not there in a minute:\n{}", serving.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
