//! `status`: where each projection stands against the broker.

use projectionist_kafka::{checkpoint, topics, Registration};
use projectionist_postgres::PgPool;

pub(crate) async fn print(pool: &PgPool, brokers: &str, registrations: &[Registration]) -> anyhow::Result<()> {
    let stored = checkpoint::all(pool).await?;
    println!("{:<24} {:<24} {:>9} {:>12} {:>12} {:>10}", "projection", "topic", "partition", "checkpoint", "high", "lag");
    for r in registrations {
        let name = r.projection.name();
        for topic in &r.topics {
            let brokers = brokers.to_owned();
            let t = topic.clone();
            let marks = tokio::task::spawn_blocking(move || topics::watermarks(&brokers, &t)).await??;
            for (partition, low, high) in marks {
                let at = stored.iter().find(|c| c.projection == name && c.topic == *topic && c.partition == partition).map(|c| c.next_offset);
                let lag = high - at.unwrap_or(low);
                let shown = at.map_or("-".to_owned(), |o| o.to_string());
                println!("{name:<24} {topic:<24} {partition:>9} {shown:>12} {high:>12} {lag:>10}");
            }
        }
    }
    Ok(())
}
