//! The version gate: every read-model write keyed by aggregate ID + version, so
//! duplicates, replays and stale redeliveries are no-ops without a dedup table.
//!
//! Three shapes, pick by how the event relates to the row:
//!
//! * [`Upsert`] — **state transfer**: the event carries the row's full state. Applied when
//!   the incoming version is newer than the stored one (`ON CONFLICT … WHERE t.version <
//!   EXCLUDED.version`); versions may be skipped.
//! * [`Transition`] — **guarded transition**: the event changes the row relative to its
//!   current state (`balance = balance + $amount`, `status = 'shipped'`). Applied only when
//!   the stored version is exactly `version - 1`; version 1 inserts the row.
//! * [`watermark`] — **fan-in**: the rows written are not 1:1 with aggregates (totals per
//!   customer fed by many orders). A per-projection, per-aggregate watermark row is advanced
//!   by a guarded transition in the same transaction and gates every write of the event.
//!
//! When a write changes no row, the gate reads the stored version in the same transaction
//! and classifies the event as [`Outcome::Duplicate`], [`Outcome::Stale`] or
//! [`Outcome::Gap`]. Two transactions applying the same event at once: the second waits on
//! the first's row lock, then finds the version already moved and reports `Duplicate`.
//!
//! ## Why the watermark is not a dedup table
//! A processed-messages table grows by one row per message forever (or needs a TTL that
//! silently reopens the window for duplicates). The watermark holds one row per aggregate —
//! the aggregate's last applied version, exactly what a 1:1 read-model row's `version`
//! column holds — and it also rejects out-of-order events, which an id table cannot.
//! Use it only where no row of your own carries the aggregate's version.

use projectionist_core::{Envelope, Outcome};
use sqlx::postgres::PgArguments;
use sqlx::{Arguments, Encode, PgConnection, Postgres, Type};

use crate::{Error, Ident, Result};

/// A read-model table whose rows are keyed by aggregate ID (a `text` column) and carry the
/// aggregate's last applied version (a `bigint` column, `version` unless configured).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    name: Ident,
    key: Ident,
    version: Ident,
}

impl Table {
    /// A table keyed by `key`, with its version in column `version`.
    pub fn new(name: &str, key: &str) -> Result<Self> {
        Ok(Self { name: Ident::new(name)?, key: Ident::new(key)?, version: Ident::new("version")? })
    }

    /// Uses another column for the version.
    pub fn with_version_column(mut self, column: &str) -> Result<Self> {
        self.version = Ident::new(column)?;
        Ok(self)
    }

    /// The table name.
    pub fn name(&self) -> &Ident {
        &self.name
    }

    /// A state-transfer upsert of the event's aggregate row.
    pub fn upsert<'q, E>(&'q self, event: &Envelope<E>) -> Upsert<'q> {
        Upsert(Write::new(self, &event.aggregate_id, event.version))
    }

    /// A guarded transition of the event's aggregate row.
    pub fn transition<'q, E>(&'q self, event: &Envelope<E>) -> Transition<'q> {
        Transition(Write::new(self, &event.aggregate_id, event.version))
    }

    /// The version stored for `key`, read in the caller's transaction.
    pub async fn stored_version(&self, conn: &mut PgConnection, key: &str) -> Result<Option<i64>> {
        let sql = format!("SELECT {v} FROM {t} WHERE {k} = $1", v = self.version, t = self.name, k = self.key);
        Ok(sqlx::query_scalar(&sql).bind(key).fetch_optional(conn).await?)
    }
}

#[derive(Clone, Copy)]
enum Op {
    Set,
    Add,
}

struct Write<'q> {
    table: &'q Table,
    key: String,
    version: i64,
    columns: Vec<(Ident, Op)>,
    args: PgArguments,
    error: Option<Error>,
}

impl<'q> Write<'q> {
    fn new(table: &'q Table, key: &str, version: i64) -> Self {
        let mut args = PgArguments::default();
        let mut error = None;
        if let Err(e) = args.add(key.to_owned()).and_then(|()| args.add(version)) {
            error = Some(Error::Bind { column: table.key.as_str().into(), reason: e.to_string() });
        }
        Self { table, key: key.to_owned(), version, columns: Vec::new(), args, error }
    }

    fn push<T>(&mut self, column: &str, op: Op, value: T)
    where
        T: 'q + Encode<'q, Postgres> + Type<Postgres>,
    {
        if self.error.is_some() {
            return;
        }
        match Ident::new(column) {
            Err(e) => self.error = Some(e),
            Ok(ident) => match self.args.add(value) {
                Ok(()) => self.columns.push((ident, op)),
                Err(e) => self.error = Some(Error::Bind { column: column.into(), reason: e.to_string() }),
            },
        }
    }

    /// `INSERT (key, cols…, version) VALUES ($1, $3…, $2)`.
    fn insert_sql(&self) -> String {
        let t = self.table;
        let mut cols = vec![t.key.to_string()];
        let mut vals = vec!["$1".to_owned()];
        for (i, (c, _)) in self.columns.iter().enumerate() {
            cols.push(c.to_string());
            vals.push(format!("${}", i + 3));
        }
        cols.push(t.version.to_string());
        vals.push("$2".into());
        format!("INSERT INTO {} AS t ({}) VALUES ({})", t.name, cols.join(", "), vals.join(", "))
    }

