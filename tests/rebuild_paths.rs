//! A rebuild of a stream that is not as the engine expects (the broker at KAFKA_BROKERS, a
//! fresh database per test): it ends, and its tables equal a live run's.

#[path = "common/kafka.rs"]
mod kafka;

use std::sync::Arc;
use std::time::Duration;

use bank_accounts::AccountEvent;
use kafka::{config, produce_to, rand_test_topic, run};
use projectionist::kafka::rebuild::{rebuild, Rebuilt};
use projectionist::kafka::Engine;
use projectionist::postgres::{migrate, PgConnection};
use projectionist::{Envelope, Projection, RawEnvelope, Table, Writes};
use sqlx::PgPool;

/// Accounts with their last deposit kept as `jsonb`: a value `COPY` does not take, so the
/// rows a rebuild's fold creates go in by the JSON path.
struct Ledger;

const LEDGER: Table = Table::transition("ledger_accounts", "account_id")
    .aggregate_type(bank_accounts::AGGREGATE_TYPE)
    .columns(&[("balance", "bigint NOT NULL DEFAULT 0"), ("last", "jsonb")]);

impl Projection<PgConnection> for Ledger {
    type Event = AccountEvent;

    fn name(&self) -> &str {
        "ledger"
    }

    fn tables(&self) -> &[Table] {
        &[LEDGER]
    }

    fn project(&self, env: &Envelope<AccountEvent>) -> Writes {
        let row = LEDGER.write(env);
        match &env.event {
            AccountEvent::AccountOpened { owner } => row.set("last", serde_json::json!({ "opened_by": owner })),
            AccountEvent::MoneyDeposited { amount } => {
                row.add("balance", *amount).set("last", serde_json::json!({ "deposit": amount }))
            }
            AccountEvent::MoneyWithdrawn { amount } => row.add("balance", -amount),
            _ => row.add("balance", 0),
        }
        .into()
    }
}

/// An aggregate's events on two partitions (a producer with another partitioner, or
/// partitions added): its versions alternating between them, or all of them sent to both
/// (two producers). A rebuild ends, and its table equals the live run's. (It used to try the
/// fold's write again every 500 ms without end, "planned 20 row(s), changed 0", or swap in
/// rows left behind a parking no partition resumed.)
#[sqlx::test(migrations = false)]
async fn a_rebuild_of_aggregates_split_across_partitions_ends_and_equals_the_live_run(pool: PgPool) {
    rebuilds_as_the_live_run(pool, true).await;
}

/// As above, every aggregate's events sent to both partitions and none alternating: no
/// batch parks, so every batch is folded, and both partitions' folds create the same rows.
#[sqlx::test(migrations = false)]
async fn a_rebuild_of_aggregates_sent_to_two_partitions_ends_and_equals_the_live_run(pool: PgPool) {
    rebuilds_as_the_live_run(pool, false).await;
}

async fn rebuilds_as_the_live_run(pool: PgPool, alternating: bool) {
    migrate(&pool, &[&Ledger]).await.unwrap();
    let e = bank_accounts::generate::envelope;
    let topic = rand_test_topic("split");
    let mut messages: Vec<(i32, RawEnvelope)> = Vec::new();
    for i in 0..20 {
        let (id, sent) = (format!("acc-a{i}"), format!("acc-s{i}"));
        if alternating {
            messages.push((0, e(&id, 1, &AccountEvent::AccountOpened { owner: id.clone() })));
            for v in 2..=5 {
                messages.push((v as i32 % 2, e(&id, v, &AccountEvent::MoneyDeposited { amount: v })));
            }
        }
        let opened = e(&sent, 1, &AccountEvent::AccountOpened { owner: sent.clone() });
        let deposit = e(&sent, 2, &AccountEvent::MoneyDeposited { amount: 3 });
        messages.extend([(0, opened.clone()), (0, deposit.clone()), (1, opened), (1, deposit)]);
    }
    let messages: Vec<_> =
        messages.iter().map(|(p, m)| (Some(*p), Some(m.aggregate_id.as_str()), Some(m.to_json()))).collect();
    produce_to(&topic, 2, &messages).await;
    let live = run(Engine::new(pool.clone(), config()).register(Arc::new(Ledger), [topic.clone()])).await;
    assert!(live.halts().is_empty(), "{:?}", live.halts());
    let dump = || projectionist_testing::dump_tables(&pool, &Ledger);
    let after_live = dump().await;
    let total: i64 =
        sqlx::query_scalar("SELECT sum(balance)::bigint FROM ledger_accounts").fetch_one(&pool).await.unwrap();
    let alternated = if alternating { 20 * (2 + 3 + 4 + 5) } else { 0 };
    assert_eq!(total, alternated + 20 * 3, "the live run applied every deposit once");

    let folded = std::sync::atomic::AtomicU64::default();
    let rebuilt = rebuild(&pool, config(), Arc::new(Ledger), vec![topic.clone()], &folded, std::future::pending());
    let rebuilt = tokio::time::timeout(Duration::from_secs(90), rebuilt).await.expect("the rebuild ended").unwrap();
    assert!(matches!(rebuilt, Rebuilt::Swapped { .. }), "swapped in");
    assert_eq!(dump().await, after_live, "the rebuilt table equals the live run's");
}
