//! Given / when / then over a real database.

use projectionist_core::{Outcome, RawEnvelope};
use projectionist_postgres::{apply_batch, apply_batch_in, migrate, Mode, PgPool, PgProjection, Policy};
use serde_json::Value;

/// A scenario for one projection: events already applied (`given`), the events under test
/// (`when`), and what must follow (`then_*`). Runs against the pool's database, which
/// should be fresh (e.g. from `#[sqlx::test]`). The `when` events are applied with the
/// engine's policies, as `run` applies them unless told otherwise: a gap parks its aggregate
/// ([`Outcome::Parked`]; the held event applies once its predecessor comes), a poison event is
/// dead-lettered; [`ProjectionTest::policy`] chooses others.
///
/// ```no_run
/// # async fn demo(
/// #     pool: sqlx::PgPool,
/// #     projection: impl projectionist_postgres::PgProjection,
/// #     opened: projectionist_core::RawEnvelope,
/// #     deposit: projectionist_core::RawEnvelope,
/// # ) {
/// use projectionist_core::Outcome;
/// use projectionist_testing::ProjectionTest;
///
/// ProjectionTest::new(pool, projection)
///     .given([opened])
///     .when([deposit.clone(), deposit])
///     .then_outcomes([Outcome::Applied, Outcome::Duplicate])
///     .then_rows("SELECT balance FROM bank_accounts", serde_json::json!([{"balance": 500}]))
///     .run()
///     .await;
/// # }
/// ```
#[must_use = "nothing is checked until `run`"]
pub struct ProjectionTest<P> {
    pool: PgPool,
    projection: P,
    given: Vec<RawEnvelope>,
    when: Vec<RawEnvelope>,
    outcomes: Option<Vec<Outcome>>,
    rows: Vec<(String, Value)>,
    policy: Policy,
}

impl<P: PgProjection> ProjectionTest<P> {
    /// A scenario for `projection` on `pool`'s database.
    pub fn new(pool: PgPool, projection: P) -> Self {
        let (given, when, rows) = (Vec::new(), Vec::new(), Vec::new());
        Self { pool, projection, given, when, outcomes: None, rows, policy: Policy::default() }
    }

    /// What the `when` events do at a gap or a poison event, as `run`'s `on_gap` and
    /// `on_poison` say (default: park, dead-letter). [`Policy::HALT`]: a gap is
    /// [`Outcome::Gap`], a poison event fails the scenario.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Events applied before the events under test (must not fail or gap).
    pub fn given(mut self, events: impl IntoIterator<Item = RawEnvelope>) -> Self {
        self.given.extend(events);
        self
    }

    /// The events under test, applied in order in one transaction.
    pub fn when(mut self, events: impl IntoIterator<Item = RawEnvelope>) -> Self {
        self.when.extend(events);
        self
    }

    /// The outcomes the `when` events must report, in order.
    pub fn then_outcomes(mut self, outcomes: impl IntoIterator<Item = Outcome>) -> Self {
        self.outcomes = Some(outcomes.into_iter().collect());
        self
    }

    /// After the `when` events, `sql` must return exactly `expected` (a JSON array of rows
    /// as objects). Give the query an `ORDER BY` when it returns several rows.
    pub fn then_rows(mut self, sql: &str, expected: Value) -> Self {
        self.rows.push((sql.to_owned(), expected));
        self
    }

    /// Runs the scenario; panics with a message naming the first expectation that failed.
    pub async fn run(self) {
        migrate(&self.pool, &[&self.projection]).await.expect("migrating the test database");
        for (i, event) in self.given.iter().enumerate() {
            let outcome = apply_batch(&self.pool, &self.projection, std::slice::from_ref(event))
                .await
                .unwrap_or_else(|e| panic!("given event #{i} ({} v{}) failed: {e}", event.aggregate_id, event.version));
            assert!(
                outcome[0].is_ok(),
                "given event #{i} ({} v{}) reported {}",
                event.aggregate_id,
                event.version,
                outcome[0]
            );
        }
        let outcomes = apply_batch_in(&self.pool, &self.projection, &self.when, Mode::Batch, self.policy)
            .await
            .unwrap_or_else(|e| panic!("when events failed: {e}"));
        if let Some(expected) = &self.outcomes {
            assert_eq!(&outcomes, expected, "outcomes of the `when` events");
        }
        for (sql, expected) in &self.rows {
            let wrapped = format!("SELECT coalesce(jsonb_agg(to_jsonb(q)), '[]') FROM ({sql}) q");
            let actual: Value = sqlx::query_scalar(&wrapped)
                .fetch_one(&self.pool)
                .await
                .unwrap_or_else(|e| panic!("query {sql:?} failed: {e}"));
            assert_eq!(&actual, expected, "rows of {sql:?}");
        }
    }
}
