//! The read model never depends on an operator acting beside a run: random streams applied
//! in random batches, the partition remembering the versions its batches wrote, with an
//! operator acting between batches at random — retrying and discarding the open dead letters,
//! skipping the versions parked aggregates wait for — end with the same accounts as the
//! stream applied event by event with those events never sent (their versions skipped, as a
//! discard or a skip skips them); so do the same streams folded as a rebuild folds them,
//! then resolved; and so do runs whose batches a revoked grant halts at random, healed by
//! reading again from the checkpoint. Against PostgreSQL, without Kafka.

mod common;

use bank_accounts::generate::envelope;
use bank_accounts::{AccountEvent, BankAccounts};
use common::{emptied, run_folded};
use projectionist::postgres::park::{dead_letters, list, resolve, skip_gap, Resolve};
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

/// The accounts of `reference` applied one event at a time, from empty tables.
async fn per_event(pool: &PgPool, reference: &[RawEnvelope]) -> Vec<(String, i64, i64)> {
    emptied(pool, &BankAccounts).await;
    for event in reference {
        let (known, policy) = (KnownVersions::new(), (Mode::PerEvent, Policy::default()));
        apply_batch_knowing(pool, &BankAccounts, std::slice::from_ref(event), policy, &known).await.unwrap();
    }
    accounts(pool).await
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

/// Accounts' histories interleaved, a few events poison and a few never sent (a gap, never
/// the last of a history); and the same stream with each of those an event of a type the
/// projection ignores instead, which moves the version as a discard or a skip does; and the
/// versions never sent.
fn streams_with_gaps(seed: u64) -> (Vec<RawEnvelope>, Vec<RawEnvelope>, Lost) {
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut sent, mut reference, mut lost) = (Vec::new(), Vec::new(), Lost::new());
    for a in 0..rng.gen_range(4..12) {
        let id = format!("acc-{a}");
        let (mut live, mut want) = (Vec::new(), Vec::new());
        live.push(envelope(&id, 1, &AccountEvent::AccountOpened { owner: id.clone() }));
        want.push(live[0].clone());
        let last = rng.gen_range(3..14);
        for v in 2..=last {
            let deposit = envelope(&id, v, &AccountEvent::MoneyDeposited { amount: rng.gen_range(1..100) });
            let mut ignored = deposit.clone();
            ignored.event_type = "NeverHandled".into();
            match rng.gen_range(0..100) {
                // Never sent: a gap its next version parks.
                0..10 if v < last => {
                    lost.insert((id.clone(), v));
                    want.push(ignored);
                }
                10..22 => {
                    let mut bad = deposit;
                    bad.data = serde_json::json!({ "amount": "a lot" });
                    live.push(bad);
                    want.push(ignored);
                }
                _ => {
                    live.push(deposit.clone());
                    want.push(deposit);
                }
            }
        }
        sent.push(live);
        reference.push(want);
    }
    (interleave(sent, seed), interleave(reference, seed), lost)
}

/// Versions never sent, by aggregate id.
type Lost = std::collections::HashSet<(String, i64)>;

/// What an operator does beside the run, until nothing is left to do: retries some open dead
/// letters (still poison: dead-lettered again), discards the others, and skips the version
/// an aggregate parked on a gap waits for where that version was never sent (`lost`: an
/// aggregate parked for a version that was sent is a wrong parking, left for the test to
/// find); how many of each.
async fn resolve_all(pool: &PgPool, rng: &mut StdRng, lost: &Lost) -> [usize; 3] {
    let mut done = [0; 3];
    loop {
        let open = dead_letters(pool, Some("bank_accounts"), false).await.unwrap();
        let parked = list(pool, Some("bank_accounts")).await.unwrap().into_iter();
        let gaps: Vec<_> = parked
            .filter(|p| p.dead_letter.is_none() && lost.contains(&(p.aggregate_id.clone(), p.waiting_for)))
            .collect();
        if open.is_empty() && gaps.is_empty() {
            return done;
        }
        // A resolution applies what was held, which may park its aggregate again: the letters
        // first, then, listed again, the gaps.
        for letter in &open {
            if rng.gen_bool(0.3) {
                resolve(pool, &BankAccounts, letter.id, Resolve::Retry).await.unwrap();
                done[0] += 1;
            } else {
                let discard = Resolve::Discard { reason: "not wanted".into() };
                resolve(pool, &BankAccounts, letter.id, discard).await.unwrap();
                done[1] += 1;
            }
        }
        if !open.is_empty() {
            continue;
        }
        for parked in gaps {
            skip_gap(pool, &BankAccounts, &parked.aggregate_type, &parked.aggregate_id, "lost").await.unwrap();
            done[2] += 1;
        }
    }
}

