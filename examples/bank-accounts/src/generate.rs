//! A reproducible stream of account events, and the read model it must produce, computed
//! independently of the database.

use std::collections::{BTreeMap, BinaryHeap};
use std::fmt::Write as _;

use projectionist::RawEnvelope;
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

use crate::{AccountEvent, AGGREGATE_TYPE};

/// One expected `bank_accounts` row.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExpectedAccount {
    /// Holder.
    pub owner: String,
    /// Cents.
    pub balance: i64,
    /// `open` or `closed`.
    pub status: String,
    /// Last version.
    pub version: i64,
}

/// Generates `accounts` account streams (ids `acc-00001`…) of 1 to `max_events` events
/// each, interleaved across accounts in a random order that keeps each account's own
/// order. Deterministic for a seed, except the producer-minted event ids; an account's
/// events depend only on the seed and its number, so streams of different sizes agree.
pub fn stream(accounts: usize, max_events: i64, seed: u64) -> Vec<RawEnvelope> {
    let per_account: Vec<Vec<RawEnvelope>> = (1..=accounts)
        .map(|n| {
            let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(1_000_003).wrapping_add(n as u64));
            let id = format!("acc-{n:05}");
            let count = rng.gen_range(1..=max_events.max(1));
            let mut balance = 0_i64;
            (1..=count)
                .map(|version| {
                    let event = if version == 1 {
                        AccountEvent::AccountOpened { owner: format!("owner-{}", n % 97) }
                    } else if version == count && count > 2 && rng.gen_bool(0.2) {
                        AccountEvent::AccountClosed {}
                    } else if balance > 0 && rng.gen_bool(0.35) {
                        let amount = rng.gen_range(1..=balance);
                        balance -= amount;
                        AccountEvent::MoneyWithdrawn { amount }
                    } else {
                        let amount = rng.gen_range(1..=100_000);
                        balance += amount;
                        AccountEvent::MoneyDeposited { amount }
                    };
                    envelope(&id, version, &event)
                })
                .collect()
        })
        .collect();
    projectionist::testing::interleave(per_account, seed)
}

/// A wire envelope for one account event (fresh id, `occurred_at` derived from version).
pub fn envelope(account_id: &str, version: i64, event: &AccountEvent) -> RawEnvelope {
    projectionist::testing::envelope(AGGREGATE_TYPE, account_id, version, event)
}

/// The read model `events` must produce, folded in memory: the latest version of each
/// account applied once, in version order, whatever duplicates the input holds.
pub fn expected(events: &[RawEnvelope]) -> BTreeMap<String, ExpectedAccount> {
    by_account(events)
        .into_iter()
        .map(|(id, versions)| {
            let mut row = ExpectedAccount::default();
            for (version, event) in versions {
                assert_eq!(version, row.version + 1, "account {id} has a gap before version {version}");
                row.apply(version, event);
            }
            (id.to_owned(), row)
        })
        .collect()
}

/// Each account's distinct events, by version.
fn by_account(events: &[RawEnvelope]) -> BTreeMap<&str, BTreeMap<i64, AccountEvent>> {
    let mut by_account: BTreeMap<&str, BTreeMap<i64, AccountEvent>> = BTreeMap::new();
    for e in events {
        let event: AccountEvent =
            serde_json::from_value(serde_json::json!({"type": e.event_type, "data": e.data})).expect("valid event");
        by_account.entry(&e.aggregate_id).or_default().insert(e.version, event);
    }
    by_account
}

impl ExpectedAccount {
    /// The row after `event`, its version `version`.
    fn apply(&mut self, version: i64, event: AccountEvent) {
        match event {
            AccountEvent::AccountOpened { owner } => (self.owner, self.status) = (owner, "open".into()),
            AccountEvent::MoneyDeposited { amount } => self.balance += amount,
            AccountEvent::MoneyWithdrawn { amount } => self.balance -= amount,
            AccountEvent::AccountClosed {} => self.status = "closed".into(),
        }
        self.version = version;
    }
}

