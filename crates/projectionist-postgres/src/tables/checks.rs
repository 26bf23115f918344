//! What PostgreSQL checks of a projection's tables beyond what their declarations say, read
//! from the catalog: the set-based writer coalesces a row's writes only where no state it
//! skips could have been refused, so that a batch ends as one event at a time would.

use projectionist_core::Table;
use sqlx::PgConnection;

use crate::error::Result;
use crate::tables::ident::Ident;
use crate::tables::types::required_columns;

/// The tables of a projection that PostgreSQL checks beyond their declared columns' types,
/// by how a run that writes them must go so that every check meets the states it would meet
/// one event at a time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checks {
    /// Each row state is checked on its own — a CHECK constraint, a domain-typed column, a
    /// generated column, a NOT NULL column with no default that its declaration does not
    /// name as such: a run that writes a row of such a table twice is written in rounds
    /// (each row once per round).
    pub rounds: Vec<Table>,
    /// A row is checked against other rows — a unique index besides the key, an exclusion
    /// constraint, a foreign key from or to it: whether a write is refused depends on the
    /// order of writes across rows, so a run that writes such a table goes event by event.
    pub ordered: Vec<Table>,
}

impl Checks {
    /// Nothing beyond the declarations: every write may be coalesced (and folded).
    pub fn is_empty(&self) -> bool {
        self.rounds.is_empty() && self.ordered.is_empty()
    }

    /// Whether rows of `table` are checked state by state (see [`Checks::rounds`]).
    pub fn in_rounds(&self, table: &Table) -> bool {
        self.rounds.iter().chain(&self.ordered).any(|t| t.same(table))
    }

    /// Whether writes to `table` go event by event (see [`Checks::ordered`]).
    pub fn is_ordered(&self, table: &Table) -> bool {
        self.ordered.iter().any(|t| t.same(table))
    }
}

/// Reads from the catalog what PostgreSQL checks of `tables` (as the connection's
/// `search_path` finds them).
pub(crate) async fn read(conn: &mut PgConnection, tables: &[Table]) -> Result<Checks> {
    let names = tables.iter().map(|t| Ident::new(t.name()).map(|i| i.to_string())).collect::<Result<Vec<_>>>()?;
    let found: Vec<(i64, bool, bool, Vec<String>)> = sqlx::query_as(
        "SELECT i, \
           EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conrelid = r.oid AND c.contype = 'c') \
           OR EXISTS (SELECT 1 FROM pg_attribute a JOIN pg_type ty ON ty.oid = a.atttypid \
                      WHERE a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped \
                      AND (ty.typtype = 'd' OR a.attgenerated <> '')), \
           EXISTS (SELECT 1 FROM pg_index x WHERE x.indrelid = r.oid AND x.indisunique AND NOT x.indisprimary) \
           OR EXISTS (SELECT 1 FROM pg_constraint c WHERE (c.conrelid = r.oid AND c.contype IN ('x', 'f')) \
                      OR (c.confrelid = r.oid AND c.contype = 'f')), \
           ARRAY(SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = r.oid AND a.attnum > 0 \
                 AND NOT a.attisdropped AND a.attnotnull AND NOT a.atthasdef AND a.attidentity = '' \
                 AND a.attgenerated = '') \
         FROM unnest($1::text[]) WITH ORDINALITY AS n(name, i) JOIN pg_class r ON r.oid = n.name::regclass",
    )
    .bind(&names)
    .fetch_all(&mut *conn)
    .await?;
    let mut checks = Checks::default();
    for (i, each_row, across_rows, not_null) in found {
        let table = tables[i as usize - 1];
        if table.gate() == projectionist_core::Gate::Custom {
            continue;
        }
        // A NOT NULL column without a default that the declarations name as such is seen by
        // the planner; the key (a child table: both keys) and the version are always written.
        let declared = required_columns(&table);
        let engine = [table.key(), table.version(), table.child_key()];
        let unseen = not_null.iter().any(|c| !engine.contains(&c.as_str()) && !declared.contains(&c.as_str()));
        if across_rows {
            checks.ordered.push(table);
        } else if each_row || unseen {
            checks.rounds.push(table);
        }
    }
    Ok(checks)
}
