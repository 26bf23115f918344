//! Topics in another format than projectionist's own, through the `bank-accounts` binary
//! (issue 68): each written by its real producer, with duplicates and re-sends; read by
//! `run --topic-format`, SIGKILLed mid-stream and run again to the end, then by `rebuild`.

mod common;
#[path = "../../../tests/common/producers.rs"]
mod producers;

use std::time::{Duration, Instant};

use bank_accounts::generate;
use common::cli::Env;
use common::{brokers, partition_accounts, read_model, skip};
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

/// Runs `run --topic-format TOPIC=FORMAT` over the published topic, SIGKILLs it once a tenth
/// of the stream is applied, runs again to the end, then rebuilds: the oracle's read model
/// each time.
async fn killed_mid_stream_then_rebuilt(pool: &PgPool, env: &Env, format: &str, events: &[RawEnvelope]) {
    let want = generate::expected(events);
    let total: i64 = want.values().map(|a| a.version).sum();
    let flag = format!("{}={format}", env.topic);
    let (mut child, log) = env.spawn(&["--topic-format", &flag, "--batch-size", "10", "--batch-wait-ms", "5"]);
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

    let (status, stdout, stderr) = env.run_until_caught_up(&["--topic-format", &flag]).await;
    assert!(status.success(), "{stderr}");
    let partitions = partition_accounts(&stdout, &env.topic);
    assert!(!partitions.is_empty() && partitions.iter().all(|p| p.adds_up() && p.counts[6] == 0), "{stdout}");
    assert_eq!(read_model(pool).await, want, "{format}: exact after a SIGKILL, duplicates and re-sends");

    let mut args = env.run_args(&["--topic-format", &flag]);
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
    killed_mid_stream_then_rebuilt(&pool, &env, "cloudevents", &events).await;
}

/// Axon Framework's Kafka messages (its sequence counted from 0).
#[sqlx::test(migrations = false)]
async fn axon_messages_survive_a_sigkill_and_rebuild_exactly(pool: PgPool) {
    let env = Env::new(&pool, "axon-kill").await;
    env.publish(&[]).await;
    let (published, events) = stream(682);
    producers::publish_axon(&brokers(), &env.topic, &published).await;
    killed_mid_stream_then_rebuilt(&pool, &env, "axon", &events).await;
}
