//! The version gate against a real PostgreSQL: every helper, every outcome, concurrent
//! duplicate delivery and hostile identifiers. Each test gets a fresh database.

use std::sync::Arc;
use std::time::Duration;

use projectionist::postgres::gate::Table;
use projectionist::postgres::{self, Error};
use projectionist::{Envelope, Outcome};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

fn env(id: &str, version: i64) -> Envelope<()> {
    Envelope {
        id: uuid::Uuid::new_v4(),
        aggregate_type: "account".into(),
        aggregate_id: id.into(),
        version,
        event_type: "Test".into(),
        occurred_at: chrono::DateTime::from_timestamp(1_790_000_000 + version, 0).unwrap(),
        event: (),
        metadata: None,
    }
}

async fn create(pool: &PgPool, ddl: &str) {
    sqlx::raw_sql(ddl).execute(pool).await.unwrap();
}

const ACCOUNTS: &str =
    "CREATE TABLE acct (id text PRIMARY KEY, owner text, balance bigint NOT NULL DEFAULT 0, version bigint NOT NULL)";

async fn upsert(pool: &PgPool, table: &Table, id: &str, version: i64, owner: &str) -> Outcome {
    let mut tx = pool.begin().await.unwrap();
    let e = env(id, version);
    let outcome = table.upsert(&e).set("owner", owner).execute(&mut tx).await.unwrap();
    tx.commit().await.unwrap();
    outcome
}

async fn transition(pool: &PgPool, table: &Table, id: &str, version: i64, amount: i64) -> Outcome {
    let mut tx = pool.begin().await.unwrap();
    let e = env(id, version);
    let outcome = table.transition(&e).add("balance", amount).execute(&mut tx).await.unwrap();
    tx.commit().await.unwrap();
    outcome
}

async fn row(pool: &PgPool, id: &str) -> (Option<String>, i64, i64) {
    sqlx::query_as("SELECT owner, balance, version FROM acct WHERE id = $1").bind(id).fetch_one(pool).await.unwrap()
}

#[sqlx::test(migrator = "projectionist::postgres::MIGRATOR")]
async fn upsert_applies_newer_versions_only(pool: PgPool) {
    create(&pool, ACCOUNTS).await;
    let t = Table::new("acct", "id").unwrap();
    assert_eq!(upsert(&pool, &t, "a", 1, "ann").await, Outcome::Applied);
    assert_eq!(upsert(&pool, &t, "a", 1, "ann").await, Outcome::Duplicate);
    assert_eq!(upsert(&pool, &t, "a", 3, "bob").await, Outcome::Applied, "state transfer may skip versions");
    assert_eq!(upsert(&pool, &t, "a", 2, "old").await, Outcome::Stale);
    assert_eq!(upsert(&pool, &t, "a", 3, "bob").await, Outcome::Duplicate);
    assert_eq!(row(&pool, "a").await, (Some("bob".into()), 0, 3));
}

#[sqlx::test(migrator = "projectionist::postgres::MIGRATOR")]
async fn transition_applies_exactly_the_next_version(pool: PgPool) {
    create(&pool, ACCOUNTS).await;
    let t = Table::new("acct", "id").unwrap();
    assert_eq!(transition(&pool, &t, "a", 2, 10).await, Outcome::Gap { expected: 1, found: 2 }, "no row yet");
    assert_eq!(transition(&pool, &t, "a", 1, 100).await, Outcome::Applied, "version 1 inserts");
    assert_eq!(transition(&pool, &t, "a", 1, 100).await, Outcome::Duplicate);
    assert_eq!(transition(&pool, &t, "a", 3, 5).await, Outcome::Gap { expected: 2, found: 3 });
    assert_eq!(transition(&pool, &t, "a", 2, 50).await, Outcome::Applied);
    assert_eq!(transition(&pool, &t, "a", 2, 50).await, Outcome::Duplicate, "a redelivered deposit");
    assert_eq!(transition(&pool, &t, "a", 1, 100).await, Outcome::Stale);
    assert_eq!(transition(&pool, &t, "a", 3, -30).await, Outcome::Applied);
    assert_eq!(row(&pool, "a").await, (None, 120, 3), "each increment counted once");
}

