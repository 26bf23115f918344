//! `migrate` against a real PostgreSQL: the engine keeps its own migration history and
//! leaves an application's sqlx history as it is; a table that differs from its declaration
//! is refused by `migrate`, a reset and `run`, naming the table, the difference and what to
//! do; a nullable column is added in place only when asked.

use std::path::PathBuf;

use projectionist::kafka::{Engine, EngineConfig};
use projectionist::postgres::{
    check_tables, migrate, migrate_with, reset, Error, MigrateError, MigrateOptions, PgConnection,
};
use projectionist::{Envelope, Projection, Table, Writes};
use serde::Deserialize;
use sqlx::migrate::Migrator;
use sqlx::PgPool;

#[derive(Deserialize)]
#[serde(tag = "type", content = "data")]
enum Ev {
    Named { name: String },
}

/// A projection over one table, declared at run time.
struct Shop(Table);

impl Projection<PgConnection> for Shop {
    type Event = Ev;

    fn name(&self) -> &str {
        "shop"
    }

    fn tables(&self) -> &[Table] {
        std::slice::from_ref(&self.0)
    }

    fn project(&self, e: &Envelope<Ev>) -> Writes {
        let Ev::Named { name } = &e.event;
        self.0.write(e).set("name", name).into()
    }
}

const V1: Table = Table::upsert("shops", "id").aggregate_type("shop").columns(&[
    ("name", "text"),
    ("stock", "bigint NOT NULL DEFAULT 0"),
    ("price", "numeric(10,2)"),
]);

