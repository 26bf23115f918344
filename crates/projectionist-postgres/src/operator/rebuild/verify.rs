//! A rebuild's shadow compared with the live tables instead of swapped in (`rebuild
//! --verify`): the reconciliation an operator schedules, which finds what slipped past the
//! engine (a row written by hand, a bug of a projection's, a restore gone wrong).

use std::collections::BTreeMap;

use projectionist_core::Gate;
use serde_json::Value;
use sqlx::{Connection, PgConnection, PgPool};

use super::swap::live_tables;
use super::{problem, schema_exists, shadow_schema, unqualified, versions_in};
use crate::error::Result;
use crate::projection::PgProjection;
use crate::tables::ident::Ident;

/// How many differing rows of a table a verification shows (it counts them all).
pub const FIRST_DIFFERENCES: i64 = 5;

/// What a verification found.
#[derive(Debug, Clone, PartialEq)]
pub enum Verification {
    /// The shadow and the live tables were compared at the same offsets: the tables that
    /// differ (none: the live read model is the stream's).
    Compared(Vec<Difference>),
    /// The live run has read past the shadow on these partitions (topic, partition, the
    /// shadow's next offset, the live one): catch the shadow up, then verify again.
    ShadowBehind(Vec<(String, i32, Option<i64>, Option<i64>)>),
    /// The shadow has read past the live run on these partitions (same shape): the live
    /// run has yet to apply what the shadow has; compared now, its tables would differ.
    LiveBehind(Vec<(String, i32, Option<i64>, Option<i64>)>),
}

/// A table whose live rows are not its rebuilt ones.
#[derive(Debug, Clone, PartialEq)]
pub struct Difference {
    /// The table (or `projectionist_aggregate_versions`, the projection's rows of it).
    pub table: String,
    /// Rows only the live table has (by key; a table without a key the engine knows, a
    /// custom one, is compared as whole rows).
    pub only_live: i64,
    /// Rows only the rebuilt table has.
    pub only_rebuilt: i64,
    /// Rows of the same key whose values differ.
    pub changed: i64,
    /// The first differing rows, by key: the key (`null` for whole rows), the live row and
    /// the rebuilt one (`null` where a side has none).
    pub first: Vec<(Value, Value, Value)>,
}

impl Difference {
    /// How many rows differ.
    pub fn rows(&self) -> i64 {
        self.only_live + self.only_rebuilt + self.changed
    }
}

/// Compares `projection`'s shadow with its live tables, when both have read `topics` to the
/// same offsets: every table of the projection and its aggregate versions, in one snapshot
/// (the live checkpoints and rows a batch commits together are seen together). Writers are
/// not held back: the live run goes on meanwhile.
pub async fn verify(pool: &PgPool, projection: &dyn PgProjection, topics: &[String]) -> Result<Verification> {
    let name = projection.name();
    unqualified(projection)?;
    let shadow = Ident::new(&shadow_schema(name))?;
    let mut conn = pool.acquire().await?;
    if !schema_exists(&mut conn, &shadow_schema(name)).await? {
        return Err(problem(name, "there is no rebuild of it to verify (`rebuild --verify` builds one)"));
    }
    let (engine, live) = live_tables(&mut conn, projection).await?;
    let mut tx = conn.begin().await?;
    sqlx::raw_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY").execute(&mut *tx).await?;
    let (behind, ahead) = positions(&mut tx, name, topics, &engine, &shadow).await?;
    if !behind.is_empty() {
        return Ok(Verification::ShadowBehind(behind));
    }
    if !ahead.is_empty() {
        return Ok(Verification::LiveBehind(ahead));
    }
    let mut differences = Vec::new();
    for (table, (schema, ident)) in projection.tables().iter().zip(&live) {
        let keys: Vec<&str> = match table.gate() {
            Gate::Custom => Vec::new(),
            _ => [table.key(), table.child_key()].into_iter().filter(|k| !k.is_empty()).collect(),
        };
        let (live_rows, rebuilt_rows) = (format!("{schema}.{ident}"), format!("{shadow}.{ident}"));
        let found = compare(&mut tx, table.name(), &live_rows, &rebuilt_rows, &keys, None).await?;
        differences.extend(found);
    }
    let keys = ["aggregate_type", "aggregate_id"];
    let table = "projectionist_aggregate_versions";
    differences.extend(compare(&mut tx, table, &versions_in(&engine), &versions_in(&shadow), &keys, Some(name)).await?);
    tx.rollback().await?;
    Ok(Verification::Compared(differences))
}

