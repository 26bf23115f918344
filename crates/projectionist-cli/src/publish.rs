//! `publish`: NDJSON envelopes onto a topic through an idempotent, transactional producer.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use projectionist_core::RawEnvelope;
use projectionist_kafka::KafkaClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use tokio::io::{AsyncBufReadExt, BufReader};

#[derive(clap::Args)]
pub(crate) struct PublishArgs {
    /// Topic to publish to (created through the admin API if missing).
    #[arg(long)]
    topic: String,
    /// NDJSON file of envelopes, one per line, or - for stdin. A line:
    /// {"id":"6f1c2a8e-8d0b-4c1e-9a57-2f4d1c3b5e70","aggregate_type":"account","aggregate_id":"acc-1","version":2,"type":"MoneyDeposited","occurred_at":"2026-11-21T10:00:00Z","data":{"amount":500}}
    /// (optional: "metadata": {…}). Fields: see the README, "The event envelope". Each line is
    /// checked, then published as written, byte for byte (keyed by its aggregate_id).
    file: String,
    /// Events per producer transaction.
    #[arg(long, default_value_t = 1000)]
    chunk_size: usize,
    /// Partitions if the topic must be created.
    #[arg(long, env = "PROJECTIONIST_PARTITIONS", default_value_t = 4)]
    partitions: i32,
    /// Transactional id (default: projectionist-publish-<topic>).
    #[arg(long)]
    transactional_id: Option<String>,
    /// Write where each event went, once its transaction commits, to this file (- for
    /// stdout), one JSON line per event: {"id", "aggregate_type", "aggregate_id", "version",
    /// "topic", "partition", "offset"}, e.g. to wait for it (`/wait` on a `run`, or the
    /// library's `Waiter`).
    #[arg(long, value_name = "FILE")]
    report_offsets: Option<String>,
    /// Publish each line as it is, unchecked, keyed by `--key` (none without it): for a
    /// dead-letter drill, a malformed message on purpose. Not for events.
    #[arg(long, conflicts_with = "report_offsets")]
    raw: bool,
    /// With `--raw`: the key of every message.
    #[arg(long, requires = "raw")]
    key: Option<String>,
}

/// A line to publish: its text, as written, and the envelope it holds (`None`: `--raw`).
type Line = (Option<RawEnvelope>, String);

pub(crate) async fn publish(client: &KafkaClientConfig, args: PublishArgs) -> anyhow::Result<ExitCode> {
    projectionist_kafka::topics::create_topics(client, &[&args.topic], args.partitions, 1).await?;
    let producer: FutureProducer = client
        .client_config_with_defaults(&[("linger.ms", "5")])
        .set("enable.idempotence", "true")
        .set(
            "transactional.id",
            args.transactional_id.clone().unwrap_or_else(|| format!("projectionist-publish-{}", args.topic)),
        )
        .create()?;
    let init = producer.clone();
    tokio::task::spawn_blocking(move || init.init_transactions(Duration::from_secs(30))).await??;

    let reader: Box<dyn tokio::io::AsyncRead + Unpin + Send> = if args.file == "-" {
        Box::new(tokio::io::stdin())
    } else {
        Box::new(tokio::fs::File::open(&args.file).await.with_context(|| format!("cannot open {}", args.file))?)
    };
    let total = if args.file == "-" { None } else { count_lines(&args.file).await };
    let mut report: Option<Box<dyn std::io::Write + Send>> = match args.report_offsets.as_deref() {
        None => None,
        Some("-") => Some(Box::new(std::io::stdout())),
        Some(path) => Some(Box::new(std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("cannot create {path}"))?,
        ))),
    };
    let mut progress = crate::progress::ProgressDisplay::new("Publishing", "events", total);
    let lines = BufReader::new(reader).lines();
    let mut chunks = Chunks { lines, file: &args.file, line_no: 0, done: false, raw: args.raw };
    let (mut published, mut transactions, mut bad_lines, mut skipped_chunks) = (0_usize, 0_usize, 0_usize, 0_usize);
    while !chunks.done {
        let (chunk, errors) = chunks.next(args.chunk_size.max(1)).await?;
        if !errors.is_empty() {
            for e in &errors {
                eprintln!("malformed: {e}");
            }
            bad_lines += errors.len();
            skipped_chunks += 1;
            eprintln!("Chunk ending at line {} not published: {} malformed line(s).", chunks.line_no, errors.len());
            continue;
        }
        if chunk.is_empty() {
            continue;
        }
        let delivered = send_chunk(&producer, &args.topic, &chunk, args.key.as_deref()).await?;
        if let Some(report) = report.as_mut() {
            report_offsets(report, &args.topic, &chunk, delivered)?;
        }
        published += chunk.len();
        transactions += 1;
        progress.update((published + bad_lines) as u64);
    }
    progress.finish((published + bad_lines) as u64);
    if let Some(mut report) = report {
        report.flush().context("writing the offsets report")?;
    }
    let summary = format!(
        "Published {published} events to {} in {transactions} transaction(s); {bad_lines} malformed line(s), \
        {skipped_chunks} chunk(s) not published.",
        args.topic
    );
    // With the offsets report on stdout, stdout holds JSON lines only.
    if args.report_offsets.as_deref() == Some("-") {
        eprintln!("{summary}");
    } else {
        println!("{summary}");
    }
    Ok(if bad_lines > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// The input's lines, read a chunk at a time.
struct Chunks<'a, R> {
    lines: tokio::io::Lines<R>,
    file: &'a str,
    /// The last line read, counted from 1.
    line_no: usize,
    /// Whether the input has ended.
    done: bool,
    /// Lines are published unchecked (`--raw`).
    raw: bool,
}

