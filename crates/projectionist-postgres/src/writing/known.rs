//! The versions a live partition's batches left in its gated tables, remembered so that its
//! next batch need not read them back (as Propulsion keeps each stream's written position).
//!
//! What is remembered is only ever what this process committed, for the table it committed
//! it to: each batch still asks PostgreSQL, in the statement that reads the versions it does
//! not know, which file the table is (`pg_relation_filenode`), and forgets the table when
//! that changed (a rebuild's swap or rollback renames tables, `TRUNCATE` gives a new file).
//! A version that is behind the table (another writer moved the row on) is harmless: the
//! write built on it changes no row, its count says so, and the batch falls back to the
//! per-event path, which reads and locks every row and forgets what was remembered. A gap
//! planned against what is remembered (an operator's discard, retry or skip moved the row on
//! in a transaction of its own) forgets the waiting aggregates' versions and is planned again. What
//! the per-event path, a projection's own `apply` or a failed transaction wrote is never
//! taken in. What is not caught: a row deleted or moved back behind the engine's back
//! (an operator's `DELETE`) is taken to stand where this process left it until the
//! partition is assigned again.

use std::collections::HashMap;
use std::sync::Mutex;

use projectionist_core::plan::{RowKind, RowWrite};

/// How many keys a table keeps per generation: a full generation becomes the old one (the
/// one before it dropped), so a table keeps between this many and twice as many keys.
const GENERATION: usize = 32_768;

type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// The versions one partition's batches wrote (see the module's documentation). One per
/// partition assignment, used by one batch at a time.
#[derive(Debug, Default)]
pub struct KnownVersions(Mutex<Inner>);

#[derive(Debug, Default)]
struct Inner {
    /// Per gated table: what committed batches left there, and what the open transaction
    /// wrote (all of it forgotten unless that commits).
    tables: Map<&'static str, Known>,
    /// A transaction is open: what it wrote is in `tables`, to be forgotten unless it
    /// commits (also where its end was never told: a batch dropped mid-way).
    open: bool,
    /// Nothing is looked up or taken in for the rest of the transaction (it went per event).
    off: bool,
}

/// One table's versions, in two generations, as of its file `filenode`.
#[derive(Debug, Default)]
struct Known {
    filenode: Option<i64>,
    young: Map<Key, i64>,
    old: Map<Key, i64>,
}

impl Known {
    fn get(&self, key: &str) -> Option<i64> {
        let key = key.as_bytes();
        self.young.get(key).or_else(|| self.old.get(key)).copied()
    }

    /// Sets `key`'s version (`None`: unknown). A key already young is set in place; one
    /// that is old moves.
    fn set(&mut self, key: &str, version: Option<i64>) {
        let key = key.as_bytes();
        let Some(version) = version else {
            self.young.remove(key);
            self.old.remove(key);
            return;
        };
        if let Some(young) = self.young.get_mut(key) {
            *young = version;
            return;
        }
        let key = self.old.remove_entry(key).map_or_else(|| Key::new(key), |(key, _)| key);
        if self.young.len() >= GENERATION {
            self.old = std::mem::take(&mut self.young);
        }
        self.young.insert(key, version);
    }
}

/// A key as the known versions keep it: one of up to [`Key::INLINE`] bytes (most aggregate
/// ids) in the map's own slot, so that a lookup reads the slot and not another allocation
/// too; a longer one boxed. Hashed and compared as its bytes (looked up by `&[u8]`).
#[derive(Debug, Clone)]
enum Key {
    Inline(u8, [u8; Key::INLINE]),
    Boxed(Box<[u8]>),
}

impl Key {
    const INLINE: usize = 22;

    fn new(key: &[u8]) -> Self {
        if key.len() <= Self::INLINE {
            let mut bytes = [0; Self::INLINE];
            bytes[..key.len()].copy_from_slice(key);
            Key::Inline(key.len() as u8, bytes)
        } else {
            Key::Boxed(key.into())
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Key::Inline(len, bytes) => &bytes[..usize::from(*len)],
            Key::Boxed(bytes) => bytes,
        }
    }
}

