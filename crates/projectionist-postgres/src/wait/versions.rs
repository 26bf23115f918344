//! The waits for an aggregate's version: per projection, one query reads the versions of
//! every aggregate waited on whenever the projection may have moved.

use std::collections::HashMap;
use std::sync::Arc;

use sqlx::PgPool;
use tokio::sync::oneshot;

use crate::error::Result;
use crate::projection::PgProjection;
use crate::tables::ident::Ident;

/// A projection's version waits: whenever it may have moved, one query reads the versions
/// of every aggregate waited on (not one per wait), and wakes the waits they reach.
pub(super) struct Watched {
    pub(super) query: Arc<VersionQuery>,
    /// Per aggregate (type, id): the version each wait wants.
    pub(super) waits: HashMap<(String, String), Vec<VersionWait>>,
    /// A read is under way; `again`: the projection may have moved since it began.
    pub(super) reading: bool,
    pub(super) again: bool,
}

impl Watched {
    /// Wakes the waits of `aggregate` that `version` reaches.
    pub(super) fn reached(&mut self, aggregate: &(String, String), version: i64) {
        let Some(waits) = self.waits.remove(aggregate) else { return };
        let (done, left): (Vec<_>, Vec<_>) = waits.into_iter().partition(|(wanted, _)| version >= *wanted);
        for (_, wait) in done {
            let _ = wait.send(version);
        }
        if !left.is_empty() {
            self.waits.insert(aggregate.clone(), left);
        }
    }

    /// Forgets the waits that gave up; whether any are left.
    pub(super) fn prune(&mut self) -> bool {
        self.waits.retain(|_, waits| {
            waits.retain(|(_, w)| !w.is_closed());
            !waits.is_empty()
        });
        !self.waits.is_empty()
    }
}

/// A wait for a version: the version wanted, and whom to wake with the version reached.
pub(super) type VersionWait = (i64, oneshot::Sender<i64>);

/// Reads the versions of aggregates of one projection: per aggregate, the highest of its
/// aggregate version and its rows' versions in the projection's gated tables owning its type.
pub(super) struct VersionQuery {
    sql: String,
    /// Per gated table, the aggregate types it owns (parameters `$4`, `$5`, …).
    owners: Vec<Vec<String>>,
}

impl VersionQuery {
    pub(super) fn of(projection: &dyn PgProjection) -> Result<Self> {
        let mut gates = vec![
            "SELECT version FROM projectionist_aggregate_versions WHERE projection = $1 AND aggregate_type = w.t \
             AND aggregate_id = w.i"
                .to_owned(),
        ];
        let mut owners = Vec::new();
        for table in projection.tables().iter().filter(|t| t.is_gated()) {
            let (name, key, version) =
                (Ident::new(table.name())?, Ident::new(table.key())?, Ident::new(table.version())?);
            owners.push(table.aggregate_types_declared().iter().map(|t| (*t).to_owned()).collect());
            let owned = owners.len() + 3;
            gates.push(format!("SELECT {version} FROM {name} WHERE {key} = w.i AND w.t = ANY(${owned}::text[])"));
        }
        let sql = format!(
            "SELECT w.t, w.i, (SELECT max(v) FROM ({}) AS gates(v)) FROM unnest($2::text[], $3::text[]) AS w(t, i)",
            gates.join(" UNION ALL ")
        );
        Ok(Self { sql, owners })
    }

    /// The versions `aggregates` stand at (`None`: no row of it yet).
    pub(super) async fn read(
        &self,
        pool: &PgPool,
        projection: &str,
        aggregates: &[(String, String)],
    ) -> Result<Vec<((String, String), Option<i64>)>> {
        let (types, ids): (Vec<&str>, Vec<&str>) = aggregates.iter().map(|(t, i)| (t.as_str(), i.as_str())).unzip();
        let mut query =
            sqlx::query_as::<_, (String, String, Option<i64>)>(&self.sql).bind(projection).bind(types).bind(ids);
        for owners in &self.owners {
            query = query.bind(owners);
        }
        let found = query.fetch_all(pool).await?;
        Ok(found.into_iter().map(|(t, i, v)| ((t, i), v)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_read_wakes_the_waits_it_reaches_and_keeps_the_rest() {
        let query = Arc::new(VersionQuery { sql: String::new(), owners: Vec::new() });
        let mut watched = Watched { query, waits: HashMap::new(), reading: false, again: false };
        let a = ("account".to_owned(), "a".to_owned());
        let mut woken = Vec::new();
        for wanted in [1, 3, 5] {
            let (wake, rx) = oneshot::channel();
            watched.waits.entry(a.clone()).or_default().push((wanted, wake));
            woken.push(rx);
        }
        watched.reached(&a, 3);
        let answers: Vec<Option<i64>> = woken.iter_mut().map(|rx| rx.try_recv().ok()).collect();
        assert_eq!(answers, [Some(3), Some(3), None]);
        assert!(watched.prune(), "the wait for 5 is left");
        drop(woken);
        assert!(!watched.prune(), "a wait that gave up is forgotten");
    }
}
