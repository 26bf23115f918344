//! A partition's task that ends unexpectedly (a panic: a bug in the engine or a library it
//! calls) is a halt the operator sees, never silence.

use std::time::{Duration, Instant};

use sqlx::PgPool;

use super::accounting::Expect;
use super::common::{http_get, Serving};
use super::{conclude, stream, Scene};

/// The fault hooks make a partition's task panic as it reads its 30th message
/// (`partition-read:30:panic`) under a live run. `/ready` then answers 503 naming one halted
/// partition, the halt gauge says 1, the log says the task ended unexpectedly, and the run
/// exits 2 when stopped. The next run reads on from the checkpoint and ends exact.
#[sqlx::test(migrations = false)]
async fn a_partition_task_that_panics_is_a_visible_halt(pool: PgPool) {
    let scene = Scene::new(&pool, "chaos-task-panic").await;
    let events = stream(100, 47);
    scene.publish(&events, Duration::ZERO).await.unwrap();
    let mut run = scene.cli(&["run", "--group-id", &scene.group, "--metrics-addr", "127.0.0.1:0"]);
    run.env("PROJECTIONIST_FAULT", "partition-read:30:panic");
    let mut serving = Serving::spawn(run).await;
    let started = Instant::now();
    let ready = loop {
        let ready = http_get(&serving.addr, "/ready").await;
        if ready.0 == 503 && ready.1.contains("partitions halted: 1") {
            break ready;
        }
        assert!(started.elapsed() < Duration::from_secs(90), "no halt seen: {ready:?}\n{}", serving.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let (_, metrics) = http_get(&serving.addr, "/metrics").await;
    let gauge = metrics.lines().find(|l| l.starts_with("projectionist_partitions_halted{"));
    assert!(gauge.is_some_and(|l| l.ends_with(" 1")), "halt gauge: {gauge:?} ({ready:?})");
    let pid = serving.child.id().unwrap().to_string();
    std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    let status = tokio::time::timeout(Duration::from_secs(60), serving.child.wait()).await.expect("stops").unwrap();
    let log = serving.log();
    assert_eq!(status.code(), Some(2), "a run with a halted partition exits 2:\n{log}");
    assert!(log.contains("the partition's task ended unexpectedly"), "{log}");
    assert!(log.contains("fault point partition-read reached the 30th time: panic"), "{log}");
    // The next run reads on from the checkpoint: nothing lost, nothing doubled.
    let recovery = scene.run_to_the_end().await;
    let done = "a partition's task panicked under a live run";
    let (scenario, expect) = ("a partition task that panics", Expect::AddsUp);
    conclude(&pool, &scene, scenario, done, recovery, &events, expect).await;
}
