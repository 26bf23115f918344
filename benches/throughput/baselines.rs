//! What the pipeline is compared with: PostgreSQL alone applying the same deliveries
//! (staged, set-based; and folded in one statement), and a naive inbox consumer.

use super::*;

/// PostgreSQL alone: the deliveries staged in a table, then applied server-side by
/// version-gated set-based statements, one per wave (the k-th delivery of every account),
/// no client in the loop. Written for the bench, not the product's code path.
pub(super) async fn ceiling(pool: &PgPool, events: &[RawEnvelope]) -> f64 {
    sqlx::raw_sql(
        "CREATE UNLOGGED TABLE staged (seq bigint, account_id text, version bigint, kind text, owner text, amount \
        bigint, at timestamptz); \
         TRUNCATE bank_accounts",
    )
    .execute(pool)
    .await
    .unwrap();
    for (n, chunk) in events.chunks(10_000).enumerate() {
        let seq: Vec<i64> = (0..chunk.len()).map(|i| (n * 10_000 + i) as i64).collect();
        let ids: Vec<&str> = chunk.iter().map(|e| e.aggregate_id.as_str()).collect();
        let versions: Vec<i64> = chunk.iter().map(|e| e.version).collect();
        let kinds: Vec<&str> = chunk.iter().map(|e| e.event_type.as_str()).collect();
        let owners: Vec<Option<&str>> = chunk.iter().map(|e| e.data.get("owner").and_then(|v| v.as_str())).collect();
        let amounts: Vec<Option<i64>> = chunk.iter().map(|e| e.data.get("amount").and_then(|v| v.as_i64())).collect();
        let at: Vec<chrono::DateTime<chrono::Utc>> = chunk.iter().map(|e| e.occurred_at).collect();
        sqlx::query(
            "INSERT INTO staged SELECT * FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::text[], \
            $5::text[], $6::bigint[], $7::timestamptz[])",
        )
        .bind(seq)
        .bind(ids)
        .bind(versions)
        .bind(kinds)
        .bind(owners)
        .bind(amounts)
        .bind(at)
        .execute(pool)
        .await
        .unwrap();
    }
    let waves = waves(pool, "account_id").await;
    let started = Instant::now();
    for wave in 1..=waves {
        let mut tx = pool.begin().await.unwrap();
        sqlx::query(
            "INSERT INTO bank_accounts (account_id, owner, balance, status, updated_at, version) \
             SELECT account_id, owner, 0, 'open', at, 1 FROM waves WHERE wave = $1 AND version = 1 ON CONFLICT \
             (account_id) DO NOTHING",
        )
        .bind(wave)
        .execute(&mut *tx)
        .await
        .unwrap();
        sqlx::query(
            "UPDATE bank_accounts t SET balance = t.balance + CASE w.kind WHEN 'MoneyDeposited' THEN w.amount WHEN \
            'MoneyWithdrawn' THEN -w.amount ELSE 0 END, \
             status = CASE w.kind WHEN 'AccountClosed' THEN 'closed' ELSE t.status END, updated_at = w.at, version = \
             w.version \
             FROM waves w WHERE w.wave = $1 AND w.version > 1 AND t.account_id = w.account_id AND t.version = \
             w.version - 1",
        )
        .bind(wave)
        .execute(&mut *tx)
        .await
        .unwrap();
        tx.commit().await.unwrap();
    }
    events.len() as f64 / started.elapsed().as_secs_f64()
}

/// Numbers the staged deliveries of each aggregate (`key`) in stream order into the table
/// `waves`: the k-th delivery of every aggregate is wave k, which a ceiling applies with one
/// set-based statement. Returns how many waves there are.
pub(super) async fn waves(pool: &PgPool, key: &str) -> i64 {
    let sql = format!(
        "CREATE UNLOGGED TABLE waves AS SELECT *, row_number() OVER (PARTITION BY {key} ORDER BY seq) AS wave FROM \
         staged; CREATE INDEX ON waves (wave); ANALYZE waves"
    );
    sqlx::raw_sql(&sql).execute(pool).await.unwrap();
    sqlx::query_scalar("SELECT max(wave) FROM waves").fetch_one(pool).await.unwrap()
}

/// PostgreSQL alone building the final state of the stream staged by [`ceiling`] with one
/// `INSERT … SELECT` of the stream folded per account (duplicates dropped): what a rebuild
/// from offset zero could at best be. Written for the bench, not the product's code path.
pub(super) async fn folded_ceiling(pool: &PgPool, deliveries: usize) -> f64 {
    sqlx::raw_sql("TRUNCATE bank_accounts").execute(pool).await.unwrap();
    let started = Instant::now();
    sqlx::raw_sql(
        "INSERT INTO bank_accounts (account_id, owner, balance, status, updated_at, version) \
         SELECT account_id, max(owner) FILTER (WHERE kind = 'AccountOpened'), \
         coalesce(sum(CASE kind WHEN 'MoneyDeposited' THEN amount WHEN 'MoneyWithdrawn' THEN -amount ELSE 0 END), 0), \
         CASE WHEN bool_or(kind = 'AccountClosed') THEN 'closed' ELSE 'open' END, \
         (array_agg(at ORDER BY version DESC))[1], max(version) \
         FROM (SELECT DISTINCT ON (account_id, version) * FROM staged ORDER BY account_id, version, seq) d \
         GROUP BY account_id",
    )
    .execute(pool)
    .await
    .unwrap();
    deliveries as f64 / started.elapsed().as_secs_f64()
}

/// The pattern the gate replaces: per event, a transaction inserting the event id into a
/// processed-messages table, then an unguarded write when the id was new.
pub(super) async fn inbox(pool: &PgPool, events: &[RawEnvelope]) -> f64 {
    sqlx::raw_sql(
        "CREATE TABLE processed_messages (id uuid PRIMARY KEY, processed_at timestamptz NOT NULL DEFAULT \
        now()); TRUNCATE bank_accounts",
    )
    .execute(pool)
    .await
    .unwrap();
    let started = Instant::now();
    for e in events {
        let mut tx = pool.begin().await.unwrap();
        let fresh = sqlx::query("INSERT INTO processed_messages (id) VALUES ($1) ON CONFLICT DO NOTHING")
            .bind(e.id.as_uuid())
            .execute(&mut *tx)
            .await
            .unwrap();
        if fresh.rows_affected() == 1 {
            let amount = e.data.get("amount").and_then(|v| v.as_i64()).unwrap_or(0);
            let delta = if e.event_type == "MoneyWithdrawn" { -amount } else { amount };
            sqlx::query(
                "INSERT INTO bank_accounts (account_id, balance, version) VALUES ($1, $2, $3) \
                 ON CONFLICT (account_id) DO UPDATE SET balance = bank_accounts.balance + $2, version = $3",
            )
            .bind(&e.aggregate_id)
            .bind(delta)
            .bind(e.version)
            .execute(&mut *tx)
            .await
            .unwrap();
        }
        tx.commit().await.unwrap();
    }
    events.len() as f64 / started.elapsed().as_secs_f64()
}
