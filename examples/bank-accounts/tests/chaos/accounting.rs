//! The accounting identity per partition: every member that stops cleanly prints, per
//! partition it read, what became of the messages it read (`read R = applied A + duplicates
//! D + stale S + ignored I + parked P + dead-lettered L + not applied U`), and each must add
//! up. Against the stream as the broker holds it, read back per partition: no member
//! applies more events of a partition than it has distinct events, and where one member
//! reads a partition from its start with PostgreSQL up throughout, exactly as many.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};

pub use super::common::{partition_accounts as parse, PartitionAccount as Account};

/// What a scenario's members should have applied, against the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// One member read each partition from its start, PostgreSQL up throughout: it applied
    /// each distinct event exactly once.
    Exact,
    /// No member applied more of a partition than its distinct events (an acknowledgement of
    /// a commit lost to a fault, a member killed, leave some applied by no clean one).
    AtMost,
    /// Only that each adds up: the read model was rolled back under a member, which applies
    /// again what the restored tables lack.
    AddsUp,
}

/// Each partition's distinct events (aggregate and version) in `topic` as the broker holds
/// it, read back with `read_committed`.
pub fn distinct_events(brokers: &str, topic: &str, partitions: i32) -> BTreeMap<i32, u64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "chaos-accounting")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
        .expect("a consumer");
    let mut assignment = TopicPartitionList::new();
    let mut highs = BTreeMap::new();
    for p in 0..partitions {
        assignment.add_partition_offset(topic, p, Offset::Beginning).unwrap();
        highs.insert(p, consumer.fetch_watermarks(topic, p, Duration::from_secs(10)).expect("watermarks").1);
    }
    consumer.assign(&assignment).unwrap();
    let mut seen: BTreeMap<i32, HashSet<(String, i64)>> = (0..partitions).map(|p| (p, HashSet::new())).collect();
    // The suite's producer is not transactional: every offset below the high watermark is an event.
    let read_all = |c: &BaseConsumer| {
        let position = c.position().unwrap();
        highs.iter().all(|(p, high)| {
            *high == 0
                || position.find_partition(topic, *p).and_then(|e| e.offset().to_raw()).is_some_and(|o| o >= *high)
        })
    };
    let since = std::time::Instant::now();
    while !read_all(&consumer) {
        assert!(since.elapsed() < Duration::from_secs(60), "read {topic} back within a minute");
        let Some(message) = consumer.poll(Duration::from_millis(500)) else { continue };
        let message = message.expect("a message");
        let event: serde_json::Value = serde_json::from_slice(message.payload().expect("an event")).expect("JSON");
        let id = event["aggregate_id"].as_str().expect("aggregate_id").to_owned();
        seen.get_mut(&message.partition()).unwrap().insert((id, event["version"].as_i64().expect("version")));
    }
    seen.into_iter().map(|(p, events)| (p, events.len() as u64)).collect()
}

/// Checks `accounts` (every clean exit's, over a scenario) against `distinct` as `expect`
/// says: what is wrong, if anything.
pub fn judge(accounts: &[Account], distinct: &BTreeMap<i32, u64>, expect: Expect) -> Option<String> {
    if let Some(a) = accounts.iter().find(|a| !a.adds_up()) {
        return Some(format!("partition {} does not add up: {:?}", a.partition, a.counts));
    }
    let mut applied: BTreeMap<i32, u64> = BTreeMap::new();
    for a in accounts {
        *applied.entry(a.partition).or_default() += a.applied();
    }
    for (p, events) in distinct {
        let got = applied.get(p).copied().unwrap_or(0);
        let wrong = match expect {
            Expect::Exact => got != *events,
            Expect::AtMost => got > *events,
            Expect::AddsUp => false,
        };
        if wrong {
            return Some(format!("partition {p}: applied {got} of {events} distinct events ({expect:?})"));
        }
    }
    None
}
