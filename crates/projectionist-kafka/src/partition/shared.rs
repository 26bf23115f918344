//! What a partition's task shares with the runner and librdkafka's statistics callback: its
//! [`Progress`]. A leaf: the consumer's context holds these without reaching into the task.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

/// A partition's progress, shared with the runner and the statistics callback.
#[derive(Debug)]
pub(crate) struct Progress {
    /// Next offset the checkpoint holds: the start checkpoint, then each commit's (−1 while
    /// unknown: no checkpoint yet). A rebuild counts the batches it folded here before it
    /// writes them.
    pub checkpoint: AtomicI64,
    /// The checkpoint as this process last read or stored it (−1: none stored): what the
    /// next store expects to find (see `projectionist_postgres::checkpoint::store`).
    pub stored: AtomicI64,
    /// Reached the high watermark it had when assigned (or halted: it cannot move).
    caught_up: AtomicBool,
    /// Told once it catches up: the runner, which stops when every partition has
    /// (`exit_when_caught_up`), need not wait for its next tick.
    told: Arc<tokio::sync::Notify>,
    /// Offsets of batches folded and not yet written (a rebuild's), counted in
    /// [`crate::Stats::folded`] too until they are.
    pub folded: AtomicU64,
    /// Broker timestamp (ms since the epoch) of the oldest message read and not applied —
    /// in the batch in flight, buffered, or the one a halt stopped at; −1 when none.
    pub oldest_unapplied_ms: AtomicI64,
}

impl Progress {
    /// A partition starting at `checkpoint` (none: from the beginning), whose stored
    /// checkpoint was read as `stored`; `told` is notified when it catches up.
    pub(crate) fn new(checkpoint: Option<i64>, stored: Option<i64>, told: Arc<tokio::sync::Notify>) -> Self {
        Self {
            checkpoint: AtomicI64::new(checkpoint.unwrap_or(-1)),
            stored: AtomicI64::new(stored.unwrap_or(-1)),
            caught_up: AtomicBool::new(false),
            told,
            folded: AtomicU64::new(0),
            oldest_unapplied_ms: AtomicI64::new(-1),
        }
    }

    /// Whether it reached the high watermark it had when assigned, or halted.
    pub(crate) fn is_caught_up(&self) -> bool {
        self.caught_up.load(Ordering::SeqCst)
    }

    /// It reached its high watermark, or halted (it cannot move): says so to the runner.
    pub(crate) fn set_caught_up(&self) {
        if !self.caught_up.swap(true, Ordering::SeqCst) {
            self.told.notify_one();
        }
    }

    /// Lag against the partition's `head` (the next offset a `read_committed` reader can
    /// reach) and its `low` watermark: offsets between the checkpoint and the head, and
    /// seconds — 0 when caught up, else the age of the oldest message read and not applied
    /// (`None` while no such message is known). `None` when the head is unknown yet.
    pub(crate) fn lag(&self, head: i64, low: i64, now_ms: i64) -> Option<(i64, Option<f64>)> {
        if head < 0 {
            return None;
        }
        let checkpoint = self.checkpoint.load(Ordering::SeqCst);
        let applied_to = if checkpoint >= 0 { checkpoint } else { low.max(0) };
        let messages = (head - applied_to).max(0);
        if messages == 0 {
            return Some((0, Some(0.0)));
        }
        let oldest = self.oldest_unapplied_ms.load(Ordering::SeqCst);
        Some((messages, (oldest >= 0).then(|| (now_ms - oldest).max(0) as f64 / 1000.0)))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn lag_is_zero_at_the_head_and_else_the_age_of_the_oldest_unapplied_message() {
        let now = 1_000_000;
        let progress = Progress::new(Some(100), Some(100), Arc::default());
        assert_eq!(progress.lag(-1, 0, now), None, "head unknown yet: nothing exported");
        assert_eq!(progress.lag(100, 0, now), Some((0, Some(0.0))), "caught up");
        assert_eq!(progress.lag(90, 0, now), Some((0, Some(0.0))), "never negative");
        assert_eq!(progress.lag(105, 0, now), Some((5, None)), "behind, nothing read yet: age unknown");
        progress.oldest_unapplied_ms.store(now - 2_500, Ordering::SeqCst);
        assert_eq!(progress.lag(105, 0, now), Some((5, Some(2.5))));
        progress.checkpoint.store(105, Ordering::SeqCst);
        assert_eq!(progress.lag(105, 0, now), Some((0, Some(0.0))), "applied: 0 again, whatever is remembered");
        let fresh = Progress::new(None, None, Arc::default());
        assert_eq!(fresh.lag(50, 20, now), Some((30, None)), "no checkpoint: counted from the low watermark");
    }

    #[tokio::test]
    async fn catching_up_tells_the_runner_once() {
        let told = Arc::new(tokio::sync::Notify::new());
        let progress = Progress::new(None, None, told.clone());
        let wait = Duration::from_millis(50);
        assert!(!progress.is_caught_up());
        assert!(tokio::time::timeout(wait, told.notified()).await.is_err(), "nothing to tell yet");
        progress.set_caught_up();
        assert!(progress.is_caught_up());
        assert!(tokio::time::timeout(wait, told.notified()).await.is_ok(), "told when it caught up");
        progress.set_caught_up();
        assert!(tokio::time::timeout(wait, told.notified()).await.is_err(), "and only once");
    }
}