impl std::borrow::Borrow<[u8]> for Key {
    fn borrow(&self) -> &[u8] {
        self.bytes()
    }
}

impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.bytes().hash(state);
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.bytes() == other.bytes()
    }
}

impl Eq for Key {}

/// What a lookup found: versions known (from the table at `filenode`), and the keys to read.
pub(crate) struct Lookup<'k> {
    pub known: Vec<(&'k str, i64)>,
    pub unknown: Vec<&'k str>,
}

impl KnownVersions {
    /// Nothing known yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A transaction begins. Where the last one's end was never told (its batch dropped
    /// mid-way), what it wrote may not have committed: everything is forgotten.
    pub(crate) fn begin(&self) {
        let mut inner = self.inner();
        if inner.open {
            inner.tables.clear();
        }
        inner.open = true;
        inner.off = false;
    }

    /// The transaction committed: what it wrote stays known.
    pub(crate) fn committed(&self) {
        self.inner().open = false;
    }

    /// Everything forgotten: the transaction failed.
    pub(crate) fn forget(&self) {
        let mut inner = self.inner();
        inner.tables.clear();
        inner.open = false;
    }

    /// The versions of `keys` forgotten in every table, the transaction going on: what is
    /// remembered of them may be behind a row changed outside the partition (an operator's
    /// command), and a gap planned against it is to be planned again against the table.
    /// Whether any of them was remembered (else the plan was against the table already).
    pub(crate) fn distrust(&self, keys: Vec<&str>) -> bool {
        let mut inner = self.inner();
        let mut forgot = false;
        for known in inner.tables.values_mut() {
            for key in &keys {
                forgot |= known.get(key).is_some();
                known.set(key, None);
            }
        }
        forgot
    }

    /// Everything forgotten, and nothing looked up or taken in until the next transaction
    /// (it goes event by event, or through a projection's own `apply`).
    pub(crate) fn off(&self) {
        let mut inner = self.inner();
        inner.tables.clear();
        inner.off = true;
    }

    /// Splits `keys` of `table` (as a batch's events hold them: a key may come more than
    /// once) into those whose version is known (written by this transaction, or by committed
    /// ones) and those to read.
    pub(crate) fn lookup<'k>(&self, table: &'static str, keys: Vec<&'k str>) -> Lookup<'k> {
        let inner = self.inner();
        let Some(known) = inner.tables.get(table).filter(|_| !inner.off) else {
            return Lookup { known: Vec::new(), unknown: keys };
        };
        let mut lookup = Lookup { known: Vec::with_capacity(keys.len()), unknown: Vec::new() };
        for key in keys {
            match known.get(key) {
                Some(v) => lookup.known.push((key, v)),
                None => lookup.unknown.push(key),
            }
        }
        lookup
    }

    /// Whether what is known of `table` is of its file `filenode` (read in the batch's
    /// transaction, under the swap lock). Where it is not, the table's versions are
    /// forgotten (this transaction's own writes with them: they are read again).
    /// A table without a file of its own (`None`: a partitioned table) is never known.
    pub(crate) fn same_file(&self, table: &'static str, filenode: Option<i64>) -> bool {
        let mut inner = self.inner();
        let known = inner.tables.entry(table).or_default();
        if filenode.is_some() && known.filenode == filenode {
            return true;
        }
        *known = Known { filenode, ..Known::default() };
        false
    }

