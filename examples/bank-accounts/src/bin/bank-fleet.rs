//! Many projections of one topic in one process: `bank_accounts_1` … `bank_accounts_N`
//! (N from `BANK_FLEET_PROJECTIONS`, 10 unless set), each the bank accounts read model in
//! a table of its name, all on `bank.accounts` (or the topic named by `BANK_ACCOUNTS_TOPIC`).
//! It shows a process keeping within one PostgreSQL connection budget across them
//! (`--pg-max-connections`; docs/operations.md); the bench's capped arm runs it.

use std::process::ExitCode;

use bank_accounts::{NamedAccounts, TOPIC};

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let topic = std::env::var("BANK_ACCOUNTS_TOPIC").unwrap_or_else(|_| TOPIC.to_owned());
    let count = match std::env::var("BANK_FLEET_PROJECTIONS").map(|n| n.parse::<u32>()) {
        Err(_) => 10,
        Ok(Ok(n)) if n >= 1 => n,
        Ok(_) => {
            eprintln!("BANK_FLEET_PROJECTIONS is not a number of projections (1 or more)");
            return ExitCode::FAILURE;
        }
    };
    let mut app = projectionist::cli::App::new("bank-fleet");
    for i in 1..=count {
        app = app.projection(NamedAccounts::new(&format!("bank_accounts_{i}")), [topic.clone()]);
    }
    app.main().await
}
