//! Anomaly equivalence: a stream delivered badly must build the same read model as the
//! stream delivered cleanly.

use std::collections::HashMap;
use std::fmt;

use projectionist_core::{OutcomeCounts, RawEnvelope};
use projectionist_postgres::{apply_batch_in, migrate, reset, Mode, PgPool, PgProjection, Policy};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;

use crate::dump_tables;

/// A way of delivering a stream badly, as at-least-once delivery does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// About a third of the events delivered again, right away or later.
    Duplicated,
    /// Every event re-sent with a fresh event id (a producer retry after a lost ack).
    FreshIds,
    /// Aggregates interleaved in a random order, each aggregate's own order kept (the
    /// reordering Kafka allows between keys; within a key the partition keeps order).
    Shuffled,
    /// The whole stream applied twice (a replay from offset zero).
    ReplayedTwice,
    /// Within an aggregate, some events delivered before their predecessor (a producer that
    /// re-sent a lost event late, a topic whose partitions were increased): each is parked,
    /// as `run` parks it, until its predecessor comes.
    Reordered,
    /// All of the above at once.
    Everything,
}

impl Variant {
    /// Every variant, in the order the check runs them.
    pub const ALL: [Variant; 6] =
        [Self::Duplicated, Self::FreshIds, Self::Shuffled, Self::ReplayedTwice, Self::Reordered, Self::Everything];

