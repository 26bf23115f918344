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
    println!();
    println!("{:<24} {:>16} {:>12}", "projection", "parked", "events held");
    for r in registrations {
        let name = r.projection.name();
        let (parked, held) = projectionist_postgres::park::count(pool, name).await?;
        println!("{name:<24} {parked:>16} {held:>12}");
    }
    Ok(())
}

/// Prints the parked aggregates (of `projection`, or of all): a table, or JSON lines.
pub(crate) async fn print_parked(pool: &PgPool, projection: Option<&str>, json: bool) -> anyhow::Result<()> {
    let parked = projectionist_postgres::park::list(pool, projection).await?;
    if json {
        for p in &parked {
            println!("{}", serde_json::to_string(p)?);
        }
        return Ok(());
    }
    if parked.is_empty() {
        println!("No aggregate is parked.");
        return Ok(());
    }
    println!(
        "{:<20} {:<32} {:>11} {:>6} {:>13} {:<24} {:<25} reason",
        "projection", "aggregate", "waiting for", "held", "held versions", "since", "topic/partition"
    );
    for p in &parked {
        let aggregate = format!("{}/{}", p.aggregate_type, p.aggregate_id);
        let versions = p.held_versions.map_or("-".to_owned(), |(lo, hi)| format!("{lo}..{hi}"));
        let since = p.since.format("%Y-%m-%d %H:%M:%S UTC").to_string();
        let at = format!("{}/{}", p.topic, p.partition);
        println!(
            "{:<20} {aggregate:<32} {:>11} {:>6} {versions:>13} {since:<24} {at:<25} {}",
            p.projection, p.waiting_for, p.held, p.reason
        );
    }
    Ok(())
}
