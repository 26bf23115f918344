//! TLS and SASL through the `bank-accounts` binary, against real services set up by
//! `scripts/services.sh --tls`: PostgreSQL with `ssl = on`, a broker listener requiring
//! mutual TLS (KAFKA_TLS_BROKERS, certificates from KAFKA_TLS_*), and a broker listener
//! requiring SASL (KAFKA_SASL_BROKERS; on Apache Kafka with a real user,
//! KAFKA_SASL_TEST_USER and KAFKA_SASL_TEST_PASSWORD). Without them each test reports itself
//! skipped.

mod common;

use common::skip;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use bank_accounts::generate;
use sqlx::PgPool;
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_bank-accounts");

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The TLS broker's address and certificate files, or `None` (and a skip line).
struct Tls {
    brokers: String,
    ca: String,
    wrong_ca: String,
    cert: String,
    key: String,
}

impl Tls {
    fn from_env(test: &str) -> Option<Self> {
        let found = (|| {
            Some(Self {
                brokers: var("KAFKA_TLS_BROKERS")?,
                ca: var("KAFKA_TLS_CA")?,
                wrong_ca: var("KAFKA_TLS_WRONG_CA")?,
                cert: var("KAFKA_TLS_CLIENT_CERT")?,
                key: var("KAFKA_TLS_CLIENT_KEY")?,
            })
        })();
        if found.is_none() {
            skip(test, "no TLS broker: KAFKA_TLS_* unset (run scripts/test.sh, which starts one)");
        }
        found
    }
}

/// The URL of this test's database, with extra query parameters.
fn database_url(pool: &PgPool, params: &str) -> String {
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let base = base.split('?').next().unwrap();
    let db = pool.connect_options().get_database().expect("test database").to_owned();
    format!("{}/{db}?{params}", base.rsplit_once('/').expect("URL with a database").0)
}

fn cli(database_url: &str, topic: &str, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args)
        .env("DATABASE_URL", database_url)
        .env("BANK_ACCOUNTS_TOPIC", topic)
        .env("RUST_LOG", "info")
        .env("PROJECTIONIST_METRICS_ADDR", "off")
        .env("KAFKA_CONNECT_TIMEOUT_SECS", "20")
        .env_remove("KAFKA_BROKERS")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    c
}

fn over_tls(c: &mut Command, tls: &Tls, ca: &str) {
    c.env("KAFKA_BROKERS", &tls.brokers)
        .env("KAFKA_SECURITY_PROTOCOL", "SSL")
        .env("KAFKA_SSL_CA_LOCATION", ca)
        .env("KAFKA_SSL_CERTIFICATE_LOCATION", &tls.cert)
        .env("KAFKA_SSL_KEY_LOCATION", &tls.key);
}

async fn output(mut c: Command) -> (Output, String) {
    let out = tokio::time::timeout(Duration::from_secs(120), c.output()).await.expect("command timed out").unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out, text)
}

