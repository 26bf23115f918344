//! A halt that may heal: when its cause can go away while the run goes on (a permission, a
//! table or column, a constraint, a bound, a failing `apply`), the partition reads again
//! from its checkpoint after 1 s, 2 s, 4 s, … (at most [`Settings::heal`](super::Settings)),
//! until it gets past. Nothing at or after the halt is applied in between.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::halt::{resume, retracted};
use super::{Halt, Task};

/// A halt being retried: when next, how often so far, since when.
#[derive(Debug, Clone)]
pub(crate) struct Healing {
    /// The halt's offset (a halt elsewhere starts over).
    pub offset: i64,
    /// Retries so far.
    pub attempt: u32,
    /// When the partition first halted there.
    pub since: chrono::DateTime<chrono::Utc>,
    /// When it is read again from its checkpoint; `None` while it is (not halted).
    pub at: Option<Instant>,
    /// What [`report`](super::report) put in the run's halts, to take out again on the retry.
    pub reported: String,
}

impl Healing {
    /// The delay before retry `attempt` (0-based): 1 s doubled each time, at most `max`.
    pub(crate) fn delay(attempt: u32, max: Duration) -> Duration {
        Duration::from_secs(1).saturating_mul(1 << attempt.min(16)).min(max)
    }
}

impl Task {
    /// When `halt` is tried again, and since when the partition is halted there, if it may
    /// heal and this run heals halts (not a one-shot run's, nor a rebuild's).
    pub(super) fn retry_at(&mut self, halt: &Halt) -> Option<(Duration, chrono::DateTime<chrono::Utc>)> {
        let settings = &self.partition.settings;
        let max = settings.heal.filter(|_| halt.heals && !settings.exit_when_caught_up);
        let Some(max) = max.filter(|_| !self.partition.sink.holds_rows()) else {
            self.healing = None;
            return None;
        };
        let mut healing = match self.healing.take() {
            Some(h) if h.offset == halt.offset => Healing { attempt: h.attempt + 1, ..h },
            _ => Healing {
                offset: halt.offset,
                attempt: 0,
                since: chrono::Utc::now(),
                at: None,
                reported: String::new(),
            },
        };
        let delay = Healing::delay(healing.attempt, max);
        healing.at = Some(Instant::now() + delay);
        let since = healing.since;
        self.healing = Some(healing);
        Some((delay, since))
    }

    /// The halt's time to be tried again: it is no longer reported, and the partition reads
    /// again from its checkpoint (nothing at or after the halt was applied).
    pub(super) fn heal(&mut self) {
        let Some(healing) = &mut self.healing else { return };
        healing.at = None;
        let partition = &self.partition;
        let (topic, number) = (&partition.tp.topic, partition.tp.partition);
        tracing::warn!(
            projection = %partition.name(),
            %topic,
            partition = number,
            offset = healing.offset,
            attempt = healing.attempt + 1,
            since = %healing.since.format("%Y-%m-%d %H:%M:%S UTC"),
            "Retrying the halted partition from its checkpoint."
        );
        retracted(partition.name(), &partition.tp, &healing.reported, &partition.stats);
        metrics::counter!(crate::metrics::HALT_RETRIES, "projection" => partition.name().to_owned()).increment(1);
        self.batcher.unhalt();
        let checkpoint = partition.progress.checkpoint.load(Ordering::SeqCst);
        self.reread_from((checkpoint >= 0).then_some(checkpoint));
        if !self.batcher.is_halted() {
            resume(&self.partition.consumer, &self.partition.tp);
        }
    }

    /// A batch got past the halt being retried: said once.
    pub(super) fn healed(&mut self) {
        let Some(healing) = self.healing.take() else { return };
        let partition = &self.partition;
        super::halt::forget(&partition.pool, partition.name(), &partition.tp.topic, vec![partition.tp.partition]);
        tracing::info!(
            projection = %partition.name(),
            topic = %partition.tp.topic,
            partition = partition.tp.partition,
            offset = healing.offset,
            retries = healing.attempt + 1,
            since = %healing.since.format("%Y-%m-%d %H:%M:%S UTC"),
            "The halted partition healed: it got past the offset it halted at."
        );
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Healing;

    #[test]
    fn a_halt_is_retried_after_1_s_doubling_up_to_the_longest_delay() {
        let max = Duration::from_secs(300);
        let delays: Vec<u64> = (0..10).map(|a| Healing::delay(a, max).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]);
        assert_eq!(Healing::delay(u32::MAX, max), max, "no overflow however long it lasts");
        assert_eq!(Healing::delay(3, Duration::from_millis(1500)), Duration::from_millis(1500));
    }
}
