//! Waiting out the environment: what a partition applying a batch, or a runner reading
//! checkpoints, reports while PostgreSQL (or the schema registry) keeps failing — the
//! projection's waiting gauge and readiness ([`crate::Stats::waiting_for_postgres`],
//! [`crate::Stats::waiting_for_registry`]), and a log line when the wait begins and then now
//! and then, not on every attempt.

use std::fmt::Display;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::metrics as m;
use crate::retry::Retrying;
use crate::stats::Stats;

/// Least time between two log lines about one wait.
pub(crate) const LOG_EVERY: Duration = Duration::from_secs(15);

/// What a wait is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Awaited {
    Postgres,
    Registry,
}

/// One wait for PostgreSQL (or the registry), begun by the first failure it waits out. While
/// it lasts the projection counts as waiting; dropping it ends the wait (success, a stop, or
/// a failure that is not the environment's).
pub(crate) struct Outage {
    awaited: Awaited,
    stats: Arc<Stats>,
    projection: String,
    since: Option<Instant>,
    log: Throttle,
}

impl Outage {
    pub(crate) fn new(stats: Arc<Stats>, projection: &str) -> Self {
        Self::of(Awaited::Postgres, stats, projection)
    }

    /// A wait for `awaited`.
    pub(crate) fn of(awaited: Awaited, stats: Arc<Stats>, projection: &str) -> Self {
        Self { awaited, stats, projection: projection.to_owned(), since: None, log: Throttle::new(LOG_EVERY) }
    }

    /// A failure of the environment, about to be retried after `retrying.delay`.
    pub(crate) fn failed(&mut self, error: &dyn Display, retrying: Retrying) {
        let since = *self.since.get_or_insert_with(|| {
            waiting(self.awaited, &self.stats, &self.projection, 1);
            Instant::now()
        });
        if self.log.due() {
            let (attempt, waited_s) = (retrying.attempt, since.elapsed().as_secs());
            let next_attempt_ms = retrying.delay.as_millis() as u64;
            match self.awaited {
                Awaited::Postgres => tracing::warn!(
                    attempt, waited_s, next_attempt_ms, error = %error,
                    "Waiting for PostgreSQL; applying resumes by itself."
                ),
                Awaited::Registry => tracing::warn!(
                    attempt, waited_s, next_attempt_ms, error = %error,
                    "Waiting for the schema registry; reading resumes by itself."
                ),
            }
        }
    }

    /// The pool's connections were all in use past its acquire timeout: queued again for
    /// one. Not an outage (readiness and the waiting gauge are left alone): counted, and
    /// said now and then, with the budget that may be too small.
    pub(crate) fn queued(&mut self, budget: u32, retrying: Retrying) {
        metrics::counter!(m::CONNECTION_WAITS, "projection" => self.projection.clone()).increment(1);
        if self.log.due() {
            tracing::info!(
                attempt = retrying.attempt,
                budget,
                "Every PostgreSQL connection of this process ({budget}) is in use by its other partitions; \
                 waiting for one (--pg-max-connections)."
            );
        }
    }

    /// The work succeeded: logs the wait's end, if there was one.
    pub(crate) fn over(&self) {
        if let Some(since) = self.since {
            let waited_s = since.elapsed().as_secs();
            match self.awaited {
                Awaited::Postgres => tracing::info!(waited_s, "PostgreSQL answers again; applying resumed."),
                Awaited::Registry => tracing::info!(waited_s, "The schema registry answers again; reading resumed."),
            }
        }
    }
}

impl Drop for Outage {
    fn drop(&mut self) {
        if self.since.is_some() {
            waiting(self.awaited, &self.stats, &self.projection, -1);
        }
    }
}

/// Counts a wait in or out and sets the gauge under the same lock, so the gauge never
/// lags the count.
fn waiting(awaited: Awaited, stats: &Stats, projection: &str, change: isize) {
    let (count, gauge) = match awaited {
        Awaited::Postgres => (&stats.waiting, m::POSTGRES_WAITING),
        Awaited::Registry => (&stats.waiting_registry, m::REGISTRY_WAITING),
    };
    let mut n = count.lock().expect("waiting lock");
    *n = n.saturating_add_signed(change);
    metrics::gauge!(gauge, "projection" => projection.to_owned()).set(if *n > 0 { 1.0 } else { 0.0 });
}

/// Says when something repeated is worth saying again: the first time, then at most once
/// per period.
#[derive(Debug)]
pub(crate) struct Throttle {
    every: Duration,
    last: Option<Instant>,
}

impl Throttle {
    pub(crate) fn new(every: Duration) -> Self {
        Self { every, last: None }
    }

    pub(crate) fn due(&mut self) -> bool {
        let now = Instant::now();
        let due = self.last.is_none_or(|last| now.duration_since(last) >= self.every);
        if due {
            self.last = Some(now);
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retry::Retry;

    #[test]
    fn a_wait_counts_while_it_lasts_and_only_once() {
        let stats = Arc::new(Stats::default());
        let retrying = Retrying { kind: Retry::WaitOut, attempt: 1, delay: Duration::from_millis(5) };
        let mut a = Outage::new(stats.clone(), "p");
        let mut b = Outage::new(stats.clone(), "p");
        assert!(!stats.waiting_for_postgres(), "no failure yet");
        a.failed(&"refused", retrying);
        a.failed(&"refused", retrying);
        b.failed(&"refused", retrying);
        assert_eq!(*stats.waiting.lock().unwrap(), 2);
        drop(a);
        assert!(stats.waiting_for_postgres(), "b still waits");
        drop(b);
        assert!(!stats.waiting_for_postgres());
        drop(Outage::new(stats.clone(), "p"));
        assert_eq!(*stats.waiting.lock().unwrap(), 0, "a wait that never began ends nothing");
    }

    #[test]
    fn a_throttle_says_it_once_per_period() {
        let mut t = Throttle::new(Duration::from_secs(3600));
        assert!(t.due());
        assert!(!t.due());
    }
}
