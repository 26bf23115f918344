//! The connection budget arm: ten projections of a twelve-partition topic in one process
//! (`bank-fleet`), capped at [`CAP`] PostgreSQL connections, beside the same process with its
//! default pool (one connection per partition plus two, at most 64), rounds alternating. The
//! peak of connections each held is counted by PostgreSQL (`pg_stat_activity`).
//! `BENCH_BUDGET=0` skips the arm, `BENCH_BUDGET_ONLY=1` runs it alone;
//! `BENCH_BUDGET_DELIVERIES` (default 100000) sizes its stream, applied by each projection.

use projectionist_testing::ConnectionPeak;

use super::process::BANK_FLEET;
use super::*;

/// The cap of the capped runs.
pub(super) const CAP: u32 = 8;
/// Projections in the process, and partitions of their topic.
const PROJECTIONS: usize = 10;
const TOPIC_PARTITIONS: i32 = 12;
/// Rounds of each run, alternating; the best of each is compared.
const ROUNDS: usize = 2;

/// What the arm measured.
pub(super) struct Compared {
    /// Capped / uncapped (deliveries/s, best round of each).
    pub(super) ratio: f64,
    /// The most connections the process held at once: capped, uncapped.
    pub(super) peaks: (i64, i64),
}

pub(super) async fn arm() -> Compared {
    let deliveries = env_usize("BENCH_BUDGET_DELIVERIES", 100_000);
    let events = stream(deliveries);
    let (want, _) = version_sum(&events);
    let records = events.iter().map(|e| (e.aggregate_id.clone().into_bytes(), e.to_json()));
    let (topic, n, _) = kafka::publish_records_to("bench.fleet", TOPIC_PARTITIONS, records).await;
    let (pool, url) = empty_database("projectionist_bench_fleet").await;
    let url = format!("{url}{}application_name={APP}", if url.contains('?') { '&' } else { '?' });
    let status = Command::new(BANK_FLEET.path()).arg("migrate").env("DATABASE_URL", &url).status();
    assert!(status.is_ok_and(|s| s.success()), "bank-fleet migrate ({})", BANK_FLEET.path());
    let (mut capped, mut uncapped) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        capped.push(fleet_run(&pool, &url, &topic, n, Some(CAP)).await);
        uncapped.push(fleet_run(&pool, &url, &topic, n, None).await);
        for i in 1..=PROJECTIONS {
            let sql = format!("SELECT coalesce(sum(version), 0)::bigint FROM bank_accounts_{i}");
            let got: i64 = sqlx::query_scalar(&sql).fetch_one(&pool).await.unwrap();
            assert_eq!(got, want, "bank_accounts_{i} applied every event");
        }
    }
    let best = |runs: &[(f64, i64)]| runs.iter().map(|r| r.0).fold(0.0, f64::max);
    let peak = |runs: &[(f64, i64)]| runs.iter().map(|r| r.1).max().unwrap_or(0);
    let (capped_rate, uncapped_rate) = (best(&capped), best(&uncapped));
    println!(
        "  {PROJECTIONS} projections x {TOPIC_PARTITIONS} partitions, capped at {CAP} {capped_rate:>10.0} deliveries/s   \
         (uncapped {uncapped_rate:.0}; peak connections {} against {}; best of {ROUNDS} rounds, {n} deliveries each \
         projection)",
        peak(&capped),
        peak(&uncapped)
    );
    Compared { ratio: capped_rate / uncapped_rate, peaks: (peak(&capped), peak(&uncapped)) }
}

/// One `run --reset` of the fleet to caught up, capped at `cap` connections or not: its rate
/// (deliveries/s, each projection's counted) and the most connections it held at once.
async fn fleet_run(pool: &PgPool, url: &str, topic: &str, deliveries: usize, cap: Option<u32>) -> (f64, i64) {
    let mut args = vec!["--exit-when-caught-up".to_owned(), "--reset".to_owned()];
    if let Some(cap) = cap {
        args.extend(["--pg-max-connections".to_owned(), cap.to_string()]);
    }
    let sampler = ConnectionPeak::start(pool, APP);
    let (url, topic) = (url.to_owned(), topic.to_owned());
    let run = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        BANK_FLEET.projector("run", &url, &topic, deliveries * PROJECTIONS, &args)
    })
    .await
    .unwrap();
    (run.rate, sampler.most().await)
}

/// The fleet's connections' name in PostgreSQL.
const APP: &str = "projectionist-bench-fleet";
