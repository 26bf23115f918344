//! Run with: `cargo run -p bank-accounts -- --help` (the demo: `./scripts/demo.sh`).
//!
//! The bank-accounts projector: `migrate`, `create-topics`, `run`, `publish`, `status`,
//! with the `bank_accounts` projection registered on topic `bank.accounts` (or the topic
//! named by `BANK_ACCOUNTS_TOPIC`).

use std::process::ExitCode;

use bank_accounts::{BankAccounts, TOPIC};

// jemalloc rather than glibc's malloc: the projector allocates each event as it is read and
// frees it in the task that applies the batch, and glibc's cross-thread frees cost about a
// fifth of its CPU (docs/operations.md, "Allocator").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let topic = std::env::var("BANK_ACCOUNTS_TOPIC").unwrap_or_else(|_| TOPIC.to_owned());
    projectionist::cli::App::new("bank-accounts").projection(BankAccounts, [topic]).main().await
}
