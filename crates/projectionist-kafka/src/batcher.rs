//! When a partition's buffered messages become a batch: a small pure state machine, no
//! Kafka and no clock of its own, so its rules are tested directly.
//!
//! A partition applies one batch at a time, in offset order. While a batch is in flight,
//! what arrives is buffered, up to the count and byte bounds; when the batch commits, the
//! buffer becomes the next batch. So batch size follows the distance to the head by
//! itself: far behind (catch-up, replay), the buffer is full by the time the previous batch
//! commits and every batch is as large as the bounds allow; at the head, a message that
//! finds nothing in flight and nothing more to read is applied at once, alone.

use std::time::{Duration, Instant};

/// Bounds of one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Most messages in a batch.
    pub max_events: usize,
    /// Most payload bytes in a batch (a single larger message still makes a batch alone).
    pub max_bytes: usize,
    /// Longest the oldest buffered message waits for the rest of its batch while messages
    /// keep arriving (the batch is cut earlier when the partition has nothing more to read).
    pub max_wait: Duration,
}

/// Buffered messages of one partition, and whether its one batch is in flight.
#[derive(Debug)]
pub(crate) struct Batcher<M> {
    limits: Limits,
    buffer: Vec<M>,
    /// The largest batch yet: what each new buffer is made with room for.
    room: usize,
    bytes: usize,
    oldest: Option<Instant>,
    in_flight: bool,
    halted: bool,
    /// Batches of one message each (see [`Batcher::one_at_a_time`]).
    single: bool,
}

impl<M> Batcher<M> {
    pub(crate) fn new(limits: Limits) -> Self {
        let limits = Limits { max_events: limits.max_events.max(1), max_bytes: limits.max_bytes.max(1), ..limits };
        let (buffer, room, bytes) = (Vec::new(), 0, 0);
        Self { limits, buffer, room, bytes, oldest: None, in_flight: false, halted: false, single: false }
    }

    /// Whether another message may be read now: not halted, and the buffer below its bounds.
    pub(crate) fn wants_more(&self) -> bool {
        let max_events = if self.single { 1 } else { self.limits.max_events };
        !self.halted && self.buffer.len() < max_events && self.bytes < self.limits.max_bytes
    }

    /// Batches of one message each from now on (`true`), or as the bounds allow again: how
    /// a partition finds the message at fault in a batch whose task failed.
    pub(crate) fn one_at_a_time(&mut self, single: bool) {
        self.single = single;
    }

    /// Buffers a message of `bytes` payload bytes read at `now`.
    #[cfg(test)]
    pub(crate) fn push(&mut self, message: M, bytes: usize, now: Instant) {
        self.push_read_now(message, bytes, || now);
    }

    /// Buffers a message of `bytes` payload bytes read now, as `now` tells: asked only for
    /// the first message of a batch, the one whose wait counts (a clock read per message
    /// costs about 2 % of the CPU of a bulk load).
    pub(crate) fn push_read_now(&mut self, message: M, bytes: usize, now: impl FnOnce() -> Instant) {
        if self.halted {
            return;
        }
        self.oldest.get_or_insert_with(now);
        self.buffer.push(message);
        self.bytes += bytes;
    }

    /// The next batch, if one is due: nothing in flight, something buffered, and the
    /// buffer full, the partition drained (`drained`: nothing more to read right now), or
    /// the oldest message waited `max_wait`. The batch is then in flight until
    /// [`Batcher::settle`] or [`Batcher::halt`].
    pub(crate) fn cut(&mut self, now: Instant, drained: bool) -> Option<Vec<M>> {
        if self.in_flight || self.halted || self.buffer.is_empty() {
            return None;
        }
        let waited = self.oldest.is_some_and(|t| now >= t + self.limits.max_wait);
        if self.wants_more() && !drained && !waited {
            return None;
        }
        self.in_flight = true;
        self.bytes = 0;
        self.oldest = None;
        // Room for the next batch at once, as large as the largest yet (a large buffer grown
        // by doubling is moved, and touches fresh pages, at each step: when catching up, a
        // batch cut short because the fetches fell behind is followed by full ones). Only
        // what is filled is touched.
        self.room = self.room.max(self.buffer.len());
        Some(std::mem::replace(&mut self.buffer, Vec::with_capacity(self.room)))
    }

