//! `run`: the engine over the selected projections, its progress shown, its metrics and
//! waits served, until a signal or (with `--exit-when-caught-up`) the head.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use projectionist_kafka::{Engine, KafkaClientConfig, Registration};
use projectionist_postgres::PgPool;

use crate::progress::ProgressDisplay;
use crate::{config, console, http, pool, status, App};

impl App {
    pub(crate) async fn run(
        self,
        database_url: &Option<String>,
        client: KafkaClientConfig,
        args: config::RunOptions,
        signals: Signals,
    ) -> anyhow::Result<ExitCode> {
        let mut config = args.engine_config(&client)?;
        let selected = self.select(args.projections.as_deref(), &mut config)?;
        let connections = pool::size(&client, &selected, args.pg_max_connections).await;
        let serving = args.metrics_addr.as_deref().unwrap_or(config::DEFAULT_METRICS_ADDR) != "off";
        anyhow::ensure!(
            connections >= 2 || !serving,
            "--pg-max-connections {connections} leaves the partitions no connection once a reader waits on /wait \
             (it listens for checkpoints on one, for good): give 2 or more, or --metrics-addr off"
        );
        let pool = pool::open_with(database_url, connections).await?;
        tracing::debug!(connections, "PostgreSQL pool sized.");
        if args.reset {
            for r in &selected {
                projectionist_postgres::reset(&pool, r.projection.as_ref()).await?;
                tracing::info!(
                    projection = %r.projection.name(),
                    "Projection reset: tables truncated, checkpoints and aggregate versions forgotten."
                );
            }
        }
        let target = progress_target(&pool, &client, &selected, args.from_beginning || args.reset).await;
        let waits = http::Waits::new(pool.clone(), selected.iter().map(|r| r.projection.clone()).collect());
        let console = args.console.then(|| (pool.clone(), client.clone(), selected.clone()));
        let mut engine = Engine::new(pool, config);
        for r in selected {
            engine = engine.register(r.projection, r.topics);
        }
        let console = console.map(|(pool, client, registrations)| {
            let settings = console::Settings {
                token: args.console_token.clone().filter(|t| !t.is_empty()),
                payload: args.console_payload.unwrap_or_default(),
                remote: args.console_remote,
            };
            ((pool, client, registrations), settings)
        });
        serve_metrics(args.metrics_addr.as_deref(), engine.readiness(), Some(waits), console).await?;
        let started = Instant::now();
        let what = if args.from_beginning || args.reset { "Replaying" } else { "Projecting" };
        let mut progress = ProgressDisplay::new(what, "offsets", target);
        let reporter = tokio::spawn(report_progress(engine.stats(), progress.clone()));
        let report = engine.run(signals.received()).await;
        reporter.abort();
        let _ = reporter.await;
        let report = report?;
        let advanced: u64 =
            report.projections.iter().map(|(_, s)| s.advanced.load(std::sync::atomic::Ordering::Relaxed)).sum();
        progress.finish_quiet(advanced);
        let elapsed = started.elapsed().as_secs_f64();
        for (name, stats) in &report.projections {
            println!("{name}: {}", summary(stats, elapsed));
            for (topic, partition, accounting) in stats.partitions() {
                println!("  {topic}/{partition}: {accounting}");
            }
        }
        let halts = report.halts();
        if halts.is_empty() {
            Ok(ExitCode::SUCCESS)
        } else {
            for h in &halts {
                eprintln!("error: {h}");
            }
            Ok(ExitCode::from(2))
        }
    }
}

/// What a run of one projection did, on one line: events read and their rate, and what
/// became of them.
fn summary(stats: &projectionist_kafka::Stats, elapsed: f64) -> String {
    use std::sync::atomic::Ordering::Relaxed;
    let c = stats.outcomes();
    let read = stats.read();
    let offsets = stats.advanced.load(Relaxed);
    let halted = stats.partitions_halted();
    let types = stats.ignored_types.lock().expect("ignored types lock");
    let ignored_types = if types.is_empty() {
        String::new()
    } else {
        let each: Vec<String> = types.iter().map(|(t, n)| format!("{t} {n}")).collect();
        format!(" ({})", each.join(", "))
    };
    // The progress line counts offsets, transaction markers included: say both.
    let halted = if halted == 0 { String::new() } else { format!("; {halted} partition(s) halted") };
    let drained = stats.drained.load(Relaxed);
    let dead = stats.dead_letters.load(Relaxed);
    let mut parked = String::new();
    if c.parked + drained > 0 {
        parked = format!(", parked {} (`parked` lists them), held ones applied {drained}", c.parked);
    }
    if dead > 0 {
        parked.push_str(&format!(", dead letters {dead} (`dead-letters list`)"));
    }
    format!(
        "read {read} events in {elapsed:.2}s ({:.0}/s; checkpoints moved {offsets} offsets, transaction markers \
         included): applied {}, duplicates skipped {}, stale skipped {}, ignored {}{ignored_types}{parked}{halted}",
        read as f64 / elapsed.max(1e-9),
        c.applied,
        c.duplicate,
        c.stale,
        c.ignored
    )
}

