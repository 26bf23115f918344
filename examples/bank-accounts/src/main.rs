//! Run with: `cargo run -p bank-accounts -- --help` (the demo: `./scripts/demo.sh`).
//!
//! The bank-accounts projector: `migrate`, `create-topics`, `run`, `publish`, `status`,
//! with the `bank_accounts` projection registered on topic `bank.accounts` (or the topic
//! named by `BANK_ACCOUNTS_TOPIC`).

use std::process::ExitCode;

use bank_accounts::{BankAccounts, TOPIC};

#[tokio::main]
async fn main() -> ExitCode {
    let topic = std::env::var("BANK_ACCOUNTS_TOPIC").unwrap_or_else(|_| TOPIC.to_owned());
    projectionist::cli::App::new("bank-accounts").projection(BankAccounts, [topic]).main().await
}
