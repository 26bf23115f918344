//! The bench's topics: made, published to (keyed, transactional where the arm needs it),
//! drained by a plain `read_committed` consumer, and deleted.

use super::*;

/// The topics this run made, deleted at its end ([`drop_topics`]): a broker that keeps
/// every run's topics (thousands of partitions) slows down, and the figures with it.
pub(super) static MADE: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

pub(super) async fn make_topic(topic: &str) {
    make_topic_of(topic, PARTITIONS).await
}

/// A topic of `partitions` partitions, deleted at the run's end.
pub(super) async fn make_topic_of(topic: &str, partitions: i32) {
    topics::create_topics(&brokers(), &[topic], partitions, 1).await.expect("topic");
    MADE.lock().unwrap().push(topic.to_owned());
}

pub(super) async fn drop_topics() {
    let made = std::mem::take(&mut *MADE.lock().unwrap());
    if made.is_empty() || env_usize("BENCH_KEEP_TOPICS", 0) != 0 {
        return;
    }
    let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", brokers()).create().expect("admin client");
    let names: Vec<&str> = made.iter().map(String::as_str).collect();
    let options = rdkafka::admin::AdminOptions::new();
    for result in admin.delete_topics(&names, &options).await.expect("delete topics") {
        if let Err((topic, code)) = result {
            eprintln!("  could not delete topic {topic}: {code}");
        }
    }
}

pub(super) fn brokers() -> String {
    std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "localhost:9092".into())
}

pub(super) async fn publish(events: &[RawEnvelope]) -> (String, f64) {
    let (topic, _, rate) = publish_all("bench.accounts", events.iter().cloned()).await;
    (topic, rate)
}

/// Publishes `events` as they come (a stream generated on the fly stays out of memory) to a
/// new topic named from `prefix`, keyed by their aggregate ids: the topic, how many, and the
/// rate.
pub(super) async fn publish_all(prefix: &str, events: impl Iterator<Item = RawEnvelope>) -> (String, usize, f64) {
    publish_records(prefix, events.map(|e| (e.aggregate_id.clone().into_bytes(), e.to_json()))).await
}

/// Publishes `records` (key, payload) to a new topic named from `prefix`: the topic, how
/// many, and the rate.
pub(super) async fn publish_records(
    prefix: &str,
    records: impl Iterator<Item = (Vec<u8>, Vec<u8>)>,
) -> (String, usize, f64) {
    publish_records_to(prefix, PARTITIONS, records).await
}

/// [`publish_records`] to a new topic of `partitions` partitions.
pub(super) async fn publish_records_to(
    prefix: &str,
    partitions: i32,
    records: impl Iterator<Item = (Vec<u8>, Vec<u8>)>,
) -> (String, usize, f64) {
    static TOPICS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = TOPICS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let topic = format!("{prefix}.{}.{n}", std::process::id());
    make_topic_of(&topic, partitions).await;
    let producer: ThreadedProducer<DefaultProducerContext> =
        ClientConfig::new().set("bootstrap.servers", brokers()).set("linger.ms", "5").create().expect("producer");
    let started = Instant::now();
    let mut count = 0;
    for (key, payload) in records {
        count += 1;
        while let Err((err, _)) = producer.send(BaseRecord::to(&topic).key(&key).payload(&payload)) {
            assert!(
                matches!(
                    err,
                    rdkafka::error::KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull)
                ),
                "{err}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    producer.flush(Duration::from_secs(120)).expect("flush");
    (topic, count, count as f64 / started.elapsed().as_secs_f64())
}

/// A `read_committed` consumer assigned every partition of `topic` from its beginning, in a
/// group of its own (`group` and this process's id; it commits nothing), `settings` added.
pub(super) fn reader(group: &str, topic: &str, settings: &[(&str, &str)]) -> BaseConsumer {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", brokers())
        .set("group.id", format!("{group}-{}", std::process::id()))
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false");
    for (key, value) in settings {
        config.set(*key, *value);
    }
    let consumer: BaseConsumer = config.create().expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(topic, p, Offset::Beginning).unwrap();
    }
    consumer.assign(&tpl).unwrap();
    consumer
}

/// Kafka alone: a `read_committed` consumer draining every partition, no writes.
pub(super) fn kafka_drain(topic: &str, expected: usize) -> f64 {
    let consumer = reader("bench-drain", topic, &[]);
    let mut read = 0;
    let mut started = None;
    while read < expected {
        if let Some(message) = consumer.poll(Duration::from_secs(10)) {
            message.expect("message");
            started.get_or_insert_with(Instant::now);
            read += 1;
        }
    }
    read as f64 / started.expect("read something").elapsed().as_secs_f64()
}

/// Publishes `events` in one producer transaction, committed: where each went.
pub(super) async fn transaction(
    producer: &rdkafka::producer::FutureProducer,
    topic: &str,
    events: &[RawEnvelope],
) -> Vec<(i32, i64)> {
    use rdkafka::producer::FutureRecord;
    producer.begin_transaction().unwrap();
    let payloads: Vec<Vec<u8>> = events.iter().map(RawEnvelope::to_json).collect();
    let sends = events.iter().zip(&payloads).map(|(e, p)| {
        producer.send(FutureRecord::to(topic).key(&e.aggregate_id).payload(p.as_slice()), Duration::from_secs(30))
    });
    let delivered: Vec<(i32, i64)> = futures_util::future::join_all(sends)
        .await
        .into_iter()
        .map(|d| d.map(|d| (d.partition, d.offset)).map_err(|(e, _)| e).expect("delivered"))
        .collect();
    let p = producer.clone();
    tokio::task::spawn_blocking(move || p.commit_transaction(Duration::from_secs(30))).await.unwrap().unwrap();
    delivered
}
