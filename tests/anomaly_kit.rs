//! The test kit catches what it is for: a projection that writes without the version gate
//! fails the anomaly-equivalence check.

use projectionist::postgres::{PgConnection, MIGRATOR};
use projectionist::{async_trait, ApplyError, Envelope, Outcome, Projection, Table};
use projectionist_testing::{assert_anomaly_equivalence, envelope};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

#[derive(Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
enum Ev {
    Added { n: i64 },
}

/// Adds without any guard: duplicates double-count.
struct Unguarded;

#[async_trait]
impl Projection<PgConnection> for Unguarded {
    type Event = Ev;
    fn name(&self) -> &str {
        "unguarded"
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

#[sqlx::test(migrator = "MIGRATOR")]
#[should_panic(expected = "variant Duplicated")]
async fn an_unguarded_projection_fails_the_check(pool: PgPool) {
    let events: Vec<_> =
        (1..=50).map(|v| envelope("counter", &format!("c{}", v % 5), v / 5 + 1, &Ev::Added { n: v })).collect();
    assert_anomaly_equivalence(&pool, &Unguarded, &events, 1).await;
}
