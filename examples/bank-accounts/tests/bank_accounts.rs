//! The bank-accounts projection against a real PostgreSQL.

use bank_accounts::generate::{envelope, expected, stream};
use bank_accounts::{AccountEvent, BankAccounts};
use projectionist::postgres::{apply_batch, migrate, Policy};
use projectionist::{Outcome, RawEnvelope};
use projectionist_testing::{assert_anomaly_equivalence, ProjectionTest};
use serde_json::json;
use sqlx::PgPool;

fn opened(id: &str) -> RawEnvelope {
    envelope(id, 1, &AccountEvent::AccountOpened { owner: "ann".into() })
}

#[sqlx::test(migrations = false)]
async fn a_redelivered_deposit_is_counted_once(pool: PgPool) {
    let deposit = envelope("acc-1", 2, &AccountEvent::MoneyDeposited { amount: 500 });
    // Re-sent by the producer with a fresh event id: the gate keys on the version, not the id.
    let resent = RawEnvelope { id: uuid::Uuid::new_v4().into(), ..deposit.clone() };
    ProjectionTest::new(pool, BankAccounts)
        .given([opened("acc-1")])
        .when([deposit.clone(), deposit, resent])
        .then_outcomes([Outcome::Applied, Outcome::Duplicate, Outcome::Duplicate])
        .then_rows(
            "SELECT account_id, owner, balance, status, version FROM bank_accounts",
            json!([
                {"account_id": "acc-1", "owner": "ann", "balance": 500, "status": "open", "version": 2}
            ]),
        )
        .run()
        .await;
}

/// As `run` does by default, an event that comes before its predecessor is parked, and
/// applied once the predecessor comes: here in the same batch, so both report applied (one
/// event at a time, or halting at gaps, v3 would be a gap and lost).
#[sqlx::test(migrations = false)]
async fn an_event_before_its_predecessor_is_parked_then_applied(pool: PgPool) {
    ProjectionTest::new(pool, BankAccounts)
        .given([opened("acc-1")])
        .when([
            envelope("acc-1", 3, &AccountEvent::MoneyDeposited { amount: 5 }),
            envelope("acc-1", 2, &AccountEvent::MoneyDeposited { amount: 70 }),
        ])
        .then_outcomes([Outcome::Applied, Outcome::Applied])
        .then_rows("SELECT balance, version FROM bank_accounts", json!([{"balance": 75, "version": 3}]))
        .run()
        .await;
}

/// Every outcome, a gap's included: with gaps halting (`on_gap = halt`), as the policy lets
/// a scenario choose.
#[sqlx::test(migrations = false)]
async fn every_outcome_is_reported(pool: PgPool) {
    let mut unknown = envelope("acc-1", 3, &AccountEvent::AccountClosed {});
    unknown.event_type = "AccountRenamed".into();
    ProjectionTest::new(pool, BankAccounts)
        .policy(Policy::HALT)
        .given([opened("acc-1"), envelope("acc-1", 2, &AccountEvent::MoneyDeposited { amount: 70 })])
        .when([
            envelope("acc-1", 3, &AccountEvent::MoneyWithdrawn { amount: 20 }),
            envelope("acc-1", 3, &AccountEvent::MoneyWithdrawn { amount: 20 }),
            envelope("acc-1", 2, &AccountEvent::MoneyDeposited { amount: 70 }),
            envelope("acc-1", 5, &AccountEvent::AccountClosed {}),
            unknown,
        ])
        .then_outcomes([
            Outcome::Applied,
            Outcome::Duplicate,
            Outcome::Stale,
            Outcome::Gap { expected: 4, found: 5 },
            Outcome::Ignored,
        ])
        .then_rows(
            "SELECT balance, status, version FROM bank_accounts",
            json!([{"balance": 50, "status": "open", "version": 3}]),
        )
        .run()
        .await;
}

#[sqlx::test(migrations = false)]
async fn an_event_type_the_projection_does_not_handle_still_moves_the_gate(pool: PgPool) {
    // BankAccounts has no InterestAccrued: it is ignored, and the next deposit still applies.
    let mut interest = envelope("acc-1", 2, &AccountEvent::MoneyDeposited { amount: 0 });
    interest.event_type = "InterestAccrued".into();
    interest.data = json!({"rate_bp": 125});
    ProjectionTest::new(pool, BankAccounts)
        .given([opened("acc-1")])
        .when([interest.clone(), envelope("acc-1", 3, &AccountEvent::MoneyDeposited { amount: 500 }), interest])
        .then_outcomes([Outcome::Ignored, Outcome::Applied, Outcome::Ignored])
        .then_rows("SELECT balance, version FROM bank_accounts", json!([{"balance": 500, "version": 3}]))
        .run()
        .await;
}