#[sqlx::test(migrations = false)]
async fn retries_discards_and_skips_interleaved_with_batches_leave_the_model_of_a_stream_without_those_events(
    pool: PgPool,
) {
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let mut done = [0; 3];
    for seed in 0..16 {
        let (sent, reference, lost) = streams_with_gaps(seed);
        let want = per_event(&pool, &reference).await;

        emptied(&pool, &BankAccounts).await;
        let mut rng = StdRng::seed_from_u64(seed + 2000);
        let known = KnownVersions::new();
        let mut rest = sent.as_slice();
        while !rest.is_empty() {
            let (batch, tail) = rest.split_at(rng.gen_range(1..=12).min(rest.len()));
            apply_batch_knowing(&pool, &BankAccounts, batch, (Mode::Batch, Policy::default()), &known).await.unwrap();
            if rng.gen_bool(0.5) {
                let now = resolve_all(&pool, &mut rng, &lost).await;
                done = [done[0] + now[0], done[1] + now[1], done[2] + now[2]];
            }
            rest = tail;
        }
        let now = resolve_all(&pool, &mut rng, &lost).await;
        done = [done[0] + now[0], done[1] + now[1], done[2] + now[2]];
        assert_eq!(accounts(&pool).await, want, "seed {seed}");
        assert!(list(&pool, None).await.unwrap().is_empty(), "seed {seed}: nothing left parked");

        // Folded as a rebuild folds, then the operator's resolutions: the same accounts.
        run_folded(&pool, &BankAccounts, &sent, Policy::default(), (seed + 3000, 12)).await;
        resolve_all(&pool, &mut rng, &lost).await;
        assert_eq!(accounts(&pool).await, want, "seed {seed}: folded");
        assert!(list(&pool, None).await.unwrap().is_empty(), "seed {seed}: nothing left parked after the fold");
    }
    assert!(done.iter().all(|n| *n > 10), "retries, discards and skips done: {done:?}");
}

/// A halt that heals, interleaved: at random, the grant to write the read model's table is
/// revoked under a batch, which fails and rolls back as a run's halt does; granted back, the
/// partition reads again from its checkpoint (the failed batch's first event) in batches cut
/// anew, with the versions it remembers, as a healing run does; the operator's resolutions
/// come between batches as above. The same accounts as the stream applied event by event.
#[sqlx::test(migrations = false)]
async fn halts_that_heal_interleaved_with_batches_and_resolutions_leave_the_model_of_the_stream(pool: PgPool) {
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let grant = |sql: &'static str| sqlx::query(sql).execute(&pool);
    let mut healed = 0;
    for seed in 0..12 {
        let (sent, reference, lost) = streams_with_gaps(seed);
        let want = per_event(&pool, &reference).await;

        emptied(&pool, &BankAccounts).await;
        let mut rng = StdRng::seed_from_u64(seed + 4000);
        let known = KnownVersions::new();
        let mut rest = sent.as_slice();
        while !rest.is_empty() {
            let (batch, tail) = rest.split_at(rng.gen_range(1..=12).min(rest.len()));
            let revoked = rng.gen_bool(0.25);
            if revoked {
                grant("REVOKE INSERT, UPDATE ON bank_accounts FROM CURRENT_USER").await.unwrap();
            }
            let applied =
                apply_batch_knowing(&pool, &BankAccounts, batch, (Mode::Batch, Policy::default()), &known).await;
            if revoked {
                grant("GRANT INSERT, UPDATE ON bank_accounts TO CURRENT_USER").await.unwrap();
            }
            if let Err(e) = applied {
                // Halted, then healed: read again from the checkpoint, in batches cut anew.
                assert!(e.to_string().contains("permission denied"), "seed {seed}: {e}");
                healed += 1;
                continue;
            }
            if rng.gen_bool(0.5) {
                resolve_all(&pool, &mut rng, &lost).await;
            }
            rest = tail;
        }
        resolve_all(&pool, &mut rng, &lost).await;
        assert_eq!(accounts(&pool).await, want, "seed {seed}");
        assert!(list(&pool, None).await.unwrap().is_empty(), "seed {seed}: nothing left parked");
    }
    assert!(healed > 10, "batches halted by the revoked grant and healed: {healed}");
}
