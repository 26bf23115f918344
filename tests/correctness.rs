//! Inputs that once gave a wrong read model silently, each against a real PostgreSQL:
//! aggregate types sharing ids, column defaults and nullable columns under adds, fractions
//! and integer limits, a bad value in the middle of a batch, custom `apply` between planned
//! events. Each is applied set-based in one batch and event by event, and both must agree
//! with the value SQL gives applying the events one at a time.

use projectionist::postgres::{
    apply_batch_in, apply_batch_knowing, migrate, Error, KnownVersions, Mode, PgConnection, Policy,
};
use projectionist::{async_trait, ApplyError, Envelope, OnGap, Outcome, Projection, RawEnvelope, Table, Writes};
use projectionist_testing::envelope;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sqlx::PgPool;

#[derive(Serialize, Deserialize, Clone, Debug)]
#[serde(tag = "type", content = "data")]
enum Ev {
    Opened {
        owner: String,
    },
    Nudged {
        by: i64,
    },
    Deposited {
        amount: i64,
    },
    Credited {
        by: Value,
    },
    Counted {
        total: Value,
    },
    Renamed {
        owner: String,
    },
    Noted {
        text: String,
    },
    /// A customer's event: the projection handles the type, and writes nothing.
    CustomerRenamed {
        name: String,
    },
}

/// Accounts keyed by id, with a default that an add must build on, a nullable counter, an
/// exact decimal and a float.
const ACCOUNTS: Table = Table::transition("c_accounts", "id").aggregate_type("account").columns(&[
    ("owner", "text"),
    ("balance", "bigint NOT NULL DEFAULT 1000"),
    ("maybe", "bigint"),
    ("credit", "numeric(14,2) NOT NULL DEFAULT 0"),
    ("exact", "numeric"),
    ("ratio", "double precision NOT NULL DEFAULT 0"),
    ("total", "numeric NOT NULL DEFAULT 0"),
    ("small", "smallint NOT NULL DEFAULT 0"),
]);
/// Totals per owner (fan-in), with a default.
const OWNERS: Table = Table::fan_in("c_owners", "owner").aggregate_type("account").columns(&[
    ("deposits", "bigint NOT NULL DEFAULT 100"),
    ("opened", "bigint"),
    ("last", "text"),
]);
/// Written only by `apply`.
const NOTES: Table = Table::custom(
    "c_notes",
    "CREATE TABLE IF NOT EXISTS c_notes (id text, version bigint, text text, PRIMARY KEY (id, version))",
)
.aggregate_type("account");

struct Accounts;

#[async_trait]
impl Projection<PgConnection> for Accounts {
    type Event = Ev;

    fn name(&self) -> &str {
        "c_accounts"
    }

    fn tables(&self) -> &[Table] {
        &[ACCOUNTS, OWNERS, NOTES]
    }

    fn project(&self, e: &Envelope<Ev>) -> Writes {
        let row = || ACCOUNTS.write(e);
        match &e.event {
            Ev::Opened { owner } => {
                row().set("owner", owner).and(OWNERS.row(owner.clone()).set("opened", 1).set("last", &e.aggregate_id))
            }
            Ev::Deposited { amount } => {
                row().add("balance", amount).add("maybe", amount).and(OWNERS.row("all").add("deposits", amount))
            }
            Ev::Credited { by } => row().add("credit", by).add("exact", by).add("ratio", by).into(),
            Ev::Counted { total } => row().add("total", total).into(),
            Ev::Renamed { owner } => row().set("owner", owner).into(),
            Ev::Nudged { by } => row().add("small", by).into(),
            Ev::Noted { .. } => Writes::custom(),
            Ev::CustomerRenamed { .. } => Writes::none(),
        }
    }

    async fn apply(&self, tx: &mut PgConnection, e: &Envelope<Ev>) -> Result<Outcome, ApplyError> {
        let Ev::Noted { text } = &e.event else { return Err(ApplyError::msg("only notes are custom")) };
        sqlx::query("INSERT INTO c_notes VALUES ($1, $2, $3)")
            .bind(&e.aggregate_id)
            .bind(e.version)
            .bind(text)
            .execute(tx)
            .await?;
        Ok(Outcome::Applied)
    }
}