#[sqlx::test(migrator = "projectionist::postgres::MIGRATOR")]
async fn a_failed_transition_leaves_the_row_alone(pool: PgPool) {
    create(&pool, ACCOUNTS).await;
    let t = Table::new("acct", "id").unwrap();
    transition(&pool, &t, "a", 1, 7).await;
    for (v, outcome) in [(1, Outcome::Duplicate), (4, Outcome::Gap { expected: 2, found: 4 })] {
        let mut tx = pool.begin().await.unwrap();
        let e = env("a", v);
        let got = t.transition(&e).add("balance", 1000_i64).set("owner", "intruder").execute(&mut tx).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(got, outcome);
    }
    assert_eq!(row(&pool, "a").await, (None, 7, 1));
}

#[sqlx::test(migrator = "projectionist::postgres::MIGRATOR")]
async fn watermark_gates_fan_in_writes(pool: PgPool) {
    let mut tx = pool.begin().await.unwrap();
    let mark = |v| env("ord-1", v);
    assert_eq!(postgres::watermark(&mut tx, "stats", &mark(2)).await.unwrap(), Outcome::Gap { expected: 1, found: 2 });
    assert_eq!(postgres::watermark(&mut tx, "stats", &mark(1)).await.unwrap(), Outcome::Applied);
    assert_eq!(postgres::watermark(&mut tx, "stats", &mark(1)).await.unwrap(), Outcome::Duplicate);
    assert_eq!(postgres::watermark(&mut tx, "stats", &mark(2)).await.unwrap(), Outcome::Applied);
    assert_eq!(postgres::watermark(&mut tx, "stats", &mark(4)).await.unwrap(), Outcome::Gap { expected: 3, found: 4 });
    assert_eq!(postgres::watermark(&mut tx, "stats", &mark(1)).await.unwrap(), Outcome::Stale);
    assert_eq!(postgres::watermark(&mut tx, "other", &mark(1)).await.unwrap(), Outcome::Applied, "per projection");
    tx.commit().await.unwrap();
    let rows: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT projection, aggregate_id, version FROM projectionist_watermarks ORDER BY 1")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        rows,
        vec![("other".into(), "ord-1".into(), 1), ("stats".into(), "ord-1".into(), 2)],
        "one row per aggregate"
    );
}

