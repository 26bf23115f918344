use projectionist::testing::{envelope, ProjectionTest};
use projectionist::{Outcome, RawEnvelope};
use quickstart::{AccountEvent, Accounts};
use serde_json::json;

/// An event of account acc-1, in its envelope.
fn acc_1(version: i64, event: AccountEvent) -> RawEnvelope {
    envelope("account", "acc-1", version, &event)
}

// A fresh database per test (from DATABASE_URL); `ProjectionTest` migrates it.
#[sqlx::test(migrations = false)]
async fn a_deposit_delivered_twice_counts_once(pool: sqlx::PgPool) {
    let opened = acc_1(
        1,
        AccountEvent::AccountOpened {
            owner: "ann".into(),
        },
    );
    let deposit = acc_1(2, AccountEvent::MoneyDeposited { amount: 500 });
    let accounts = json!([{"owner": "ann", "balance": 500}]);
    let days = json!([{"deposits": 1, "amount": 500}]);
    ProjectionTest::new(pool, Accounts)
        .given([opened])
        .when([deposit.clone(), deposit])
        .then_outcomes([Outcome::Applied, Outcome::Duplicate])
        .then_rows("SELECT owner, balance FROM accounts", accounts)
        .then_rows("SELECT deposits, amount FROM daily_deposits", days)
        .run()
        .await;
}
