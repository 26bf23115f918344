//! What applying one event did to the read model.

use std::fmt;

/// The result of applying one event, decided by its aggregate version against the
/// version stored in the read model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The event changed the read model.
    Applied,
    /// This exact version was already applied (a redelivery or a replay): no-op.
    Duplicate,
    /// The read model is already past this version: no-op.
    Stale,
    /// The event's predecessor has not been applied: the read model is at
    /// `expected - 1` and this event is `found`. Applying would corrupt the model.
    Gap {
        /// The version the read model can accept next.
        expected: i64,
        /// The version of the event that arrived.
        found: i64,
    },
    /// The projection does not handle this event type.
    Ignored,
    /// Held, not applied: an earlier event of its aggregate could not be applied (a gap),
    /// so the aggregate is parked and its events wait, in the engine's table, for what it
    /// waits for (the missing version); then they are applied in version order.
    Parked,
    /// It can never apply as it stands (its data does not decode, the table refuses a value
    /// of it, …): kept as a dead letter, with its exact bytes and the error, and its
    /// aggregate parked behind it until an operator retries or discards it.
    DeadLettered,
}

impl Outcome {
    /// Classifies a guarded transition that changed no row, given the version now stored
    /// (`None`: no row). Returns `None` when the transition would apply now (another
    /// transaction moved the row in between): the caller should try the write again.
    pub fn of_failed_transition(stored: Option<i64>, incoming: i64) -> Option<Self> {
        match stored {
            None if incoming == 1 => None,
            None => Some(Self::Gap { expected: 1, found: incoming }),
            Some(s) if s == incoming => Some(Self::Duplicate),
            Some(s) if s > incoming => Some(Self::Stale),
            Some(s) if s == incoming - 1 => None,
            Some(s) => Some(Self::Gap { expected: s + 1, found: incoming }),
        }
    }

    /// Classifies a state-transfer upsert that changed no row, given the version now
    /// stored. Returns `None` when the upsert would apply now (a race): try again.
    pub fn of_failed_upsert(stored: Option<i64>, incoming: i64) -> Option<Self> {
        match stored {
            Some(s) if s == incoming => Some(Self::Duplicate),
            Some(s) if s > incoming => Some(Self::Stale),
            _ => None,
        }
    }

    /// A bounded label for metrics and logs: `applied`, `duplicate`, `stale`, `gap`,
    /// `ignored`, `parked`, `dead_lettered`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::Duplicate => "duplicate",
            Self::Stale => "stale",
            Self::Gap { .. } => "gap",
            Self::Ignored => "ignored",
            Self::Parked => "parked",
            Self::DeadLettered => "dead_lettered",
        }
    }

    /// True for outcomes that leave the read model consistent (everything but a gap).
    pub fn is_ok(&self) -> bool {
        !matches!(self, Self::Gap { .. })
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Gap { expected, found } => write!(f, "gap: expected version {expected}, found {found}"),
            other => f.write_str(other.label()),
        }
    }
}

/// Counts of outcomes over a batch or a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutcomeCounts {
    /// Events that changed the read model.
    pub applied: u64,
    /// Versions already applied.
    pub duplicate: u64,
    /// Versions older than the stored one.
    pub stale: u64,
    /// Events whose predecessor is missing.
    pub gap: u64,
    /// Event types the projection does not handle.
    pub ignored: u64,
    /// Events held behind a parked aggregate's missing version.
    pub parked: u64,
    /// Events kept as dead letters.
    pub dead_lettered: u64,
}

impl OutcomeCounts {
    /// Adds one outcome.
    pub fn add(&mut self, outcome: &Outcome) {
        match outcome {
            Outcome::Applied => self.applied += 1,
            Outcome::Duplicate => self.duplicate += 1,
            Outcome::Stale => self.stale += 1,
            Outcome::Gap { .. } => self.gap += 1,
            Outcome::Ignored => self.ignored += 1,
            Outcome::Parked => self.parked += 1,
            Outcome::DeadLettered => self.dead_lettered += 1,
        }
    }

    /// Adds another count.
    pub fn merge(&mut self, other: &Self) {
        self.applied += other.applied;
        self.duplicate += other.duplicate;
        self.stale += other.stale;
        self.gap += other.gap;
        self.ignored += other.ignored;
        self.parked += other.parked;
        self.dead_lettered += other.dead_lettered;
    }

    /// All events counted.
    pub fn total(&self) -> u64 {
        self.applied + self.duplicate + self.stale + self.gap + self.ignored + self.parked + self.dead_lettered
    }
}

impl<'a> FromIterator<&'a Outcome> for OutcomeCounts {
    fn from_iter<I: IntoIterator<Item = &'a Outcome>>(iter: I) -> Self {
        let mut c = Self::default();
        iter.into_iter().for_each(|o| c.add(o));
        c
    }
}

#[cfg(test)]
mod tests {
    use super::Outcome::{self, *};

    #[test]
    fn classifies_a_transition_that_changed_nothing() {
        assert_eq!(Outcome::of_failed_transition(Some(5), 5), Some(Duplicate));
        assert_eq!(Outcome::of_failed_transition(Some(7), 5), Some(Stale));
        assert_eq!(Outcome::of_failed_transition(Some(2), 5), Some(Gap { expected: 3, found: 5 }));
        assert_eq!(Outcome::of_failed_transition(None, 4), Some(Gap { expected: 1, found: 4 }));
        assert_eq!(Outcome::of_failed_transition(Some(4), 5), None, "predecessor present: retry");
        assert_eq!(Outcome::of_failed_transition(None, 1), None, "creation with no row: retry");
        assert_eq!(Outcome::of_failed_transition(Some(1), 1), Some(Duplicate));
    }

    #[test]
    fn classifies_an_upsert_that_changed_nothing() {
        assert_eq!(Outcome::of_failed_upsert(Some(3), 3), Some(Duplicate));
        assert_eq!(Outcome::of_failed_upsert(Some(9), 3), Some(Stale));
        assert_eq!(Outcome::of_failed_upsert(Some(2), 3), None);
        assert_eq!(Outcome::of_failed_upsert(None, 3), None);
    }

    #[test]
    fn counts_and_labels() {
        let outcomes = [Applied, Duplicate, Stale, Applied, Ignored, Gap { expected: 2, found: 4 }, Parked];
        let c: super::OutcomeCounts = outcomes.iter().collect();
        assert_eq!((c.applied, c.duplicate, c.stale, c.ignored, c.gap, c.parked, c.total()), (2, 1, 1, 1, 1, 1, 7));
        assert_eq!(Gap { expected: 2, found: 4 }.to_string(), "gap: expected version 2, found 4");
        assert_eq!(Stale.label(), "stale");
        assert!(!Gap { expected: 1, found: 3 }.is_ok());
    }
}
