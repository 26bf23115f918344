use projectionist::testing::{envelope, ProjectionTest};
use projectionist::Outcome;
use quickstart::{AccountEvent, Accounts};
use serde_json::json;

// A fresh database per test (from DATABASE_URL); `ProjectionTest` migrates it.
#[sqlx::test(migrations = false)]
async fn a_deposit_delivered_twice_counts_once(pool: sqlx::PgPool) {
    let opened = envelope(
        "account",
        "acc-1",
        1,
        &AccountEvent::AccountOpened {
            owner: "ann".into(),
        },
    );
    let deposit = envelope(
        "account",
        "acc-1",
        2,
        &AccountEvent::MoneyDeposited { amount: 500 },
    );
    ProjectionTest::new(pool, Accounts)
        .given([opened])
        .when([deposit.clone(), deposit])
        .then_outcomes([Outcome::Applied, Outcome::Duplicate])
        .then_rows(
            "SELECT owner, balance FROM accounts",
            json!([{"owner": "ann", "balance": 500}]),
        )
        .then_rows(
            "SELECT deposits, amount FROM daily_deposits",
            json!([{"deposits": 1, "amount": 500}]),
        )
        .run()
        .await;
}
