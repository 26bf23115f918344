//! An operator's commands beside a live `run` (the broker at KAFKA_BROKERS, a fresh
//! database per test): a discard, a retry or a skip moves an aggregate's row in a
//! transaction of its own, and the partition, which remembers the versions its batches
//! wrote, must not plan the aggregate's next event against what it remembered.

#[path = "common/kafka.rs"]
mod kafka;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bank_accounts::{AccountEvent, BankAccounts};
use kafka::{config, produce_to, rand_test_topic};
use projectionist::kafka::{Engine, EngineConfig, RunReport};
use projectionist::postgres::migrate;
use projectionist::postgres::park::{dead_letters, list, resolve, skip_gap, Resolve};
use projectionist::{OnGap, RawEnvelope};
use sqlx::PgPool;

/// A `run` of the bank accounts that goes on when caught up, until told to stop.
struct Live {
    stop: tokio::sync::oneshot::Sender<()>,
    run: tokio::task::JoinHandle<projectionist::kafka::Result<RunReport>>,
}

impl Live {
    fn start(pool: &PgPool, topic: &str, config: EngineConfig) -> Self {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let engine = Engine::new(pool.clone(), config.with_exit_when_caught_up(false))
            .register(Arc::new(BankAccounts), [topic.to_owned()]);
        let run = tokio::spawn(engine.run(async move {
            let _ = stopped.await;
        }));
        Self { stop, run }
    }

    async fn stop(self) -> RunReport {
        let _ = self.stop.send(());
        self.run.await.unwrap().unwrap()
    }
}