/// Each delivery of `events` as a state-transfer record (see [`crate::states`]): the same
/// envelope (id, aggregate, version, time), carrying the account's row after that version
/// instead of the event. Duplicates and re-sends stay what they were.
pub fn state_transfer(events: &[RawEnvelope]) -> Vec<RawEnvelope> {
    let mut rows: std::collections::HashMap<(&str, i64), serde_json::Value> = std::collections::HashMap::new();
    for (id, versions) in by_account(events) {
        let mut row = ExpectedAccount::default();
        for (version, event) in versions {
            row.apply(version, event);
            let state = serde_json::json!({ "owner": row.owner, "balance_cents": row.balance, "status": row.status });
            rows.insert((id, version), state);
        }
    }
    let state = |e: &RawEnvelope| RawEnvelope {
        event_type: "AccountState".into(),
        data: rows[&(e.aggregate_id.as_str(), e.version)].clone(),
        ..e.clone()
    };
    events.iter().map(state).collect()
}

pub use projectionist::testing::with_redeliveries;

/// How far a redelivery may trail its original in [`deliveries`]: it comes after the
/// original and before the first delivery of the event `REDELIVERY_WINDOW + 1` places later
/// in the interleaved stream. At most two redeliveries per event are pending (one duplicate,
/// one re-send), so the window bounds what [`Deliveries`] holds to `2 × (REDELIVERY_WINDOW + 1)`
/// envelopes.
pub const REDELIVERY_WINDOW: u64 = 100_000;

/// An account's random generator, seeded as `stream` seeds it, counting the 32-bit words
/// drawn from it: its state is its seed and that count, so an account need not hold it
/// between events (a `StdRng` is over 300 bytes, most of it a buffer of drawn words).
struct AccountRng {
    rng: StdRng,
    /// Words drawn (`StdRng` draws whole words: a `u64` is two).
    words: u64,
}

impl AccountRng {
    /// Account `n`'s generator, at its start.
    fn new(n: usize, seed: u64) -> Self {
        Self { rng: StdRng::seed_from_u64(seed.wrapping_mul(1_000_003).wrapping_add(n as u64)), words: 0 }
    }

    /// Account `n`'s generator, after `words` words.
    fn resume(n: usize, seed: u64, words: u64) -> Self {
        let mut rng = Self::new(n, seed);
        let mut skipped = [0_u8; 256];
        let mut left = words;
        while left > 0 {
            let now = left.min(64);
            rng.fill_bytes(&mut skipped[..4 * now as usize]);
            left -= now;
        }
        rng
    }
}

impl RngCore for AccountRng {
    fn next_u32(&mut self) -> u32 {
        self.words += 1;
        self.rng.next_u32()
    }

    fn next_u64(&mut self) -> u64 {
        self.words += 2;
        self.rng.next_u64()
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        self.words += dest.len().div_ceil(4) as u64;
        self.rng.fill_bytes(dest);
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}

/// Most events of an account whose generator is replayed from its seed for each event
/// rather than held. An event draws about 4 words, and replaying generates the account's
/// words again, 64 at a time: up to this length, a few such refills per event; a longer
/// account holds its generator (the replays would cost it quadratic time).
const REPLAYED_EVENTS: i64 = 64;

/// Where one account stands in its events, drawn one at a time from its [`AccountRng`]: the
/// same sequence `stream` builds for it, without holding it.
struct AccountEvents {
    /// Account number (`acc-{n:05}`).
    n: usize,
    /// Number of events.
    count: i64,
    /// Version of the last event drawn (0 before the first).
    version: i64,
    balance: i64,
    /// Words drawn from the account's generator so far.
    words: u64,
    /// The generator, held between events (accounts of more than [`REPLAYED_EVENTS`]);
    /// otherwise replayed.
    held: Option<Box<AccountRng>>,
}

impl AccountEvents {
    /// Account `n`, its number of events drawn as `stream` draws it; `hold` keeps its
    /// generator between events whatever its length.
    fn new(n: usize, max_events: i64, seed: u64, hold: bool) -> Self {
        let mut rng = AccountRng::new(n, seed);
        let count = rng.gen_range(1..=max_events.max(1));
        let words = rng.words;
        let held = (hold || count > REPLAYED_EVENTS).then(|| Box::new(rng));
        Self { n, count, version: 0, balance: 0, words, held }
    }

