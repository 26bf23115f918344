//! The orders arm: a read model that shrinks and nests (issue 41). The order-status
//! projector on a stream of orders placed, their lines added, changed (added to again) and
//! removed, orders paid, shipped, cancelled (their lines cleared) and archived (their rows
//! deleted), with the bank stream's share of duplicates and re-sends: the pipeline and a
//! rebuild against PostgreSQL alone doing the same gated writes, staged, one statement per
//! wave. Every run's tables are compared with the oracle computed in memory.

use std::collections::BTreeMap;
use std::time::Instant;

use order_status::generate::{expected_customer_stats, expected_orders, OrderRow};
use projectionist::postgres::migrate;
use projectionist::RawEnvelope;
use sqlx::PgPool;

use super::{empty_database, env_usize, publish_all, waves, Bin, Run};

const ORDER_STATUS: Bin = Bin {
    var: "ORDER_STATUS_BIN",
    default: "target/release/order-status",
    topic_var: "ORDER_STATUS_TOPIC",
    package: "order-status",
};

/// An order stream of about `deliveries` deliveries (7.3 per order on average), 10 % of
/// its events delivered twice and 5 % re-sent under a fresh id.
fn stream(deliveries: usize) -> Vec<RawEnvelope> {
    let orders = (deliveries * 10 / 73).max(10);
    let distinct = order_status::generate::stream(orders, orders / 20 + 1, 7);
    projectionist_testing::with_redeliveries(&distinct, 0.10, 0.05, 11)
}

/// What one run left in the three tables, or the oracle's.
#[derive(Debug, PartialEq)]
struct Model {
    orders: BTreeMap<String, OrderRow>,
    lines: BTreeMap<(String, String), i64>,
    stats: BTreeMap<String, (i64, i64)>,
}

impl Model {
    fn expected(events: &[RawEnvelope]) -> Self {
        let (orders, lines) = expected_orders(events);
        Self { orders, lines, stats: expected_customer_stats(events) }
    }

    async fn read(pool: &PgPool) -> Self {
        let orders: Vec<(String, String, String, i64, i64)> =
            sqlx::query_as("SELECT order_id, customer_id, status, total_cents, paid_cents FROM orders")
                .fetch_all(pool)
                .await
                .unwrap();
        let lines: Vec<(String, String, i64)> =
            sqlx::query_as("SELECT order_id, sku, quantity FROM order_lines").fetch_all(pool).await.unwrap();
        let stats: Vec<(String, i64, i64)> =
            sqlx::query_as("SELECT customer_id, orders_placed, total_cents FROM customer_order_stats")
                .fetch_all(pool)
                .await
                .unwrap();
        Self {
            orders: orders.into_iter().map(|(o, c, s, t, p)| (o, (c, s, t, p))).collect(),
            lines: lines.into_iter().map(|(o, s, q)| ((o, s), q)).collect(),
            stats: stats.into_iter().map(|(c, n, t)| (c, (n, t))).collect(),
        }
    }

    /// Panics naming the first difference from `want` (the models are large).
    fn assert_is(&self, want: &Model, what: &str) {
        let first = |a: Vec<String>, b: Vec<String>| a.into_iter().zip(b).find(|(a, b)| a != b);
        let rows = |m: &Model| -> [Vec<String>; 3] {
            [
                m.orders.iter().map(|r| format!("{r:?}")).collect(),
                m.lines.iter().map(|r| format!("{r:?}")).collect(),
                m.stats.iter().map(|r| format!("{r:?}")).collect(),
            ]
        };
        for ((got, want), table) in rows(self).into_iter().zip(rows(want)).zip(["orders", "order_lines", "stats"]) {
            let (n, m) = (got.len(), want.len());
            assert!(
                n == m && first(got.clone(), want.clone()).is_none(),
                "{what}: {table} has {n} rows, the oracle {m}; \
                first difference {:?}",
                first(got, want)
            );
        }
    }
}