/// Waits (60 s at most) until `check` gives `Some`, and returns it.
async fn eventually<T, F: Future<Output = Option<T>>>(what: &str, mut check: impl FnMut() -> F) -> T {
    for _ in 0..600 {
        if let Some(found) = check().await {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("not within 60 s: {what}")
}

async fn row(pool: &PgPool, id: &str) -> Option<(i64, i64)> {
    sqlx::query_as("SELECT balance, version FROM bank_accounts WHERE account_id = $1")
        .bind(id)
        .fetch_optional(pool)
        .await
        .unwrap()
}

async fn publish(topic: &str, events: &[RawEnvelope]) {
    let messages: Vec<_> = events.iter().map(|e| (Some(0), Some(e.aggregate_id.as_str()), Some(e.to_json()))).collect();
    produce_to(topic, 1, &messages).await;
}

/// What the operator does to `acc-o` once its dead letter (or its gap) is there.
#[derive(Debug, Clone, Copy)]
enum Act {
    /// v2 does not decode: discarded (the row moves to v2, unchanged).
    Discard,
    /// v2 is refused by a CHECK constraint: the constraint dropped, v2 retried (applied).
    Retry,
    /// v2 is never published: v3 parks, the gap is skipped (v3 applied by the skip).
    Skip,
}

/// Runs `act` on a live run under `on_gap`, then publishes the aggregate's next event, which
/// must apply: the row ends at that version with every deposit not given up.
async fn the_next_event_applies_after(pool: PgPool, act: Act, on_gap: OnGap) {
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let e = bank_accounts::generate::envelope;
    let deposit = |v, amount| e("acc-o", v, &AccountEvent::MoneyDeposited { amount });
    let topic = rand_test_topic("operator");
    let live = Live::start(&pool, &topic, config().with_on_gap(on_gap));
    publish(&topic, &[e("acc-o", 1, &AccountEvent::AccountOpened { owner: "o".into() }), deposit(2, 5)]).await;
    eventually("v2 applied", || async { row(&pool, "acc-o").await.filter(|r| r.1 == 2) }).await;
    sqlx::query("ALTER TABLE bank_accounts ADD CONSTRAINT small CHECK (balance < 1000)").execute(&pool).await.unwrap();

    let mut v3 = deposit(3, 7);
    match act {
        Act::Discard => v3.data = serde_json::json!({ "amount": "a lot" }),
        Act::Retry => v3 = deposit(3, 5000),
        Act::Skip => {}
    }
    let next = match act {
        Act::Skip => 5,
        _ => 4,
    };
    publish(&topic, &[if matches!(act, Act::Skip) { deposit(4, 7) } else { v3 }]).await;
    match act {
        Act::Discard | Act::Retry => {
            let letter = eventually("the dead letter", || async {
                dead_letters(&pool, Some("bank_accounts"), false).await.unwrap().into_iter().next()
            })
            .await;
            if matches!(act, Act::Retry) {
                sqlx::query("ALTER TABLE bank_accounts DROP CONSTRAINT small").execute(&pool).await.unwrap();
                let retried = resolve(&pool, &BankAccounts, letter.id, Resolve::Retry).await.unwrap();
                assert_eq!(retried.outcome, projectionist::Outcome::Applied, "{retried:?}");
            } else {
                let discard = Resolve::Discard { reason: "bad data".into() };
                resolve(&pool, &BankAccounts, letter.id, discard).await.unwrap();
                a_wait_says_v3_was_discarded(&pool, &topic, letter.id).await;
            }
        }
        Act::Skip => {
            eventually("v4 parked", || async { list(&pool, None).await.unwrap().into_iter().next() }).await;
            let skipped = skip_gap(&pool, &BankAccounts, "account", "acc-o", "never published").await.unwrap();
            assert_eq!(skipped.drained.applied, 1, "{skipped:?}");
        }
    }
    let moved = row(&pool, "acc-o").await.unwrap().1;
    assert_eq!(moved, next - 1, "the operator's command moved the row");
    publish(&topic, &[deposit(next, 11)]).await;
    let want = match act {
        Act::Discard => 5 + 11,
        Act::Retry => 5 + 5000 + 11,
        Act::Skip => 5 + 7 + 11,
    };
    let mut applied = None;
    for _ in 0..200 {
        applied = row(&pool, "acc-o").await.filter(|r| r.1 == next);
        if applied.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let Some(applied) = applied else {
        let (parked, row) = (list(&pool, None).await.unwrap(), row(&pool, "acc-o").await);
        let halts = live.stop().await.halts();
        panic!("v{next} not applied after {act:?} under {on_gap:?}: row {row:?}, parked {parked:?}, halts {halts:?}");
    };
    assert_eq!(applied, (want, next));
    assert!(list(&pool, None).await.unwrap().is_empty(), "nothing parked");
    let report = live.stop().await;
    assert!(report.halts().is_empty(), "{:?}", report.halts());
    // Only the skip's gap parked anything: the event after the command was never held (a
    // live run's idle sweep would resume it within seconds, and hide that it was).
    let outcomes = report.projections[0].1.outcomes();
    let parked = u64::from(matches!(act, Act::Skip));
    assert_eq!((outcomes.parked, outcomes.gap), (parked, 0), "{act:?} under {on_gap:?}: {outcomes:?}");
}

/// A wait for the discarded v3 of `acc-o` (offset 2), by version and by offset, says it was
/// discarded, though the row stands at v3; a wait for v2 says it was applied.
async fn a_wait_says_v3_was_discarded(pool: &PgPool, topic: &str, letter: i64) {
    use projectionist::postgres::wait::{Fate, Position, Waiter};
    use projectionist::postgres::{Error, WaitError};
    let waiter = Waiter::new(pool.clone()).await.unwrap();
    let timeout = Duration::from_secs(10);
    let discarded = |answer: Result<Position, Error>| match answer {
        Err(Error::Wait(WaitError::NotApplied { fate: Fate::Discarded { id }, .. })) => assert_eq!(id, letter),
        other => panic!("expected v3 discarded (dead letter {letter}), got {other:?}"),
    };
    discarded(waiter.wait_for_version(&BankAccounts, "account", "acc-o", 3, timeout).await);
    discarded(waiter.wait_for_offset("bank_accounts", topic, 0, 2, timeout).await);
    let v2 = waiter.wait_for_version(&BankAccounts, "account", "acc-o", 2, timeout).await;
    assert_eq!(v2.unwrap(), Position::Version { version: Some(3) });
}

#[sqlx::test(migrations = false)]
async fn a_discard_beside_a_live_run_leaves_the_next_event_applicable(pool: PgPool) {
    the_next_event_applies_after(pool, Act::Discard, OnGap::Park).await;
}

#[sqlx::test(migrations = false)]
async fn a_discard_beside_a_live_run_that_halts_on_gaps_does_not_halt_it(pool: PgPool) {
    the_next_event_applies_after(pool, Act::Discard, OnGap::Halt).await;
}

#[sqlx::test(migrations = false)]
async fn a_retry_beside_a_live_run_leaves_the_next_event_applicable(pool: PgPool) {
    the_next_event_applies_after(pool, Act::Retry, OnGap::Park).await;
}

#[sqlx::test(migrations = false)]
async fn a_retry_beside_a_live_run_that_halts_on_gaps_does_not_halt_it(pool: PgPool) {
    the_next_event_applies_after(pool, Act::Retry, OnGap::Halt).await;
}

#[sqlx::test(migrations = false)]
async fn a_skipped_gap_beside_a_live_run_leaves_the_next_event_applicable(pool: PgPool) {
    the_next_event_applies_after(pool, Act::Skip, OnGap::Park).await;
}

/// A one-shot run (`exit_when_caught_up`) does not stop with an aggregate it could resume:
/// v1 and v3 on partition 0 (v3 parked, waiting for v2), then v2 on partition 1, which does
/// not know of a parking of partition 0's. The run that applies v2 ends with v3 applied and
/// nothing parked, as a live run's idle sweep would leave it within seconds.
#[sqlx::test(migrations = false)]
async fn a_one_shot_run_resumes_what_it_can_before_it_exits(pool: PgPool) {
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let e = bank_accounts::generate::envelope;
    let deposit = |v, amount| e("acc-split", v, &AccountEvent::MoneyDeposited { amount });
    let opened = e("acc-split", 1, &AccountEvent::AccountOpened { owner: "s".into() });
    let on = |partition, event: &RawEnvelope| (Some(partition), Some("acc-split"), Some(event.to_json()));
    let topic = rand_test_topic("one-shot");
    let one_shot = || kafka::run(Engine::new(pool.clone(), config()).register(Arc::new(BankAccounts), [topic.clone()]));
    produce_to(&topic, 2, &[on(0, &opened), on(0, &deposit(3, 7))]).await;
    assert!(one_shot().await.halts().is_empty());
    let parked = list(&pool, None).await.unwrap();
    assert_eq!(parked.iter().map(|p| (p.partition, p.waiting_for)).collect::<Vec<_>>(), [(0, 2)]);

    produce_to(&topic, 2, &[on(1, &deposit(2, 5))]).await;
    let report = one_shot().await;
    assert!(report.halts().is_empty(), "{:?}", report.halts());
    let parked = list(&pool, None).await.unwrap();
    assert_eq!(row(&pool, "acc-split").await, Some((12, 3)), "v3 applied before the run exited; parked: {parked:?}");
    assert!(parked.is_empty(), "nothing left parked");
}

/// `parked` points at the dead letter that holds the version an aggregate waits for,
/// whichever came first: the gap (v3 parked, then v2 dead-lettered) or the dead letter.
#[sqlx::test(migrations = false)]
async fn parked_names_the_dead_letter_holding_the_version_it_waits_for(pool: PgPool) {
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let e = bank_accounts::generate::envelope;
    let topic = rand_test_topic("parked-letter");
    let live = Live::start(&pool, &topic, config());
    for (id, order) in [("acc-gap-first", [3, 2]), ("acc-letter-first", [2, 3])] {
        let mut events = vec![e(id, 1, &AccountEvent::AccountOpened { owner: "p".into() })];
        events.extend(order.map(|v| {
            let mut event = e(id, v, &AccountEvent::MoneyDeposited { amount: 5 });
            if v == 2 {
                event.data = serde_json::json!({ "amount": "a lot" });
            }
            event
        }));
        for event in &events {
            publish(&topic, std::slice::from_ref(event)).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    let letters = eventually("two dead letters", || async {
        let letters = dead_letters(&pool, Some("bank_accounts"), false).await.unwrap();
        (letters.len() == 2).then_some(letters)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let parked = list(&pool, None).await.unwrap();
    for p in &parked {
        let letter = letters.iter().find(|d| d.aggregate_id.as_deref() == Some(p.aggregate_id.as_str())).unwrap();
        assert_eq!((p.waiting_for, p.dead_letter), (2, Some(letter.id)), "{p:?}");
        assert!(p.to_resume().contains(&format!("dead-letters retry {}", letter.id)), "{}", p.to_resume());
    }
    assert_eq!(parked.len(), 2, "{parked:?}");
    assert!(live.stop().await.halts().is_empty());
}

/// Aggregates whose versions alternate between two partitions (a producer with another
/// partitioner): both partitions park and resume the same aggregates at once, and a
/// one-shot run still ends with every event applied and nothing parked.
#[sqlx::test(migrations = false)]
async fn aggregates_split_over_two_partitions_end_applied(pool: PgPool) {
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let e = bank_accounts::generate::envelope;
    let topic = rand_test_topic("split");
    let mut messages = Vec::new();
    for n in 0..10 {
        let id = format!("acc-{n}");
        messages.push((
            Some(0),
            Some(id.clone()),
            Some(e(&id, 1, &AccountEvent::AccountOpened { owner: "s".into() }).to_json()),
        ));
        for v in 2..=6 {
            let deposit = e(&id, v, &AccountEvent::MoneyDeposited { amount: v });
            messages.push((Some((v % 2) as i32), Some(id.clone()), Some(deposit.to_json())));
        }
    }
    let borrowed: Vec<_> = messages.iter().map(|(p, k, v)| (*p, k.as_deref(), v.clone())).collect();
    produce_to(&topic, 2, &borrowed).await;
    let report =
        kafka::run(Engine::new(pool.clone(), config()).register(Arc::new(BankAccounts), [topic.clone()])).await;
    assert!(report.halts().is_empty(), "{:?}", report.halts());
    let parked = list(&pool, None).await.unwrap();
    let rows: Vec<(String, i64, i64)> =
        sqlx::query_as("SELECT account_id, balance, version FROM bank_accounts ORDER BY account_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let want: Vec<_> = (0..10).map(|n| (format!("acc-{n}"), 2 + 3 + 4 + 5 + 6, 6)).collect();
    assert_eq!(rows, want, "parked: {parked:?}");
    assert!(parked.is_empty(), "{parked:?}");
}

/// A dead letter read on another partition than the one that parked its aggregate: v1 and
/// v3 on partition 0 (v3 parked, waiting for v2), v2 poison on partition 1. Its discard
/// resumes the aggregate where it is parked, and v3 applies in the discard's transaction.
#[sqlx::test(migrations = false)]
async fn a_discard_of_a_dead_letter_read_on_another_partition_resumes_its_aggregate(pool: PgPool) {
    migrate(&pool, &[&BankAccounts]).await.unwrap();
    let e = bank_accounts::generate::envelope;
    let on = |partition, event: &RawEnvelope| (Some(partition), Some("acc-two"), Some(event.to_json()));
    let topic = rand_test_topic("two-partitions");
    let one_shot = || kafka::run(Engine::new(pool.clone(), config()).register(Arc::new(BankAccounts), [topic.clone()]));
    let opened = e("acc-two", 1, &AccountEvent::AccountOpened { owner: "t".into() });
    produce_to(&topic, 2, &[on(0, &opened), on(0, &e("acc-two", 3, &AccountEvent::MoneyDeposited { amount: 7 }))])
        .await;
    assert!(one_shot().await.halts().is_empty());
    let mut poison = e("acc-two", 2, &AccountEvent::MoneyDeposited { amount: 5 });
    poison.data = serde_json::json!({ "amount": "a lot" });
    produce_to(&topic, 2, &[on(1, &poison)]).await;
    assert!(one_shot().await.halts().is_empty());
    let letter = dead_letters(&pool, Some("bank_accounts"), false).await.unwrap().remove(0);
    assert_eq!(letter.partition, 1);
    let parked = list(&pool, None).await.unwrap();
    assert_eq!(parked.iter().map(|p| (p.partition, p.dead_letter)).collect::<Vec<_>>(), [(0, Some(letter.id))]);

    let discarded = resolve(&pool, &BankAccounts, letter.id, Resolve::Discard { reason: "bad".into() }).await.unwrap();
    assert_eq!(discarded.drained.applied, 1, "{discarded:?}");
    assert_eq!(row(&pool, "acc-two").await, Some((7, 3)));
    assert!(list(&pool, None).await.unwrap().is_empty());
}