    /// Runs `write` and reads the stored version in one round trip; a second read, with a
    /// fresh snapshot, only when the first cannot classify (another transaction moved the
    /// row while this one waited on its lock).
    async fn run(
        self,
        conn: &mut PgConnection,
        write: String,
        classify: fn(Option<i64>, i64) -> Option<Outcome>,
    ) -> Result<Outcome> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let t = self.table;
        let sql = format!(
            "WITH w AS ({write} RETURNING 1) SELECT (SELECT count(*) FROM w), (SELECT {v} FROM {n} WHERE {k} = $1)",
            v = t.version,
            n = t.name,
            k = t.key
        );
        let (changed, before): (i64, Option<i64>) = sqlx::query_as_with(&sql, self.args).fetch_one(&mut *conn).await?;
        if changed > 0 {
            return Ok(Outcome::Applied);
        }
        if let Some(outcome) = classify(before, self.version) {
            return Ok(outcome);
        }
        let stored = t.stored_version(conn, &self.key).await?;
        classify(stored, self.version).ok_or_else(|| Error::Race {
            table: t.name.as_str().into(),
            key: self.key,
            version: self.version,
        })
    }
}

/// A state-transfer upsert: see the [module docs](self). Build with [`Table::upsert`].
#[must_use = "the write happens in `execute`"]
pub struct Upsert<'q>(Write<'q>);

impl<'q> Upsert<'q> {
    /// Sets `column` to `value`.
    pub fn set<T>(mut self, column: &str, value: T) -> Self
    where
        T: 'q + Encode<'q, Postgres> + Type<Postgres>,
    {
        self.0.push(column, Op::Set, value);
        self
    }

    /// Runs the upsert in the caller's transaction.
    pub async fn execute(self, conn: &mut PgConnection) -> Result<Outcome> {
        let w = &self.0;
        let mut sets: Vec<String> = w.columns.iter().map(|(c, _)| format!("{c} = EXCLUDED.{c}")).collect();
        sets.push(format!("{v} = EXCLUDED.{v}", v = w.table.version));
        let sql = format!(
            "{} ON CONFLICT ({k}) DO UPDATE SET {} WHERE t.{v} < EXCLUDED.{v}",
            w.insert_sql(),
            sets.join(", "),
            k = w.table.key,
            v = w.table.version,
        );
        self.0.run(conn, sql, Outcome::of_failed_upsert).await
    }
}

/// A guarded transition: see the [module docs](self). Build with [`Table::transition`].
///
/// Version 1 inserts the row (columns set to the values given, increments starting from
/// them); later versions update it only when it stands at exactly `version - 1`.
#[must_use = "the write happens in `execute`"]
pub struct Transition<'q>(Write<'q>);

impl<'q> Transition<'q> {
    /// Sets `column` to `value`.
    pub fn set<T>(mut self, column: &str, value: T) -> Self
    where
        T: 'q + Encode<'q, Postgres> + Type<Postgres>,
    {
        self.0.push(column, Op::Set, value);
        self
    }

    /// Adds `value` to `column` (`column = column + value`); on creation, sets it.
    pub fn add<T>(mut self, column: &str, value: T) -> Self
    where
        T: 'q + Encode<'q, Postgres> + Type<Postgres>,
    {
        self.0.push(column, Op::Add, value);
        self
    }

    /// Runs the transition in the caller's transaction.
    pub async fn execute(self, conn: &mut PgConnection) -> Result<Outcome> {
        let w = &self.0;
        let t = w.table;
        let sql = if w.version == 1 {
            format!("{} ON CONFLICT ({}) DO NOTHING", w.insert_sql(), t.key)
        } else {
            let mut sets: Vec<String> = w
                .columns
                .iter()
                .enumerate()
                .map(|(i, (c, op))| match op {
                    Op::Set => format!("{c} = ${}", i + 3),
                    Op::Add => format!("{c} = t.{c} + ${}", i + 3),
                })
                .collect();
            sets.push(format!("{} = $2", t.version));
            format!(
                "UPDATE {} AS t SET {} WHERE t.{} = $1 AND t.{v} = $2 - 1",
                t.name,
                sets.join(", "),
                t.key,
                v = t.version
            )
        };
        self.0.run(conn, sql, Outcome::of_failed_transition).await
    }
}

/// Advances the fan-in watermark of `projection` for the event's aggregate by a guarded
/// transition, in the caller's transaction. Perform the event's writes only when this
/// returns [`Outcome::Applied`]; any other outcome means the event must change nothing.
pub async fn watermark<E>(conn: &mut PgConnection, projection: &str, event: &Envelope<E>) -> Result<Outcome> {
    const STORED: &str = "SELECT version FROM projectionist_watermarks WHERE projection = $1 AND aggregate_type = $2 AND aggregate_id = $3";
    let write = if event.version == 1 {
        "INSERT INTO projectionist_watermarks (projection, aggregate_type, aggregate_id, version) \
         VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING"
    } else {
        "UPDATE projectionist_watermarks SET version = $4 \
         WHERE projection = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND version = $4 - 1"
    };
    // One round trip: the write and the version it found (see `Write::run`).
    let sql = format!("WITH w AS ({write} RETURNING 1) SELECT (SELECT count(*) FROM w), ({STORED})");
    let (changed, before): (i64, Option<i64>) = sqlx::query_as(&sql)
        .bind(projection)
        .bind(&event.aggregate_type)
        .bind(&event.aggregate_id)
        .bind(event.version)
        .fetch_one(&mut *conn)
        .await?;
    if changed > 0 {
        return Ok(Outcome::Applied);
    }
    if let Some(outcome) = Outcome::of_failed_transition(before, event.version) {
        return Ok(outcome);
    }
    let stored: Option<i64> = sqlx::query_scalar(STORED)
        .bind(projection)
        .bind(&event.aggregate_type)
        .bind(&event.aggregate_id)
        .fetch_optional(&mut *conn)
        .await?;
    Outcome::of_failed_transition(stored, event.version).ok_or_else(|| Error::Race {
        table: "projectionist_watermarks".into(),
        key: event.aggregate_id.clone(),
        version: event.version,
    })
}
