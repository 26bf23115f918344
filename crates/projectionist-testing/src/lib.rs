#![doc = include_str!("../README.md")]

mod anomaly;
mod connections;
mod given;
mod streams;

pub use anomaly::{assert_anomaly_equivalence, AnomalyReport, Variant};
pub use connections::ConnectionPeak;
pub use given::ProjectionTest;
pub use streams::{interleave, with_redeliveries};

use chrono::{DateTime, Utc};
use projectionist_core::RawEnvelope;
use projectionist_postgres::{PgPool, PgProjection};
use serde::Serialize;
use serde_json::Value;

/// Builds a wire envelope for `event` (a serde enum tagged `type`, content `data`) with a
/// fresh id and an `occurred_at` derived from the version, so runs are reproducible.
pub fn envelope<E: Serialize>(aggregate_type: &str, aggregate_id: &str, version: i64, event: &E) -> RawEnvelope {
    let occurred_at = DateTime::<Utc>::from_timestamp(1_790_000_000 + version, 0).expect("valid timestamp");
    RawEnvelope::new(aggregate_type, aggregate_id, version, occurred_at, event)
}

/// `url` (a PostgreSQL URL) naming database `db` instead of its own, its parameters
/// (`sslmode`, ...) kept: a test's or a bench's own database on the same server.
pub fn with_database(url: &str, db: &str) -> String {
    let (path, query) = url.split_once('?').map_or((url, None), |(p, q)| (p, Some(q)));
    let server = path.rsplit_once('/').map_or(path, |(server, _)| server);
    match query {
        Some(query) => format!("{server}/{db}?{query}"),
        None => format!("{server}/{db}"),
    }
}

/// Dumps the full contents of the projection's tables (as JSON rows in a stable order),
/// plus its aggregate versions (fan-in and custom tables), for exact comparison between runs.
pub async fn dump_tables(pool: &PgPool, projection: &dyn PgProjection) -> Value {
    let mut dump = serde_json::Map::new();
    for table in projection.tables().iter().map(|t| t.name()) {
        let ident = projectionist_postgres::Ident::new(table).expect("valid table name");
        let sql = format!("SELECT coalesce(jsonb_agg(to_jsonb(t) ORDER BY to_jsonb(t)::text), '[]') FROM {ident} t");
        let rows: Value =
            sqlx::query_scalar(&sql).fetch_one(pool).await.unwrap_or_else(|e| panic!("dumping {table}: {e}"));
        dump.insert(table.to_owned(), rows);
    }
    let marks: Value = sqlx::query_scalar(
        "SELECT coalesce(jsonb_agg(jsonb_build_array(aggregate_type, aggregate_id, version) \
         ORDER BY aggregate_type, aggregate_id), '[]') FROM projectionist_aggregate_versions WHERE projection = $1",
    )
    .bind(projection.name())
    .fetch_one(pool)
    .await
    .unwrap_or_else(|e| panic!("dumping aggregate versions: {e}"));
    dump.insert("projectionist_aggregate_versions".into(), marks);
    let parked: Value = sqlx::query_scalar(
        "SELECT coalesce(jsonb_agg(jsonb_build_array(aggregate_type, aggregate_id, waiting_for) \
         ORDER BY aggregate_type, aggregate_id), '[]') FROM projectionist_parked WHERE projection = $1",
    )
    .bind(projection.name())
    .fetch_one(pool)
    .await
    .unwrap_or_else(|e| panic!("dumping parked aggregates: {e}"));
    dump.insert("projectionist_parked".into(), parked);
    let held: Value = sqlx::query_scalar(
        "SELECT coalesce(jsonb_agg(jsonb_build_array(aggregate_type, aggregate_id, version) \
         ORDER BY aggregate_type, aggregate_id, version), '[]') FROM projectionist_held WHERE projection = $1",
    )
    .bind(projection.name())
    .fetch_one(pool)
    .await
    .unwrap_or_else(|e| panic!("dumping held events: {e}"));
    dump.insert("projectionist_held".into(), held);
    let dead: Value = sqlx::query_scalar(
        "SELECT coalesce(jsonb_agg(jsonb_build_array(aggregate_type, aggregate_id, version, reason) \
         ORDER BY aggregate_type, aggregate_id, version, reason), '[]') FROM projectionist_dead_letters \
         WHERE projection = $1",
    )
    .bind(projection.name())
    .fetch_one(pool)
    .await
    .unwrap_or_else(|e| panic!("dumping dead letters: {e}"));
    dump.insert("projectionist_dead_letters".into(), dead);
    Value::Object(dump)
}

#[cfg(test)]
mod tests {
    #[test]
    fn another_database_keeps_the_server_and_the_parameters() {
        use super::with_database;
        assert_eq!(
            with_database("postgres://u:p@h:5432/app?sslmode=disable", "b"),
            "postgres://u:p@h:5432/b?sslmode=disable"
        );
        assert_eq!(with_database("postgres://u:p@h/app", "b"), "postgres://u:p@h/b");
    }
}
