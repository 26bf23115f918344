//! Live counters of one projection, readable while it runs: a leaf the runner, its
//! partitions and the outage watch all count into.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use projectionist_core::OutcomeCounts;

use crate::tp::Tp;

/// Live counters of one projection, readable while it runs.
#[derive(Debug, Default)]
pub struct Stats {
    /// Offsets the partitions' checkpoints moved past in this run: events and the
    /// transaction markers between them alike, so it reaches the distance to the high
    /// watermarks exactly (progress against them).
    pub advanced: AtomicU64,
    /// Offsets a rebuild's partitions moved past by folding batches whose rows are not yet
    /// written with their checkpoint (see [`Exclusive::fold`](crate::Exclusive::fold)):
    /// with the checkpoints in PostgreSQL, how far the rebuild has read.
    pub folded: AtomicU64,
    /// Events that changed the read model.
    pub applied: AtomicU64,
    /// Redeliveries of applied versions.
    pub duplicate: AtomicU64,
    /// Versions older than the stored one.
    pub stale: AtomicU64,
    /// Event types the projection does not handle.
    pub ignored: AtomicU64,
    /// Events held behind a parked aggregate.
    pub parked: AtomicU64,
    /// Held events applied (or found duplicate or stale) once their missing version came.
    pub drained: AtomicU64,
    /// Dead letters kept.
    pub dead_letters: AtomicU64,
    /// Events ignored, by type (the projection has no variant for it): at most
    /// [`Stats::MAX_IGNORED_TYPES`] types, any further ones counted as `other`.
    pub ignored_types: Mutex<BTreeMap<String, u64>>,
    /// Batches committed.
    pub batches: AtomicU64,
    /// A batch changed the parking since the parking gauges were last counted: the runner
    /// counts them on its next tick (a count per batch cost PostgreSQL a scan of the held
    /// events each time).
    pub(crate) parking_changed: AtomicBool,
    /// Halted partitions and why.
    pub halts: Mutex<Vec<String>>,
    /// Partitions halted in this process: they stay halted when assigned again.
    pub(crate) halted: Mutex<HashSet<Tp>>,
    /// Waits for PostgreSQL under way: partitions applying a batch and checkpoint reads on
    /// assignment (see [`crate::outage`]).
    pub(crate) waiting: Mutex<usize>,
    /// Waits for the schema registry under way: partitions fetching the schemas of a batch.
    pub(crate) waiting_registry: Mutex<usize>,
    /// What became of the messages each partition read, over all its assignments in this
    /// process.
    partitions: Mutex<BTreeMap<Tp, Arc<Tally>>>,
}

/// What became of the messages one partition read in a process: each read message ends in
/// exactly one of the other counters, so that `read` is their sum ([`Accounting::adds_up`])
/// once nothing is in flight. Held events applied later, when their aggregate resumes, are
/// not counted again here (they were counted `parked` when read).
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub read: AtomicU64,
    pub applied: AtomicU64,
    pub duplicate: AtomicU64,
    pub stale: AtomicU64,
    pub ignored: AtomicU64,
    pub parked: AtomicU64,
    pub dead_lettered: AtomicU64,
    /// Read and then dropped before an outcome: revoked, halted, a checkpoint that moved, a
    /// batch abandoned or that failed. Read again by the partition's next owner or run.
    pub unapplied: AtomicU64,
    /// Events of aggregates a repair does not rebuild, passed over.
    pub other_aggregates: AtomicU64,
}

impl Tally {
    /// The outcomes of a committed batch's own events, and `dead_lettered` messages of it
    /// that are not events at all.
    pub(crate) fn add(&self, c: &OutcomeCounts, not_events: u64) {
        self.applied.fetch_add(c.applied, Ordering::Relaxed);
        self.duplicate.fetch_add(c.duplicate, Ordering::Relaxed);
        self.stale.fetch_add(c.stale, Ordering::Relaxed);
        self.ignored.fetch_add(c.ignored, Ordering::Relaxed);
        self.parked.fetch_add(c.parked, Ordering::Relaxed);
        self.dead_lettered.fetch_add(c.dead_lettered + not_events, Ordering::Relaxed);
    }

    /// `n` messages read and dropped before an outcome.
    pub(crate) fn unapplied(&self, n: usize) {
        self.unapplied.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// `n` messages of other aggregates than a repair's, passed over in a committed batch.
    pub(crate) fn other_aggregates(&self, n: usize) {
        self.other_aggregates.fetch_add(n as u64, Ordering::Relaxed);
    }

    fn snapshot(&self) -> Accounting {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Accounting {
            read: load(&self.read),
            applied: load(&self.applied),
            duplicate: load(&self.duplicate),
            stale: load(&self.stale),
            ignored: load(&self.ignored),
            parked: load(&self.parked),
            dead_lettered: load(&self.dead_lettered),
            unapplied: load(&self.unapplied),
            other_aggregates: load(&self.other_aggregates),
        }
    }
}

/// What became of the messages one partition read in a process, as [`Stats::partitions`]
/// tells it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Accounting {
    /// Messages read from the partition.
    pub read: u64,
    /// Events that changed the read model.
    pub applied: u64,
    /// Redeliveries of applied versions.
    pub duplicate: u64,
    /// Versions older than the stored one.
    pub stale: u64,
    /// Event types the projection does not handle.
    pub ignored: u64,
    /// Events held behind a parked aggregate.
    pub parked: u64,
    /// Messages kept as dead letters.
    pub dead_lettered: u64,
    /// Read, then dropped before an outcome (revoked, halted, stopped, a moved checkpoint):
    /// read again by the partition's next owner or run.
    pub unapplied: u64,
    /// Events of other aggregates than a repair's (`rebuild --aggregate`), passed over.
    pub other_aggregates: u64,
}

