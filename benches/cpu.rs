//! Where a projector's own CPU goes per delivery, stage by stage, on the bench's bank stream
//! (the stream `benches/throughput.rs` publishes), in one thread, with no Kafka and no
//! PostgreSQL: decoding each envelope from its Kafka payload; preparing each batch (each
//! event's data decoded, then projected into row writes); and planning each batch against
//! the versions a rebuild's fold holds and folding the plan in, as a rebuild does (its tables
//! empty at the start, so the fold holds every version there is). Batches of 5,000 events,
//! `run`'s size; the fold is emptied at 100,000 rows, as a rebuild writes it. Each stage is
//! timed over the whole stream, best of three runs, and printed per delivery and as its share
//! of the whole: the figures to compare, side by side, between two builds (`BENCH_CPU_DELIVERIES`,
//! default 500000, sizes the stream). Run with: `cargo bench --bench cpu`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use bank_accounts::{AccountEvent, BankAccounts};
use projectionist::fold::Fold;
use projectionist::plan::{plan_unordered, Effect, EventRef, Stored};
use projectionist::postgres::{PgProjection, PgTypes};
use projectionist::{Envelope, EventDecoder, LazyEnvelope, Projection, Writes};

// The allocator the projector binaries link (`examples/*/src/main.rs`): with glibc's malloc
// this bench's stages spent about a seventh of their time in it, which a projector does not.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const BATCH: usize = 5_000;
const FOLD_ROWS: usize = 100_000;
const RUNS: usize = 3;

/// An event as the planner takes it, projected ahead of the timing.
struct Projected {
    aggregate_type: String,
    aggregate_id: String,
    version: i64,
    writes: Writes,
}

fn main() {
    let deliveries: usize = std::env::var("BENCH_CPU_DELIVERIES").ok().and_then(|v| v.parse().ok()).unwrap_or(500_000);
    let accounts = (deliveries / 26).max(10);
    let distinct = bank_accounts::generate::stream(accounts, 45, 7);
    let stream = projectionist_testing::with_redeliveries(&distinct, 0.10, 0.05, 11);
    let payloads: Vec<Vec<u8>> = stream.iter().map(|e| serde_json::to_vec(e).expect("an envelope encodes")).collect();
    let n = payloads.len();
    let decode_all = || -> Vec<LazyEnvelope> {
        payloads.iter().map(|p| LazyEnvelope::from_slice(p).expect("the bench's envelopes decode")).collect()
    };

    let decode = best(|| {
        let start = Instant::now();
        for p in &payloads {
            black_box(LazyEnvelope::from_slice(black_box(p)).expect("decodes"));
        }
        start.elapsed()
    });

    let prepare = best(|| {
        let mut batches: Vec<Vec<LazyEnvelope>> = Vec::new();
        let mut all = decode_all().into_iter();
        loop {
            let batch: Vec<LazyEnvelope> = all.by_ref().take(BATCH).collect();
            if batch.is_empty() {
                break;
            }
            batches.push(batch);
        }
        let start = Instant::now();
        for batch in batches {
            black_box(BankAccounts.prepare_lazy(batch));
        }
        start.elapsed()
    });

    let decoder = EventDecoder::<AccountEvent>::new();
    let projected: Vec<Projected> = decode_all()
        .into_iter()
        .map(|e| {
            let event = decoder.event_from_json(&e.event_type, &e.data).expect("the bench's events decode");
            let LazyEnvelope { id, aggregate_type, aggregate_id, version, event_type, occurred_at, metadata, .. } = e;
            let env = Envelope { id, aggregate_type, aggregate_id, version, event_type, occurred_at, event, metadata };
            let writes = BankAccounts.project(&env);
            Projected { aggregate_type: env.aggregate_type, aggregate_id: env.aggregate_id, version, writes }
        })
        .collect();
    let tables = Projection::tables(&BankAccounts);
    let (mut plan_best, mut fold_best) = (Duration::MAX, Duration::MAX);
    for _ in 0..RUNS {
        let (mut planning, mut folding) = (Duration::ZERO, Duration::ZERO);
        let mut fold = Fold::default();
        for batch in projected.chunks(BATCH) {
            let start = Instant::now();
            let events: Vec<(EventRef<'_>, Effect<'_>)> = batch
                .iter()
                .map(|p| {
                    let event = EventRef {
                        aggregate_type: &p.aggregate_type,
                        aggregate_id: &p.aggregate_id,
                        version: p.version,
                    };
                    (event, Effect::Writes(p.writes.writes()))
                })
                .collect();
            // The versions as a rebuild reads them (`read_stored`): each key of the batch once,
            // from its fold, for the rows it holds.
            let mut stored = Stored::default();
            let mut ids: Vec<&str> = events.iter().map(|(e, _)| e.aggregate_id).collect();
            ids.sort_unstable();
            ids.dedup();
            for table in tables {
                let held = stored.rows.entry(table.name()).or_default();
                for id in &ids {
                    if let Some(Some(v)) = fold.version(table.name(), id) {
                        held.insert(*id, v);
                    }
                }
            }
            let planned = plan_unordered(tables, &PgTypes, &stored, &events).expect("the bench's batches plan");
            let planned_at = Instant::now();
            assert!(fold.absorb(tables, &PgTypes, &planned), "the bench's batches fold");
            if fold.len() >= FOLD_ROWS {
                fold.clear();
            }
            planning += planned_at - start;
            folding += planned_at.elapsed();
        }
        plan_best = plan_best.min(planning);
        fold_best = fold_best.min(folding);
    }

    let stages = [
        ("decode envelopes (from Kafka payloads)", decode),
        ("prepare (decode data, project)", prepare),
        ("plan against the fold's versions", plan_best),
        ("fold the plan in", fold_best),
    ];
    let total: Duration = stages.iter().map(|(_, d)| *d).sum();
    println!(
        "projectionist CPU per delivery, one thread, no I/O: {n} deliveries ({accounts} accounts), batches of {BATCH}"
    );
    for (stage, took) in stages {
        let share = took.as_secs_f64() / total.as_secs_f64() * 100.0;
        println!("  {stage:<40} {:>6.3} us   ({share:>4.1} % of the whole)", per_delivery(took, n));
    }
    println!("  {:<40} {:>6.3} us", "whole", per_delivery(total, n));
}

/// The shortest of [`RUNS`] runs of `run`, which times itself (leaving out its set-up).
fn best(mut run: impl FnMut() -> Duration) -> Duration {
    (0..RUNS).map(|_| run()).min().expect("at least one run")
}

fn per_delivery(took: Duration, n: usize) -> f64 {
    took.as_secs_f64() / n as f64 * 1e6
}
