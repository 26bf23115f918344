//! `rebuild`: a projection built again beside its live tables and swapped in, with its
//! progress shown; `--rollback`, `--drop-old` and `--abandon`.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use projectionist_kafka::{Engine, KafkaClientConfig, Registration};
use projectionist_postgres::rebuild::Difference;
use projectionist_postgres::PgPool;

use crate::args::RebuildArgs;
use crate::progress::ProgressDisplay;
use crate::run::{serve_metrics, Signals};
use crate::{pool, status, App};

impl App {
    pub(crate) async fn rebuild(
        self,
        database_url: &Option<String>,
        client: KafkaClientConfig,
        args: RebuildArgs,
    ) -> anyhow::Result<ExitCode> {
        if args.run.reset || args.run.from_beginning || args.run.exit_when_caught_up {
            bail!(
                "a rebuild reads from offset zero into tables of its own and ends with its swap: --reset, \
                 --from-beginning and --exit-when-caught-up are `run`'s"
            );
        }
        let mut config = args.run.engine_config(&client)?;
        let selected = self.select(args.run.projections.as_deref(), &mut config)?;
        let maintenance = args.rollback || args.drop_old || args.abandon;
        let mut differ = false;
        // The whole process's budget, its shadow's pool included: one connection for each
        // partition of the shadow (its warm-up opens them, so no batch waits for a TLS set-up
        // mid-run) and the rebuild's own.
        let connections = if maintenance {
            pool::DEFAULT_SIZE
        } else {
            pool::rebuild_size(&client, &selected, args.run.pg_max_connections).await?
        };
        let pool = pool::open_with(database_url, connections).await?;
        status::engine_tables(&pool).await?;
        if !maintenance {
            // The rebuild's own metrics, and its shadow run's (ready: PostgreSQL answers).
            let readiness = Engine::new(pool.clone(), config.clone()).readiness();
            serve_metrics(args.run.metrics_addr.as_deref(), readiness, None, None).await?;
        }
        if !args.aggregate.is_empty() {
            return crate::repair::repair_each(&pool, config, selected, &args).await;
        }
        for r in selected {
            if maintenance {
                maintain(&pool, &r, &args).await?;
                continue;
            }
            match rebuild_one(&pool, &client, config.for_projection(r.projection.name()), r, args.verify).await? {
                Ended::Done => {}
                Ended::Differs => differ = true,
                Ended::Stopped => return Ok(ExitCode::from(130)),
            }
        }
        Ok(if differ { ExitCode::FAILURE } else { ExitCode::SUCCESS })
    }
}

/// How one projection's rebuild (or verification) ended, for the exit code.
enum Ended {
    Done,
    Differs,
    Stopped,
}

/// `--rollback`, `--drop-old` or `--abandon` of one projection, behind its rebuild lock.
async fn maintain(pool: &PgPool, r: &Registration, args: &RebuildArgs) -> anyhow::Result<()> {
    use projectionist_postgres::rebuild;
    let name = r.projection.name();
    let _lock = rebuild::lock(pool, name).await?;
    if args.rollback {
        rebuild::rollback(pool, r.projection.as_ref()).await?;
        println!("{name}: the tables the last rebuild replaced are live again, with their checkpoints.");
    } else if args.drop_old {
        let dropped = rebuild::drop_old(pool, name).await?;
        println!("{name}: {}", if dropped { "the replaced tables are removed." } else { "no replaced tables kept." });
    } else {
        let dropped = rebuild::abandon(pool, name).await?;
        println!("{name}: {}", if dropped { "the unfinished rebuild is removed." } else { "no unfinished rebuild." });
    }
    Ok(())
}

