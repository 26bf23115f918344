//! A process keeps within its PostgreSQL connection budget (issue 70): `--pg-max-connections`
//! caps the whole process, across its projections and partitions, a rebuild's shadow included.
//! Counted by PostgreSQL itself (`pg_stat_activity`), sampled while the process runs.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use bank_accounts::generate::{self, ExpectedAccount};
use common::cli::Env;
use common::read_model;
use projectionist_testing::ConnectionPeak;
use sqlx::PgPool;
use tokio::process::Command;

/// Ten copies of the bank accounts read model in one process.
const FLEET: &str = env!("CARGO_BIN_EXE_bank-fleet");

/// The fleet's command against `env`'s database and topic, its connections named `app` in
/// PostgreSQL so that they can be told from the test's own.
fn fleet(env: &Env, app: &str, args: &[&str]) -> Command {
    let join = if env.database_url.contains('?') { '&' } else { '?' };
    let mut fleet = Command::new(FLEET);
    fleet
        .args(args)
        .env("DATABASE_URL", format!("{}{join}application_name={app}", env.database_url))
        .env("KAFKA_BROKERS", common::brokers())
        .env("BANK_ACCOUNTS_TOPIC", &env.topic)
        .env("BANK_FLEET_PROJECTIONS", "10")
        .env("RUST_LOG", "info")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    fleet
}

async fn table(pool: &PgPool, name: &str) -> BTreeMap<String, ExpectedAccount> {
    let sql = format!("SELECT account_id, owner, balance, status, version FROM {name} ORDER BY account_id");
    let rows: Vec<(String, String, i64, String, i64)> = sqlx::query_as(&sql).fetch_all(pool).await.unwrap();
    rows.into_iter()
        .map(|(id, owner, balance, status, version)| (id, ExpectedAccount { owner, balance, status, version }))
        .collect()
}

async fn output(mut command: Command) -> (bool, String) {
    let out = tokio::time::timeout(Duration::from_secs(240), command.output()).await.expect("in time").unwrap();
    let text = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    (out.status.success(), text)
}

/// Ten projections of a twelve-partition topic in one `run` capped at six connections: never
/// more than six open, each table exact, no partition told to wait for PostgreSQL (it
/// answers: they wait for one another). Then one projection rebuilt under the same cap: the
/// rebuild's own connections and its shadow's together stay within it.
#[sqlx::test(migrations = false)]
async fn ten_projections_of_twelve_partitions_keep_within_the_connection_budget(pool: PgPool) {
    const CAP: i64 = 6;
    let env = Env::new(&pool, "budget").await;
    let app = format!("budget-{}", uuid::Uuid::new_v4().simple());
    let (ok, said) = output(fleet(&env, &app, &["migrate"])).await;
    assert!(ok, "migrate: {said}");
    let (ok, said) = output(fleet(&env, &app, &["create-topics", "--partitions", "12"])).await;
    assert!(ok, "create-topics: {said}");
    let events = generate::stream(600, 8, 7070);
    env.publish(&events).await;
    let expected = generate::expected(&events);

    let sampler = ConnectionPeak::start(&pool, &app);
    let args = env.run_args(&["--exit-when-caught-up", "--pg-max-connections", "6"]);
    let (ok, said) = output(fleet(&env, &app, &args)).await;
    let most = sampler.most().await;
    assert!(ok, "run: {said}");
    for i in 1..=10 {
        assert_eq!(table(&pool, &format!("bank_accounts_{i}")).await, expected, "bank_accounts_{i}");
    }
    assert!(most >= 2, "the sampler saw the run's connections: {most}");
    assert!(most <= CAP, "at most {CAP} connections open at once, {most} seen:\n{said}");
    assert!(!said.contains("Waiting for PostgreSQL"), "PostgreSQL answered all along:\n{said}");

    let sampler = ConnectionPeak::start(&pool, &app);
    let rebuild = ["rebuild", "--projection", "bank_accounts_3", "--pg-max-connections", "6", "--metrics-addr", "off"];
    let (ok, said) = output(fleet(&env, &app, &rebuild)).await;
    let most = sampler.most().await;
    assert!(ok, "rebuild: {said}");
    assert!(said.contains("bank_accounts_3: rebuilt"), "{said}");
    assert_eq!(table(&pool, "bank_accounts_3").await, expected, "rebuilt");
    assert!(most >= 2, "the sampler saw the rebuild's connections: {most}");
    assert!(most <= CAP, "a rebuild and its shadow within {CAP} connections, {most} seen:\n{said}");

    let too_few = ["rebuild", "--projection", "bank_accounts_3", "--pg-max-connections", "4", "--metrics-addr", "off"];
    let (ok, said) = output(fleet(&env, &app, &too_few)).await;
    assert!(!ok && said.contains("--pg-max-connections 4 is too few for a rebuild"), "{said}");
}

/// A partition waiting for the process's only connection past the pool's 10 s acquire
/// timeout (another partition's batch holds it for 12 s) queues for it again: the log says
/// it waits for a connection, never that PostgreSQL is away, and every event is applied once.
#[sqlx::test(migrations = false)]
async fn a_partition_queued_for_a_busy_connection_is_not_told_that_postgres_is_away(pool: PgPool) {
    let env = Env::new(&pool, "budget-queue").await;
    sqlx::raw_sql(
        "CREATE SEQUENCE slow_calls; \
         CREATE FUNCTION slow_write() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN IF nextval('slow_calls') = 1 THEN PERFORM pg_sleep(12); END IF; RETURN NULL; END $$; \
         CREATE TRIGGER slow BEFORE INSERT OR UPDATE ON bank_accounts FOR EACH STATEMENT EXECUTE FUNCTION slow_write();",
    )
    .execute(&pool)
    .await
    .unwrap();
    let events = generate::stream(40, 5, 71);
    env.publish(&events).await;
    let (status, _, err) = env.run_until_caught_up(&["--pg-max-connections", "1"]).await;
    assert!(status.success(), "{err}");
    assert_eq!(read_model(&pool).await, generate::expected(&events));
    assert!(err.contains("is in use by its other partitions; waiting for one"), "said it queued:\n{err}");
    assert!(!err.contains("Waiting for PostgreSQL"), "PostgreSQL answered all along:\n{err}");

    // Serving /wait, whose listener keeps a connection for good, one is too few: refused.
    let (status, _, err) =
        env.run_until_caught_up(&["--pg-max-connections", "1", "--metrics-addr", "127.0.0.1:0"]).await;
    assert!(!status.success() && err.contains("--pg-max-connections 1 leaves the partitions no connection"), "{err}");
}
