//! Run with:
//! `cargo run -p bank-accounts --features generate --bin generate-bank-events -- --accounts 300 > events.ndjson`
//!
//! Writes a reproducible NDJSON stream of account events to stdout, with duplicates and
//! re-sent events (fresh ids) mixed in, as at-least-once delivery produces. The stream is
//! written as it is generated, in memory that grows with the accounts, not the events.

use std::io::Write;

use bank_accounts::generate;
use clap::Parser;

#[derive(Parser)]
#[command(about = "Generate bank-account events as NDJSON.")]
struct Args {
    /// Number of accounts.
    #[arg(long, default_value_t = 300)]
    accounts: usize,
    /// Most events per account (each gets 1..=N).
    #[arg(long, default_value_t = 30)]
    max_events: i64,
    /// Share of events delivered twice as they are.
    #[arg(long, default_value_t = 0.1)]
    duplicates: f64,
    /// Share of events re-sent with a fresh event id.
    #[arg(long, default_value_t = 0.05)]
    resent: f64,
    /// Random seed.
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut delivered = 0_u64;
    for e in generate::deliveries(args.accounts, args.max_events, args.duplicates, args.resent, args.seed) {
        serde_json::to_writer(&mut out, &e)?;
        out.write_all(b"\n")?;
        delivered += 1;
    }
    out.flush()?;
    let expected = generate::expectation(args.accounts, args.max_events, args.seed);
    eprintln!(
        "Generated {} distinct events for {} accounts, {delivered} deliveries in all.",
        expected.events, args.accounts
    );
    eprintln!(
        "Expected read model: {} accounts, total balance {} cents, {} events applied.",
        expected.accounts, expected.balance, expected.events
    );
    Ok(())
}