#[sqlx::test(migrations = false)]
async fn a_projection_runs_end_to_end_over_mutual_tls_with_postgres_over_tls(pool: PgPool) {
    let Some(tls) = Tls::from_env("a_projection_runs_end_to_end_over_mutual_tls_with_postgres_over_tls") else {
        return;
    };
    let app = format!("tls-e2e-{}", uuid::Uuid::new_v4().simple());
    let url = database_url(&pool, &format!("sslmode=require&application_name={app}"));
    let topic = format!("test.tls.{}", uuid::Uuid::new_v4().simple());
    let dir = std::env::temp_dir().join(format!("projectionist-tls-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();

    let (out, text) = output(cli(&url, &topic, &["migrate"])).await;
    assert!(out.status.success(), "migrate: {text}");
    let events = generate::stream(60, 10, 7);
    let delivered = generate::with_redeliveries(&events, 0.2, 0.1, 7);
    let file = dir.join("events.ndjson");
    std::fs::write(&file, delivered.iter().map(|e| String::from_utf8(e.to_json()).unwrap() + "\n").collect::<String>())
        .unwrap();
    let mut publish = cli(&url, &topic, &["publish", "--topic", &topic, file.to_str().unwrap()]);
    over_tls(&mut publish, &tls, &tls.ca);
    let (out, text) = output(publish).await;
    assert!(
        out.status.success() && text.contains(&format!("Published {} events", delivered.len())),
        "publish over TLS: {text}"
    );

    let mut run = cli(&url, &topic, &["run", "--group-id", &app, "--kafka-property", "session.timeout.ms=6000"]);
    over_tls(&mut run, &tls, &tls.ca);
    let mut child = run.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let expected = generate::expected(&events);
    let started = Instant::now();
    loop {
        let rows: Vec<(String, i64)> =
            sqlx::query_as("SELECT account_id, version FROM bank_accounts").fetch_all(&pool).await.unwrap_or_default();
        if rows.len() == expected.len() && rows.iter().all(|(id, v)| expected[id].version == *v) {
            break;
        }
        assert!(child.try_wait().unwrap().is_none(), "the runner exited early");
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "read model not complete over TLS: {} of {} accounts",
            rows.len(),
            expected.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Every connection of the running engine (pool and checkpoint reader) is encrypted.
    let (connections, encrypted): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE s.ssl) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) WHERE \
        a.application_name = $1",
    )
    .bind(&app)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(connections >= 1 && encrypted == connections, "{encrypted} of {connections} engine connections use TLS");
    std::process::Command::new("kill").args(["-TERM", &child.id().unwrap().to_string()]).status().unwrap();
    assert!(child.wait().await.unwrap().success());

    let (out, text) = output({
        let mut status = cli(&url, &topic, &["status"]);
        over_tls(&mut status, &tls, &tls.ca);
        status
    })
    .await;
    assert!(out.status.success() && text.contains(&topic), "status over TLS: {text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[sqlx::test(migrations = false)]
async fn a_broker_certificate_from_the_wrong_ca_fails_clearly(pool: PgPool) {
    let Some(tls) = Tls::from_env("a_broker_certificate_from_the_wrong_ca_fails_clearly") else { return };
    let url = database_url(&pool, "");
    let topic = format!("test.tls.{}", uuid::Uuid::new_v4().simple());
    let (out, text) = output(cli(&url, &topic, &["migrate"])).await;
    assert!(out.status.success(), "migrate: {text}");

    let mut run = cli(&url, &topic, &["run", "--exit-when-caught-up"]);
    over_tls(&mut run, &tls, &tls.wrong_ca);
    let started = Instant::now();
    let (out, text) = output(run).await;
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!("cannot connect to Kafka at {}: broker certificate not trusted", tls.brokers)),
        "{text}"
    );
    assert!(text.contains("certificate verify failed"), "librdkafka's reason is kept: {text}");
    assert!(started.elapsed() < Duration::from_secs(15), "failed fast, not after the timeout: {:?}", started.elapsed());

    // The right CA but no client certificate: the terminator requires one.
    let mut run = cli(&url, &topic, &["status"]);
    run.env("KAFKA_BROKERS", &tls.brokers).env("KAFKA_SECURITY_PROTOCOL", "SSL").env("KAFKA_SSL_CA_LOCATION", &tls.ca);
    let (out, text) = output(run).await;
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("cannot connect to Kafka at") && text.contains("TLS handshake failed"), "{text}");
}

