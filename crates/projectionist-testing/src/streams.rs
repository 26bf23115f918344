//! Building delivered streams from per-aggregate event lists, as a broker delivers them.

use projectionist_core::RawEnvelope;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Interleaves per-aggregate streams in a random order that keeps each aggregate's own
/// order (what a partitioned topic keyed by aggregate id delivers). Deterministic per seed.
pub fn interleave(per_aggregate: Vec<Vec<RawEnvelope>>, seed: u64) -> Vec<RawEnvelope> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut queues: Vec<std::vec::IntoIter<RawEnvelope>> =
        per_aggregate.into_iter().filter(|s| !s.is_empty()).map(Vec::into_iter).collect();
    let mut out = Vec::with_capacity(queues.iter().map(|q| q.len()).sum());
    while !queues.is_empty() {
        let k = rng.gen_range(0..queues.len());
        match queues[k].next() {
            Some(event) => out.push(event),
            None => {
                queues.swap_remove(k);
            }
        }
    }
    out
}

/// Mixes redeliveries into `events`: about `duplicates` of them delivered again as they are,
/// and `resent` of them re-sent by the producer with a fresh event id, each somewhere after
/// its original (a redelivery never precedes the first delivery). Deterministic per seed,
/// except the fresh ids.
pub fn with_redeliveries(events: &[RawEnvelope], duplicates: f64, resent: f64, seed: u64) -> Vec<RawEnvelope> {
    let mut rng = StdRng::seed_from_u64(seed);
    let n = events.len() as f64;
    let mut timed: Vec<(f64, RawEnvelope)> = events.iter().enumerate().map(|(i, e)| (i as f64, e.clone())).collect();
    for (i, e) in events.iter().enumerate() {
        if rng.gen_bool(duplicates.clamp(0.0, 1.0)) {
            let at = if rng.gen_bool(0.5) { i as f64 + 0.5 } else { rng.gen_range(i as f64 + 0.1..n + 1.0) };
            timed.push((at, e.clone()));
        }
        if rng.gen_bool(resent.clamp(0.0, 1.0)) {
            timed.push((
                rng.gen_range(i as f64 + 0.1..n + 1.0),
                RawEnvelope { id: uuid::Uuid::new_v4().into(), ..e.clone() },
            ));
        }
    }
    timed.sort_by(|a, b| a.0.total_cmp(&b.0));
    timed.into_iter().map(|(_, e)| e).collect()
}