    /// Takes in what a set-based run wrote to gated tables: a row's new version, or (a
    /// delete, a check before one) that it is unknown.
    pub(crate) fn wrote(&self, rows: &[RowWrite<'_>]) {
        let mut inner = self.inner();
        if inner.off {
            return;
        }
        let gated = rows.iter().filter(|r| r.table.is_gated() && r.child.is_none());
        // A plan's rows come table by table: each table's versions looked up once per run
        // (told apart by their names' address: at worst a run split in two, looked up twice).
        let same_table = |a: &&RowWrite<'_>, b: &&RowWrite<'_>| std::ptr::eq(a.table.name(), b.table.name());
        for run in gated.collect::<Vec<_>>().chunk_by(same_table) {
            let known = inner.tables.entry(run[0].table.name()).or_default();
            for row in run {
                let version = match row.kind {
                    RowKind::Insert | RowKind::Update => row.version,
                    _ => None,
                };
                known.set(row.key, version);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_generation_becomes_the_old_one() {
        let mut known = Known::default();
        for n in 0..GENERATION + 1 {
            known.set(&n.to_string(), Some(n as i64));
        }
        assert_eq!(known.get("0"), Some(0), "the first generation is still there, as the old one");
        assert_eq!(known.get(&GENERATION.to_string()), Some(GENERATION as i64));
        assert_eq!(known.young.len(), 1);
        known.set("1", Some(7));
        let moved = (known.get("1"), known.young.len(), known.old.contains_key("1".as_bytes()));
        assert_eq!(moved, (Some(7), 2, false), "moved");
        known.set("0", None);
        assert_eq!(known.get("0"), None, "a key set unknown is gone from both generations");
    }

    #[test]
    fn keys_in_place_and_boxed_are_found_as_set() {
        let mut known = Known::default();
        let (edge, long) = ("e".repeat(Key::INLINE), "l".repeat(Key::INLINE + 1));
        let keys = ["", "a", "é✓", edge.as_str(), long.as_str()];
        for (v, key) in keys.iter().enumerate() {
            known.set(key, Some(v as i64));
        }
        let found: Vec<_> = keys.iter().map(|k| known.get(k)).collect();
        assert_eq!(found, vec![Some(0), Some(1), Some(2), Some(3), Some(4)]);
        assert!(matches!(known.young.keys().find(|k| k.bytes() == long.as_bytes()), Some(Key::Boxed(_))));
        let near = ["e".repeat(Key::INLINE - 1), "l".repeat(Key::INLINE), "a\0".to_owned()];
        assert!(near.iter().all(|k| known.get(k).is_none()), "a prefix or a padded key is another key");
    }

    /// As a set-based run's write of `key` in `table` at `version` takes it in.
    fn wrote(known: &KnownVersions, key: &str, version: i64) {
        known.inner().tables.entry("t").or_default().set(key, Some(version));
    }

    #[test]
    fn only_what_commits_is_known_and_a_new_file_forgets() {
        let known = KnownVersions::new();
        known.begin();
        assert!(!known.same_file("t", Some(7)), "the table's file was never read");
        wrote(&known, "a", 3);
        assert_eq!(known.lookup("t", vec!["a"]).known, vec![("a", 3)], "this transaction's own write");
        known.forget();
        assert_eq!(known.lookup("t", vec!["a"]).unknown, vec!["a"], "not committed: forgotten");
        known.begin();
        assert!(!known.same_file("t", Some(7)));
        wrote(&known, "a", 4);
        known.committed();
        known.begin();
        assert!(known.same_file("t", Some(7)));
        assert_eq!(known.lookup("t", vec!["a", "b"]).known, vec![("a", 4)]);
        wrote(&known, "a", 5);
        known.begin();
        assert_eq!(known.lookup("t", vec!["a"]).unknown, vec!["a"], "the last end never told: forgotten");
        known.committed();
        known.begin();
        assert!(!known.same_file("t", Some(7)));
        wrote(&known, "a", 5);
        known.committed();
        assert!(!known.same_file("t", Some(8)), "another file: a swap, a truncate");
        assert_eq!(known.lookup("t", vec!["a"]).unknown, vec!["a"]);
        assert!(!known.same_file("t", None) && !known.same_file("t", None), "no file: never known");
        known.begin();
        known.off();
        assert_eq!(known.lookup("t", vec!["a"]).unknown, vec!["a"], "off for the transaction");
    }
}
