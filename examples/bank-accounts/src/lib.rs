//! Run with: `cargo test -p bank-accounts` (needs `DATABASE_URL`; see the top README).
//!
//! Bank accounts projected into `bank_accounts`, one row per account, the balance moved by
//! guarded transitions (`balance = balance + $amount` only when the row stands at
//! `version - 1`), so a redelivered deposit is never counted twice.

#[cfg(feature = "generate")]
pub mod generate;
pub mod states;

use projectionist::postgres::PgConnection;
use projectionist::{Envelope, Projection, Table, Writes};
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

/// The columns of an account's row.
const COLUMNS: &[(&str, &str)] =
    &[("owner", "text"), ("balance", "bigint NOT NULL DEFAULT 0"), ("status", "text"), ("updated_at", "timestamptz")];

/// One row per account, moved by guarded transitions.
pub const ACCOUNTS: Table =
    Table::transition("bank_accounts", "account_id").aggregate_type(AGGREGATE_TYPE).columns(COLUMNS);

impl Projection<PgConnection> for BankAccounts {
    type Event = AccountEvent;

    fn name(&self) -> &str {
        "bank_accounts"
    }

    fn tables(&self) -> &[Table] {
        &[ACCOUNTS]
    }

    fn project(&self, env: &Envelope<AccountEvent>) -> Writes {
        project_into(&ACCOUNTS, env)
    }
}

/// The same read model under another name, in a table of that name: many projections of
/// one topic in one process (the `bank-fleet` binary).
#[derive(Debug, Clone)]
pub struct NamedAccounts {
    tables: [Table; 1],
}

impl NamedAccounts {
    /// The accounts projected into table `name`, by a projection of that name.
    pub fn new(name: &str) -> Self {
        // Tables name themselves with `&'static str`: one small string per projection, kept.
        let name: &'static str = Box::leak(name.to_owned().into_boxed_str());
        Self { tables: [Table::transition(name, "account_id").aggregate_type(AGGREGATE_TYPE).columns(COLUMNS)] }
    }
}

impl Projection<PgConnection> for NamedAccounts {
    type Event = AccountEvent;

    fn name(&self) -> &str {
        self.tables[0].name()
    }

    fn tables(&self) -> &[Table] {
        &self.tables
    }

    fn project(&self, env: &Envelope<AccountEvent>) -> Writes {
        project_into(&self.tables[0], env)
    }
}

/// An account's event as a write of its row in `table`.
fn project_into(table: &Table, env: &Envelope<AccountEvent>) -> Writes {
    let row = table.write(env).set("updated_at", env.occurred_at);
    match &env.event {
        AccountEvent::AccountOpened { owner } => row.set("owner", owner).set("balance", 0).set("status", "open"),
        AccountEvent::MoneyDeposited { amount } => row.add("balance", amount),
        AccountEvent::MoneyWithdrawn { amount } => row.add("balance", -amount),
        AccountEvent::AccountClosed {} => row.set("status", "closed"),
    }
    .into()
}