fn account(id: &str, version: i64, event: Ev) -> RawEnvelope {
    envelope("account", id, version, &event)
}

fn customer(id: &str, version: i64) -> RawEnvelope {
    envelope("customer", id, version, &Ev::CustomerRenamed { name: format!("c{version}") })
}

/// Applies `events` in one batch (set-based, or event by event), on a fresh read model.
async fn apply(pool: &PgPool, events: &[RawEnvelope], mode: Mode) -> Result<Vec<Outcome>, Error> {
    projectionist::postgres::reset(pool, &Accounts).await.unwrap();
    apply_batch_in(pool, &Accounts, events, mode, Policy::HALT).await
}

/// Applies `events` both ways and checks they agree on outcomes and tables; returns them.
async fn both(pool: &PgPool, events: &[RawEnvelope]) -> (Vec<Outcome>, Value) {
    let per_event = apply(pool, events, Mode::PerEvent).await.unwrap();
    let per_event_tables = projectionist_testing::dump_tables(pool, &Accounts).await;
    let batched = apply(pool, events, Mode::Batch).await.unwrap();
    let batched_tables = projectionist_testing::dump_tables(pool, &Accounts).await;
    assert_eq!(batched, per_event, "outcomes, batched vs per event");
    assert_eq!(batched_tables, per_event_tables, "tables, batched vs per event");
    (batched, batched_tables)
}

async fn row(pool: &PgPool, id: &str) -> Value {
    sqlx::query_scalar("SELECT to_jsonb(t) - 'id' FROM c_accounts t WHERE id = $1")
        .bind(id)
        .fetch_optional(pool)
        .await
        .unwrap()
        .unwrap_or(Value::Null)
}

async fn setup(pool: &PgPool) {
    migrate(pool, &[&Accounts]).await.unwrap();
}

#[sqlx::test(migrations = false)]
async fn an_event_moves_only_the_gates_of_its_own_aggregate_type(pool: PgPool) {
    setup(&pool).await;
    use Outcome::*;
    // A customer sharing the account's id, first in the batch.
    let events = [customer("42", 1), account("42", 1, Ev::Opened { owner: "ann".into() })];
    let (outcomes, _) = both(&pool, &events).await;
    assert_eq!(outcomes, [Applied, Applied]);
    assert_eq!(row(&pool, "42").await["owner"], json!("ann"), "the account is opened");

    // A customer's later version between the account's events.
    let events = [
        account("42", 1, Ev::Opened { owner: "ann".into() }),
        account("42", 2, Ev::Deposited { amount: 5 }),
        customer("42", 3),
        account("42", 3, Ev::Deposited { amount: 7 }),
    ];
    let (outcomes, _) = both(&pool, &events).await;
    assert_eq!(outcomes, [Applied, Applied, Applied, Applied]);
    assert_eq!(row(&pool, "42").await["balance"], json!(1012));

    // A customer at version 2 with no account row: not a gap of the account.
    let (outcomes, _) = both(&pool, &[customer("x", 2)]).await;
    assert_eq!(outcomes, [Applied]);
    assert_eq!(row(&pool, "x").await, Value::Null, "no account row made for a customer");
}

#[sqlx::test(migrations = false)]
async fn an_add_after_the_creating_event_builds_on_the_column_default(pool: PgPool) {
    setup(&pool).await;
    let events = [
        account("a", 1, Ev::Opened { owner: "ann".into() }),
        account("a", 2, Ev::Deposited { amount: 500 }),
        account("a", 3, Ev::Deposited { amount: 1 }),
    ];
    both(&pool, &events).await;
    let a = row(&pool, "a").await;
    assert_eq!(a["balance"], json!(1501), "default 1000 + 500 + 1");
    assert_eq!(a["maybe"], Value::Null, "NULL + 500 is NULL, as in SQL");
    let all: (i64,) =
        sqlx::query_as("SELECT deposits FROM c_owners WHERE owner = 'all'").fetch_one(&pool).await.unwrap();
    assert_eq!(all.0, 501, "the first fan-in write inserts its own value, later ones add to it");

    // A fan-in row created by a set of one column, then added to in another.
    let events = [account("b", 1, Ev::Opened { owner: "all".into() }), account("b", 2, Ev::Deposited { amount: 5 })];
    both(&pool, &events).await;
    let all: (i64, Option<i64>) =
        sqlx::query_as("SELECT deposits, opened FROM c_owners WHERE owner = 'all'").fetch_one(&pool).await.unwrap();
    assert_eq!(all, (105, Some(1)), "default 100 + 5");
}

