//! The order-status projection (state machine + fan-in gated by aggregate versions) against a real PostgreSQL.

use order_status::generate::{envelope, expected_customer_stats, expected_orders, stream};
use order_status::{OrderEvent, OrderStatus};
use projectionist::Outcome;
use projectionist_testing::{assert_anomaly_equivalence, ProjectionTest};
use serde_json::json;
use sqlx::PgPool;

fn placed(order: &str, customer: &str, total: i64) -> projectionist::RawEnvelope {
    envelope(order, 1, &OrderEvent::OrderPlaced { customer_id: customer.into(), total_cents: total })
}

#[sqlx::test(migrations = false)]
async fn fan_in_totals_count_each_order_once(pool: PgPool) {
    ProjectionTest::new(pool, OrderStatus)
        .given([placed("o-1", "c-1", 1000)])
        .when([
            placed("o-1", "c-1", 1000),
            placed("o-2", "c-1", 250),
            placed("o-2", "c-1", 250),
            envelope("o-1", 2, &OrderEvent::OrderPaid { amount_cents: 1000 }),
            envelope("o-1", 3, &OrderEvent::OrderShipped {}),
            envelope("o-2", 2, &OrderEvent::OrderCancelled { reason: "no".into() }),
            envelope("o-1", 2, &OrderEvent::OrderPaid { amount_cents: 1000 }),
        ])
        .then_outcomes([
            Outcome::Duplicate,
            Outcome::Applied,
            Outcome::Duplicate,
            Outcome::Applied,
            Outcome::Applied,
            Outcome::Applied,
            Outcome::Stale,
        ])
        .then_rows(
            "SELECT customer_id, orders_placed, total_cents FROM customer_order_stats",
            json!([
                {"customer_id": "c-1", "orders_placed": 2, "total_cents": 1250}
            ]),
        )
        .then_rows(
            "SELECT order_id, status, paid_cents, version FROM orders ORDER BY order_id",
            json!([
                {"order_id": "o-1", "status": "shipped", "paid_cents": 1000, "version": 3},
                {"order_id": "o-2", "status": "cancelled", "paid_cents": 0, "version": 2}
            ]),
        )
        .run()
        .await;
}

#[sqlx::test(migrations = false)]
async fn a_gap_changes_neither_table(pool: PgPool) {
    // Parked, as `run` parks it by default: held until version 2 comes.
    ProjectionTest::new(pool, OrderStatus)
        .given([placed("o-1", "c-1", 1000)])
        .when([envelope("o-1", 3, &OrderEvent::OrderShipped {})])
        .then_outcomes([Outcome::Parked])
        .then_rows("SELECT status, version FROM orders", json!([{"status": "placed", "version": 1}]))
        .then_rows("SELECT orders_placed FROM customer_order_stats", json!([{"orders_placed": 1}]))
        .run()
        .await;
}

#[sqlx::test(migrations = false)]
async fn an_archived_order_is_gone_and_its_replay_does_not_bring_it_back(pool: PgPool) {
    let history = [
        placed("o-1", "c-1", 1000),
        envelope("o-1", 2, &OrderEvent::OrderPaid { amount_cents: 1000 }),
        envelope("o-1", 3, &OrderEvent::OrderArchived {}),
    ];
    ProjectionTest::new(pool, OrderStatus)
        .given(history.clone())
        .when(history)
        .then_outcomes([Outcome::Stale, Outcome::Stale, Outcome::Duplicate])
        .then_rows("SELECT order_id FROM orders", json!([]))
        .then_rows(
            "SELECT orders_placed, total_cents FROM customer_order_stats",
            json!([{"orders_placed": 1, "total_cents": 1000}]),
        )
        .run()
        .await;
}

#[sqlx::test(migrations = false)]
async fn lines_are_added_removed_and_cleared_and_a_replay_brings_none_back(pool: PgPool) {
    let item = |v, sku: &str, quantity| envelope("o-1", v, &OrderEvent::ItemAdded { sku: sku.into(), quantity });
    let removed = |v, sku: &str| envelope("o-1", v, &OrderEvent::ItemRemoved { sku: sku.into() });
    let history =
        [placed("o-1", "c-1", 1000), item(2, "apple", 2), item(3, "pear", 1), item(4, "apple", 1), removed(5, "pear")];
    let lines = "SELECT sku, quantity FROM order_lines ORDER BY sku";
    ProjectionTest::new(pool.clone(), OrderStatus)
        .given(history.clone())
        .when(history.clone())
        .then_rows(lines, json!([{"sku": "apple", "quantity": 3}]))
        .run()
        .await;
    // Cancelled: every line cleared, and a replay of the history after it adds none back.
    let cancelled = envelope("o-1", 6, &OrderEvent::OrderCancelled { reason: "no".into() });
    ProjectionTest::new(pool, OrderStatus)
        .given(history.iter().cloned().chain([cancelled]))
        .when(history)
        .then_outcomes([Outcome::Stale; 5])
        .then_rows(lines, json!([]))
        .run()
        .await;
}

#[sqlx::test(migrations = false)]
async fn thousands_of_events_survive_every_delivery_anomaly(pool: PgPool) {
    let events = stream(1_000, 40, 11);
    assert!(events.len() > 3_000, "{} events", events.len());
    let report = assert_anomaly_equivalence(&pool, &OrderStatus, &events, 5).await;
    assert_eq!(report.clean.applied, events.len() as u64);

    let want = expected_customer_stats(&events);
    let rows: Vec<(String, i64, i64)> =
        sqlx::query_as("SELECT customer_id, orders_placed, total_cents FROM customer_order_stats ORDER BY customer_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let got: std::collections::BTreeMap<_, _> = rows.into_iter().map(|(c, n, t)| (c, (n, t))).collect();
    assert_eq!(got, want);

    // The orders and their lines as the oracle computes them: archived orders gone, the
    // lines of cancelled and archived ones cleared, removed items gone.
    let (orders, lines) = expected_orders(&events);
    let rows: Vec<(String, String, String, i64, i64)> =
        sqlx::query_as("SELECT order_id, customer_id, status, total_cents, paid_cents FROM orders ORDER BY order_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let got: std::collections::BTreeMap<_, _> = rows.into_iter().map(|(o, c, s, t, p)| (o, (c, s, t, p))).collect();
    assert!(got.len() < 1_000 && lines.len() > 1_000, "{} orders and {} lines left", got.len(), lines.len());
    assert_eq!(got, orders);
    let rows: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT order_id, sku, quantity FROM order_lines ORDER BY order_id, sku")
            .fetch_all(&pool)
            .await
            .unwrap();
    let got: std::collections::BTreeMap<_, _> = rows.into_iter().map(|(o, s, q)| ((o, s), q)).collect();
    assert_eq!(got, lines);
}
