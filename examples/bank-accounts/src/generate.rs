//! A reproducible stream of account events, and the read model it must produce, computed
//! independently of the database.

use std::collections::BTreeMap;

use projectionist::RawEnvelope;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::{AccountEvent, AGGREGATE_TYPE};

/// One expected `bank_accounts` row.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    let mut by_account: BTreeMap<String, BTreeMap<i64, AccountEvent>> = BTreeMap::new();
    for e in events {
        let event: AccountEvent =
            serde_json::from_value(serde_json::json!({"type": e.event_type, "data": e.data})).expect("valid event");
        by_account.entry(e.aggregate_id.clone()).or_default().insert(e.version, event);
    }
    by_account
        .into_iter()
        .map(|(id, versions)| {
            let mut row = ExpectedAccount { owner: String::new(), balance: 0, status: String::new(), version: 0 };
            for (version, event) in versions {
                assert_eq!(version, row.version + 1, "account {id} has a gap before version {version}");
                match event {
                    AccountEvent::AccountOpened { owner } => (row.owner, row.status) = (owner, "open".into()),
                    AccountEvent::MoneyDeposited { amount } => row.balance += amount,
                    AccountEvent::MoneyWithdrawn { amount } => row.balance -= amount,
                    AccountEvent::AccountClosed {} => row.status = "closed".into(),
                }
                row.version = version;
            }
            (id, row)
        })
        .collect()
}

pub use projectionist::testing::with_redeliveries;