/// Updates the progress line from the engine's counters while a run works: offsets the
/// checkpoints moved past, the same measure as the target (transaction markers take offsets
/// too, so counting messages read would end short of 100 %).
pub(crate) async fn report_progress(stats: Vec<Arc<projectionist_kafka::Stats>>, mut progress: ProgressDisplay) {
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let advanced: u64 = stats.iter().map(|s| s.advanced.load(std::sync::atomic::Ordering::Relaxed)).sum();
        progress.update(advanced);
    }
}

/// Serves /metrics, /health, /ready and (with `waits`) /wait on `addr` (default
/// [`config::DEFAULT_METRICS_ADDR`]; `off`: nothing), ready as `readiness` says.
pub(crate) async fn serve_metrics(
    addr: Option<&str>,
    readiness: projectionist_kafka::Readiness,
    waits: Option<http::Waits>,
    console: Option<(console::Parts, console::Settings)>,
) -> anyhow::Result<()> {
    let addr = addr.unwrap_or(config::DEFAULT_METRICS_ADDR);
    if addr == "off" {
        anyhow::ensure!(console.is_none(), "--console needs the HTTP listener: --metrics-addr is off");
        return Ok(());
    }
    let parsed = addr.parse().map_err(|_| anyhow::anyhow!("--metrics-addr {addr:?} is not host:port or off"))?;
    let handle = http::install_recorder()?;
    let mut served = if waits.is_some() { "/metrics, /health, /ready, /wait" } else { "/metrics, /health, /ready" };
    let console = match console {
        Some((parts, settings)) => {
            served = if waits.is_some() { "/metrics, /health, /ready, /wait, /console" } else { served };
            let console = console::Console::start(parsed, parts, (handle.clone(), readiness.clone()), settings)?;
            Some(console::router(console))
        }
        None => None,
    };
    let bound = http::serve(parsed, handle, readiness, (waits, console), http::Limits::default()).await?;
    tracing::info!(address = %bound, "Serving {served}.");
    Ok(())
}

/// Messages between each partition's start (checkpoint, or low watermark when replaying)
/// and its high watermark now: the run's target. `None` when the broker cannot say.
pub(crate) async fn progress_target(
    pool: &PgPool,
    client: &KafkaClientConfig,
    registrations: &[Registration],
    replay: bool,
) -> Option<u64> {
    let positions = status::positions(pool, client, registrations).await.ok()?;
    let start = |p: &status::Position| if replay { p.low } else { p.checkpoint.unwrap_or(p.low) };
    Some(positions.iter().map(|p| (p.high - start(p)).max(0) as u64).sum())
}

/// SIGTERM and Ctrl-C, listened for from the moment it is made. A stop that arrives before
/// the engine runs (while the command starts up: its preflight, its pool) ends the process
/// at once with exit 0, nothing read or applied yet, rather than by the signal's default
/// (exit 143); once the engine runs, it is the engine's orderly shutdown.
pub(crate) struct Signals {
    asked: tokio::sync::watch::Receiver<bool>,
    running: Arc<std::sync::atomic::AtomicBool>,
}

impl Signals {
    pub(crate) fn listen() -> anyhow::Result<Self> {
        let (tell, asked) = tokio::sync::watch::channel(false);
        let running = Arc::new(std::sync::atomic::AtomicBool::new(false));
        use futures_util::StreamExt;
        let mut stops = stops()?;
        let engine_runs = running.clone();
        tokio::spawn(async move {
            while stops.next().await.is_some() {
                if !engine_runs.load(std::sync::atomic::Ordering::SeqCst) {
                    tracing::info!("Stop asked for before the run started; nothing was read or applied.");
                    std::process::exit(0);
                }
                let _ = tell.send(true);
            }
        });
        Ok(Self { asked, running })
    }

    /// Completes at the first stop asked for from now on: the engine's shutdown.
    pub(crate) fn received(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.running.store(true, std::sync::atomic::Ordering::SeqCst);
        let mut asked = self.asked.clone();
        async move {
            let _ = asked.wait_for(|asked| *asked).await;
        }
    }
}

/// Every SIGTERM and SIGINT (Ctrl-C) from now on, as a stream.
fn stops() -> anyhow::Result<futures_util::stream::BoxStream<'static, ()>> {
    use futures_util::StreamExt;
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).map_err(|e| anyhow::anyhow!("cannot handle SIGTERM: {e}"))?;
        let mut int = signal(SignalKind::interrupt()).map_err(|e| anyhow::anyhow!("cannot handle SIGINT: {e}"))?;
        let term = futures_util::stream::poll_fn(move |cx| term.poll_recv(cx));
        let int = futures_util::stream::poll_fn(move |cx| int.poll_recv(cx));
        Ok(futures_util::stream::select(term, int).boxed())
    }
    #[cfg(not(unix))]
    Ok(futures_util::stream::unfold((), |()| async { tokio::signal::ctrl_c().await.ok().map(|()| ((), ())) }).boxed())
}
