//! `status`: where each projection stands against the broker.

use projectionist_kafka::{topics, KafkaClientConfig, Registration};
use projectionist_postgres::checkpoint;
use projectionist_postgres::PgPool;

/// One partition of a registered projection's topic: its stored checkpoint and the
/// broker's watermarks.
pub(crate) struct Position {
    pub projection: String,
    pub topic: String,
    pub partition: i32,
    pub checkpoint: Option<i64>,
    pub low: i64,
    pub high: i64,
}

/// Every partition of every registered topic, with checkpoints read once.
pub(crate) async fn positions(
    pool: &PgPool,
    client: &KafkaClientConfig,
    registrations: &[Registration],
) -> anyhow::Result<Vec<Position>> {
    let stored = checkpoint::all(pool).await?;
    let mut out = Vec::new();
    for r in registrations {
        let name = r.projection.name();
        for topic in &r.topics {
            let (c, t) = (client.clone(), topic.clone());
            let marks = tokio::task::spawn_blocking(move || topics::watermarks(c, &t)).await??;
            for (partition, low, high) in marks {
                let checkpoint = stored
                    .iter()
                    .find(|c| c.projection == name && c.topic == *topic && c.partition == partition)
                    .map(|c| c.next_offset);
                out.push(Position {
                    projection: name.to_owned(),
                    topic: topic.clone(),
                    partition,
                    checkpoint,
                    low,
                    high,
                });
            }
        }
    }
    Ok(out)
}

pub(crate) async fn print(
    pool: &PgPool,
    client: &KafkaClientConfig,
    registrations: &[Registration],
) -> anyhow::Result<()> {
    println!(
        "{:<24} {:<24} {:>9} {:>12} {:>12} {:>10}",
        "projection", "topic", "partition", "checkpoint", "high", "lag"
    );
    for p in positions(pool, client, registrations).await? {
        let lag = p.high - p.checkpoint.unwrap_or(p.low);
        let shown = p.checkpoint.map_or("-".to_owned(), |o| o.to_string());
        println!("{:<24} {:<24} {:>9} {shown:>12} {:>12} {lag:>10}", p.projection, p.topic, p.partition, p.high);
    }
    Ok(())
}
