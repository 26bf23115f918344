//! The traces arm: the pipeline with traces exported over OTLP gRPC at 1 % sampling to a real
//! Jaeger, and to a collector that is away, beside the pipeline without traces, rounds
//! alternating. Needs Jaeger (`scripts/services.sh --jaeger`: the bench script starts it) for
//! the first; skipped, saying why, without it. `BENCH_TRACES=0` skips the arm.

use super::*;

/// Rounds of each pipeline, alternating; the best of each is compared.
const ROUNDS: usize = 2;

/// What the arm measured.
pub(super) struct Compared {
    /// Traced at 1 % to Jaeger / untraced (deliveries/s, best round of each).
    pub(super) ratio: f64,
    /// Traced at 1 % to a collector that is away / untraced.
    pub(super) away: f64,
    /// CPU per delivery (user + system) of the traced run over the untraced one's, in µs.
    pub(super) cpu_us: f64,
    /// Rows of the traced runs' read models that differ from the untraced run's.
    pub(super) wrong: usize,
}

/// The arm, or `None` (and why) where Jaeger is not there.
pub(super) async fn arm(events: &[RawEnvelope], topic: &str) -> Option<Compared> {
    let Some(jaeger) = std::env::var("OTLP_GRPC_ENDPOINT").ok().filter(|u| !u.is_empty()) else {
        println!("  traces arm skipped: OTLP_GRPC_ENDPOINT is not set (scripts/bench.sh starts Jaeger)");
        return None;
    };
    // A port nothing listens on: taken, then let go.
    let away = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let away = format!("http://{away}");
    let traced =
        |endpoint| ["--reset", "--otlp-protocol", "grpc", "--trace-sample-ratio", "0.01", "--otlp-endpoint", endpoint];
    let (plain_pool, plain_url) = fresh_database("projectionist_bench_untraced").await;
    let (traced_pool, traced_url) = fresh_database("projectionist_bench_traced").await;
    let (away_pool, away_url) = fresh_database("projectionist_bench_traced_away").await;
    let (to_jaeger, to_away) = (traced(jaeger.as_str()), traced(away.as_str()));
    let (mut plain, mut on, mut off) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        plain.push(pipeline(&plain_url, topic, events.len(), &["--reset"]));
        on.push(pipeline(&traced_url, topic, events.len(), &to_jaeger));
        off.push(pipeline(&away_url, topic, events.len(), &to_away));
    }
    let best = |runs: &[Run]| runs.iter().map(|r| r.rate).fold(0.0, f64::max);
    let cpu_us =
        |runs: &[Run]| runs.iter().map(|r| r.cpu_seconds).fold(f64::INFINITY, f64::min) / events.len() as f64 * 1e6;
    let (plain_rate, on_rate, off_rate) = (best(&plain), best(&on), best(&off));
    println!("  pipeline traced at 1 % to Jaeger            {on_rate:>10.0} deliveries/s   (untraced beside it {plain_rate:.0}, best of {ROUNDS} rounds each)");
    println!("  pipeline traced at 1 %, collector away      {off_rate:>10.0} deliveries/s");
    let wrong =
        avro::differing_rows(&plain_pool, &traced_pool).await + avro::differing_rows(&plain_pool, &away_pool).await;
    Some(Compared {
        ratio: on_rate / plain_rate,
        away: off_rate / plain_rate,
        cpu_us: cpu_us(&on) - cpu_us(&plain),
        wrong,
    })
}