/// The arm: prints its figures and returns the medians over its rounds of
/// (pipeline / ceiling, rebuild / pipeline). Each round measures the three side by side
/// (pipeline, rebuild, ceiling, each on a fresh database); `BENCH_ORDERS_ROUNDS` (default 3)
/// rounds, because one pair on this small a stream moves with whatever else the machine does.
pub(super) async fn arm() -> (f64, f64) {
    let events = stream(env_usize("BENCH_ORDERS_DELIVERIES", 200_000));
    let want = Model::expected(&events);
    println!(
        "orders (child rows and deletes): {} deliveries, {} orders left of {}, {} lines",
        events.len(),
        want.orders.len(),
        events
            .iter()
            .filter(|e| e.version == 1)
            .map(|e| &e.aggregate_id)
            .collect::<std::collections::HashSet<_>>()
            .len(),
        want.lines.len()
    );
    let (topic, _, _) = publish_all("bench.orders", events.iter().cloned()).await;
    let mut ratios = Vec::new();
    for round in 1..=env_usize("BENCH_ORDERS_ROUNDS", 3).max(1) {
        let (pool, url) = orders_database("projectionist_bench_orders").await;
        let run: Run = ORDER_STATUS.projector("run", &url, &topic, events.len(), &["--reset", "--exit-when-caught-up"]);
        Model::read(&pool).await.assert_is(&want, "the pipeline");
        let rebuilt = ORDER_STATUS.projector("rebuild", &url, &topic, events.len(), &[]);
        Model::read(&pool).await.assert_is(&want, "the rebuild");
        let (ceiling_pool, _) = orders_database("projectionist_bench_orders_ceiling").await;
        let ceiling = ceiling(&ceiling_pool, &events).await;
        Model::read(&ceiling_pool).await.assert_is(&want, "the ceiling");
        println!(
            "  round {round}: pipeline {:>7.0}/s, rebuild beside the live tables, swapped {:>7.0}/s, \
             PostgreSQL alone (staged, set-based waves) {ceiling:>7.0}/s",
            run.rate, rebuilt.rate
        );
        ratios.push((run.rate / ceiling, rebuilt.rate / run.rate));
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (of_ceiling, rebuild): (Vec<f64>, Vec<f64>) = ratios.into_iter().unzip();
    let spread = |v: &[f64]| {
        let (lo, hi) = v.iter().fold((f64::MAX, f64::MIN), |(l, h), &x| (l.min(x), h.max(x)));
        format!("{lo:.2}-{hi:.2}")
    };
    println!("  rounds' spread: pipeline / ceiling {}, rebuild / pipeline {}", spread(&of_ceiling), spread(&rebuild));
    (median(of_ceiling), median(rebuild))
}

async fn orders_database(name: &str) -> (PgPool, String) {
    let (pool, url) = empty_database(name).await;
    migrate(&pool, &[&order_status::OrderStatus]).await.unwrap();
    (pool, url)
}

/// PostgreSQL alone: the deliveries staged in a table, then applied server-side, one
/// statement per wave (the k-th delivery of every order): a version per order, never
/// deleted, gates every write (a re-sent `OrderPlaced` of an archived order creates
/// nothing), then the orders inserted, updated and deleted, their lines upserted, removed and
/// cleared, the customers' totals added to. Written for the bench, not the product's code.
async fn ceiling(pool: &PgPool, events: &[RawEnvelope]) -> f64 {
    sqlx::raw_sql(
        "CREATE UNLOGGED TABLE staged (seq bigint, order_id text, version bigint, kind text, customer text, total \
         bigint, sku text, quantity bigint, amount bigint, at timestamptz); \
         CREATE TABLE ceiling_versions (order_id text PRIMARY KEY, version bigint NOT NULL)",
    )
    .execute(pool)
    .await
    .unwrap();
    for (n, chunk) in events.chunks(10_000).enumerate() {
        let seq: Vec<i64> = (0..chunk.len()).map(|i| (n * 10_000 + i) as i64).collect();
        let text =
            |f: &str| -> Vec<Option<&str>> { chunk.iter().map(|e| e.data.get(f).and_then(|v| v.as_str())).collect() };
        let int =
            |f: &str| -> Vec<Option<i64>> { chunk.iter().map(|e| e.data.get(f).and_then(|v| v.as_i64())).collect() };
        sqlx::query(
            "INSERT INTO staged SELECT * FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::text[], $5::text[], \
             $6::bigint[], $7::text[], $8::bigint[], $9::bigint[], $10::timestamptz[])",
        )
        .bind(seq)
        .bind(chunk.iter().map(|e| e.aggregate_id.as_str()).collect::<Vec<_>>())
        .bind(chunk.iter().map(|e| e.version).collect::<Vec<_>>())
        .bind(chunk.iter().map(|e| e.event_type.as_str()).collect::<Vec<_>>())
        .bind(text("customer_id"))
        .bind(int("total_cents"))
        .bind(text("sku"))
        .bind(int("quantity"))
        .bind(int("amount_cents"))
        .bind(chunk.iter().map(|e| e.occurred_at).collect::<Vec<_>>())
        .execute(pool)
        .await
        .unwrap();
    }
    let waves = waves(pool, "order_id").await;
    let started = Instant::now();
    for wave in 1..=waves {
        sqlx::query(WAVE).bind(wave).execute(pool).await.unwrap();
    }
    events.len() as f64 / started.elapsed().as_secs_f64()
}

/// One wave of the ceiling: an order's first delivery is its version 1 (a stream's
/// redeliveries come after their originals), so the gate inserts it; every later one moves
/// the order's version only from the version before it.
const WAVE: &str = "WITH w AS (SELECT * FROM waves WHERE wave = $1), \
    moved AS (INSERT INTO ceiling_versions AS v (order_id, version) SELECT order_id, version FROM w \
        ON CONFLICT (order_id) DO UPDATE SET version = excluded.version WHERE v.version = excluded.version - 1 \
        RETURNING order_id, version), \
    a AS (SELECT w.* FROM w JOIN moved USING (order_id, version)), \
    placed AS (INSERT INTO orders (order_id, customer_id, status, total_cents, paid_cents, updated_at, version) \
        SELECT order_id, customer, 'placed', total, 0, at, version FROM a WHERE kind = 'OrderPlaced'), \
    changed AS (UPDATE orders o SET status = CASE a.kind WHEN 'OrderPaid' THEN 'paid' WHEN 'OrderShipped' THEN \
        'shipped' WHEN 'OrderCancelled' THEN 'cancelled' ELSE o.status END, paid_cents = o.paid_cents + \
        coalesce(a.amount, 0), updated_at = a.at, version = a.version FROM a WHERE o.order_id = a.order_id \
        AND a.kind NOT IN ('OrderPlaced', 'OrderArchived')), \
    archived AS (DELETE FROM orders o USING a WHERE o.order_id = a.order_id AND a.kind = 'OrderArchived'), \
    added AS (INSERT INTO order_lines AS l (order_id, sku, quantity, updated_at) \
        SELECT order_id, sku, quantity, at FROM a WHERE kind = 'ItemAdded' ON CONFLICT (order_id, sku) \
        DO UPDATE SET quantity = l.quantity + excluded.quantity, updated_at = excluded.updated_at), \
    removed AS (DELETE FROM order_lines l USING a WHERE l.order_id = a.order_id AND (a.kind IN \
        ('OrderCancelled', 'OrderArchived') OR (a.kind = 'ItemRemoved' AND l.sku = a.sku))), \
    totals AS (INSERT INTO customer_order_stats AS s (customer_id, orders_placed, total_cents) \
        SELECT customer, count(*), sum(total) FROM a WHERE kind = 'OrderPlaced' GROUP BY customer \
        ON CONFLICT (customer_id) DO UPDATE SET orders_placed = s.orders_placed + excluded.orders_placed, \
        total_cents = s.total_cents + excluded.total_cents) \
    SELECT count(*) FROM moved";
