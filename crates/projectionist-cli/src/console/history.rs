//! The lag of every partition over the last minutes, sampled for the console's chart.

use std::collections::{BTreeMap, VecDeque};

use crate::status::Position;

/// A partition: projection, topic, partition.
type Key = (String, String, i32);

/// One partition's samples: offsets behind, and seconds behind where known.
type Series = (VecDeque<Option<i64>>, VecDeque<Option<f64>>);

/// Samples of lag, oldest first: their times and, per partition, offsets and seconds behind.
pub(crate) struct History {
    capacity: usize,
    times: VecDeque<i64>,
    series: BTreeMap<Key, Series>,
    /// Each rebuild under way as first seen: when, and how many offsets it had read.
    rebuilds: BTreeMap<String, (std::time::Instant, i64)>,
}

impl History {
    pub(crate) fn new(capacity: usize) -> Self {
        Self { capacity, times: VecDeque::new(), series: BTreeMap::new(), rebuilds: BTreeMap::new() }
    }

    /// Seconds until rebuild `name`, at `read` of `high` offsets now, reads the rest at the
    /// rate it has read since the console first saw it; `None` until it has moved.
    pub(crate) fn eta(&mut self, name: &str, read: i64, high: i64) -> Option<u64> {
        let (since, first) = *self.rebuilds.entry(name.to_owned()).or_insert((std::time::Instant::now(), read));
        let rate = (read - first) as f64 / since.elapsed().as_secs_f64();
        (rate > 0.0).then(|| ((high - read).max(0) as f64 / rate).ceil() as u64)
    }

    /// A sample now: each position's lag in offsets, and in seconds where `seconds` has it.
    pub(crate) fn push(&mut self, positions: &[Position], seconds: &BTreeMap<Key, f64>) {
        if self.times.len() == self.capacity {
            self.times.pop_front();
            for (offsets, behind) in self.series.values_mut() {
                offsets.pop_front();
                behind.pop_front();
            }
        }
        let filled = self.times.len();
        self.times.push_back(chrono::Utc::now().timestamp());
        for p in positions {
            let key = (p.projection.clone(), p.topic.clone(), p.partition);
            let lag = p.high - p.checkpoint.unwrap_or(p.low);
            let secs = seconds.get(&key).copied();
            let (offsets, behind) = self.series.entry(key).or_insert_with(|| {
                (std::iter::repeat_n(None, filled).collect(), std::iter::repeat_n(None, filled).collect())
            });
            offsets.push_back(Some(lag.max(0)));
            behind.push_back(secs);
        }
        for (offsets, behind) in self.series.values_mut() {
            // A partition missing from this sample (a topic gone): a hole.
            if offsets.len() < self.times.len() {
                offsets.push_back(None);
                behind.push_back(None);
            }
        }
    }

    /// The chart's data: `{"t": [...], "series": [{"label", "offsets": [...], "seconds": [...]}]}`.
    pub(crate) fn json(&self) -> String {
        let series: Vec<serde_json::Value> = self
            .series
            .iter()
            .map(|((projection, topic, partition), (offsets, seconds))| {
                serde_json::json!({
                    "label": format!("{projection} {topic}/{partition}"),
                    "offsets": offsets,
                    "seconds": seconds,
                })
            })
            .collect();
        serde_json::json!({ "t": self.times, "series": series }).to_string()
    }

    /// The latest lag in seconds of a partition, if sampled.
    pub(crate) fn seconds(&self, key: &Key) -> Option<f64> {
        self.series.get(key).and_then(|(_, s)| s.back().copied().flatten())
    }
}

/// `projectionist_consumer_lag_seconds` of each partition, read from the Prometheus text the
/// listener serves (the engine sets it from the broker's timestamps).
pub(crate) fn lag_seconds(metrics: &str) -> BTreeMap<Key, f64> {
    let mut out = BTreeMap::new();
    for line in metrics.lines().filter(|l| l.starts_with("projectionist_consumer_lag_seconds{")) {
        let Some((labels, value)) = line.rsplit_once(' ') else { continue };
        let Ok(value) = value.parse::<f64>() else { continue };
        let label = |name: &str| {
            let start = labels.find(&format!("{name}=\""))? + name.len() + 2;
            let end = labels[start..].find('"')? + start;
            Some(labels[start..end].to_owned())
        };
        if let (Some(p), Some(t), Some(n)) = (label("projection"), label("topic"), label("partition")) {
            if let Ok(n) = n.parse() {
                out.insert((p, t, n), value);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(partition: i32, checkpoint: i64, high: i64) -> Position {
        let (projection, topic) = ("p".to_owned(), "t".to_owned());
        Position { projection, topic, partition, checkpoint: Some(checkpoint), low: 0, high }
    }

    #[test]
    fn keeps_the_last_samples_of_each_partition_aligned_with_their_times() {
        let mut history = History::new(2);
        let seconds = lag_seconds(
            "# TYPE x gauge\nprojectionist_consumer_lag_seconds{projection=\"p\",topic=\"t\",partition=\"0\"} 1.5\n",
        );
        history.push(&[at(0, 5, 10)], &seconds);
        history.push(&[at(0, 8, 10), at(1, 0, 3)], &BTreeMap::new());
        history.push(&[at(1, 3, 3)], &BTreeMap::new());
        let json: serde_json::Value = serde_json::from_str(&history.json()).unwrap();
        assert_eq!(json["t"].as_array().unwrap().len(), 2);
        assert_eq!(json["series"][0]["label"], "p t/0");
        assert_eq!(json["series"][0]["offsets"], serde_json::json!([2, null]));
        assert_eq!(json["series"][1]["offsets"], serde_json::json!([3, 0]));
        assert_eq!(history.seconds(&("p".into(), "t".into(), 1)), None);
        let mut fresh = History::new(3);
        fresh.push(&[at(0, 0, 1)], &seconds);
        assert_eq!(fresh.seconds(&("p".into(), "t".into(), 0)), Some(1.5));
    }
}
