//! A halted partition heals (issue 70): a halt whose cause can go away (a permission, a
//! table, a constraint) is retried with backoff while the run goes on, and says so.

mod common;

use std::time::{Duration, Instant};

use bank_accounts::generate;
use common::cli::Env;
use common::{http_get, read_model, Serving};
use sqlx::PgPool;

/// Waits up to a minute for `done`, saying `what` and the run's log if it never comes.
async fn until<F: std::future::Future<Output = bool>>(serving: &Serving, what: &str, mut done: impl FnMut() -> F) {
    let started = Instant::now();
    while !done().await {
        assert!(started.elapsed() < Duration::from_secs(60), "{what}: not in a minute:\n{}", serving.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The grant to write the read model's table is revoked under a running `run`: its
/// partitions halt and say they retry; nothing is dead-lettered. Once it is granted back,
/// they resume on their own, and the read model ends exact: nothing lost or applied twice.
#[sqlx::test(migrations = false)]
async fn a_partition_halted_by_a_revoked_grant_resumes_once_it_is_granted_again(pool: PgPool) {
    let env = Env::new(&pool, "heal-grant").await;
    let events = generate::stream(24, 6, 700);
    let (first, rest) = events.split_at(events.len() / 2);
    env.publish(first).await;
    let args = env.run_args(&["--metrics-addr", "127.0.0.1:0", "--halt-retry-max-delay-ms", "1000"]);
    let serving = Serving::spawn(env.cli(&args)).await;
    let before = generate::expected(first);
    until(&serving, "the first half applied", || async { read_model(&pool).await == before }).await;

    sqlx::query("REVOKE INSERT, UPDATE ON bank_accounts FROM CURRENT_USER").execute(&pool).await.unwrap();
    env.publish(rest).await;
    until(&serving, "halted", || async { http_get(&serving.addr, "/ready").await.0 == 503 }).await;
    let (_, ready) = http_get(&serving.addr, "/ready").await;
    assert!(ready.contains("permission denied for table bank_accounts") && ready.contains("halted since"), "{ready}");
    // Retried, and halted again while the grant is away: twice over.
    until(&serving, "a second retry", || async { serving.log().contains("attempt=2") }).await;
    let log = serving.log();
    assert!(log.contains("permission denied") && log.contains("retried in"), "says what and when:\n{log}");
    assert_eq!(read_model(&pool).await, before, "nothing applied while the grant is away");
    // `status`, another process, shows the halts the run recorded: where, why, when retried.
    let (_, status, _) = env.output(&["status"]).await;
    let halted = status.split("\nhalted ").nth(1).unwrap_or_else(|| panic!("status shows the halts:\n{status}"));
    assert!(halted.contains("permission denied for table bank_accounts") && halted.contains("next at"), "{status}");

    sqlx::query("GRANT INSERT, UPDATE ON bank_accounts TO CURRENT_USER").execute(&pool).await.unwrap();
    let after = generate::expected(&events);
    until(&serving, "everything applied", || async { read_model(&pool).await == after }).await;
    until(&serving, "ready again", || async { http_get(&serving.addr, "/ready").await.0 == 200 }).await;
    let letters = projectionist::postgres::park::dead_letters(&pool, None, true).await.unwrap();
    assert!(letters.is_empty(), "nothing dead-lettered: {}", letters.len());
    let (_, metrics) = http_get(&serving.addr, "/metrics").await;
    assert!(
        metrics.lines().any(|l| l.starts_with("projectionist_partitions_halted{") && l.ends_with(" 0")),
        "{metrics}"
    );
    assert!(metrics.contains("projectionist_halt_retries_total{"), "{metrics}");
    until(&serving, "said healed", || async { serving.log().contains("The halted partition healed") }).await;
    until(&serving, "status shows no halt", || async { !env.output(&["status"]).await.1.contains("\nhalted ") }).await;
}