/// Runs `apply` for the same event in `n` transactions at once, each held open a moment
/// after its write so the others pile up on its row lock.
async fn race<F, Fut>(pool: &PgPool, n: usize, apply: F) -> Vec<Outcome>
where
    F: Fn(sqlx::Transaction<'static, sqlx::Postgres>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = (Outcome, sqlx::Transaction<'static, sqlx::Postgres>)> + Send,
{
    let wide = PgPoolOptions::new()
        .max_connections(n as u32 + 1)
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap();
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let apply = Arc::new(apply);
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (wide, barrier, apply) = (wide.clone(), barrier.clone(), apply.clone());
            tokio::spawn(async move {
                let tx = wide.begin().await.unwrap();
                barrier.wait().await;
                let (outcome, tx) = apply(tx).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
                tx.commit().await.unwrap();
                outcome
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(t.await.expect("no task may fail: a concurrent duplicate must not be an error"));
    }
    outcomes
}

fn assert_exactly_one_applied(outcomes: &[Outcome]) {
    assert_eq!(outcomes.iter().filter(|o| **o == Outcome::Applied).count(), 1, "{outcomes:?}");
    assert!(outcomes.iter().all(|o| matches!(o, Outcome::Applied | Outcome::Duplicate)), "{outcomes:?}");
}

#[sqlx::test(migrator = "projectionist::postgres::MIGRATOR")]
async fn concurrent_duplicates_apply_once(pool: PgPool) {
    create(&pool, ACCOUNTS).await;
    let t = Arc::new(Table::new("acct", "id").unwrap());

    // Creation (INSERT … ON CONFLICT DO NOTHING).
    let tt = t.clone();
    let outcomes = race(&pool, 6, move |mut tx| {
        let tt = tt.clone();
        async move { (tt.transition(&env("c", 1)).add("balance", 100_i64).execute(&mut tx).await.unwrap(), tx) }
    })
    .await;
    assert_exactly_one_applied(&outcomes);

    // Relative increment (UPDATE … WHERE version = v - 1).
    let tt = t.clone();
    let outcomes = race(&pool, 6, move |mut tx| {
        let tt = tt.clone();
        async move { (tt.transition(&env("c", 2)).add("balance", 25_i64).execute(&mut tx).await.unwrap(), tx) }
    })
    .await;
    assert_exactly_one_applied(&outcomes);
    assert_eq!(row(&pool, "c").await, (None, 125, 2));

    // State transfer, new row and existing row.
    for version in [1, 2] {
        let tt = t.clone();
        let outcomes = race(&pool, 6, move |mut tx| {
            let tt = tt.clone();
            async move { (tt.upsert(&env("u", version)).set("owner", "ann").execute(&mut tx).await.unwrap(), tx) }
        })
        .await;
        assert_exactly_one_applied(&outcomes);
    }

    // Fan-in watermark.
    for version in [1, 2] {
        let outcomes = race(&pool, 6, move |mut tx| async move {
            (postgres::watermark(&mut tx, "stats", &env("w", version)).await.unwrap(), tx)
        })
        .await;
        assert_exactly_one_applied(&outcomes);
    }
}

#[sqlx::test(migrator = "projectionist::postgres::MIGRATOR")]
async fn hostile_identifiers_are_rejected_before_any_sql(pool: PgPool) {
    create(&pool, ACCOUNTS).await;
    for bad in ["acct\"; DROP TABLE acct; --", "acct;", "a b", ""] {
        let err = Table::new(bad, "id").unwrap_err();
        assert!(matches!(err, Error::Identifier { .. }), "{bad:?}: {err}");
        assert!(err.to_string().contains(&format!("{bad:?}")), "error names the identifier: {err}");
    }
    assert!(Table::new("acct", "id\" OR 1=1 --").is_err());
    assert!(Table::new("acct", "id").unwrap().with_version_column("v; --").is_err());

    let t = Table::new("acct", "id").unwrap();
    let mut tx = pool.begin().await.unwrap();
    let err =
        t.transition(&env("a", 1)).set("owner = 'x'; DROP TABLE acct; --", "x").execute(&mut tx).await.unwrap_err();
    assert!(err.to_string().starts_with("invalid identifier"), "{err}");
    tx.commit().await.unwrap();
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM acct").fetch_one(&pool).await.unwrap();
    assert_eq!(count, 0, "table intact and untouched");
}

#[sqlx::test(migrator = "projectionist::postgres::MIGRATOR")]
async fn reserved_and_mixed_case_names_work_quoted(pool: PgPool) {
    create(&pool, r#"CREATE TABLE "order" ("select" text PRIMARY KEY, "From" text, "Version" bigint NOT NULL)"#).await;
    let t = Table::new("order", "select").unwrap().with_version_column("Version").unwrap();
    let mut tx = pool.begin().await.unwrap();
    assert_eq!(t.upsert(&env("k", 1)).set("From", "x").execute(&mut tx).await.unwrap(), Outcome::Applied);
    assert_eq!(t.upsert(&env("k", 1)).set("From", "y").execute(&mut tx).await.unwrap(), Outcome::Duplicate);
    assert_eq!(t.transition(&env("k", 2)).set("From", "z").execute(&mut tx).await.unwrap(), Outcome::Applied);
    tx.commit().await.unwrap();
    let from: String = sqlx::query_scalar(r#"SELECT "From" FROM "order""#).fetch_one(&pool).await.unwrap();
    assert_eq!(from, "z");
}

#[sqlx::test(migrator = "projectionist::postgres::MIGRATOR")]
async fn a_missing_table_is_a_database_error_not_retryable(pool: PgPool) {
    let t = Table::new("nowhere", "id").unwrap();
    let mut tx = pool.begin().await.unwrap();
    let err = t.upsert(&env("a", 1)).execute(&mut tx).await.unwrap_err();
    assert!(matches!(err, Error::Database(_)), "{err}");
    assert!(!err.is_retryable());
    assert!(err.to_string().contains("nowhere"), "{err}");
}
