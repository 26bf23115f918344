//! The freshness arm: the projector at the head of a topic a transactional producer feeds
//! at a fixed rate; per event, commit to applied beside commit to a consumer's receipt.

use super::*;

/// How long each freshness rate is measured by default, in seconds. A p99 is the worst
/// hundredth of the events: over 5 s at 10k/s, the events of 50 ms of traffic, what one slow
/// batch or broker fetch delays, so that five such runs of one build gave 15.4 to 29.9 ms over
/// the broker's p99; over 30 s (300 ms of traffic), four gave 8.8 to 14.7 ms.
pub(super) const FRESHNESS_SECONDS: usize = 30;

/// Latencies of one freshness run, in milliseconds, sorted.
pub(super) struct Latencies(Vec<f64>);

impl Latencies {
    pub(super) fn at(&self, q: f64) -> f64 {
        if self.0.is_empty() {
            return f64::NAN;
        }
        self.0[((self.0.len() - 1) as f64 * q).round() as usize]
    }

    pub(super) fn show(&self) -> String {
        format!("p50 {:>6.1} ms  p99 {:>6.1} ms  max {:>6.1} ms", self.at(0.5), self.at(0.99), self.at(1.0))
    }
}

/// Freshness at `rate` events/s for `seconds` (after a second of warm-up, not counted: the
/// projector's first connections and batches): a transactional producer publishes `stream`
/// from its start (a transaction per loop, of what is due by then; the same mix of new
/// accounts, deposits, duplicates and re-sends the pipeline's maximum was measured on) while
/// the projector runs at the head, stopping early if the stream runs out;
/// for each event, the time from its transaction's commit to the moment a [`Waiter`] reports
/// it applied (its row visible; an upper bound: the wait is for the transaction's last event
/// on the partition), and, beside it on the same events, to the moment a
/// `read_committed` consumer receives it (the broker alone). Returns the achieved rate and
/// both latencies.
///
/// [`Waiter`]: projectionist::postgres::wait::Waiter
pub(super) async fn freshness(rate: f64, seconds: f64, stream: &[RawEnvelope]) -> (f64, Latencies, Latencies) {
    use projectionist::postgres::wait::Waiter;

    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let topic = format!("bench.fresh.{}.{n}", std::process::id());
    make_topic(&topic).await;
    let (pool, url) = fresh_database(&format!("projectionist_bench_fresh_{n}")).await;
    let mut projector = Projector::start(&url, &topic, n);
    let broker = BrokerReader::start(&topic);
    // Let the reader join before the first commit.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let waiter = Waiter::new(pool.clone()).await.expect("waiter");
    let producer = transactional_producer(n).await;
    // A projector at the head has been running: its first batches, which open its PostgreSQL
    // connections (a TLS set-up each, tens of milliseconds of CPU), are a cold start, not its
    // freshness. A first transaction, applied before the measured traffic starts, takes them.
    let primed = stream.len().min(100);
    for (partition, offset) in transaction(&producer, &topic, &stream[..primed]).await {
        let applied = waiter.wait_for_offset("bank_accounts", &topic, partition, offset, Duration::from_secs(30)).await;
        applied.expect("the projector applied the first transaction");
    }
    let traffic = Traffic { producer: &producer, waiter: &waiter, topic: &topic, stream, primed };
    let published = traffic.publish(rate, seconds).await;
    let received = broker.stop(published.sent);
    let (achieved, applied) = published.applied(&received);
    let mut broker: Vec<f64> = published
        .commits
        .iter()
        .filter(|(_, committed)| *committed >= published.counted_from)
        .map(|(at, committed)| received[at].saturating_duration_since(*committed).as_secs_f64() * 1000.0)
        .collect();
    println!("  freshness at {rate:.0}/s: {}", projector.batches());
    projector.stop();
    assert_eq!(versions(&pool).await, highest_versions(&stream[..published.sent]), "the projector applied every event");
    broker.sort_by(f64::total_cmp);
    (achieved, applied, Latencies(broker))
}

/// The sum of each account's highest version in `sent`: what the projector has applied once
/// it has read them (each account's versions arrive in order, redeliveries after them).
fn highest_versions(sent: &[RawEnvelope]) -> i64 {
    let mut highest: std::collections::HashMap<&str, i64> = std::collections::HashMap::new();
    for e in sent {
        let v = highest.entry(e.aggregate_id.as_str()).or_default();
        *v = (*v).max(e.version);
    }
    highest.values().sum()
}

/// The projector, at the head of an empty topic, and what its log tells: its metrics address.
struct Projector {
    child: std::process::Child,
    metrics_addr: std::sync::Arc<std::sync::Mutex<Option<String>>>,
}

