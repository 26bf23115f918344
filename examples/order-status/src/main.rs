//! Run with: `cargo run -p order-status -- --help`
//!
//! The order-status projector: `migrate`, `create-topics`, `run`, `publish`, `status`,
//! with the `order_status` projection registered on topic `orders`.

use std::process::ExitCode;

use order_status::{OrderStatus, TOPIC};

#[tokio::main]
async fn main() -> ExitCode {
    projectionist::cli::App::new("order-status").projection(OrderStatus, [TOPIC]).main().await
}
