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

impl Position {
    /// Where a rebuild has read this partition up to, by its shadow's checkpoints
    /// (`rebuild::shadow_checkpoints`): the next offset, or the low watermark if none.
    pub(crate) fn in_shadow(&self, shadow: &[(String, i32, i64)]) -> i64 {
        shadow.iter().find(|(t, n, _)| *t == self.topic && *n == self.partition).map_or(self.low, |(.., o)| *o)
    }
}

/// Every partition of every registered topic, with checkpoints read once.
pub(crate) async fn positions(
    pool: &PgPool,
    client: &KafkaClientConfig,
    registrations: &[Registration],
) -> anyhow::Result<Vec<Position>> {
    // The broker first: a topic that does not exist is the first thing to fix.
    let mut marks = Vec::new();
    for r in registrations {
        for topic in &r.topics {
            let (c, t) = (client.clone(), topic.clone());
            marks.push(tokio::task::spawn_blocking(move || topics::watermarks(c, &t)).await??);
        }
    }
    engine_tables(pool).await?;
    let stored = checkpoint::all(pool).await?;
    let mut marks = marks.into_iter();
    let mut out = Vec::new();
    for r in registrations {
        let name = r.projection.name();
        for topic in &r.topics {
            for (partition, low, high) in marks.next().expect("the watermarks of each topic") {
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
    let positions = positions(pool, client, registrations).await?;
    println!(
        "{:<24} {:<24} {:>9} {:>12} {:>12} {:>10}",
        "projection", "topic", "partition", "checkpoint", "high", "lag"
    );
    for p in &positions {
        let lag = p.high - p.checkpoint.unwrap_or(p.low);
        let shown = p.checkpoint.map_or("-".to_owned(), |o| o.to_string());
        println!("{:<24} {:<24} {:>9} {shown:>12} {:>12} {lag:>10}", p.projection, p.topic, p.partition, p.high);
    }
    println!();
    println!("{:<24} {:>16} {:>12} {:>12}", "projection", "parked", "events held", "dead letters");
    for r in registrations {
        let name = r.projection.name();
        let (parked, held, dead, _) = projectionist_postgres::park::count(pool, name).await?;
        println!("{name:<24} {parked:>16} {held:>12} {dead:>12}");
    }
    print_halts(pool, registrations).await;
    let rebuilds = rebuilds(pool, registrations, &positions).await?;
    if !rebuilds.is_empty() {
        println!();
        println!("{:<24} {:>16} {:>12} {:>12}", "rebuild of", "read", "of", "behind live");
        for (name, read, high, live) in rebuilds {
            println!("{name:<24} {read:>16} {high:>12} {live:>12}");
        }
    }
    Ok(())
}

/// The partitions halted in running processes, as they recorded them: where, since when,
/// whether and when each is retried, and why.
async fn print_halts(pool: &PgPool, registrations: &[Registration]) {
    let halts = match projectionist_postgres::halts::list(pool, None).await {
        Ok(halts) => halts,
        Err(e) => return println!("\nhalted partitions: cannot be read ({e}); `migrate` makes their table"),
    };
    let ours = |name: &str| registrations.iter().any(|r| r.projection.name() == name);
    let halts: Vec<_> = halts.into_iter().filter(|h| ours(&h.projection)).collect();
    if halts.is_empty() {
        return;
    }
    let time = |t: chrono::DateTime<chrono::Utc>| t.format("%Y-%m-%d %H:%M:%S").to_string();
    println!();
    println!("{:<24} {:<24} {:>9} {:>12} {:<20} retried", "halted", "topic", "partition", "at offset", "since (UTC)");
    for h in halts {
        let retried = match h.retry_at {
            Some(at) if h.heals => format!("next at {} UTC", time(at)),
            _ => "no: fix it, then restart the run".to_owned(),
        };
        println!(
            "{:<24} {:<24} {:>9} {:>12} {:<20} {retried}",
            h.projection,
            h.topic,
            h.partition,
            h.halted_at,
            time(h.since)
        );
        println!("  {} (reported {} UTC)", h.reason, time(h.reported_at));
    }
}

/// The rebuilds under way (a shadow schema there): of each, the offsets read, of how many,
/// and how far it is behind the live checkpoints.
pub(crate) async fn rebuilds<'a>(
    pool: &PgPool,
    registrations: &'a [Registration],
    positions: &[Position],
) -> anyhow::Result<Vec<(&'a str, i64, i64, i64)>> {
    let mut rebuilds = Vec::new();
    for r in registrations {
        let name = r.projection.name();
        if let Some(shadow) = projectionist_postgres::rebuild::shadow_checkpoints(pool, name).await? {
            let mine = positions.iter().filter(|p| p.projection == name);
            let (mut read, mut live, mut high) = (0, 0, 0);
            for p in mine {
                let at = p.in_shadow(&shadow);
                read += (at - p.low).max(0);
                live += (p.checkpoint.unwrap_or(p.low) - at).max(0);
                high += (p.high - p.low).max(0);
            }
            rebuilds.push((name, read, high, live));
        }
    }
    Ok(rebuilds)
}

/// An error saying what to do when the engine's tables are not in the database.
pub(crate) async fn engine_tables(pool: &PgPool) -> anyhow::Result<()> {
    let present: bool = sqlx::query_scalar(
        "SELECT to_regclass('projectionist_checkpoints') IS NOT NULL \
         AND to_regclass('projectionist_dead_letters') IS NOT NULL",
    )
    .fetch_one(pool)
    .await?;
    anyhow::ensure!(present, "the engine's tables are not in this database (or not all of them): run `migrate` first");
    Ok(())
}

/// Prints the parked aggregates (of `projection`, or of all): a table, or JSON lines.
pub(crate) async fn print_parked(pool: &PgPool, projection: Option<&str>, json: bool) -> anyhow::Result<()> {
    engine_tables(pool).await?;
    let parked = projectionist_postgres::park::list(pool, projection).await?;
    if json {
        for p in &parked {
            let mut line = serde_json::to_value(p)?;
            line["to_resume"] = p.to_resume().into();
            println!("{line}");
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
        println!("{:<20} to resume: {}", "", p.to_resume());
    }
    Ok(())
}

/// Prints the dead letters (of `projection`, or of all): a table, or JSON lines.
pub(crate) async fn print_dead_letters(
    pool: &PgPool,
    projection: Option<&str>,
    resolved: bool,
    json: bool,
) -> anyhow::Result<()> {
    engine_tables(pool).await?;
    let letters = projectionist_postgres::park::dead_letters(pool, projection, resolved).await?;
    if json {
        for d in &letters {
            println!("{}", dead_letter_json(d));
        }
        return Ok(());
    }
    if letters.is_empty() {
        println!("No dead letter.");
        return Ok(());
    }
    println!(
        "{:>6} {:<20} {:<30} {:<32} {:<12} {:>8} {:<24} error",
        "id", "projection", "topic/partition@offset", "aggregate v", "reason", "attempts", "last seen"
    );
    for d in &letters {
        let at = format!("{}/{}@{}", d.topic, d.partition, d.offset.map_or("-".to_owned(), |o| o.to_string()));
        let aggregate = match (&d.aggregate_type, &d.aggregate_id, d.version) {
            (Some(t), Some(i), Some(v)) => format!("{t}/{i} v{v}"),
            _ => "- (alone)".to_owned(),
        };
        let seen = d.last_seen.format("%Y-%m-%d %H:%M:%S UTC").to_string();
        let mut error: String = d.error.chars().take(120).collect();
        if let Some(resolution) = &d.resolution {
            error = format!("[{resolution}] {error}");
        }
        println!(
            "{:>6} {:<20} {at:<30} {aggregate:<32} {:<12} {:>8} {seen:<24} {error}",
            d.id, d.projection, d.reason, d.attempts
        );
    }
    Ok(())
}

/// Prints dead letter `id` in full.
pub(crate) async fn print_dead_letter(pool: &PgPool, id: i64, json: bool) -> anyhow::Result<()> {
    engine_tables(pool).await?;
    let Some(d) = projectionist_postgres::park::dead_letter(pool, id).await? else {
        anyhow::bail!("no dead letter {id} (`dead-letters list` shows them)");
    };
    if json {
        println!("{}", dead_letter_json(&d));
        return Ok(());
    }
    let at = format!("{}/{}@{}", d.topic, d.partition, d.offset.map_or("-".to_owned(), |o| o.to_string()));
    println!("dead letter {} of projection {}, read at {at}", d.id, d.projection);
    match (&d.aggregate_type, &d.aggregate_id, d.version) {
        (Some(t), Some(i), Some(v)) => println!("aggregate:  {t}/{i} version {v} ({})", behind_it(&d)),
        _ => println!("aggregate:  none usable (dead-lettered alone)"),
    }
    println!("reason:     {}", d.reason);
    println!("attempts:   {} (first {}, last {})", d.attempts, d.first_seen, d.last_seen);
    println!("key:        {}", d.key.as_deref().map_or("(none)".to_owned(), shown));
    for (name, value) in d.header_names.iter().zip(&d.header_values) {
        println!("header:     {}: {}", shown(name), value.as_deref().map_or("(null)".to_owned(), shown));
    }
    match (d.payload_bytes, &d.payload_sha256) {
        (Some(bytes), Some(sha256)) => println!(
            "payload (only its first {} of {bytes} bytes kept; SHA-256 of the whole: {}):\n{}",
            d.payload.len(),
            hex(sha256),
            shown(&d.payload)
        ),
        _ => println!("payload ({} bytes):\n{}", d.payload.len(), shown(&d.payload)),
    }
    println!("error:\n{}", d.error);
    if let (Some(resolution), Some(at)) = (&d.resolution, d.resolved_at) {
        println!("{resolution} at {at}: {}", d.resolution_note.as_deref().unwrap_or(""));
    }
    Ok(())
}

/// What became of the aggregate behind a dead letter: parked while it is open; once an
/// operator resolved it, what they did.
fn behind_it(d: &projectionist_postgres::park::StoredDeadLetter) -> &'static str {
    match d.resolution.as_deref() {
        None => "parked behind it",
        Some("discarded") => "its version skipped: the aggregate went on without it",
        Some(_) => "applied by a retry: the aggregate went on",
    }
}

/// Bytes as text when they are UTF-8, else as hex (`0x…`).
pub(crate) fn shown(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        Err(_) => format!("0x{}", hex(bytes)),
    }
}

/// Bytes as lowercase hex.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A dead letter as one JSON object: bytes as text when they are UTF-8, else as hex.
fn dead_letter_json(d: &projectionist_postgres::park::StoredDeadLetter) -> serde_json::Value {
    let headers: serde_json::Map<String, serde_json::Value> =
        d.header_names.iter().zip(&d.header_values).map(|(n, v)| (shown(n), v.as_deref().map(shown).into())).collect();
    serde_json::json!({
        "id": d.id,
        "projection": d.projection,
        "topic": d.topic,
        "partition": d.partition,
        "offset": d.offset,
        "key": d.key.as_deref().map(shown),
        "headers": headers,
        "payload": shown(&d.payload),
        "payload_truncated": d.payload_bytes.is_some(),
        "payload_bytes": d.payload_bytes.unwrap_or(d.payload.len() as i64),
        "payload_sha256": d.payload_sha256.as_deref().map(hex),
        "aggregate_type": d.aggregate_type,
        "aggregate_id": d.aggregate_id,
        "version": d.version,
        "reason": d.reason,
        "error": d.error,
        "attempts": d.attempts,
        "first_seen": d.first_seen,
        "last_seen": d.last_seen,
        "resolution": d.resolution,
        "resolved_at": d.resolved_at,
        "resolution_note": d.resolution_note,
    })
}