impl Projector {
    /// Started on `topic`, returned once it holds partitions.
    fn start(url: &str, topic: &str, n: usize) -> Self {
        use std::sync::{Arc, Mutex};
        let bin = BANK_ACCOUNTS.path();
        let mut child = Command::new(&bin)
            .args(["run", "--metrics-addr", "127.0.0.1:0", "--kafka-property", "session.timeout.ms=6000"])
            .args(["--group-id", &format!("bench-fresh-{}-{n}", std::process::id())])
            .env("DATABASE_URL", url)
            .env("BANK_ACCOUNTS_TOPIC", topic)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the projector starts");
        let (assigned_tx, assigned_rx) = std::sync::mpsc::channel();
        let metrics_addr: Arc<Mutex<Option<String>>> = Arc::default();
        let stderr = child.stderr.take().unwrap();
        let addr_seen = metrics_addr.clone();
        std::thread::spawn(move || {
            let mut told = false;
            for line in BufReader::new(stderr).lines() {
                let line = line.unwrap_or_default();
                if !told && line.contains("Partition assigned") {
                    told = assigned_tx.send(()).is_ok();
                }
                if let Some(addr) = line.split("address=").nth(1).and_then(|a| a.split_whitespace().next()) {
                    *addr_seen.lock().unwrap() = Some(addr.to_owned());
                }
                // What went wrong, if anything, said beside the figures it explains.
                if line.contains("ERROR") || line.contains("WARN") {
                    eprintln!("  freshness projector: {line}");
                }
            }
        });
        assigned_rx.recv_timeout(Duration::from_secs(60)).expect("the projector was assigned partitions");
        Self { child, metrics_addr }
    }

    /// Its batches, from its `/metrics` (see [`batch_summary`]).
    fn batches(&self) -> String {
        self.metrics_addr.lock().unwrap().clone().map(|addr| batch_summary(&addr)).unwrap_or_default()
    }

    fn stop(&mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let _ = self.child.wait();
    }
}

/// The broker alone: a `read_committed` consumer of the topic, noting when each message
/// (partition, offset) arrived.
struct BrokerReader {
    received: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<(i32, i64), Instant>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl BrokerReader {
    fn start(topic: &str) -> Self {
        use rdkafka::Message;
        let received: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<(i32, i64), Instant>>> =
            Default::default();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let thread = {
            let (received, stop, topic) = (received.clone(), stop.clone(), topic.to_owned());
            std::thread::spawn(move || {
                let consumer = reader("bench-fresh-reader", &topic, &[("fetch.wait.max.ms", "10")]);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Some(Ok(m)) = consumer.poll(Duration::from_millis(20)) {
                        received.lock().unwrap().insert((m.partition(), m.offset()), Instant::now());
                    }
                }
            })
        };
        Self { received, stop, thread }
    }

    /// What it received, once it has `sent` messages (or 30 s have passed).
    fn stop(self, sent: usize) -> std::collections::HashMap<(i32, i64), Instant> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.received.lock().unwrap().len() < sent && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = self.thread.join();
        std::mem::take(&mut *self.received.lock().unwrap())
    }
}

/// A transactional producer of the freshness arm's run `n`, its transactions initialised.
async fn transactional_producer(n: usize) -> rdkafka::producer::FutureProducer {
    let producer: rdkafka::producer::FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("enable.idempotence", "true")
        .set("transactional.id", format!("bench-fresh-{}-{n}", std::process::id()))
        .set("linger.ms", "0")
        .create()
        .expect("producer");
    let init = producer.clone();
    tokio::task::spawn_blocking(move || init.init_transactions(Duration::from_secs(30))).await.unwrap().unwrap();
    producer
}

/// The measured traffic: `stream` published from `primed` on, each transaction waited for.
struct Traffic<'a> {
    producer: &'a rdkafka::producer::FutureProducer,
    waiter: &'a projectionist::postgres::wait::Waiter,
    topic: &'a str,
    stream: &'a [RawEnvelope],
    primed: usize,
}

/// One wait's end: the time to applied and the events it stands for (none before the
/// warm-up second's end), or where it timed out and why.
type Waited = Result<Option<(Duration, usize)>, ((i32, i64), String)>;

/// What [`Traffic::publish`] did.
struct Published {
    /// Each event's place and when its transaction committed.
    commits: Vec<((i32, i64), Instant)>,
    /// Events counted from this commit time on (after the warm-up second).
    counted_from: Instant,
    /// Events published, the primed ones included.
    sent: usize,
    /// Events published per second, the primed ones not counted.
    achieved: f64,
    /// Per wait: the time to applied and the events it stands for, or where it timed out.
    waited: Vec<Waited>,
}

