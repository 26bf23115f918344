//! A reproducible stream of order events, and the read model it must produce, computed
//! independently of the database.

use std::collections::BTreeMap;

use projectionist::RawEnvelope;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::{OrderEvent, AGGREGATE_TYPE};

/// Generates `orders` order streams (ids `ord-00001`…) from `customers` customers, each a
/// walk through the order state machine with items added and removed (a fifth of them
/// archived at the end), interleaved across orders (each order's own order
/// kept). Deterministic for a seed, except the producer-minted event ids.
pub fn stream(orders: usize, customers: usize, seed: u64) -> Vec<RawEnvelope> {
    let mut rng = StdRng::seed_from_u64(seed);
    let per_order: Vec<Vec<RawEnvelope>> = (1..=orders)
        .map(|n| {
            let id = format!("ord-{n:05}");
            let total = rng.gen_range(100..=50_000_i64);
            let mut events = vec![OrderEvent::OrderPlaced {
                customer_id: format!("cust-{}", rng.gen_range(1..=customers.max(1))),
                total_cents: total,
            }];
            // Its items (one sometimes added twice), one sometimes taken out again.
            for _ in 0..rng.gen_range(1..=3) {
                let sku = format!("sku-{}", rng.gen_range(1..=5));
                events.push(OrderEvent::ItemAdded { sku, quantity: rng.gen_range(1..=3) });
            }
            if rng.gen_bool(0.3) {
                events.push(OrderEvent::ItemRemoved { sku: format!("sku-{}", rng.gen_range(1..=5)) });
            }
            if rng.gen_bool(0.15) {
                events.push(OrderEvent::OrderCancelled { reason: "changed mind".into() });
            } else {
                let first = rng.gen_range(1..=total);
                events.push(OrderEvent::OrderPaid { amount_cents: first });
                if first < total {
                    events.push(OrderEvent::OrderPaid { amount_cents: total - first });
                }
                if rng.gen_bool(0.7) {
                    events.push(OrderEvent::OrderShipped {});
                }
            }
            // Some orders are archived: their rows deleted.
            if rng.gen_bool(0.2) {
                events.push(OrderEvent::OrderArchived {});
            }
            events.iter().zip(1..).map(|(e, v)| envelope(&id, v, e)).collect()
        })
        .collect();
    projectionist::testing::interleave(per_order, seed)
}

/// A wire envelope for one order event (fresh id, `occurred_at` derived from version).
pub fn envelope(order_id: &str, version: i64, event: &OrderEvent) -> RawEnvelope {
    projectionist::testing::envelope(AGGREGATE_TYPE, order_id, version, event)
}

/// Expected `customer_order_stats`: customer → (orders placed, total cents), folded in memory
/// over distinct (order, version) pairs.
pub fn expected_customer_stats(events: &[RawEnvelope]) -> BTreeMap<String, (i64, i64)> {
    let mut seen = std::collections::HashSet::new();
    let mut stats: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for e in events {
        if !seen.insert((e.aggregate_id.clone(), e.version)) || e.event_type != "OrderPlaced" {
            continue;
        }
        let customer = e.data["customer_id"].as_str().expect("customer_id").to_owned();
        let entry = stats.entry(customer).or_default();
        entry.0 += 1;
        entry.1 += e.data["total_cents"].as_i64().expect("total_cents");
    }
    stats
}