#[sqlx::test(migrations = false)]
async fn adds_use_the_columns_own_arithmetic(pool: PgPool) {
    setup(&pool).await;
    let credit = |v, by: Value| account("a", v, Ev::Credited { by });
    let events = [
        account("a", 1, Ev::Opened { owner: "ann".into() }),
        credit(2, json!(0.1)),
        credit(3, json!(0.2)),
        credit(4, json!(0.005)),
        credit(5, json!(0.005)),
    ];
    both(&pool, &events).await;
    let a = row(&pool, "a").await;
    // Each add rounded to the column's scale first, as an UPDATE per event does.
    assert_eq!(a["credit"], json!(0.32));
    assert_eq!(a["exact"], Value::Null, "NULL absorbs");
    // double precision: ((0 + 0.1) + 0.2) + 0.005 + 0.005, in that order.
    assert_eq!(a["ratio"], json!(((0.1f64 + 0.2) + 0.005) + 0.005));

    // Integers beyond i64, and strings PostgreSQL reads as numbers, summed exactly.
    let count = |v, total: Value| account("n", v, Ev::Counted { total });
    let events = [
        account("n", 1, Ev::Opened { owner: "n".into() }),
        count(2, json!("100000000000000000000")),
        count(3, json!(u64::MAX)),
        count(4, json!("0.5")),
    ];
    both(&pool, &events).await;
    let total: String =
        sqlx::query_scalar("SELECT total::text FROM c_accounts WHERE id = 'n'").fetch_one(&pool).await.unwrap();
    assert_eq!(total, "118446744073709551615.5");
}

#[sqlx::test(migrations = false)]
async fn an_overflow_mid_chain_fails_batched_as_it_does_per_event(pool: PgPool) {
    setup(&pool).await;
    let events = [
        account("a", 1, Ev::Opened { owner: "ann".into() }),
        account("a", 2, Ev::Deposited { amount: i64::MAX - 1000 }),
        account("a", 3, Ev::Deposited { amount: 10 }),
        account("a", 4, Ev::Deposited { amount: -10 }),
    ];
    for mode in [Mode::PerEvent, Mode::Batch] {
        let err = apply(&pool, &events, mode).await.unwrap_err();
        assert!(err.to_string().contains("bigint out of range"), "{mode:?}: {err}");
    }
    // A smallint: a running sum past its range fails, one that stays inside passes, and a
    // delta the type cannot take fails although the deltas cancel out.
    let nudges = |bys: &[i64]| {
        let mut events = vec![account("s", 1, Ev::Opened { owner: "s".into() })];
        events.extend(bys.iter().zip(2..).map(|(by, v)| account("s", v, Ev::Nudged { by: *by })));
        events
    };
    for mode in [Mode::PerEvent, Mode::Batch] {
        let err = apply(&pool, &nudges(&[30000, 10000, -10000]), mode).await.unwrap_err();
        assert!(err.to_string().contains("smallint out of range"), "{mode:?}: {err}");
        let err = apply(&pool, &nudges(&[40000, -40000]), mode).await.unwrap_err();
        assert!(err.to_string().contains("out of range"), "{mode:?}: {err}");
        apply(&pool, &nudges(&[-32768, 32767, 1, -5]), mode).await.unwrap();
        assert_eq!(row(&pool, "s").await["small"], json!(-5), "{mode:?}");
    }
}

