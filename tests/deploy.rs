//! The documented deploy of a release that adds a column fed by a new event type, followed
//! step by step beside a live run (the broker at KAFKA_BROKERS, a fresh database per test),
//! with events of every type published throughout: no event is lost, and the deploy ends
//! with the new release's tables and views.

#[path = "common/kafka.rs"]
mod kafka;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kafka::{config, produce_to, rand_test_topic};
use projectionist::kafka::rebuild::{rebuild, verify, Rebuilt};
use projectionist::kafka::{Engine, RunReport, Stats};
use projectionist::postgres::{migrate, PgConnection};
use projectionist::{Envelope, Projection, RawEnvelope, Table, Writes};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

/// Release 1's events: it has no `Tagged`.
#[derive(Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
enum V1 {
    Opened {},
    Deposited { amount: i64 },
}

/// Release 2's: `Tagged` sets the new column `tag`.
#[derive(Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
enum V2 {
    Opened {},
    Deposited { amount: i64 },
    Tagged { tag: String },
}

const COLUMNS_1: &[(&str, &str)] = &[("balance", "bigint NOT NULL DEFAULT 0")];
const COLUMNS_2: &[(&str, &str)] = &[("balance", "bigint NOT NULL DEFAULT 0"), ("tag", "text")];
const TABLE_1: Table = Table::transition("shop_accounts", "account_id").aggregate_type("account").columns(COLUMNS_1);
const TABLE_2: Table = Table::transition("shop_accounts", "account_id").aggregate_type("account").columns(COLUMNS_2);

struct Release1;
struct Release2;

impl Projection<PgConnection> for Release1 {
    type Event = V1;
    fn name(&self) -> &str {
        "shop"
    }
    fn tables(&self) -> &[Table] {
        &[TABLE_1]
    }
    fn schema(&self) -> &[&str] {
        &["CREATE OR REPLACE VIEW shop_view AS SELECT account_id, balance FROM shop_accounts"]
    }
    fn project(&self, env: &Envelope<V1>) -> Writes {
        let row = TABLE_1.write(env);
        match &env.event {
            V1::Opened {} => row.set("balance", 0),
            V1::Deposited { amount } => row.add("balance", *amount),
        }
        .into()
    }
}

impl Projection<PgConnection> for Release2 {
    type Event = V2;
    fn name(&self) -> &str {
        "shop"
    }
    fn tables(&self) -> &[Table] {
        &[TABLE_2]
    }
    fn schema(&self) -> &[&str] {
        &["CREATE OR REPLACE VIEW shop_view AS SELECT account_id, balance, tag FROM shop_accounts"]
    }
    fn project(&self, env: &Envelope<V2>) -> Writes {
        let row = TABLE_2.write(env);
        match &env.event {
            V2::Opened {} => row.set("balance", 0),
            V2::Deposited { amount } => row.add("balance", *amount),
            V2::Tagged { tag } => row.set("tag", tag.as_str()),
        }
        .into()
    }
}

/// Publishes, until told to stop, each of 10 accounts' next event in turn: a deposit, or
/// every third one a tag (10 ms apart); how many were published.
async fn publish_throughout(topic: String, stop: Arc<AtomicBool>) -> u64 {
    let mut version = [0i64; 10];
    let mut published = 0;
    while !stop.load(Ordering::SeqCst) {
        let i = (published % 10) as usize;
        let id = format!("acc-{i}");
        version[i] += 1;
        let v = version[i];
        let event = match v {
            1 => projectionist_testing::envelope("account", &id, v, &V2::Opened {}),
            _ if v % 3 == 0 => projectionist_testing::envelope("account", &id, v, &V2::Tagged { tag: format!("t{v}") }),
            _ => projectionist_testing::envelope("account", &id, v, &V2::Deposited { amount: v }),
        };
        produce_to(&topic, 2, &[(None, Some(&id), Some(RawEnvelope::to_json(&event)))]).await;
        published += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    published
}

/// A live run of `projection` until told to stop, and its counters.
fn live<P: Projection<PgConnection>>(
    pool: &PgPool,
    topic: &str,
    projection: P,
) -> (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<RunReport>, Arc<Stats>) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let engine = Engine::new(pool.clone(), config().with_exit_when_caught_up(false))
        .register(Arc::new(projection), [topic.to_owned()]);
    let stats = engine.stats().remove(0);
    let run = tokio::spawn(async move {
        engine
            .run(async move {
                let _ = stopped.await;
            })
            .await
            .unwrap()
    });
    (stop, run, stats)
}