type Positions = Vec<(String, i32, Option<i64>, Option<i64>)>;

/// The partitions of `topics` the shadow has read less of than the live run, and those it
/// has read more of: (topic, partition, the shadow's next offset, the live one).
async fn positions(
    conn: &mut PgConnection,
    projection: &str,
    topics: &[String],
    engine: &Ident,
    shadow: &Ident,
) -> Result<(Positions, Positions)> {
    let read = |schema: &Ident| {
        format!(
            "SELECT topic, partition, next_offset FROM {schema}.projectionist_checkpoints \
             WHERE projection = $1 AND topic = ANY($2)"
        )
    };
    let mut both: BTreeMap<(String, i32), (Option<i64>, Option<i64>)> = BTreeMap::new();
    for (side, schema) in [(0, shadow), (1, engine)] {
        let rows: Vec<(String, i32, i64)> =
            sqlx::query_as(&read(schema)).bind(projection).bind(topics).fetch_all(&mut *conn).await?;
        for (topic, partition, next) in rows {
            let entry = both.entry((topic, partition)).or_default();
            if side == 0 {
                entry.0 = Some(next);
            } else {
                entry.1 = Some(next);
            }
        }
    }
    let (mut behind, mut ahead) = (Vec::new(), Vec::new());
    for ((topic, partition), (shadow, live)) in both {
        // No checkpoint is offset zero: nothing read yet.
        let (s, l) = (shadow.unwrap_or(0), live.unwrap_or(0));
        if s < l {
            behind.push((topic, partition, shadow, live));
        } else if s > l {
            ahead.push((topic, partition, shadow, live));
        }
    }
    Ok((behind, ahead))
}

/// The rows of `live` and `rebuilt` (a table or a subquery, `$1` bound to `projection`
/// when given) that differ, matched by `keys`, or as whole rows without keys.
async fn compare(
    conn: &mut PgConnection,
    table: &str,
    live: &str,
    rebuilt: &str,
    keys: &[&str],
    projection: Option<&str>,
) -> Result<Option<Difference>> {
    let differing = if keys.is_empty() {
        format!(
            "WITH l AS (SELECT to_jsonb(t) AS r FROM {live} t), s AS (SELECT to_jsonb(t) AS r FROM {rebuilt} t), \
             d AS ((SELECT 'null'::jsonb AS key, r AS live, NULL::jsonb AS rebuilt FROM \
             (SELECT r FROM l EXCEPT ALL SELECT r FROM s) o) \
             UNION ALL (SELECT 'null'::jsonb, NULL, r FROM (SELECT r FROM s EXCEPT ALL SELECT r FROM l) o))"
        )
    } else {
        let key = keys.iter().map(|k| Ident::new(k)).collect::<std::result::Result<Vec<_>, _>>()?;
        let on = key.iter().map(|k| format!("l.{k} = s.{k}")).collect::<Vec<_>>().join(" AND ");
        let pick = key.iter().map(|k| format!("to_jsonb(coalesce(l.{k}, s.{k}))")).collect::<Vec<_>>().join(", ");
        format!(
            "WITH d AS (SELECT jsonb_build_array({pick}) AS key, to_jsonb(l) AS live, to_jsonb(s) AS rebuilt \
             FROM {live} l FULL JOIN {rebuilt} s ON {on} WHERE to_jsonb(l) IS DISTINCT FROM to_jsonb(s))"
        )
    };
    let sql = format!(
        "{differing} SELECT count(*) FILTER (WHERE rebuilt IS NULL), count(*) FILTER (WHERE live IS NULL), \
         count(*) FILTER (WHERE live IS NOT NULL AND rebuilt IS NOT NULL), \
         (SELECT coalesce(jsonb_agg(jsonb_build_array(key, live, rebuilt)), '[]') FROM \
         (SELECT * FROM d ORDER BY key, live::text, rebuilt::text LIMIT {FIRST_DIFFERENCES}) f) FROM d"
    );
    let mut query = sqlx::query_as::<_, (i64, i64, i64, Value)>(&sql);
    if let Some(projection) = projection {
        query = query.bind(projection);
    }
    let (only_live, only_rebuilt, changed, first) = query.fetch_one(&mut *conn).await?;
    if only_live + only_rebuilt + changed == 0 {
        return Ok(None);
    }
    let first =
        first.as_array().into_iter().flatten().map(|row| (row[0].clone(), row[1].clone(), row[2].clone())).collect();
    Ok(Some(Difference { table: table.to_owned(), only_live, only_rebuilt, changed, first }))
}
