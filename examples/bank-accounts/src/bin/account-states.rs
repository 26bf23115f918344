//! The `account_states` projector: the bank's accounts as state-transfer records (see
//! `bank_accounts::states`), on topic `bank.account-states` (or the one named by
//! `ACCOUNT_STATES_TOPIC`). The bench's peer arm runs it beside Kafka Connect.

use std::process::ExitCode;

use bank_accounts::states::{AccountStates, STATES_TOPIC};

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let topic = std::env::var("ACCOUNT_STATES_TOPIC").unwrap_or_else(|_| STATES_TOPIC.to_owned());
    projectionist::cli::App::new("account-states").projection(AccountStates, [topic]).main().await
}
