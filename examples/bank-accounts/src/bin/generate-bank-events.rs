//! Run with:
//! `cargo run -p bank-accounts --features generate --bin generate-bank-events -- --accounts 300 > events.ndjson`
//!
//! Writes a reproducible NDJSON stream of account events to stdout, with duplicates and
//! re-sent events (fresh ids) mixed in, as at-least-once delivery produces.

use std::io::Write;

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
    let events = bank_accounts::generate::stream(args.accounts, args.max_events, args.seed);
    let delivered = bank_accounts::generate::with_redeliveries(&events, args.duplicates, args.resent, args.seed);
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for e in &delivered {
        out.write_all(&e.to_json())?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    eprintln!(
        "Generated {} distinct events for {} accounts, {} deliveries in all.",
        events.len(),
        args.accounts,
        delivered.len()
    );
    let expected = bank_accounts::generate::expected(&events);
    let balance: i64 = expected.values().map(|a| a.balance).sum();
    eprintln!(
        "Expected read model: {} accounts, total balance {balance} cents, {} events applied.",
        expected.len(),
        events.len()
    );
    Ok(())
}
