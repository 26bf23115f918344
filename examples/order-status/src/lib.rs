//! Run with: `cargo test -p order-status` (needs `DATABASE_URL`; see the top README).
//!
//! Orders projected two ways: `orders`, one row per order moved through its states by
//! guarded transitions, and `customer_order_stats`, a fan-in total per customer fed by many
//! orders and gated by the per-order version watermark, so a redelivered `OrderPlaced` is
//! never counted twice.

pub mod generate;

use std::sync::LazyLock;

use async_trait::async_trait;
use projectionist_core::{ApplyError, Envelope, Outcome, Projection};
use projectionist_postgres::{watermark, PgConnection, Table};
use serde::{Deserialize, Serialize};

/// Aggregate type of the events.
pub const AGGREGATE_TYPE: &str = "order";
/// Topic the events are published to.
pub const TOPIC: &str = "orders";

/// Events of an order; amounts in integer cents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
pub enum OrderEvent {
    /// Version 1 of every order.
    OrderPlaced {
        /// Customer who placed it.
        customer_id: String,
        /// Order total.
        total_cents: i64,
    },
    /// A payment (orders may be paid in parts).
    OrderPaid {
        /// Amount paid.
        amount_cents: i64,
    },
    /// Shipped.
    OrderShipped {},
    /// Cancelled.
    OrderCancelled {
        /// Why.
        reason: String,
    },
}

/// The `orders` and `customer_order_stats` read models.
#[derive(Debug, Clone, Copy, Default)]
pub struct OrderStatus;

static ORDERS: LazyLock<Table> = LazyLock::new(|| Table::new("orders", "order_id").expect("valid names"));

const SCHEMA: [&str; 2] = [
    "CREATE TABLE IF NOT EXISTS orders (
        order_id    text PRIMARY KEY,
        customer_id text,
        status      text,
        total_cents bigint,
        paid_cents  bigint NOT NULL DEFAULT 0,
        version     bigint NOT NULL,
        updated_at  timestamptz
    )",
    "CREATE TABLE IF NOT EXISTS customer_order_stats (
        customer_id   text PRIMARY KEY,
        orders_placed bigint NOT NULL,
        total_cents   bigint NOT NULL
    )",
];

#[async_trait]
impl Projection<PgConnection> for OrderStatus {
    type Event = OrderEvent;

    fn name(&self) -> &str {
        "order_status"
    }

    fn schema(&self) -> &[&str] {
        &SCHEMA
    }

    fn tables(&self) -> &[&str] {
        &["orders", "customer_order_stats"]
    }

    async fn apply(&self, tx: &mut PgConnection, env: &Envelope<OrderEvent>) -> Result<Outcome, ApplyError> {
        // Fan-in first: the watermark decides whether this event may touch the totals.
        let gate = watermark(tx, Projection::name(self), env).await?;
        if let (Outcome::Applied, OrderEvent::OrderPlaced { customer_id, total_cents }) = (gate, &env.event) {
            sqlx::query(
                "INSERT INTO customer_order_stats AS s (customer_id, orders_placed, total_cents) VALUES ($1, 1, $2) \
                 ON CONFLICT (customer_id) DO UPDATE SET orders_placed = s.orders_placed + 1, \
                 total_cents = s.total_cents + EXCLUDED.total_cents",
            )
            .bind(customer_id)
            .bind(total_cents)
            .execute(&mut *tx)
            .await?;
        }

        let write = ORDERS.transition(env).set("updated_at", env.occurred_at);
        let write = match &env.event {
            OrderEvent::OrderPlaced { customer_id, total_cents } => write
                .set("customer_id", customer_id.as_str())
                .set("total_cents", *total_cents)
                .set("paid_cents", 0_i64)
                .set("status", "placed"),
            OrderEvent::OrderPaid { amount_cents } => write.add("paid_cents", *amount_cents).set("status", "paid"),
            OrderEvent::OrderShipped {} => write.set("status", "shipped"),
            OrderEvent::OrderCancelled { .. } => write.set("status", "cancelled"),
        };
        let row = write.execute(tx).await?;
        if row != gate {
            // Both gates hold the same version in the same transaction; disagreement means
            // one of the tables was changed behind the engine's back.
            return Err(ApplyError::msg(format!(
                "order {} v{}: orders row says {row} but the watermark says {gate}; reset the projection",
                env.aggregate_id, env.version
            )));
        }
        Ok(row)
    }
}