/// A CHECK constraint sees every state a row goes through, as one event at a time would: a
/// withdrawal below zero is refused though a deposit later in the batch would cover it.
#[sqlx::test(migrations = false)]
async fn a_check_constraint_refuses_a_state_between_as_it_does_per_event(pool: PgPool) {
    setup(&pool).await;
    sqlx::raw_sql("ALTER TABLE c_accounts ADD CONSTRAINT c_no_overdraft CHECK (balance >= 0)")
        .execute(&pool)
        .await
        .unwrap();
    let events = [
        account("a", 1, Ev::Opened { owner: "ann".into() }),
        account("b", 1, Ev::Opened { owner: "bob".into() }),
        account("a", 2, Ev::Deposited { amount: -1500 }),
        account("b", 2, Ev::Deposited { amount: 5 }),
        account("a", 3, Ev::Deposited { amount: 1000 }),
    ];
    for mode in [Mode::PerEvent, Mode::Batch] {
        let err = apply(&pool, &events, mode).await.unwrap_err();
        assert_eq!(err.event_index(), Some(2), "{mode:?}: {err}");
        assert!(err.to_string().contains("c_no_overdraft"), "{mode:?}: {err}");
    }
    // Without the state between, both apply the batch alike.
    let (_, tables) = both(&pool, &[&events[..2], &[account("a", 2, Ev::Deposited { amount: -900 })]].concat()).await;
    assert!(tables.to_string().contains("\"balance\":100"), "{tables}");
}

#[sqlx::test(migrations = false)]
async fn a_bad_value_is_blamed_on_its_own_event(pool: PgPool) {
    setup(&pool).await;
    let events = [
        account("a", 1, Ev::Opened { owner: "ann".into() }),
        account("b", 1, Ev::Opened { owner: "bob".into() }),
        account("b", 2, Ev::Renamed { owner: "nul\u{0}byte".into() }),
        account("a", 2, Ev::Deposited { amount: 1 }),
    ];
    for mode in [Mode::Batch, Mode::PerEvent] {
        let err = apply(&pool, &events, mode).await.unwrap_err();
        assert_eq!(err.event_index(), Some(2), "{mode:?}: {err}");
        let text = err.to_string();
        assert!(text.contains("b v2") && text.contains("\\u0000"), "{mode:?}: {text}");
    }
}

#[sqlx::test(migrations = false)]
async fn a_key_longer_than_the_limit_is_refused_before_any_write(pool: PgPool) {
    setup(&pool).await;
    let long = "k".repeat(projectionist::MAX_KEY_BYTES + 1);
    let events =
        [account("a", 1, Ev::Opened { owner: "ann".into() }), account(&long, 1, Ev::Opened { owner: "x".into() })];
    for mode in [Mode::Batch, Mode::PerEvent] {
        let err = apply(&pool, &events, mode).await.unwrap_err();
        assert_eq!(err.event_index(), Some(1), "{mode:?}: {err}");
        assert!(err.to_string().contains("longer than"), "{err}");
    }
    let wire = account(&long, 1, Ev::Opened { owner: "x".into() }).to_json();
    let err = RawEnvelope::from_slice(&wire).unwrap_err();
    assert!(err.to_string().contains("aggregate_id"), "{err}");
}

#[sqlx::test(migrations = false)]
async fn events_handled_by_apply_move_the_gates(pool: PgPool) {
    setup(&pool).await;
    use Outcome::*;
    let events = [
        account("a", 1, Ev::Opened { owner: "ann".into() }),
        account("a", 2, Ev::Noted { text: "hello".into() }),
        account("a", 3, Ev::Deposited { amount: 5 }),
        account("a", 2, Ev::Noted { text: "hello".into() }),
    ];
    let (outcomes, _) = both(&pool, &events).await;
    assert_eq!(outcomes, [Applied, Applied, Applied, Stale]);
    let a = row(&pool, "a").await;
    assert_eq!((a["balance"].clone(), a["version"].clone()), (json!(1005), json!(3)));
    let notes: i64 = sqlx::query_scalar("SELECT count(*) FROM c_notes").fetch_one(&pool).await.unwrap();
    assert_eq!(notes, 1, "the stale re-send of the note never reached apply");
}

/// A projection over one table, declared at run time.
struct OneTable(Table);

impl Projection<PgConnection> for OneTable {
    type Event = Ev;

    fn name(&self) -> &str {
        "one_table"
    }

    fn tables(&self) -> &[Table] {
        std::slice::from_ref(&self.0)
    }