    /// The next event and its version, drawn exactly as `stream` draws it.
    fn next_event(&mut self, seed: u64) -> Option<(i64, AccountEvent)> {
        if self.version == self.count {
            self.held = None;
            return None;
        }
        let event = match self.held.take() {
            Some(mut rng) => {
                let event = self.draw(&mut rng);
                self.held = Some(rng);
                event
            }
            None => self.draw(&mut AccountRng::resume(self.n, seed, self.words)),
        };
        Some((self.version, event))
    }

    /// The next event, from `rng` standing where the account does.
    fn draw(&mut self, rng: &mut AccountRng) -> AccountEvent {
        debug_assert_eq!(rng.words, self.words, "account {} resumed elsewhere", self.n);
        self.version += 1;
        let (version, count) = (self.version, self.count);
        let event = if version == 1 {
            AccountEvent::AccountOpened { owner: format!("owner-{}", self.n % 97) }
        } else if version == count && count > 2 && rng.gen_bool(0.2) {
            AccountEvent::AccountClosed {}
        } else if self.balance > 0 && rng.gen_bool(0.35) {
            let amount = rng.gen_range(1..=self.balance);
            self.balance -= amount;
            AccountEvent::MoneyWithdrawn { amount }
        } else {
            let amount = rng.gen_range(1..=100_000);
            self.balance += amount;
            AccountEvent::MoneyDeposited { amount }
        };
        self.words = rng.words;
        event
    }
}

/// A redelivery waiting for its place: delivered once `due` first deliveries are out.
struct Pending {
    due: u64,
    /// Scheduling order, breaking ties between redeliveries due together.
    seq: u64,
    envelope: RawEnvelope,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        (self.due, self.seq) == (other.due, other.seq)
    }
}

impl Eq for Pending {}

impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Pending {
    /// Reversed, so that the max-heap `BinaryHeap` pops the earliest due first.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (other.due, other.seq).cmp(&(self.due, self.seq))
    }
}

/// The delivered stream of [`deliveries`], generated as it is read.
///
/// Holds a few counters for each unfinished account (about 50 bytes; an account of more
/// than 64 events also holds its random generator, some 300 bytes) and the pending
/// redeliveries (bounded by [`REDELIVERY_WINDOW`]), never the stream: an account's
/// generator is replayed from its seed to draw its next event.
pub struct Deliveries {
    /// Accounts not yet picked after their last event (as `interleave` keeps its queues).
    accounts: Vec<AccountEvents>,
    /// Seeds the accounts' generators.
    seed: u64,
    /// Picks the account of each first delivery, as `interleave` does.
    pick: StdRng,
    /// Decides the redeliveries and where they go.
    redeliver: StdRng,
    duplicates: f64,
    resent: f64,
    /// First deliveries made so far.
    firsts: u64,
    pending: BinaryHeap<Pending>,
    scheduled: u64,
    /// [`REDELIVERY_WINDOW`], smaller in tests.
    window: u64,
    /// Reused for the account id of each envelope.
    id: String,
}

impl std::fmt::Debug for Deliveries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deliveries")
            .field("accounts_left", &self.accounts.len())
            .field("first_deliveries", &self.firsts)
            .field("pending_redeliveries", &self.pending.len())
            .finish_non_exhaustive()
    }
}

/// Streams what a broker delivers of `stream(accounts, max_events, seed)`, in memory
/// bounded by the number of accounts rather than events: each account's events are drawn
/// from its own generator when it is its turn, so they are those of [`stream`] (types,
/// amounts, versions, owners; not event ids), and the first deliveries come in [`stream`]'s
/// order. Mixed in, as [`with_redeliveries`] does but within [`REDELIVERY_WINDOW`] of the
/// original: about `duplicates` of the events delivered again as they are (half of them
/// right after the original), and `resent` of them re-sent with a fresh event id, each
/// after its original. Deterministic per seed, except the event ids.
///
/// [`expectation`] gives the read model it must produce without reading it.
pub fn deliveries(accounts: usize, max_events: i64, duplicates: f64, resent: f64, seed: u64) -> Deliveries {
    deliveries_within(REDELIVERY_WINDOW, accounts, max_events, duplicates, resent, seed)
}

