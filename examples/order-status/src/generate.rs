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

/// An `orders` row as the oracle holds it: customer, status, total and paid cents.
pub type OrderRow = (String, String, i64, i64);

/// Expected `orders` (order → row) and `order_lines` ((order, sku) → quantity), computed
/// in memory: each order's events applied once, in version order (a stream from [`stream`],
/// redelivered or not, brings each order's versions in order; a version not next for its
/// order is a duplicate or a re-send and changes nothing).
pub fn expected_orders(events: &[RawEnvelope]) -> (BTreeMap<String, OrderRow>, BTreeMap<(String, String), i64>) {
    let mut latest: std::collections::HashMap<&str, i64> = std::collections::HashMap::new();
    let (mut orders, mut lines) = (BTreeMap::new(), BTreeMap::new());
    for e in events {
        let version = latest.entry(e.aggregate_id.as_str()).or_default();
        assert!(e.version <= *version + 1, "{} skips from version {version} to {}", e.aggregate_id, e.version);
        if e.version != *version + 1 {
            continue;
        }
        *version = e.version;
        let (id, data) = (&e.aggregate_id, &e.data);
        let text = |field: &str| data[field].as_str().unwrap_or_else(|| panic!("{field} of {id}")).to_owned();
        let int = |field: &str| data[field].as_i64().unwrap_or_else(|| panic!("{field} of {id}"));
        let mut status = |to: &str| orders.get_mut(id).map(|o: &mut OrderRow| o.1 = to.to_owned());
        match e.event_type.as_str() {
            "OrderPlaced" => {
                orders.insert(id.clone(), (text("customer_id"), "placed".to_owned(), int("total_cents"), 0));
            }
            "ItemAdded" => *lines.entry((id.clone(), text("sku"))).or_default() += int("quantity"),
            "ItemRemoved" => drop(lines.remove(&(id.clone(), text("sku")))),
            "OrderPaid" => {
                status("paid");
                orders.get_mut(id).expect("placed before paid").3 += int("amount_cents");
            }
            "OrderShipped" => drop(status("shipped")),
            "OrderCancelled" => {
                status("cancelled");
                clear_lines(&mut lines, id);
            }
            "OrderArchived" => {
                orders.remove(id);
                clear_lines(&mut lines, id);
            }
            other => panic!("unknown event type {other}"),
        }
    }
    (orders, lines)
}

fn clear_lines(lines: &mut BTreeMap<(String, String), i64>, order: &str) {
    let of_order: Vec<_> = lines
        .range((order.to_owned(), String::new())..)
        .take_while(|((o, _), _)| o == order)
        .map(|(k, _)| k.clone())
        .collect();
    for key in of_order {
        lines.remove(&key);
    }
}