    fn project(&self, e: &Envelope<Ev>) -> Writes {
        match &e.event {
            Ev::Renamed { owner } => self.0.write(e).set("From", owner).into(),
            _ => Writes::none(),
        }
    }
}

#[sqlx::test(migrations = false)]
async fn reserved_and_mixed_case_names_work_quoted(pool: PgPool) {
    let table = Table::upsert("order", "select")
        .aggregate_type("account")
        .version_column("Version")
        .columns(&[("From", "text")]);
    migrate(&pool, &[&OneTable(table)]).await.unwrap();
    let rename = |v, owner: &str| account("k", v, Ev::Renamed { owner: owner.into() });
    let outcomes = apply_batch_in(
        &pool,
        &OneTable(table),
        &[rename(1, "x"), rename(1, "y"), rename(2, "z")],
        Mode::Batch,
        Policy::HALT,
    )
    .await
    .unwrap();
    assert_eq!(outcomes, [Outcome::Applied, Outcome::Duplicate, Outcome::Applied]);
    let from: String = sqlx::query_scalar(r#"SELECT "From" FROM "order""#).fetch_one(&pool).await.unwrap();
    assert_eq!(from, "z");
}

#[sqlx::test(migrations = false)]
async fn bad_declarations_are_refused_before_any_sql(pool: PgPool) {
    const HOSTILE: Table = Table::upsert("acct\"; DROP TABLE x; --", "id").aggregate_type("account");
    let err = migrate(&pool, &[&OneTable(HOSTILE)]).await.unwrap_err();
    assert!(matches!(err, Error::Identifier { .. }) && err.to_string().contains("DROP TABLE"), "{err}");
    const UNTYPED: Table = Table::transition("untyped", "id");
    let err = migrate(&pool, &[&OneTable(UNTYPED)]).await.unwrap_err();
    assert!(
        err.to_string().contains("table untyped holds one row per aggregate: declare which aggregate type"),
        "{err}"
    );
    let err = apply_batch_in(
        &pool,
        &OneTable(UNTYPED),
        &[account("a", 1, Ev::Noted { text: "x".into() })],
        Mode::Batch,
        Policy::HALT,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Declaration { .. }), "{err}");
    let tables: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_tables WHERE tablename IN ('untyped', 'x')")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(tables, 0, "nothing created");
}

#[sqlx::test(migrations = false)]
async fn a_gap_ends_the_batch_and_what_precedes_it_stays_written(pool: PgPool) {
    use projectionist::postgres::PgProjection;
    setup(&pool).await;
    let events = [
        account("a", 1, Ev::Opened { owner: "ann".into() }),
        account("a", 3, Ev::Deposited { amount: 5 }),
        account("b", 1, Ev::Opened { owner: "bob".into() }),
    ];
    let gap = Outcome::Gap { expected: 2, found: 3 };
    for mode in [Mode::Batch, Mode::PerEvent] {
        projectionist::postgres::reset(&pool, &Accounts).await.unwrap();
        let mut tx = pool.begin().await.unwrap();
        let prepared = Accounts.prepare(events.to_vec());
        assert!(prepared.failure().is_none() && prepared.len() == events.len());
        let outcomes = projectionist::postgres::writer::write(&mut tx, &Accounts, &prepared, mode, OnGap::Halt)
            .await
            .unwrap()
            .outcomes;
        tx.commit().await.unwrap();
        assert_eq!(outcomes, [Outcome::Applied, gap], "{mode:?}: the engine halts there");
        assert_eq!(row(&pool, "a").await["version"], json!(1), "{mode:?}");
        assert_eq!(row(&pool, "b").await, Value::Null, "{mode:?}: nothing after the gap is written");
    }
    // The tools' apply_batch goes on past a gap, so every event has an outcome.
    let (outcomes, _) = both(&pool, &events).await;
    assert_eq!(outcomes, [Outcome::Applied, gap, Outcome::Applied]);
}

// Between batches, a partition remembers the versions it committed (`KnownVersions`) and
// reads only the others: what it remembers must never stand for a table that changed.

