//! The same accounts as state-transfer records: each event carries the account's whole row
//! after it, as a Kafka Connect sink reads such a stream (the bench's peer arm sets the two
//! side by side). Projected into `account_states` by upserts gated by the version: a record
//! older than the row (a re-send arriving late) is stale and changes nothing.

use projectionist::postgres::PgConnection;
use projectionist::{Envelope, Projection, Table, Writes};
use serde::{Deserialize, Serialize};

use crate::AGGREGATE_TYPE;

/// Topic the state-transfer records are published to.
pub const STATES_TOPIC: &str = "bank.account-states";

/// A state-transfer record: the account as it stands after one of its events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
pub enum AccountStateEvent {
    /// The account's row.
    AccountState {
        /// Account holder.
        owner: String,
        /// Cents.
        balance_cents: i64,
        /// `open` or `closed`.
        status: String,
    },
}

/// One row per account, each record's row written over an older one.
pub const STATES: Table = Table::upsert("account_states", "account_id").aggregate_type(AGGREGATE_TYPE).columns(&[
    ("owner", "text"),
    ("balance_cents", "bigint"),
    ("status", "text"),
]);

/// The `account_states` read model.
#[derive(Debug, Clone, Copy, Default)]
pub struct AccountStates;

impl Projection<PgConnection> for AccountStates {
    type Event = AccountStateEvent;

    fn name(&self) -> &str {
        "account_states"
    }

    fn tables(&self) -> &[Table] {
        &[STATES]
    }

    /// Each account's row is written over once per record: half of each page left free
    /// lets PostgreSQL write the new row version beside the old one without a new index
    /// entry (a HOT update). Kept by a rebuild's table too (it runs these statements).
    fn schema(&self) -> &[&str] {
        &["ALTER TABLE account_states SET (fillfactor = 50)"]
    }

    fn project(&self, env: &Envelope<AccountStateEvent>) -> Writes {
        let AccountStateEvent::AccountState { owner, balance_cents, status } = &env.event;
        STATES.write(env).set("owner", owner).set("balance_cents", balance_cents).set("status", status).into()
    }
}
