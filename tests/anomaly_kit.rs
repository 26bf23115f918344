//! The test kit catches what it is for: a projection whose result depends on how the
//! stream's aggregates interleave fails the anomaly-equivalence check. And custom SQL in
//! `apply` needs no guard of its own: the engine gates it by the aggregate's version.

use projectionist::postgres::PgConnection;
use projectionist::{async_trait, ApplyError, Envelope, Outcome, Projection, Table, Writes};
use projectionist_testing::{assert_anomaly_equivalence, envelope};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

#[derive(Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
enum Ev {
    Added { n: i64 },
}

fn events() -> Vec<projectionist::RawEnvelope> {
    (0..50).map(|v| envelope("counter", &format!("c{}", v % 5), v / 5 + 1, &Ev::Added { n: v })).collect()
}

/// Remembers which counter moved last: an answer that depends on the order between
/// aggregates, which Kafka keeps only within a key.
struct LastMover;

const LAST: Table = Table::fan_in("last_mover", "id").columns(&[("counter", "text")]);

impl Projection<PgConnection> for LastMover {
    type Event = Ev;
    fn name(&self) -> &str {
        "last_mover"
    }
    fn tables(&self) -> &[Table] {
        &[LAST]
    }
    fn project(&self, env: &Envelope<Ev>) -> Writes {
        LAST.row("all").set("counter", &env.aggregate_id).into()
    }
}

#[sqlx::test(migrations = false)]
#[should_panic(expected = "variant Shuffled")]
async fn an_order_dependent_projection_fails_the_check(pool: PgPool) {
    assert_anomaly_equivalence(&pool, &LastMover, &events(), 1).await;
}

/// Adds with custom SQL and no guard of its own.
struct CustomSums;

#[async_trait]
impl Projection<PgConnection> for CustomSums {
    type Event = Ev;
    fn name(&self) -> &str {
        "custom_sums"
    }
    fn tables(&self) -> &[Table] {
        const SUMS: Table =
            Table::custom("sums", "CREATE TABLE IF NOT EXISTS sums (id text PRIMARY KEY, total bigint NOT NULL)");
        &[SUMS]
    }
    async fn apply(&self, tx: &mut PgConnection, env: &Envelope<Ev>) -> Result<Outcome, ApplyError> {
        let Ev::Added { n } = env.event;
        sqlx::query(
            "INSERT INTO sums VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET total = sums.total + EXCLUDED.total",
        )
        .bind(&env.aggregate_id)
        .bind(n)
        .execute(tx)
        .await?;
        Ok(Outcome::Applied)
    }
}

#[sqlx::test(migrations = false)]
async fn custom_sql_is_gated_by_the_engine(pool: PgPool) {
    let report = assert_anomaly_equivalence(&pool, &CustomSums, &events(), 1).await;
    assert_eq!(report.clean.applied, 50, "{report:?}");
    let total: i64 = sqlx::query_scalar("SELECT sum(total)::bigint FROM sums").fetch_one(&pool).await.unwrap();
    assert_eq!(total, (0..50).sum::<i64>());
}