    fn deliver(self, events: &[RawEnvelope], rng: &mut StdRng) -> Vec<RawEnvelope> {
        match self {
            Self::Duplicated => duplicated(events, rng),
            Self::FreshIds => events.iter().map(fresh_id).collect(),
            Self::Shuffled => shuffled(events, rng),
            Self::ReplayedTwice => events.iter().chain(events).cloned().collect(),
            Self::Reordered => reordered(events, rng),
            Self::Everything => {
                let once = duplicated(&reordered(&shuffled(events, rng), rng), rng);
                let mut twice: Vec<_> = once.iter().map(fresh_id).collect();
                twice.extend(shuffled(events, rng));
                twice
            }
        }
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// What the check saw: outcome counts of the clean run and of each variant.
#[derive(Debug, Clone)]
pub struct AnomalyReport {
    /// The clean in-order run.
    pub clean: OutcomeCounts,
    /// Each variant's run.
    pub variants: Vec<(Variant, OutcomeCounts)>,
}

/// Applies `events` cleanly in order, then once per [`Variant`] on an emptied read model,
/// in batches of random size, with the engine's policies (a gap parks its aggregate), and
/// asserts every variant ends with table contents (and aggregate versions) identical to the
/// clean run, nothing left parked or dead-lettered, and, where no event came before its
/// predecessor, exactly as many events applied. Panics naming the variant and the first
/// differing table otherwise.
pub async fn assert_anomaly_equivalence(
    pool: &PgPool,
    projection: &dyn PgProjection,
    events: &[RawEnvelope],
    seed: u64,
) -> AnomalyReport {
    migrate(pool, &[projection]).await.expect("migrating the test database");
    let mut rng = StdRng::seed_from_u64(seed);
    let name = projection.name().to_owned();
    assert!(!projection.tables().is_empty(), "projection {name} declares no tables() to compare");

    reset(pool, projection).await.expect("resetting the projection");
    let clean = run(pool, projection, events, &mut rng, "Clean").await;
    assert_eq!(clean.gap, 0, "the clean in-order run reported gaps: the input stream itself is broken");
    let expected = dump_tables(pool, projection).await;

    let mut variants = Vec::new();
    for variant in Variant::ALL {
        reset(pool, projection).await.expect("resetting the projection");
        let stream = variant.deliver(events, &mut rng);
        let counts = run(pool, projection, &stream, &mut rng, &variant.to_string()).await;
        assert_eq!(counts.gap, 0, "variant {variant}: reported gaps");
        assert_eq!(counts.dead_lettered, 0, "variant {variant}: dead-lettered events the clean run applied");
        let parked = projectionist_postgres::park::list(pool, Some(&name)).await.expect("listing parked aggregates");
        assert!(parked.is_empty(), "variant {variant}: aggregates left parked: {parked:?}");
        // An event parked, then applied as its predecessor came, has no outcome of its own.
        if !matches!(variant, Variant::Reordered | Variant::Everything) {
            assert_eq!(
                counts.applied, clean.applied,
                "variant {variant}: applied a different number of events than the clean run"
            );
        }
        let actual = dump_tables(pool, projection).await;
        if actual != expected {
            panic!(
                "variant {variant}: read model differs from the clean run\n{}",
                first_difference(&expected, &actual)
            );
        }
        variants.push((variant, counts));
    }
    AnomalyReport { clean, variants }
}

async fn run(
    pool: &PgPool,
    projection: &dyn PgProjection,
    stream: &[RawEnvelope],
    rng: &mut StdRng,
    label: &str,
) -> OutcomeCounts {
    let mut counts = OutcomeCounts::default();
    let mut rest = stream;
    while !rest.is_empty() {
        let size = rng.gen_range(1..=64).min(rest.len());
        let (batch, tail) = rest.split_at(size);
        let outcomes = apply_batch_in(pool, projection, batch, Mode::Batch, Policy::default())
            .await
            .unwrap_or_else(|e| panic!("{label} run: applying a batch failed: {e}"));
        for (event, outcome) in batch.iter().zip(&outcomes) {
            assert!(outcome.is_ok(), "{label} run: {} v{} reported {outcome}", event.aggregate_id, event.version);
            counts.add(outcome);
        }
        rest = tail;
    }
    counts
}

fn fresh_id(event: &RawEnvelope) -> RawEnvelope {
    RawEnvelope { id: uuid::Uuid::new_v4().into(), ..event.clone() }
}

fn duplicated(events: &[RawEnvelope], rng: &mut StdRng) -> Vec<RawEnvelope> {
    crate::streams::with_redeliveries(events, 0.33, 0.0, rng.gen())
}

fn shuffled(events: &[RawEnvelope], rng: &mut StdRng) -> Vec<RawEnvelope> {
    let mut per_aggregate: Vec<Vec<RawEnvelope>> = Vec::new();
    let mut index: HashMap<(&str, &str), usize> = HashMap::new();
    for e in events {
        let at = *index.entry((e.aggregate_type.as_str(), e.aggregate_id.as_str())).or_insert_with(|| {
            per_aggregate.push(Vec::new());
            per_aggregate.len() - 1
        });
        per_aggregate[at].push(e.clone());
    }
    crate::streams::interleave(per_aggregate, rng.gen())
}

/// `events` with about one event in eight of each aggregate delivered right before its
/// predecessor (a pair of neighbouring versions swapped).
fn reordered(events: &[RawEnvelope], rng: &mut StdRng) -> Vec<RawEnvelope> {
    let mut out = events.to_vec();
    let mut last: HashMap<(&str, &str), usize> = HashMap::new();
    let mut swaps = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let key = (e.aggregate_type.as_str(), e.aggregate_id.as_str());
        if let Some(&before) = last.get(&key) {
            if rng.gen_bool(0.125) && swaps.last().is_none_or(|(_, j)| *j != before) {
                swaps.push((before, i));
            }
        }
        last.insert(key, i);
    }
    for (a, b) in swaps {
        out.swap(a, b);
    }
    out
}

fn first_difference(expected: &Value, actual: &Value) -> String {
    let (Some(exp), Some(act)) = (expected.as_object(), actual.as_object()) else {
        return format!("expected {expected}\nactual {actual}");
    };
    for (table, rows) in exp {
        let other = &act[table];
        if rows != other {
            let (e, a) = (rows.as_array().cloned().unwrap_or_default(), other.as_array().cloned().unwrap_or_default());
            let row = e.iter().zip(&a).find(|(x, y)| x != y);
            return match row {
                Some((x, y)) => format!("table {table}: first differing row\n  clean:   {x}\n  variant: {y}"),
                None => format!("table {table}: {} rows in the clean run, {} in the variant", e.len(), a.len()),
            };
        }
    }
    "no difference found".into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream() -> Vec<RawEnvelope> {
        let mut out = Vec::new();
        for v in 1..=5 {
            for agg in ["a", "b", "c"] {
                out.push(crate::envelope("t", agg, v, &serde_json::json!({"type": "E", "data": {}})));
            }
        }
        out
    }

    fn per_aggregate_versions(events: &[RawEnvelope]) -> HashMap<String, Vec<i64>> {
        let mut m: HashMap<String, Vec<i64>> = HashMap::new();
        for e in events {
            m.entry(e.aggregate_id.clone()).or_default().push(e.version);
        }
        m
    }

    #[test]
    fn shuffling_keeps_each_aggregates_order_and_every_event() {
        let events = stream();
        let out = shuffled(&events, &mut StdRng::seed_from_u64(7));
        assert_eq!(out.len(), events.len());
        assert_ne!(out, events, "seed 7 should move something");
        for versions in per_aggregate_versions(&out).values() {
            assert_eq!(versions, &[1, 2, 3, 4, 5]);
        }
    }

    #[test]
    fn reordering_moves_some_events_before_their_predecessor_and_keeps_every_event() {
        let events = stream();
        let out = reordered(&events, &mut StdRng::seed_from_u64(5));
        assert_eq!(out.len(), events.len());
        assert!(out.iter().all(|e| events.contains(e)));
        let versions = per_aggregate_versions(&out);
        assert!(versions.values().any(|v| v.windows(2).any(|w| w[0] > w[1])), "something reordered: {versions:?}");
    }

    #[test]
    fn duplicates_come_after_their_original() {
        let events = stream();
        let out = duplicated(&events, &mut StdRng::seed_from_u64(3));
        assert!(out.len() > events.len(), "some events delivered twice");
        // First deliveries keep the original order; every other delivery is a later copy.
        let mut first_seen = Vec::new();
        for e in &out {
            if !first_seen.contains(&e.id) {
                first_seen.push(e.id.clone());
            }
        }
        assert_eq!(first_seen, events.iter().map(|e| e.id.clone()).collect::<Vec<_>>());
        assert!(out.iter().all(|e| events.contains(e)), "duplicates are exact copies");
    }

    #[test]
    fn fresh_ids_change_only_the_id() {
        let events = stream();
        let out = Variant::FreshIds.deliver(&events, &mut StdRng::seed_from_u64(1));
        for (a, b) in events.iter().zip(&out) {
            assert_ne!(a.id, b.id);
            assert_eq!(RawEnvelope { id: a.id.clone(), ..b.clone() }, *a);
        }
    }
}