/// As [`deliveries`], with redeliveries within `window`.
fn deliveries_within(
    window: u64,
    accounts: usize,
    max_events: i64,
    duplicates: f64,
    resent: f64,
    seed: u64,
) -> Deliveries {
    Deliveries {
        accounts: (1..=accounts).map(|n| AccountEvents::new(n, max_events, seed, false)).collect(),
        seed,
        pick: StdRng::seed_from_u64(seed),
        // Not the picking seed: the two generators would draw the same words.
        redeliver: StdRng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15),
        duplicates: duplicates.clamp(0.0, 1.0),
        resent: resent.clamp(0.0, 1.0),
        firsts: 0,
        pending: BinaryHeap::new(),
        scheduled: 0,
        window,
        id: String::new(),
    }
}

impl Deliveries {
    /// Queues `envelope` for delivery after `delay` more first deliveries.
    fn schedule(&mut self, delay: u64, envelope: RawEnvelope) {
        self.scheduled += 1;
        self.pending.push(Pending { due: self.firsts + delay, seq: self.scheduled, envelope });
    }

    /// The next first delivery, with its redeliveries scheduled.
    fn first_delivery(&mut self) -> Option<RawEnvelope> {
        while !self.accounts.is_empty() {
            let k = self.pick.gen_range(0..self.accounts.len());
            let account = &mut self.accounts[k];
            let Some((version, event)) = account.next_event(self.seed) else {
                self.accounts.swap_remove(k);
                continue;
            };
            self.id.clear();
            write!(self.id, "acc-{:05}", account.n).expect("writing to a String");
            let original = envelope(&self.id, version, &event);
            self.firsts += 1;
            if self.redeliver.gen_bool(self.duplicates) {
                let delay = if self.redeliver.gen_bool(0.5) { 0 } else { self.redeliver.gen_range(0..=self.window) };
                self.schedule(delay, original.clone());
            }
            if self.redeliver.gen_bool(self.resent) {
                let delay = self.redeliver.gen_range(0..=self.window);
                // `envelope` mints a fresh id; the rest is the original's.
                let resend = envelope(&self.id, version, &event);
                self.schedule(delay, resend);
            }
            return Some(original);
        }
        None
    }
}

impl Iterator for Deliveries {
    type Item = RawEnvelope;

    fn next(&mut self) -> Option<RawEnvelope> {
        if self.pending.peek().is_some_and(|p| p.due <= self.firsts) {
            return self.pending.pop().map(|p| p.envelope);
        }
        // Once the accounts are done, the rest of the redeliveries in order.
        self.first_delivery().or_else(|| self.pending.pop().map(|p| p.envelope))
    }
}

/// Totals of the read model a stream must produce, as [`expectation`] computes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Expectation {
    /// Rows in `bank_accounts`.
    pub accounts: usize,
    /// Sum of the balances, in cents.
    pub balance: i64,
    /// Distinct events applied (each once, whatever its redeliveries).
    pub events: u64,
    /// Sum of the accounts' last versions.
    pub version_sum: i64,
}