#[sqlx::test(migrations = false)]
async fn sasl_and_oauth_secrets_never_reach_the_logs_and_bad_credentials_fail_clearly(pool: PgPool) {
    const PASSWORD: &str = "Scram-pw-never-logged-4711";
    const CLIENT_SECRET: &str = "Oidc-secret-never-logged-0815";
    let test = "sasl_and_oauth_secrets_never_reach_the_logs_and_bad_credentials_fail_clearly";
    let Some(brokers) = var("KAFKA_SASL_BROKERS") else {
        skip(test, "no SASL broker: KAFKA_SASL_BROKERS unset (run scripts/test.sh, which starts one)");
        return;
    };
    let url = database_url(&pool, "");
    let topic = format!("test.sasl.{}", uuid::Uuid::new_v4().simple());
    let mut logs = String::new();
    for mechanism in ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN", "OAUTHBEARER"] {
        let mut run = cli(&url, &topic, &["run", "--exit-when-caught-up", "--kafka-property", "debug=all"]);
        run.env("KAFKA_BROKERS", &brokers)
            .env("RUST_LOG", "trace")
            .env("KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
            .env("KAFKA_SASL_MECHANISM", mechanism)
            .env("KAFKA_SASL_USERNAME", "nobody")
            .env("KAFKA_SASL_PASSWORD", PASSWORD);
        if mechanism == "OAUTHBEARER" {
            // librdkafka's own OIDC client-credentials flow, against a token endpoint that refuses.
            run.env("KAFKA_SASL_OAUTHBEARER_METHOD", "oidc")
                .env("KAFKA_SASL_OAUTHBEARER_CLIENT_ID", "projectionist")
                .env("KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET", CLIENT_SECRET)
                .env("KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL", "http://127.0.0.1:1/token");
        }
        let started = Instant::now();
        let (out, text) = output(run).await;
        assert_eq!(out.status.code(), Some(1), "{mechanism}: {text}");
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "{mechanism}: failed fast, not after the 20 s connect timeout: {:?}",
            started.elapsed()
        );
        assert!(
            text.contains(&format!("cannot connect to Kafka at {brokers}: SASL authentication failed")),
            "{mechanism}: {text}"
        );
        logs.push_str(&text);
    }
    assert!(logs.contains("TRACE"), "trace logging was on");
    for secret in [PASSWORD, CLIENT_SECRET] {
        assert!(
            !logs.contains(secret),
            "a secret reached the logs:\n{}",
            logs.lines().filter(|l| l.contains(secret)).collect::<Vec<_>>().join("\n")
        );
    }
}