impl Traffic<'_> {
    /// Publishes at `rate` for `seconds` after a warm-up second (or until the stream runs
    /// out), a transaction per turn of what is due, and waits for each partition's last
    /// event of each transaction to be applied.
    async fn publish(&self, rate: f64, seconds: f64) -> Published {
        let mut commits: Vec<((i32, i64), Instant)> = Vec::new();
        let mut waits = tokio::task::JoinSet::new();
        let started = Instant::now();
        let counted_from = started + Duration::from_secs(1);
        let mut sent = self.primed;
        while started.elapsed().as_secs_f64() < seconds + 1.0 && sent < self.stream.len() {
            let due = (self.primed + (started.elapsed().as_secs_f64() * rate) as usize).min(self.stream.len());
            if due <= sent {
                tokio::time::sleep(Duration::from_micros(500)).await;
                continue;
            }
            let delivered = transaction(self.producer, self.topic, &self.stream[sent..due]).await;
            let committed = Instant::now();
            // One wait per partition of the transaction, for its last offset there: the events
            // before it on the partition are applied no later (a partition applies in order),
            // so its time is an upper bound of theirs, counted for each of them. (A wait per
            // event costs the bench's process a quarter of a core at 10k/s, taken from the
            // projector's two.)
            let mut last: std::collections::HashMap<i32, (i64, usize)> = std::collections::HashMap::new();
            for at in delivered {
                commits.push((at, committed));
                let (offset, events) = last.entry(at.0).or_insert((at.1, 0));
                *offset = (*offset).max(at.1);
                *events += 1;
            }
            for (partition, (offset, events)) in last {
                let (waiter, topic) = (self.waiter.clone(), self.topic.to_owned());
                waits.spawn(async move {
                    let waited =
                        waiter.wait_for_offset("bank_accounts", &topic, partition, offset, Duration::from_secs(30));
                    match waited.await {
                        Ok(_) => Ok((committed >= counted_from).then(|| (committed.elapsed(), events))),
                        Err(e) => Err(((partition, offset), e.to_string())),
                    }
                });
            }
            sent = due;
        }
        let achieved = (sent - self.primed) as f64 / started.elapsed().as_secs_f64();
        let mut waited = Vec::new();
        while let Some(took) = waits.join_next().await {
            waited.push(took.unwrap());
        }
        Published { commits, counted_from, sent, achieved, waited }
    }
}

impl Published {
    /// The achieved rate and the projector's latencies; panics on a wait that timed out,
    /// saying whether the broker's reader (which `received` what it did) missed it too.
    fn applied(&self, received: &std::collections::HashMap<(i32, i64), Instant>) -> (f64, Latencies) {
        let mut projector = Vec::with_capacity(self.sent);
        let mut unapplied = Vec::new();
        for waited in &self.waited {
            match waited {
                Ok(Some((took, events))) => projector.extend(std::iter::repeat_n(took.as_secs_f64() * 1000.0, *events)),
                Ok(None) => {}
                Err(timed_out) => unapplied.push(timed_out),
            }
        }
        if let Some((at, error)) = unapplied.first() {
            let reader_too = unapplied.iter().filter(|(at, _)| !received.contains_key(at)).count();
            panic!(
                "{} waits (a transaction's last event on a partition) of {} events saw it not applied within 30 s of \
                 its commit, the first {at:?}: {error}; the read_committed reader never received {reader_too} of them",
                unapplied.len(),
                self.sent
            );
        }
        let all = self.commits.iter().all(|(at, _)| received.contains_key(at));
        assert!(all, "the read_committed reader received every event");
        projector.sort_by(f64::total_cmp);
        (self.achieved, Latencies(projector))
    }
}

/// The projector's batches, from its `/metrics`: how many, their mean size and mean time
/// to apply and commit, and the share of them over 10, 25 and 50 ms.
pub(super) fn batch_summary(addr: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(addr) else { return String::new() };
    let _ = stream.write_all(format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes());
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    let value =
        |name: &str| text.lines().find(|l| l.starts_with(name)).and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
    let (Some(count), Some(size), Some(took)) = (
        value("projectionist_batch_size_events_count"),
        value("projectionist_batch_size_events_sum"),
        value("projectionist_batch_duration_seconds_sum"),
    ) else {
        return "batch metrics not found".to_owned();
    };
    // The share of batches over 10, 25 and 50 ms, from the exporter's histogram buckets.
    let within = |le: &str| {
        let bucket = format!("le=\"{le}\"");
        let line =
            text.lines().find(|l| l.starts_with("projectionist_batch_duration_seconds_bucket") && l.contains(&bucket));
        line.and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).map_or(f64::NAN, |n| 100.0 * (1.0 - n / count))
    };
    format!(
        "{count:.0} batches, {:.1} events and {:.2} ms to apply and commit each on average; over 10 ms {:.1} %, \
         over 25 ms {:.2} %, over 50 ms {:.2} %",
        size / count,
        took / count * 1000.0,
        within("0.01"),
        within("0.025"),
        within("0.05"),
    )
}
