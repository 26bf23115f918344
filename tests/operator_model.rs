//! The read model never depends on an operator acting beside a run: random streams applied
//! in random batches, the partition remembering the versions its batches wrote, with an
//! operator discarding the open dead letters between batches at random, end with the same
//! accounts as the stream applied event by event with those events never sent (their
//! versions skipped, as a discard skips them). Against PostgreSQL, without Kafka.

mod common;

use bank_accounts::generate::envelope;
use bank_accounts::{AccountEvent, BankAccounts};
use common::emptied;
use projectionist::postgres::park::{dead_letters, list, resolve, Resolve};
use projectionist::postgres::{apply_batch_knowing, migrate, KnownVersions, Mode, Policy};
use projectionist::RawEnvelope;
use projectionist_testing::interleave;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sqlx::PgPool;

/// Accounts' histories interleaved, a few events poison (data that does not decode); and
/// the same stream with each of those an event of a type the projection ignores instead.
fn streams(seed: u64) -> (Vec<RawEnvelope>, Vec<RawEnvelope>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut poisoned, mut skipped) = (Vec::new(), Vec::new());
    for a in 0..rng.gen_range(4..12) {
        let id = format!("acc-{a}");
        let (mut with_poison, mut with_skip) = (Vec::new(), Vec::new());
        with_poison.push(envelope(&id, 1, &AccountEvent::AccountOpened { owner: id.clone() }));
        with_skip.push(with_poison[0].clone());
        for v in 2..rng.gen_range(3..14) {
            let deposit = envelope(&id, v, &AccountEvent::MoneyDeposited { amount: rng.gen_range(1..100) });
            if rng.gen_bool(0.15) {
                let (mut bad, mut ignored) = (deposit.clone(), deposit);
                bad.data = serde_json::json!({ "amount": "a lot" });
                ignored.event_type = "NeverHandled".into();
                with_poison.push(bad);
                with_skip.push(ignored);
            } else {
                with_poison.push(deposit.clone());
                with_skip.push(deposit);
            }
        }
        poisoned.push(with_poison);
        skipped.push(with_skip);
    }
    (interleave(poisoned, seed), interleave(skipped, seed))
}

async fn accounts(pool: &PgPool) -> Vec<(String, i64, i64)> {
    sqlx::query_as("SELECT account_id, balance, version FROM bank_accounts ORDER BY account_id")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// Discards every open dead letter, as an operator would beside the run, until none is open
/// (a discard applies the events held behind it, which may dead-letter another); how many.
async fn discard_all(pool: &PgPool) -> usize {
    let mut discarded = 0;
    loop {
        let open = dead_letters(pool, Some("bank_accounts"), false).await.unwrap();
        if open.is_empty() {
            return discarded;
        }
        for letter in open {
            let discard = Resolve::Discard { reason: "not wanted".into() };
            resolve(pool, &BankAccounts, letter.id, discard).await.unwrap();
            discarded += 1;
        }
    }
}

#[sqlx::test(migrations = false)]
async fn discards_interleaved_with_batches_leave_the_model_of_a_stream_without_those_events(pool: PgPool) {
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let mut discarded = 0;
    for seed in 0..16 {
        let (poisoned, skipped) = streams(seed);
        // The reference: one event at a time, the poison never sent.
        emptied(&pool, &BankAccounts).await;
        for event in &skipped {
            let known = KnownVersions::new();
            apply_batch_knowing(
                &pool,
                &BankAccounts,
                std::slice::from_ref(event),
                (Mode::PerEvent, Policy::default()),
                &known,
            )
            .await
            .unwrap();
        }
        let want = accounts(&pool).await;

        // Random batches, the versions remembered, discards between them at random.
        emptied(&pool, &BankAccounts).await;
        let mut rng = StdRng::seed_from_u64(seed + 1000);
        let known = KnownVersions::new();
        let mut rest = poisoned.as_slice();
        while !rest.is_empty() {
            let (batch, tail) = rest.split_at(rng.gen_range(1..=12).min(rest.len()));
            apply_batch_knowing(&pool, &BankAccounts, batch, (Mode::Batch, Policy::default()), &known).await.unwrap();
            if rng.gen_bool(0.5) {
                discarded += discard_all(&pool).await;
            }
            rest = tail;
        }
        discarded += discard_all(&pool).await;
        assert_eq!(accounts(&pool).await, want, "seed {seed}");
        assert!(list(&pool, None).await.unwrap().is_empty(), "seed {seed}: nothing left parked");
    }
    assert!(discarded > 10, "the streams held poison to discard: {discarded}");
}