/// The application's own sqlx migrations, in a directory of their own.
async fn application_migrator() -> Migrator {
    let dir: PathBuf = std::env::temp_dir().join(format!("app-migrations-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("20240101000000_users.sql"), "CREATE TABLE app_users (id bigint PRIMARY KEY);").unwrap();
    Migrator::new(dir).await.unwrap()
}

/// The versions of the engine's migrations, from the files in `migrations/`.
fn shipped() -> Vec<i64> {
    let mut versions: Vec<i64> = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations"))
        .unwrap()
        .filter_map(|f| f.unwrap().file_name().to_str()?.split('_').next()?.parse().ok())
        .collect();
    versions.sort_unstable();
    assert!(versions.len() >= 4, "{versions:?}");
    versions
}

async fn versions(pool: &PgPool, table: &str) -> Vec<i64> {
    sqlx::query_scalar(&format!("SELECT version FROM {table} ORDER BY version")).fetch_all(pool).await.unwrap()
}

#[sqlx::test(migrations = false)]
async fn the_engine_keeps_its_history_apart_from_the_applications_sqlx_migrations(pool: PgPool) {
    let app = application_migrator().await;
    app.run(&pool).await.unwrap();
    migrate(&pool, &[&Shop(V1)]).await.unwrap();
    migrate(&pool, &[&Shop(V1)]).await.expect("a second migrate changes nothing");
    // The application's migrator still finds only its own history, and so runs again.
    app.run(&pool).await.expect("the application's migrations still run");
    assert_eq!(versions(&pool, "_sqlx_migrations").await, [20240101000000]);
    let engine = versions(&pool, "projectionist_migrations").await;
    assert_eq!(engine, shipped());
    for table in ["app_users", "projectionist_checkpoints", "projectionist_aggregate_versions", "shops"] {
        let exists: bool =
            sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL").bind(table).fetch_one(&pool).await.unwrap();
        assert!(exists, "{table}");
    }
}

#[sqlx::test(migrations = false)]
async fn a_history_from_a_newer_or_modified_build_is_refused_naming_the_migration(pool: PgPool) {
    migrate(&pool, &[]).await.unwrap();
    let last = *shipped().last().unwrap();
    // A newer release's migration in the history: this build must not run against it.
    sqlx::query("INSERT INTO projectionist_migrations (version, description, checksum) VALUES ($1, 'later', '\\x00')")
        .bind(last + 1)
        .execute(&pool)
        .await
        .unwrap();
    match migrate(&pool, &[]).await {
        Err(Error::Migrate(MigrateError::Unknown { version })) => assert_eq!(version, last + 1),
        other => panic!("expected an unknown migration, got {other:?}"),
    }
    sqlx::query("DELETE FROM projectionist_migrations WHERE version = $1").bind(last + 1).execute(&pool).await.unwrap();
    // A shipped migration applied with other contents.
    sqlx::query("UPDATE projectionist_migrations SET checksum = '\\x00' WHERE version = $1")
        .bind(last)
        .execute(&pool)
        .await
        .unwrap();
    let refused = migrate(&pool, &[]).await.unwrap_err();
    assert!(
        matches!(&refused, Error::Migrate(MigrateError::Modified { version, .. }) if *version == last),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("migrated by a modified build"), "{refused}");
}

#[sqlx::test(migrations = false)]
async fn a_history_an_earlier_build_left_in_sqlx_migrations_moves_to_the_engines(pool: PgPool) {
    // Builds of 0.1.0 ran the engine's migrations with sqlx's migrator.
    sqlx::migrate!("./migrations").run(&pool).await.unwrap();
    assert_eq!(versions(&pool, "_sqlx_migrations").await, shipped());
    migrate(&pool, &[]).await.unwrap();
    assert_eq!(versions(&pool, "_sqlx_migrations").await, Vec::<i64>::new());
    assert_eq!(versions(&pool, "projectionist_migrations").await, shipped());
    // The application can now use sqlx's migrator in the same database.
    application_migrator().await.run(&pool).await.expect("no foreign versions left in _sqlx_migrations");
}

#[sqlx::test(migrations = false)]
async fn aggregate_versions_kept_under_their_old_name_are_renamed_with_their_rows_in_every_schema(pool: PgPool) {
    // A database an earlier build migrated: every migration before the rename, a row of
    // aggregate versions, and a rebuild's shadow holding its own copy of the table.
    let dir = std::env::temp_dir().join(format!("engine-before-rename-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let rename = "20261125000001";
    for file in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations")).unwrap() {
        let file = file.unwrap();
        if file.file_name().to_str().unwrap() < rename {
            std::fs::copy(file.path(), dir.join(file.file_name())).unwrap();
        }
    }
    Migrator::new(dir).await.unwrap().run(&pool).await.unwrap();
    sqlx::raw_sql(
        "INSERT INTO projectionist_watermarks VALUES ('shop', 'shop', 's-1', 3);
         CREATE SCHEMA projectionist_rebuild_shop;
         CREATE TABLE projectionist_rebuild_shop.projectionist_watermarks (LIKE projectionist_watermarks INCLUDING ALL);
         INSERT INTO projectionist_rebuild_shop.projectionist_watermarks VALUES ('shop', 'shop', 's-2', 5);",
    )
    .execute(&pool)
    .await
    .unwrap();

    migrate(&pool, &[]).await.unwrap();
    for (schema, id, version) in [("public", "s-1", 3_i64), ("projectionist_rebuild_shop", "s-2", 5)] {
        let rows: Vec<(String, i64)> = sqlx::query_as(&format!(
            "SELECT aggregate_id, version FROM {schema}.projectionist_aggregate_versions WHERE projection = 'shop'"
        ))
        .fetch_all(&pool)
        .await
        .unwrap();
        assert_eq!(rows, [(id.to_owned(), version)], "{schema}");
        let old: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
            .bind(format!("{schema}.projectionist_watermarks"))
            .fetch_one(&pool)
            .await
            .unwrap();
        assert!(!old, "{schema}: the old name is gone");
    }
    assert_eq!(versions(&pool, "projectionist_migrations").await, shipped());
}

#[sqlx::test(migrations = false)]
async fn types_spelled_otherwise_are_the_same_columns(pool: PgPool) {
    migrate(&pool, &[&Shop(V1)]).await.unwrap();
    const RESPELLED: Table = Table::upsert("shops", "id").aggregate_type("shop").columns(&[
        ("name", "TEXT"),
        ("stock", "int8 not null default 0"),
        ("price", "NUMERIC( 10, 2 )"),
    ]);
    migrate(&pool, &[&Shop(RESPELLED)]).await.expect("no difference");
    check_tables(&pool, &Shop(RESPELLED)).await.expect("no difference");
}

#[sqlx::test(migrations = false)]
async fn a_column_added_to_a_declaration_is_refused_until_added_in_place(pool: PgPool) {
    migrate(&pool, &[&Shop(V1)]).await.unwrap();
    sqlx::query("INSERT INTO shops (id, name, version) VALUES ('s1', 'corner', 3)").execute(&pool).await.unwrap();
    const V2: Table = Table::upsert("shops", "id").aggregate_type("shop").columns(&[
        ("name", "text"),
        ("stock", "bigint NOT NULL DEFAULT 0"),
        ("price", "numeric(10,2)"),
        ("updated_at", "timestamptz"),
    ]);

    let err = migrate(&pool, &[&Shop(V2)]).await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(&err, Error::Drift { drift, .. } if drift.len() == 1), "{text}");
    assert!(text.contains("table shops: column updated_at (timestamptz) is declared but missing"), "{text}");
    assert!(text.contains("migrate --add-columns"), "{text}");
    // `run` and a reset refuse too, before reading or emptying anything.
    assert!(matches!(check_tables(&pool, &Shop(V2)).await, Err(Error::Drift { .. })));
    assert!(matches!(reset(&pool, &Shop(V2)).await, Err(Error::Drift { .. })));
    let engine =
        Engine::new(pool.clone(), EngineConfig::new("127.0.0.1:1")).register(std::sync::Arc::new(Shop(V2)), ["t"]);
    let err = engine.run(std::future::pending()).await.unwrap_err();
    assert!(err.to_string().contains("column updated_at (timestamptz) is declared but missing"), "{err}");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM shops").fetch_one(&pool).await.unwrap();
    assert_eq!(rows, 1, "nothing emptied");

    migrate_with(&pool, &[&Shop(V2)], MigrateOptions::default().add_columns()).await.unwrap();
    check_tables(&pool, &Shop(V2)).await.expect("the table is as declared now");
    let (name, updated_at): (String, Option<chrono::DateTime<chrono::Utc>>) =
        sqlx::query_as("SELECT name, updated_at FROM shops WHERE id = 's1'").fetch_one(&pool).await.unwrap();
    assert_eq!((name.as_str(), updated_at), ("corner", None), "the row kept, NULL in the new column");
}

#[sqlx::test(migrations = false)]
async fn a_changed_type_nullability_default_or_key_is_refused_and_never_changed_in_place(pool: PgPool) {
    migrate(&pool, &[&Shop(V1)]).await.unwrap();
    const CHANGED: Table = Table::upsert("shops", "sku").aggregate_type("shop").columns(&[
        ("name", "text NOT NULL"),
        ("stock", "integer NOT NULL DEFAULT 0"),
        ("price", "numeric(10,2) DEFAULT 1"),
        ("colour", "text NOT NULL DEFAULT 'red'"),
    ]);
    let err = migrate_with(&pool, &[&Shop(CHANGED)], MigrateOptions::default().add_columns()).await.unwrap_err();
    let text = err.to_string();
    for expected in [
        "column sku (text PRIMARY KEY) is declared but missing",
        "column name is nullable in the database, declared NOT NULL",
        "column stock is bigint in the database, declared integer",
        "column price has no default in the database, declared DEFAULT 1",
        "column colour (text NOT NULL DEFAULT 'red') is declared but missing",
        "column id (text NOT NULL, no default) is not declared, so every new row would fail",
        "the primary key is (id) in the database, declared (sku)",
        "must be rebuilt from the stream",
    ] {
        assert!(text.contains(expected), "{expected:?} not in:\n{text}");
    }
    assert!(!text.contains("(can be added in place"), "NOT NULL and defaulted columns are never added:\n{text}");
    let columns: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM information_schema.columns \
         WHERE table_name = 'shops' AND column_name IN ('sku', 'colour')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(columns, 0, "nothing added");
}

#[sqlx::test(migrations = false)]
async fn run_refuses_a_table_that_does_not_exist(pool: PgPool) {
    migrate(&pool, &[]).await.unwrap();
    let err = check_tables(&pool, &Shop(V1)).await.unwrap_err();
    assert!(err.to_string().contains("table shops: does not exist"), "{err}");
    assert!(err.to_string().contains("Run `migrate`"), "{err}");
}

#[sqlx::test(migrations = false)]
async fn a_role_that_may_only_read_and_write_can_run_the_check(pool: PgPool) {
    migrate(&pool, &[&Shop(V1)]).await.unwrap();
    let role = format!("rw_{}", uuid::Uuid::new_v4().simple());
    for statement in [
        format!("CREATE ROLE {role} LOGIN PASSWORD 'rw-password'"),
        "REVOKE CREATE ON SCHEMA public FROM PUBLIC".to_owned(),
        format!("GRANT USAGE ON SCHEMA public TO {role}"),
        format!("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}"),
    ] {
        sqlx::query(&statement).execute(&pool).await.unwrap();
    }
    let options = pool.connect_options().as_ref().clone().username(&role).password("rw-password");
    let rw = PgPool::connect_with(options).await.unwrap();
    let created: Result<_, _> = sqlx::query("CREATE TABLE public.not_allowed (x int)").execute(&rw).await;
    assert!(created.is_err(), "the role cannot create tables in the schema");
    check_tables(&rw, &Shop(V1)).await.expect("the check needs no CREATE on the schema");
    const WIDER: Table = Table::upsert("shops", "id").aggregate_type("shop").columns(&[
        ("name", "text"),
        ("stock", "numeric NOT NULL DEFAULT 0"),
        ("price", "numeric(10,2)"),
    ]);
    let err = check_tables(&rw, &Shop(WIDER)).await.unwrap_err().to_string();
    assert!(err.contains("column stock is bigint in the database, declared numeric"), "{err}");
    rw.close().await;
    for statement in [
        format!("REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {role}"),
        format!("REVOKE USAGE ON SCHEMA public FROM {role}"),
        format!("DROP ROLE {role}"),
    ] {
        sqlx::query(&statement).execute(&pool).await.unwrap();
    }
}
