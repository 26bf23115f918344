//! Run with: `cargo run -p order-status -- --help`
//!
//! The order-status projector: `migrate`, `create-topics`, `run`, `publish`, `status`,
//! with the `order_status` projection registered on topic `orders` (or the topic named by
//! `ORDER_STATUS_TOPIC`).

use std::process::ExitCode;

use order_status::{OrderStatus, TOPIC};

// jemalloc rather than glibc's malloc: the projector allocates each event as it is read and
// frees it in the task that applies the batch, and glibc's cross-thread frees cost about a
// fifth of its CPU (docs/operations.md, "Allocator").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let topic = std::env::var("ORDER_STATUS_TOPIC").unwrap_or_else(|_| TOPIC.to_owned());
    projectionist::cli::App::new("order-status").projection(OrderStatus, [topic]).main().await
}
