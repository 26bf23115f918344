// Accounts and their balances, and the money deposited per day.

use projectionist::postgres::PgConnection;
use projectionist::{Envelope, Projection, Table, Writes};
use serde::{Deserialize, Serialize};

/// The events, as the envelope carries them: `type` names the variant, `data` holds its
/// fields. (`Serialize` is for the test kit, which builds envelopes from them.)
#[derive(Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
pub enum AccountEvent {
    AccountOpened { owner: String },
    MoneyDeposited { amount: i64 },
    MoneyWithdrawn { amount: i64 },
}

/// One row per account, moved only from `version - 1` to `version`: a guarded transition.
pub const ACCOUNTS: Table = Table::transition("accounts", "account_id")
    .aggregate_type("account")
    .columns(&[("owner", "text"), ("balance", "bigint NOT NULL DEFAULT 0")]);

/// One row per day, fed by every account: a fan-in table, each event counted once (gated
/// by its account's version).
pub const DAILY_DEPOSITS: Table = Table::fan_in("daily_deposits", "day")
    .aggregate_type("account")
    .columns(&[
        ("deposits", "bigint NOT NULL DEFAULT 0"),
        ("amount", "bigint NOT NULL DEFAULT 0"),
    ]);

pub struct Accounts;

impl Projection<PgConnection> for Accounts {
    type Event = AccountEvent;

    fn name(&self) -> &str {
        "accounts"
    }

    fn tables(&self) -> &[Table] {
        &[ACCOUNTS, DAILY_DEPOSITS]
    }

    fn project(&self, event: &Envelope<AccountEvent>) -> Writes {
        let account = ACCOUNTS.write(event);
        match &event.event {
            AccountEvent::AccountOpened { owner } => account.set("owner", owner).into(),
            AccountEvent::MoneyDeposited { amount } => {
                let day = DAILY_DEPOSITS.row(event.occurred_at.date_naive().to_string());
                account
                    .add("balance", amount)
                    .and(day.add("deposits", 1).add("amount", amount))
            }
            AccountEvent::MoneyWithdrawn { amount } => account.add("balance", -amount).into(),
        }
    }
}