impl<R: tokio::io::AsyncBufRead + Unpin> Chunks<'_, R> {
    /// The next `size` envelopes, each checked, with its line (what is published, byte for
    /// byte), and the lines among them that are not envelopes, each named.
    async fn next(&mut self, size: usize) -> anyhow::Result<(Vec<Line>, Vec<String>)> {
        let (mut chunk, mut errors) = (Vec::with_capacity(size), Vec::new());
        while chunk.len() + errors.len() < size {
            let Some(line) = self.lines.next_line().await.with_context(|| format!("reading {}", self.file))? else {
                self.done = true;
                break;
            };
            self.line_no += 1;
            if line.trim().is_empty() {
                continue;
            }
            let text = line.trim_end_matches('\r').to_owned();
            if self.raw {
                chunk.push((None, text));
                continue;
            }
            match RawEnvelope::from_slice(line.as_bytes()) {
                Ok(e) => chunk.push((Some(e), text)),
                Err(e) => errors.push(format!("line {}: {e}", self.line_no)),
            }
        }
        Ok((chunk, errors))
    }
}

/// One JSON line per event of `chunk`: its identity and where it went.
fn report_offsets(
    report: &mut dyn std::io::Write,
    topic: &str,
    chunk: &[Line],
    delivered: Vec<(i32, i64)>,
) -> anyhow::Result<()> {
    for ((e, _), (partition, offset)) in chunk.iter().zip(delivered) {
        let Some(e) = e else { continue };
        let line = serde_json::json!({
            "id": e.id, "aggregate_type": e.aggregate_type, "aggregate_id": e.aggregate_id,
            "version": e.version, "topic": topic, "partition": partition, "offset": offset,
        });
        writeln!(report, "{line}").context("writing the offsets report")?;
    }
    Ok(())
}

/// Publishes `chunk` in one transaction, each line as it was written, keyed by its
/// envelope's aggregate id (a raw line by `raw_key`, if any); where each went (partition,
/// offset).
async fn send_chunk(
    producer: &FutureProducer,
    topic: &str,
    chunk: &[Line],
    raw_key: Option<&str>,
) -> anyhow::Result<Vec<(i32, i64)>> {
    producer.begin_transaction()?;
    let sends = chunk.iter().map(|(e, line)| {
        let record = FutureRecord::to(topic).payload(line.as_str());
        let record = match e.as_ref().map(|e| e.aggregate_id.as_str()).or(raw_key) {
            Some(key) => record.key(key),
            None => record,
        };
        producer.send(record, Duration::from_secs(30))
    });
    let results = futures_util::future::join_all(sends).await;
    let mut delivered = Vec::with_capacity(results.len());
    for result in results {
        match result {
            Ok(d) => delivered.push((d.partition, d.offset)),
            Err((e, _)) => {
                let p = producer.clone();
                let _ = tokio::task::spawn_blocking(move || p.abort_transaction(Duration::from_secs(30))).await;
                anyhow::bail!("publishing a chunk failed, transaction aborted: {e}");
            }
        }
    }
    let p = producer.clone();
    tokio::task::spawn_blocking(move || p.commit_transaction(Duration::from_secs(30))).await??;
    Ok(delivered)
}

/// Lines of `path` holding more than white space (the progress bar's total), read in
/// blocks so that memory stays flat whatever the file's size.
async fn count_lines(path: &str) -> Option<u64> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || count_lines_in(std::fs::File::open(path).ok()?).ok()).await.ok()?
}

fn count_lines_in(mut input: impl std::io::Read) -> std::io::Result<u64> {
    let mut block = vec![0; 256 * 1024];
    let (mut lines, mut in_line) = (0, false);
    loop {
        let n = input.read(&mut block)?;
        if n == 0 {
            return Ok(lines + u64::from(in_line));
        }
        for &b in &block[..n] {
            if b == b'\n' {
                lines += u64::from(in_line);
                in_line = false;
            } else if !b.is_ascii_whitespace() {
                in_line = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts_the_lines_that_hold_more_than_white_space() {
        for (text, lines) in [("", 0), ("a", 1), ("a\n", 1), ("a\n\n  \nb", 2), ("{}\r\n{}\r\n", 2), ("\n\n", 0)] {
            assert_eq!(super::count_lines_in(text.as_bytes()).unwrap(), lines, "{text:?}");
        }
        // Across blocks.
        let long = "x".repeat(300 * 1024) + "\n" + &"y".repeat(300 * 1024);
        assert_eq!(super::count_lines_in(long.as_bytes()).unwrap(), 2);
    }
}
