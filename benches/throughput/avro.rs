//! The Avro arm: the same stream written as Avro by Confluent's own serializer through a
//! schema registry (`tests/tools/avro_produce.py`), keys and values, and the pipeline over it
//! beside the pipeline over the JSON envelopes, rounds alternating. Needs the registry and
//! the Python producers (`scripts/services.sh --registry --python-producers`: the bench
//! script starts both); skipped, saying why, without them. `BENCH_AVRO=0` skips it.

use super::*;

#[path = "../../tests/common/producers.rs"]
mod producers;

/// Rounds of each pipeline, alternating; the best of each is compared.
const ROUNDS: usize = 2;

/// What the arm measured.
pub(super) struct Compared {
    /// Avro pipeline / JSON pipeline (deliveries/s, best round of each).
    pub(super) ratio: f64,
    /// CPU per delivery (user + system) of the Avro run over the JSON run's, in µs.
    pub(super) decode_us: f64,
    /// Rows of the Avro run's read model that differ from the JSON run's.
    pub(super) wrong: usize,
}

/// The arm, or `None` (and why) where the registry or the producers are not there.
pub(super) async fn arm(events: &[RawEnvelope], json_topic: &str) -> Option<Compared> {
    let registry = std::env::var("SCHEMA_REGISTRY_URL").ok().filter(|u| !u.is_empty());
    let python = std::env::var("PROJECTIONIST_PYTHON").ok().filter(|p| !p.is_empty());
    let (Some(registry), Some(python)) = (registry, python) else {
        println!(
            "  Avro arm skipped: SCHEMA_REGISTRY_URL or PROJECTIONIST_PYTHON is not set (scripts/bench.sh sets both)"
        );
        return None;
    };
    let topic = format!("bench.accounts-avro.{}", std::process::id());
    make_topic(&topic).await;
    let started = Instant::now();
    producers::publish_avro(&python, &brokers(), &topic, &registry, 1, events);
    let produce = events.len() as f64 / started.elapsed().as_secs_f64();
    println!("  produce as Avro (setup, Python serializer)  {produce:>10.0} deliveries/s");

    let (json_pool, json_url) = fresh_database("projectionist_bench_json").await;
    let (avro_pool, avro_url) = fresh_database("projectionist_bench_avro").await;
    let avro_args = ["--reset", "--schema-registry-url", registry.as_str()];
    let (mut json, mut avro) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        json.push(pipeline(&json_url, json_topic, events.len(), &["--reset"]));
        avro.push(pipeline(&avro_url, &topic, events.len(), &avro_args));
    }
    let best = |runs: &[Run]| runs.iter().map(|r| r.rate).fold(0.0, f64::max);
    let cpu_us =
        |runs: &[Run]| runs.iter().map(|r| r.cpu_seconds).fold(f64::INFINITY, f64::min) / events.len() as f64 * 1e6;
    let (json_rate, avro_rate) = (best(&json), best(&avro));
    println!("  pipeline on Avro through the registry       {avro_rate:>10.0} deliveries/s   (JSON beside it {json_rate:.0}, best of {ROUNDS} rounds each)");
    let wrong = differing_rows(&json_pool, &avro_pool).await;
    Some(Compared { ratio: avro_rate / json_rate, decode_us: cpu_us(&avro) - cpu_us(&json), wrong })
}

/// Rows of `bank_accounts` in `a` and `b` that differ, or are in one only.
pub(super) async fn differing_rows(a: &PgPool, b: &PgPool) -> usize {
    let rows = |pool: &PgPool| {
        let pool = pool.clone();
        async move {
            let rows: Vec<(String, String)> =
                sqlx::query_as("SELECT account_id, row_to_json(b)::text FROM bank_accounts b")
                    .fetch_all(&pool)
                    .await
                    .unwrap();
            rows.into_iter().collect::<std::collections::HashMap<_, _>>()
        }
    };
    let (a, b) = (rows(a).await, rows(b).await);
    let missing = b.keys().filter(|id| !a.contains_key(*id)).count();
    a.iter().filter(|(id, row)| b.get(*id) != Some(row)).count() + missing
}