/// One gated table alone: its row's version is the aggregate's only one.
const BALANCES: Table = Table::transition("k_balances", "id")
    .aggregate_type("account")
    .columns(&[("owner", "text"), ("balance", "bigint NOT NULL DEFAULT 0")]);

struct Balances;

impl Projection<PgConnection> for Balances {
    type Event = Ev;

    fn name(&self) -> &str {
        "k_balances"
    }

    fn tables(&self) -> &[Table] {
        &[BALANCES]
    }

    fn project(&self, e: &Envelope<Ev>) -> Writes {
        match &e.event {
            Ev::Opened { owner } => BALANCES.write(e).set("owner", owner).into(),
            Ev::Deposited { amount } => BALANCES.write(e).add("balance", amount).into(),
            _ => Writes::none(),
        }
    }
}

/// Applies `events` in a transaction of its own, remembering in `known`.
async fn knowing(pool: &PgPool, known: &KnownVersions, events: &[RawEnvelope]) -> Vec<Outcome> {
    apply_batch_knowing(pool, &Balances, events, (Mode::Batch, Policy::HALT), known).await.unwrap()
}

async fn balance(pool: &PgPool) -> (i64, i64) {
    sqlx::query_as("SELECT version, balance FROM k_balances WHERE id = 'a'").fetch_one(pool).await.unwrap()
}

#[sqlx::test(migrations = false)]
async fn remembered_versions_are_not_trusted_for_a_table_swapped_or_truncated(pool: PgPool) {
    migrate(&pool, &[&Balances]).await.unwrap();
    let opened = account("a", 1, Ev::Opened { owner: "ann".into() });
    let deposits = [account("a", 2, Ev::Deposited { amount: 5 }), account("a", 3, Ev::Deposited { amount: 7 })];
    let behind = [
        // A rollback: the table renamed away, an older one renamed in (a new relation).
        "CREATE TABLE k_older (LIKE k_balances INCLUDING ALL); \
         INSERT INTO k_older SELECT * FROM k_balances; UPDATE k_older SET version = 1, balance = 0; \
         ALTER TABLE k_balances RENAME TO k_newer; ALTER TABLE k_older RENAME TO k_balances; DROP TABLE k_newer",
        // The same relation, a new file.
        "CREATE TEMP TABLE saved AS SELECT * FROM k_balances; TRUNCATE k_balances; \
         INSERT INTO k_balances SELECT * FROM saved; UPDATE k_balances SET version = 1, balance = 0; \
         DROP TABLE saved",
    ];
    for sql in behind {
        projectionist::postgres::reset(&pool, &Balances).await.unwrap();
        let known = KnownVersions::new();
        assert_eq!(knowing(&pool, &known, std::slice::from_ref(&opened)).await, [Outcome::Applied]);
        assert_eq!(knowing(&pool, &known, &deposits).await, [Outcome::Applied; 2]);
        // The row is put back to version 1 behind the partition's back.
        sqlx::raw_sql(sql).execute(&pool).await.unwrap();
        // Its deposits again: remembered at version 3, they would be duplicates.
        assert_eq!(knowing(&pool, &known, &deposits).await, [Outcome::Applied; 2], "{sql}");
        assert_eq!(balance(&pool).await, (3, 12), "{sql}");
    }
}

#[sqlx::test(migrations = false)]
async fn a_row_another_writer_moved_on_is_met_by_the_count_and_applied_once(pool: PgPool) {
    migrate(&pool, &[&Balances]).await.unwrap();
    let known = KnownVersions::new();
    let opened = account("a", 1, Ev::Opened { owner: "ann".into() });
    assert_eq!(knowing(&pool, &known, &[opened]).await, [Outcome::Applied]);
    // Another writer applies version 2: remembered at 1, the row is at 2.
    let second = account("a", 2, Ev::Deposited { amount: 5 });
    apply_batch_in(&pool, &Balances, std::slice::from_ref(&second), Mode::Batch, Policy::HALT).await.unwrap();
    let third = account("a", 3, Ev::Deposited { amount: 7 });
    assert_eq!(knowing(&pool, &known, &[second, third]).await, [Outcome::Duplicate, Outcome::Applied]);
    assert_eq!(balance(&pool).await, (3, 12));
}
