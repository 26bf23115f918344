//! Run with: `cargo test -p bank-accounts` (needs `DATABASE_URL`; see the top README).
//!
//! Bank accounts projected into `bank_accounts`, one row per account, the balance moved by
//! guarded transitions (`balance = balance + $amount` only when the row stands at
//! `version - 1`), so a redelivered deposit is never counted twice.

pub mod generate;

use std::sync::LazyLock;

use async_trait::async_trait;
use projectionist_core::{ApplyError, Envelope, Outcome, Projection};
use projectionist_postgres::{PgConnection, Table};
use serde::{Deserialize, Serialize};

/// Aggregate type of the events.
pub const AGGREGATE_TYPE: &str = "account";
/// Topic the events are published to.
pub const TOPIC: &str = "bank.accounts";

/// Events of an account; amounts in integer cents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
pub enum AccountEvent {
    /// Version 1 of every account.
    AccountOpened {
        /// Account holder.
        owner: String,
    },
    /// Money paid in.
    MoneyDeposited {
        /// Cents.
        amount: i64,
    },
    /// Money taken out.
    MoneyWithdrawn {
        /// Cents.
        amount: i64,
    },
    /// The account is closed.
    AccountClosed {},
}

/// The `bank_accounts` read model.
#[derive(Debug, Clone, Copy, Default)]
pub struct BankAccounts;

static TABLE: LazyLock<Table> = LazyLock::new(|| Table::new("bank_accounts", "account_id").expect("valid names"));

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS bank_accounts (
    account_id text PRIMARY KEY,
    owner      text,
    balance    bigint NOT NULL DEFAULT 0,
    status     text,
    version    bigint NOT NULL,
    updated_at timestamptz
)";

#[async_trait]
impl Projection<PgConnection> for BankAccounts {
    type Event = AccountEvent;

    fn name(&self) -> &str {
        "bank_accounts"
    }

    fn schema(&self) -> &[&str] {
        &[SCHEMA]
    }

    fn tables(&self) -> &[&str] {
        &["bank_accounts"]
    }

    async fn apply(&self, tx: &mut PgConnection, env: &Envelope<AccountEvent>) -> Result<Outcome, ApplyError> {
        let write = TABLE.transition(env).set("updated_at", env.occurred_at);
        let write = match &env.event {
            AccountEvent::AccountOpened { owner } => write.set("owner", owner.as_str()).set("balance", 0_i64).set("status", "open"),
            AccountEvent::MoneyDeposited { amount } => write.add("balance", *amount),
            AccountEvent::MoneyWithdrawn { amount } => write.add("balance", -*amount),
            AccountEvent::AccountClosed {} => write.set("status", "closed"),
        };
        Ok(write.execute(tx).await?)
    }
}