/// One projection rebuilt and swapped in (or verified), its progress shown as it goes.
async fn rebuild_one(
    pool: &PgPool,
    client: &KafkaClientConfig,
    mut config: projectionist_kafka::EngineConfig,
    r: Registration,
    verify: bool,
) -> anyhow::Result<Ended> {
    use projectionist_kafka::rebuild::{self, Rebuilt};
    let name = r.projection.name().to_owned();
    // Its dead letters were produced to the topic when first met.
    config.dead_letter_topic = None;
    let started = Instant::now();
    let folded = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let reporter = tokio::spawn(report_rebuild(pool.clone(), client.clone(), r.clone(), folded.clone()));
    let registration = r.clone();
    let (projection, topics) = (r.projection, r.topics);
    let stop = Signals::listen()?.received();
    let rebuilt = if verify {
        rebuild::verify(pool, config, projection, topics, &folded, stop).await
    } else {
        rebuild::rebuild(pool, config, projection, topics, &folded, stop).await
    };
    reporter.abort();
    let _ = reporter.await;
    Ok(match rebuilt? {
        Rebuilt::Swapped { resumed, .. } => {
            println!(
                "{name}: rebuilt{} in {:.1}s and swapped in; the replaced tables are kept for `rebuild --rollback` \
                 (`rebuild --drop-old` removes them).",
                if resumed { " (resumed)" } else { "" },
                started.elapsed().as_secs_f64()
            );
            Ended::Done
        }
        Rebuilt::Verified { differences, .. } => {
            print_verification(&name, &differences, started.elapsed());
            crate::repair::print_repair_command(registration.projection.as_ref(), &differences);
            if differences.is_empty() {
                Ended::Done
            } else {
                Ended::Differs
            }
        }
        Rebuilt::Stopped => {
            println!("{name}: stopped before its swap; the live tables are untouched, and `rebuild` resumes it.");
            Ended::Stopped
        }
    })
}

/// What `rebuild --verify` found for projection `name`.
fn print_verification(name: &str, differences: &[Difference], took: Duration) {
    let took = took.as_secs_f64();
    if differences.is_empty() {
        println!("{name}: verified in {took:.1}s: the live tables are the stream's, row for row.");
        return;
    }
    let rows: i64 = differences.iter().map(Difference::rows).sum();
    println!("{name}: verified in {took:.1}s: {rows} rows differ from the stream's.");
    for d in differences {
        println!(
            "  {}: {} rows differ ({} only live, {} only rebuilt, {} changed); the first:",
            d.table,
            d.rows(),
            d.only_live,
            d.only_rebuilt,
            d.changed
        );
        for (key, live, rebuilt) in &d.first {
            println!("    key {key}\n      live:    {live}\n      rebuilt: {rebuilt}");
        }
    }
    println!(
        "The rebuilt tables are kept: `rebuild` swaps them in (the replaced ones kept for a rollback), \
         `rebuild --abandon` drops them."
    );
}

/// Shows a rebuild's progress (a bar on a terminal, a log line every 5 s otherwise): its
/// shadow's checkpoints, plus the offsets it has `folded` and not yet written, against the
/// high watermarks at start, counted from where it starts (a resumed rebuild's rate and ETA
/// are its own).
pub(crate) async fn report_rebuild(
    pool: PgPool,
    client: KafkaClientConfig,
    registration: Registration,
    folded: Arc<std::sync::atomic::AtomicU64>,
) {
    let name = registration.projection.name().to_owned();
    let Ok(positions) = status::positions(&pool, &client, std::slice::from_ref(&registration)).await else { return };
    let read = |shadow: &[(String, i32, i64)]| -> u64 {
        positions.iter().map(|p| (p.in_shadow(shadow).min(p.high) - p.low).max(0) as u64).sum()
    };
    let shadow = |pool: PgPool, name: String| async move {
        projectionist_postgres::rebuild::shadow_checkpoints(&pool, &name).await.ok().flatten().unwrap_or_default()
    };
    let from = read(&shadow(pool.clone(), name.clone()).await);
    let total: u64 = positions.iter().map(|p| (p.high - p.low).max(0) as u64).sum();
    let mut progress = ProgressDisplay::new("Rebuilding", "offsets", Some(total.saturating_sub(from)));
    let mut done = from;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        // The checkpoints first: a fold written in between is then missed in both (for one
        // report), never counted in both. Shown as it only ever grows (a round that halts
        // reads its folded offsets again).
        let written = read(&shadow(pool.clone(), name.clone()).await);
        done = done.max((written + folded.load(std::sync::atomic::Ordering::Relaxed)).min(total));
        projectionist_kafka::metrics::rebuild_progress(&name, done, total.saturating_sub(done));
        progress.update(done.saturating_sub(from));
    }
}
