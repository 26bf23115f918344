//! Locks of the rows several partitions write at once: fan-in rows, the only rows that
//! events of different aggregates write (a customer's totals, fed by orders on every
//! partition).

use projectionist_core::plan::Effect;
use projectionist_core::Gate;
use sqlx::PgConnection;

use crate::error::Result;

/// The locks of the fan-in rows a batch's events write, taken in one order right before
/// its first fan-in write: two transactions that write shared rows in different orders (in
/// rounds, one event at a time, one creating a row that the other merges into) deadlock,
/// again on every retry. A transaction-level advisory lock per row (its table and key,
/// hashed), all taken at once in ascending order by every writer, has them wait for each
/// other instead. Taken as late as that (after the batch's reads and its own aggregates'
/// rows), partitions sharing fan-in rows take turns only for their fan-in statements and
/// commit, not for the whole batch.
#[derive(Debug, Default)]
pub(crate) struct SharedRows {
    /// (high, low) halves of each row's hash, sorted, once each.
    locks: Vec<(i32, i32)>,
}

impl SharedRows {
    /// The locks of the fan-in rows the events of `effects` write (none: no statement).
    pub(crate) fn of<'a>(effects: impl IntoIterator<Item = Effect<'a>>) -> Self {
        let mut locks: Vec<(i32, i32)> = effects
            .into_iter()
            .filter_map(|effect| match effect {
                Effect::Writes(writes) => Some(writes.iter()),
                _ => None,
            })
            .flatten()
            .filter(|w| w.table().gate() == Gate::FanIn)
            .map(|w| row_lock(w.table().name(), w.target().keys()))
            .collect();
        locks.sort_unstable();
        locks.dedup();
        Self { locks }
    }

    /// The locks of fan-in rows given by table and keys.
    pub(crate) fn of_rows<'a>(rows: impl IntoIterator<Item = (&'a str, (&'a str, Option<&'a str>))>) -> Self {
        let mut locks: Vec<(i32, i32)> = rows.into_iter().map(|(table, keys)| row_lock(table, keys)).collect();
        locks.sort_unstable();
        locks.dedup();
        Self { locks }
    }

    /// These and `other`'s, in one order.
    pub(crate) fn with(&self, other: SharedRows) -> Self {
        let mut locks = [self.locks.as_slice(), other.locks.as_slice()].concat();
        locks.sort_unstable();
        locks.dedup();
        Self { locks }
    }

    /// Takes every lock, in ascending order; called before each run's fan-in writes. Locks
    /// the transaction already holds are taken again at no wait; those a rolled-back
    /// savepoint released are taken again, in the same order.
    pub(crate) async fn lock(&self, conn: &mut PgConnection) -> Result<()> {
        if self.locks.is_empty() {
            return Ok(());
        }
        let (high, low): (Vec<i32>, Vec<i32>) = self.locks.iter().copied().unzip();
        // Taken in the arrays' order: a scan of `unnest`, one row after the other.
        sqlx::query("SELECT count(pg_advisory_xact_lock(h, l)) FROM unnest($1::int4[], $2::int4[]) AS k(h, l)")
            .bind(high)
            .bind(low)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }
}

/// The advisory lock of a fan-in row: the two halves of a 64-bit FNV-1a hash of its table
/// and keys, the same in every process (two-key advisory locks are a space of their own,
/// apart from the one-key locks of a rebuild's swap).
fn row_lock(table: &str, (key, second): (&str, Option<&str>)) -> (i32, i32) {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in [table, key, second.unwrap_or("")] {
        for b in part.bytes().chain([0x1f]) {
            hash = (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    ((hash >> 32) as u32 as i32, hash as u32 as i32)
}

#[cfg(test)]
mod tests {
    use super::row_lock;

    #[test]
    fn a_fan_in_rows_lock_is_the_same_in_every_process_and_tells_keys_apart() {
        // FNV-1a, no per-process seed: two processes lock the same row under the same key.
        assert_eq!(row_lock("customer_order_stats", ("cust-1", Some(""))), (-1_299_604_374, -1_528_301_516));
        assert_ne!(row_lock("t", ("a", Some("bc"))), row_lock("t", ("ab", Some("c"))));
        assert_ne!(row_lock("t", ("a", Some(""))), row_lock("u", ("a", Some(""))));
    }
}