/// With a real user: a stream published and projected over SASL/SCRAM-SHA-512, then
/// projected again from offset zero over SCRAM-SHA-256 and over PLAIN.
#[sqlx::test(migrations = false)]
async fn sasl_scram_and_plain_with_real_credentials_project_end_to_end(pool: PgPool) {
    let test = "sasl_scram_and_plain_with_real_credentials_project_end_to_end";
    let (Some(brokers), Some(user), Some(password)) =
        (var("KAFKA_SASL_BROKERS"), var("KAFKA_SASL_TEST_USER"), var("KAFKA_SASL_TEST_PASSWORD"))
    else {
        skip(test, "no SASL broker with a test user: KAFKA_SASL_BROKERS/KAFKA_SASL_TEST_* unset (Apache Kafka started by scripts/test.sh has them)");
        return;
    };
    let url = database_url(&pool, "");
    let topic = format!("test.sasl.{}", uuid::Uuid::new_v4().simple());
    let sasl = |args: &[&str], mechanism: &str| {
        let mut c = cli(&url, &topic, args);
        c.env("KAFKA_BROKERS", &brokers)
            .env("KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
            .env("KAFKA_SASL_MECHANISM", mechanism)
            .env("KAFKA_SASL_USERNAME", &user)
            .env("KAFKA_SASL_PASSWORD", &password);
        c
    };
    let (out, text) = output(cli(&url, &topic, &["migrate"])).await;
    assert!(out.status.success(), "migrate: {text}");
    let events = generate::stream(40, 8, 9);
    let dir = std::env::temp_dir().join(format!("projectionist-sasl-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("events.ndjson");
    std::fs::write(&file, events.iter().map(|e| String::from_utf8(e.to_json()).unwrap() + "\n").collect::<String>())
        .unwrap();
    let (out, text) = output(sasl(&["publish", "--topic", &topic, file.to_str().unwrap()], "SCRAM-SHA-512")).await;
    assert!(out.status.success() && text.contains(&format!("Published {} events", events.len())), "{text}");
    let expected = generate::expected(&events);
    for mechanism in ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"] {
        let (out, text) = output(sasl(&["run", "--reset", "--exit-when-caught-up"], mechanism)).await;
        assert!(out.status.success(), "{mechanism}: {text}");
        assert!(!text.contains(&password), "{mechanism}: the password reached the log");
        let rows: Vec<(String, i64)> =
            sqlx::query_as("SELECT account_id, version FROM bank_accounts").fetch_all(&pool).await.unwrap();
        assert_eq!(rows.len(), expected.len(), "{mechanism}: every account");
        assert!(rows.iter().all(|(id, v)| expected[id].version == *v), "{mechanism}: every version");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[sqlx::test(migrations = false)]
async fn engine_connections_use_tls_with_sslmode_require(pool: PgPool) {
    // Connections are only observable while open: look at a running engine's.
    let (out, text) = output(cli(&database_url(&pool, ""), "test.unused", &["migrate"])).await;
    assert!(out.status.success(), "{text}");
    for (mode, encrypted) in [("require", true), ("disable", false)] {
        let app = format!("tls-{mode}-{}", uuid::Uuid::new_v4().simple());
        let url = database_url(&pool, &format!("sslmode={mode}&application_name={app}"));
        let mut run = cli(&url, "test.unused", &["run"]);
        run.env("KAFKA_BROKERS", var("KAFKA_BROKERS").unwrap_or_else(|| "localhost:9092".into()));
        let mut child = run.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        let started = Instant::now();
        let seen = loop {
            let ssl: Option<bool> = sqlx::query_scalar(
                "SELECT bool_and(s.ssl) FROM pg_stat_activity a JOIN \
                pg_stat_ssl s USING (pid) WHERE a.application_name = $1",
            )
            .bind(&app)
            .fetch_one(&pool)
            .await
            .unwrap();
            if let Some(ssl) = ssl {
                break ssl;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "no connection of the engine seen with sslmode={mode}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        child.start_kill().unwrap();
        child.wait().await.unwrap();
        assert_eq!(seen, encrypted, "pg_stat_ssl.ssl with sslmode={mode}");
    }
}

/// Against the second cluster of `services.sh --tls`: a server certificate from the test CA,
/// and a client certificate from the same CA required.
#[tokio::test]
async fn postgres_verify_ca_verify_full_and_client_certificates() {
    let test = "postgres_verify_ca_verify_full_and_client_certificates";
    let Some(base) = var("PG_TLS_URL") else {
        skip(
            test,
            "no TLS PostgreSQL cluster (PG_TLS_URL unset: PostgreSQL is not local, or scripts/test.sh was not used)",
        );
        return;
    };
    let Some(tls) = Tls::from_env(test) else { return };
    let client = format!("sslcert={}&sslkey={}", tls.cert, tls.key);
    let good = format!("sslmode=verify-full&sslrootcert={}&{client}", tls.ca);
    // A fresh database of its own.
    let db = format!("tls_{}", uuid::Uuid::new_v4().simple());
    let url = |db: &str, params: &str| format!("{}/{db}?{params}", base.rsplit_once('/').unwrap().0);
    let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(&url("postgres", &good))
        .await
        .expect("admin connection with the client certificate");
    sqlx::query(&format!("CREATE DATABASE {db}")).execute(&mut admin).await.unwrap();
    let migrate = |params: String| {
        let url = url(&db, &params);
        async move { output(cli(&url, "unused", &["migrate"])).await }
    };

    let (out, text) = migrate(good.clone()).await;
    assert!(out.status.success(), "verify-full, test CA, client certificate: {text}");
    let (out, text) = migrate(format!("sslmode=verify-ca&sslrootcert={}&{client}", tls.ca)).await;
    assert!(out.status.success(), "verify-ca: {text}");
    let (out, text) = migrate(format!("sslmode=verify-full&sslrootcert={}&{client}", tls.wrong_ca)).await;
    assert!(!out.status.success(), "verify-full against the wrong CA: {text}");
    assert!(
        text.contains("cannot connect to PostgreSQL at 127.0.0.1")
            && text.contains("TLS failed")
            && text.contains("UnknownIssuer"),
        "{text}"
    );
    assert!(!text.contains("projectionist:projectionist"), "no password in the error: {text}");
    let (out, text) = migrate(format!("sslmode=verify-full&sslrootcert={}", tls.ca)).await;
    assert!(
        !out.status.success() && text.contains("requires a valid client certificate"),
        "no client certificate: {text}"
    );

    sqlx::query(&format!("DROP DATABASE {db} WITH (FORCE)")).execute(&mut admin).await.unwrap();
}