    /// When the buffer is due by `max_wait` (`None` when empty).
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.oldest.map(|t| t + self.limits.max_wait)
    }

    /// The batch in flight committed.
    pub(crate) fn settle(&mut self) {
        self.in_flight = false;
    }

    /// The partition stops: the batch in flight ended at a halt, and what is buffered after
    /// it must not be applied. Returns how many buffered messages were dropped (they stay
    /// unapplied and uncommitted, read again after the fix).
    pub(crate) fn halt(&mut self) -> usize {
        self.in_flight = false;
        self.halted = true;
        self.bytes = 0;
        self.oldest = None;
        std::mem::take(&mut self.buffer).len()
    }

    /// The partition reads on from elsewhere (its checkpoint moved under it): nothing is in
    /// flight any more, and what is buffered is dropped (it is read again from there).
    /// Returns how many buffered messages were dropped.
    pub(crate) fn restart(&mut self) -> usize {
        self.in_flight = false;
        self.bytes = 0;
        self.oldest = None;
        std::mem::take(&mut self.buffer).len()
    }

    /// The halted partition reads again (a halt being retried; see `Task::heal`).
    pub(crate) fn unhalt(&mut self) {
        self.halted = false;
    }

    /// Whether the partition is halted.
    pub(crate) fn is_halted(&self) -> bool {
        self.halted
    }

    /// Whether a batch is in flight.
    pub(crate) fn in_flight(&self) -> bool {
        self.in_flight
    }

    /// The oldest buffered message.
    pub(crate) fn first(&self) -> Option<&M> {
        self.buffer.first()
    }

    /// How many messages are buffered.
    pub(crate) fn len(&self) -> usize {
        self.buffer.len()
    }

    /// Whether nothing is buffered.
    pub(crate) fn is_empty(&self) -> bool {
        self.buffer.is_empty()
    }

    /// Everything buffered, as a last batch at shutdown (`None` when empty, in flight or halted).
    pub(crate) fn rest(&mut self) -> Option<Vec<M>> {
        if self.in_flight || self.halted || self.buffer.is_empty() {
            return None;
        }
        self.in_flight = true;
        self.bytes = 0;
        self.oldest = None;
        Some(std::mem::take(&mut self.buffer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_at_a_time_cuts_batches_of_one_until_told_otherwise() {
        let now = Instant::now();
        let limits = Limits { max_events: 10, max_bytes: 1 << 20, max_wait: Duration::from_secs(60) };
        let mut b = Batcher::new(limits);
        b.one_at_a_time(true);
        b.push(1, 1, now);
        assert!(!b.wants_more(), "a batch of one is full");
        assert_eq!(b.cut(now, false), Some(vec![1]));
        b.settle();
        b.one_at_a_time(false);
        b.push(2, 1, now);
        assert!(b.wants_more());
        assert_eq!(b.cut(now, false), None, "not due: room for more and not drained");
    }

    fn limits(max_events: usize, max_bytes: usize) -> Limits {
        Limits { max_events, max_bytes, max_wait: Duration::from_millis(100) }
    }

    #[test]
    fn at_the_head_a_lone_message_is_applied_at_once() {
        let t = Instant::now();
        let mut b = Batcher::new(limits(1000, 1 << 20));
        b.push(1, 10, t);
        assert_eq!(b.cut(t, true), Some(vec![1]));
    }

    #[test]
    fn while_a_batch_is_in_flight_the_next_one_grows_up_to_its_bounds() {
        let t = Instant::now();
        let mut b = Batcher::new(limits(3, 1 << 20));
        b.push(0, 10, t);
        assert!(b.cut(t, true).is_some());
        for i in 1..=5 {
            if b.wants_more() {
                b.push(i, 10, t);
            }
            assert_eq!(b.cut(t + Duration::from_secs(1), true), None, "nothing is cut while a batch is in flight");
        }
        assert!(!b.wants_more(), "a full buffer stops reading: backpressure");
        b.settle();
        assert_eq!(b.cut(t, false), Some(vec![1, 2, 3]));
    }

    #[test]
    fn a_new_buffer_has_room_for_the_largest_batch_yet() {
        let t = Instant::now();
        let mut b = Batcher::new(limits(1000, 1 << 20));
        for (i, size) in [10, 2].into_iter().enumerate() {
            (0..size).for_each(|m| b.push(m, 1, t));
            assert_eq!(b.cut(t, true).map(|batch| batch.len()), Some(size), "batch {i}");
            assert!(b.buffer.capacity() >= 10, "batch {i}: room for 10, not {}", b.buffer.capacity());
            b.settle();
        }
    }

    #[test]
    fn the_byte_bound_cuts_before_the_count_bound() {
        let t = Instant::now();
        let mut b = Batcher::new(limits(1000, 100));
        b.push(1, 60, t);
        assert!(b.wants_more());
        b.push(2, 60, t);
        assert!(!b.wants_more());
        assert_eq!(b.cut(t, false), Some(vec![1, 2]));
        b.settle();
        b.push(3, 500, t);
        assert_eq!(b.cut(t, false), Some(vec![3]), "a message larger than the bound makes a batch alone");
    }

    #[test]
    fn a_steady_trickle_is_cut_by_the_wait_bound() {
        let t = Instant::now();
        let mut b = Batcher::new(limits(1000, 1 << 20));
        b.push(1, 10, t);
        assert_eq!(b.cut(t + Duration::from_millis(50), false), None);
        b.push(2, 10, t + Duration::from_millis(50));
        assert_eq!(b.deadline(), Some(t + Duration::from_millis(100)));
        assert_eq!(b.cut(t + Duration::from_millis(100), false), Some(vec![1, 2]));
        assert_eq!(b.deadline(), None);
    }

    #[test]
    fn a_halt_drops_the_buffer_and_stops_everything() {
        let t = Instant::now();
        let mut b = Batcher::new(limits(10, 1 << 20));
        b.push(1, 10, t);
        assert!(b.cut(t, true).is_some());
        b.push(2, 10, t);
        b.push(3, 10, t);
        assert_eq!(b.halt(), 2);
        assert!(b.is_halted() && !b.wants_more() && !b.in_flight());
        b.push(4, 10, t);
        assert_eq!((b.cut(t, true), b.rest()), (None, None));
    }

    #[test]
    fn shutdown_takes_the_rest_only_when_nothing_is_in_flight() {
        let t = Instant::now();
        let mut b = Batcher::new(limits(10, 1 << 20));
        b.push(1, 10, t);
        assert!(b.cut(t, true).is_some());
        b.push(2, 10, t);
        assert_eq!(b.rest(), None);
        b.settle();
        assert_eq!(b.rest(), Some(vec![2]));
        assert!(b.in_flight() && b.is_empty());
    }
}