#[sqlx::test(migrations = false)]
async fn a_poison_event_fails_the_batch_naming_it_and_applies_nothing(pool: PgPool) {
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let mut poison = envelope("acc-2", 2, &AccountEvent::MoneyDeposited { amount: 1 });
    poison.data = json!({"amount": "a lot"});
    let err = apply_batch(&pool, &BankAccounts, &[opened("acc-2"), poison]).await.unwrap_err();
    assert!(err.is_poison() && !err.is_retryable(), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("event #1") && msg.contains("acc-2 v2") && msg.contains("MoneyDeposited"), "{msg}");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM bank_accounts").fetch_one(&pool).await.unwrap();
    assert_eq!(rows, 0, "the whole batch is rolled back");
}

#[sqlx::test(migrations = false)]
async fn thousands_of_events_survive_every_delivery_anomaly(pool: PgPool) {
    let events = stream(300, 15, 42);
    assert!(events.len() > 2_000, "{} events", events.len());
    let report = assert_anomaly_equivalence(&pool, &BankAccounts, &events, 7).await;
    assert_eq!(report.clean.applied, events.len() as u64);
    for (variant, counts) in &report.variants {
        assert!(counts.total() >= events.len() as u64, "{variant}: {counts:?}");
    }

    // And the read model equals the one folded independently in memory.
    let want = expected(&events);
    let rows: Vec<(String, String, i64, String, i64)> =
        sqlx::query_as("SELECT account_id, owner, balance, status, version FROM bank_accounts ORDER BY account_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(rows.len(), want.len());
    for (id, owner, balance, status, version) in rows {
        let w = &want[&id];
        assert_eq!(
            (owner, balance, status, version),
            (w.owner.clone(), w.balance, w.status.clone(), w.version),
            "{id}"
        );
    }
}

/// State-transfer records (the bench's peer arm): a re-send of an older state that arrives
/// after a newer one is stale, where a sink that overwrites would roll the row back.
#[sqlx::test(migrations = false)]
async fn a_late_state_transfer_record_is_stale(pool: PgPool) {
    let events = [
        opened("acc-1"),
        envelope("acc-1", 2, &AccountEvent::MoneyDeposited { amount: 500 }),
        envelope("acc-1", 3, &AccountEvent::MoneyWithdrawn { amount: 200 }),
    ];
    let resent = RawEnvelope { id: uuid::Uuid::new_v4().into(), ..events[1].clone() };
    let states =
        bank_accounts::generate::state_transfer(&[events[0].clone(), events[1].clone(), events[2].clone(), resent]);
    ProjectionTest::new(pool, bank_accounts::states::AccountStates)
        .when(states)
        .then_outcomes([Outcome::Applied, Outcome::Applied, Outcome::Applied, Outcome::Stale])
        .then_rows(
            "SELECT account_id, owner, balance_cents, status, version FROM account_states",
            json!([{"account_id": "acc-1", "owner": "ann", "balance_cents": 300, "status": "open", "version": 3}]),
        )
        .run()
        .await;
}

/// Every account of a generated stream with its duplicates and re-sends, as state-transfer
/// records in batches: each row is the account's last state, as the event projection has it.
#[sqlx::test(migrations = false)]
async fn state_transfer_records_leave_each_account_at_its_last_state(pool: PgPool) {
    let distinct = stream(200, 30, 5);
    let states =
        bank_accounts::generate::state_transfer(&projectionist_testing::with_redeliveries(&distinct, 0.1, 0.05, 9));
    migrate(&pool, &[&bank_accounts::states::AccountStates]).await.unwrap();
    for batch in states.chunks(97) {
        apply_batch(&pool, &bank_accounts::states::AccountStates, batch).await.unwrap();
    }
    let rows: Vec<(String, String, i64, String, i64)> =
        sqlx::query_as("SELECT account_id, owner, balance_cents, status, version FROM account_states ORDER BY 1")
            .fetch_all(&pool)
            .await
            .unwrap();
    let want: Vec<(String, String, i64, String, i64)> =
        expected(&distinct).into_iter().map(|(id, a)| (id, a.owner, a.balance, a.status, a.version)).collect();
    assert_eq!(rows, want);
}