impl Accounting {
    /// Whether every message read is counted once: `read` is the sum of the rest.
    pub fn adds_up(&self) -> bool {
        let Self { read, applied, duplicate, stale, ignored, parked, dead_lettered, unapplied, other_aggregates } =
            *self;
        read == applied + duplicate + stale + ignored + parked + dead_lettered + unapplied + other_aggregates
    }
}

impl std::fmt::Display for Accounting {
    /// `read R = applied A + duplicates D + …`, the identity it should satisfy.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self { read, applied, duplicate, stale, ignored, parked, dead_lettered, unapplied, other_aggregates } =
            *self;
        write!(
            f,
            "read {read} = applied {applied} + duplicates {duplicate} + stale {stale} + ignored {ignored} + parked \
             {parked} + dead-lettered {dead_lettered} + not applied {unapplied}"
        )?;
        if other_aggregates > 0 {
            write!(f, " + other aggregates {other_aggregates}")?;
        }
        if !self.adds_up() {
            write!(f, " (does not add up)")?;
        }
        Ok(())
    }
}

impl Stats {
    /// The most event types [`Stats::ignored_types`] (and the metric's `type` label) tell apart.
    pub const MAX_IGNORED_TYPES: usize = 100;

    /// Counts `n` ignored events of `event_type`: the name they are counted under (the type,
    /// or `other` past [`Stats::MAX_IGNORED_TYPES`]), and whether it is new in this run.
    pub(crate) fn ignore(&self, event_type: &str, n: u64) -> (String, bool) {
        let mut types = self.ignored_types.lock().expect("ignored types lock");
        let known = types.contains_key(event_type);
        let name = if known || types.len() < Self::MAX_IGNORED_TYPES { event_type } else { "other" };
        let count = types.entry(name.to_owned()).or_default();
        let new = *count == 0;
        *count += n;
        (name.to_owned(), new)
    }

    pub(crate) fn add(&self, c: &OutcomeCounts) {
        self.applied.fetch_add(c.applied, Ordering::Relaxed);
        self.duplicate.fetch_add(c.duplicate, Ordering::Relaxed);
        self.stale.fetch_add(c.stale, Ordering::Relaxed);
        self.ignored.fetch_add(c.ignored, Ordering::Relaxed);
        self.parked.fetch_add(c.parked, Ordering::Relaxed);
        self.batches.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether some partition of the projection, or its checkpoint read on assignment, is
    /// waiting for PostgreSQL to come back (it resumes by itself).
    pub fn waiting_for_postgres(&self) -> bool {
        *self.waiting.lock().expect("waiting lock") > 0
    }

    /// Whether some partition of the projection waits for the schema registry to answer (it
    /// resumes by itself).
    pub fn waiting_for_registry(&self) -> bool {
        *self.waiting_registry.lock().expect("waiting lock") > 0
    }

    /// Partitions halted in this process (they stay halted until it restarts).
    pub fn partitions_halted(&self) -> usize {
        self.halted.lock().expect("halted lock").len()
    }

    /// Messages read from Kafka (including ones later dropped by a rebalance): the sum of
    /// the partitions' `read`.
    pub fn read(&self) -> u64 {
        let partitions = self.partitions.lock().expect("partitions lock");
        partitions.values().map(|t| t.read.load(Ordering::Relaxed)).sum()
    }

    /// The tally of partition `tp`, made at its first assignment.
    pub(crate) fn tally(&self, tp: &Tp) -> Arc<Tally> {
        self.partitions.lock().expect("partitions lock").entry(tp.clone()).or_default().clone()
    }

    /// What became of the messages each partition read in this process, by topic and
    /// partition.
    pub fn partitions(&self) -> Vec<(String, i32, Accounting)> {
        let partitions = self.partitions.lock().expect("partitions lock");
        partitions.iter().map(|(tp, t)| (tp.topic.clone(), tp.partition, t.snapshot())).collect()
    }

    /// Outcome counts so far.
    pub fn outcomes(&self) -> OutcomeCounts {
        OutcomeCounts {
            applied: self.applied.load(Ordering::Relaxed),
            duplicate: self.duplicate.load(Ordering::Relaxed),
            stale: self.stale.load(Ordering::Relaxed),
            gap: 0,
            ignored: self.ignored.load(Ordering::Relaxed),
            parked: self.parked.load(Ordering::Relaxed),
            dead_lettered: 0,
        }
    }
}
