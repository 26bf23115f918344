//! Run with: `cargo test -p order-status` (needs `DATABASE_URL`; see the top README).
//!
//! Orders projected three ways: `orders`, one row per order moved through its states by
//! guarded transitions (and deleted once archived); `order_lines`, its items as child rows
//! (removed one by one, cleared when the order is cancelled or archived); and
//! `customer_order_stats`, a fan-in total per customer fed by many
//! orders and gated by the per-order aggregate version, so a redelivered `OrderPlaced` is
//! never counted twice.

#[cfg(feature = "generate")]
pub mod generate;

use projectionist::postgres::PgConnection;
use projectionist::{Envelope, Projection, Table, Writes};
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
    /// An item put in the order (again: more of it).
    ItemAdded {
        /// The item.
        sku: String,
        /// How many.
        quantity: i64,
    },
    /// An item taken out of the order.
    ItemRemoved {
        /// The item.
        sku: String,
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
    /// Archived once its retention passed: its row leaves `orders` (a replay of its earlier
    /// events never brings it back); the customer's totals keep it.
    OrderArchived {},
}

/// The `orders`, `order_lines` and `customer_order_stats` read models.
#[derive(Debug, Clone, Copy, Default)]
pub struct OrderStatus;

/// One row per order, moved through its states by guarded transitions, deleted when the
/// order is archived.
pub const ORDERS: Table = Table::transition("orders", "order_id")
    .aggregate_type(AGGREGATE_TYPE)
    .columns(&[
        ("customer_id", "text"),
        ("status", "text"),
        ("total_cents", "bigint"),
        ("paid_cents", "bigint NOT NULL DEFAULT 0"),
        ("updated_at", "timestamptz"),
    ])
    .deletable();

/// The order's lines, one per item: added to, removed one by one, all cleared when the order
/// is cancelled or archived.
pub const ORDER_LINES: Table = Table::child("order_lines", "order_id", "sku")
    .aggregate_type(AGGREGATE_TYPE)
    .columns(&[("quantity", "bigint NOT NULL DEFAULT 0"), ("updated_at", "timestamptz")]);

/// Totals per customer, fed by many orders: fan-in, gated by each order's aggregate version.
pub const CUSTOMER_STATS: Table = Table::fan_in("customer_order_stats", "customer_id")
    .aggregate_type(AGGREGATE_TYPE)
    .columns(&[("orders_placed", "bigint NOT NULL DEFAULT 0"), ("total_cents", "bigint NOT NULL DEFAULT 0")]);

impl Projection<PgConnection> for OrderStatus {
    type Event = OrderEvent;

    fn name(&self) -> &str {
        "order_status"
    }

    fn tables(&self) -> &[Table] {
        &[ORDERS, ORDER_LINES, CUSTOMER_STATS]
    }

    fn project(&self, env: &Envelope<OrderEvent>) -> Writes {
        // Every event but the archive stamps the order's row.
        let order = || ORDERS.write(env).set("updated_at", env.occurred_at);
        match &env.event {
            OrderEvent::OrderArchived {} => ORDERS.write(env).delete().and(ORDER_LINES.clear(env)),
            OrderEvent::OrderPlaced { customer_id, total_cents } => order()
                .set("customer_id", customer_id)
                .set("total_cents", total_cents)
                .set("paid_cents", 0)
                .set("status", "placed")
                .and(CUSTOMER_STATS.row(customer_id).add("orders_placed", 1).add("total_cents", total_cents)),
            OrderEvent::ItemAdded { sku, quantity } => {
                let line = ORDER_LINES.child_row(env, sku).add("quantity", quantity).set("updated_at", env.occurred_at);
                order().and(line)
            }
            OrderEvent::ItemRemoved { sku } => order().and(ORDER_LINES.child_row(env, sku).delete()),
            OrderEvent::OrderPaid { amount_cents } => {
                order().add("paid_cents", amount_cents).set("status", "paid").into()
            }
            OrderEvent::OrderShipped {} => order().set("status", "shipped").into(),
            OrderEvent::OrderCancelled { .. } => order().set("status", "cancelled").and(ORDER_LINES.clear(env)),
        }
    }
}