/// The totals of the read model `stream(accounts, max_events, seed)` (or [`deliveries`]
/// with the same arguments) must produce, drawn account by account from the generators
/// without holding any event: those of [`expected`] over the stream.
pub fn expectation(accounts: usize, max_events: i64, seed: u64) -> Expectation {
    let mut totals = Expectation::default();
    for n in 1..=accounts {
        let mut account = AccountEvents::new(n, max_events, seed, true);
        while account.next_event(seed).is_some() {}
        totals.accounts += 1;
        totals.balance += account.balance;
        totals.events += account.count as u64;
        totals.version_sum += account.version;
    }
    totals
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, HashMap};

    use super::*;

    /// The totals of [`expected`] over `delivered`.
    fn totals(delivered: &[RawEnvelope]) -> Expectation {
        let rows = expected(delivered);
        let distinct: BTreeSet<(&str, i64)> = delivered.iter().map(|e| (e.aggregate_id.as_str(), e.version)).collect();
        Expectation {
            accounts: rows.len(),
            balance: rows.values().map(|a| a.balance).sum(),
            events: distinct.len() as u64,
            version_sum: rows.values().map(|a| a.version).sum(),
        }
    }

    #[test]
    fn expectation_is_the_fold_of_the_deliveries_and_of_the_stream() {
        // Short accounts only (replayed generators), then long ones too (held generators).
        for (accounts, max_events, seed) in [(400, 30, 7), (40, 150, 8)] {
            let delivered: Vec<RawEnvelope> = deliveries(accounts, max_events, 0.2, 0.1, seed).collect();
            let events = stream(accounts, max_events, seed);
            let want = expectation(accounts, max_events, seed);
            assert_eq!(totals(&delivered), want);
            assert_eq!(totals(&events), want);
            assert_eq!(expected(&delivered), expected(&events));
            assert_eq!(want.accounts, accounts);
        }
    }

    #[test]
    fn first_deliveries_are_the_stream_and_redeliveries_follow_their_original_within_the_window() {
        first_deliveries_are_the_stream(50, 300, 25, 3);
        first_deliveries_are_the_stream(200, 40, 150, 4);
    }

    fn first_deliveries_are_the_stream(window: u64, accounts: usize, max_events: i64, seed: u64) {
        let delivered: Vec<RawEnvelope> = deliveries_within(window, accounts, max_events, 0.2, 0.1, seed).collect();
        let events = stream(accounts, max_events, seed);
        // Place among the first deliveries, and the envelope, of each (account, version).
        let mut originals: HashMap<(&str, i64), (u64, &RawEnvelope)> = HashMap::new();
        let mut firsts = Vec::new();
        let (mut duplicates, mut resent) = (0, 0);
        for e in &delivered {
            let key = (e.aggregate_id.as_str(), e.version);
            match originals.get(&key) {
                None => {
                    originals.insert(key, (firsts.len() as u64, e));
                    firsts.push(e);
                }
                Some(&(place, original)) => {
                    let later = firsts.len() as u64 - 1 - place;
                    assert!(later <= window, "{key:?} redelivered {later} first deliveries after its original");
                    if e.id == original.id {
                        assert_eq!(e, original);
                        duplicates += 1;
                    } else {
                        assert_eq!(RawEnvelope { id: original.id.clone(), ..e.clone() }, *original);
                        resent += 1;
                    }
                }
            }
        }
        // The first deliveries are the stream, in its order (versions in order per account).
        assert_eq!(firsts.len(), events.len());
        for (got, want) in firsts.iter().zip(&events) {
            assert_eq!(RawEnvelope { id: want.id.clone(), ..(*got).clone() }, *want);
        }
        let n = events.len() as f64;
        assert!((duplicates as f64 - 0.2 * n).abs() < 0.05 * n, "{duplicates} duplicates of {n} events");
        assert!((resent as f64 - 0.1 * n).abs() < 0.05 * n, "{resent} re-sent of {n} events");
        // Every event id is new but for the duplicates.
        let ids: BTreeSet<_> = delivered.iter().map(|e| e.id.clone()).collect();
        assert_eq!(ids.len(), delivered.len() - duplicates);
    }

    #[test]
    fn deliveries_are_deterministic_and_hold_only_the_stream_without_redeliveries() {
        let keys = |seed| -> Vec<(String, i64)> {
            deliveries(200, 20, 0.3, 0.2, seed).map(|e| (e.aggregate_id, e.version)).collect()
        };
        assert_eq!(keys(5), keys(5));
        assert_ne!(keys(5), keys(6));
        let plain: Vec<(String, i64)> = deliveries(200, 20, 0.0, 0.0, 5).map(|e| (e.aggregate_id, e.version)).collect();
        let events: Vec<(String, i64)> = stream(200, 20, 5).into_iter().map(|e| (e.aggregate_id, e.version)).collect();
        assert_eq!(plain, events);
    }
}