/// docs/operations.md, "Deploying a new release", followed as written: (1) the old release
/// runs; (2) the new release's `migrate` would refuse the changed table, so (3) its
/// `rebuild` builds the new tables beside the live run and swaps them in; (4) the old run,
/// meeting an event of the new type, halts there instead of skipping it; (5) the new
/// release's `run` replaces it and goes on from there; (6) its `rebuild --verify` finds
/// nothing. Events of every type are published throughout.
#[sqlx::test(migrations = false)]
async fn a_deploy_of_a_new_column_fed_by_a_new_event_type_loses_no_event(pool: PgPool) {
    let topic = rand_test_topic("deploy");
    migrate(&pool, &[&Release1]).await.unwrap();
    let stop_publishing = Arc::new(AtomicBool::new(false));
    let publisher = tokio::spawn(publish_throughout(topic.clone(), stop_publishing.clone()));
    // 1. The old release runs.
    let (stop_old, old, old_stats) = live(&pool, &topic, Release1);
    tokio::time::sleep(Duration::from_secs(2)).await;
    // 3. The new release's rebuild, beside it.
    let folded = AtomicU64::default();
    let rebuilt = rebuild(&pool, config(), Arc::new(Release2), vec![topic.clone()], &folded, std::future::pending());
    let rebuilt = tokio::time::timeout(Duration::from_secs(120), rebuilt).await.expect("rebuilt in time").unwrap();
    assert!(matches!(rebuilt, Rebuilt::Swapped { .. }), "swapped in");
    // 4. The old run halts at the first event of the new type after the swap.
    for _ in 0..600 {
        if old_stats.partitions_halted() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = stop_old.send(());
    let old = old.await.unwrap();
    let halts = old.halts();
    assert!(!halts.is_empty(), "the old release met a Tagged event after the swap and halted");
    assert!(halts.iter().all(|h| h.contains("\"Tagged\"") && h.contains("built for")), "{halts:?}");
    // 5. The new release runs, while events go on arriving, then they stop.
    let (stop_new, new, _) = live(&pool, &topic, Release2);
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop_publishing.store(true, Ordering::SeqCst);
    let published = publisher.await.unwrap();
    let versions = || async {
        let sum: Option<i64> =
            sqlx::query_scalar("SELECT sum(version)::bigint FROM shop_accounts").fetch_one(&pool).await.unwrap();
        sum.unwrap_or(0) as u64
    };
    for _ in 0..600 {
        if versions().await >= published {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = stop_new.send(());
    assert!(new.await.unwrap().halts().is_empty());

    // Every event applied once: each account at its last version, every tag set.
    let (count, versions): (i64, i64) =
        sqlx::query_as("SELECT count(*), sum(version)::bigint FROM shop_accounts").fetch_one(&pool).await.unwrap();
    assert_eq!((count, versions as u64), (10, published), "every event applied");
    let untagged: i64 = sqlx::query_scalar("SELECT count(*) FROM shop_accounts WHERE version >= 3 AND tag IS NULL")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(untagged, 0, "no Tagged event lost");
    // The new release's view, with its new column.
    let (tags, tagged): (i64, i64) =
        sqlx::query_as("SELECT count(tag), count(*) FILTER (WHERE balance > 0) FROM shop_view")
            .fetch_one(&pool)
            .await
            .expect("the view has the new column");
    assert_eq!(tags, tagged, "the view shows every tag");
    // 6. A verification finds nothing.
    let verified = verify(&pool, config(), Arc::new(Release2), vec![topic.clone()], &folded, std::future::pending());
    match tokio::time::timeout(Duration::from_secs(120), verified).await.expect("verified in time").unwrap() {
        Rebuilt::Verified { differences, .. } => assert!(differences.is_empty(), "{differences:?}"),
        _ => panic!("not verified"),
    }
}
