#![doc = include_str!("../README.md")]
//!
//! ```no_run
//! # struct BankAccounts;
//! # #[projectionist_core::async_trait]
//! # impl projectionist_core::Projection<sqlx::PgConnection> for BankAccounts {
//! #     type Event = serde_json::Value;
//! #     fn name(&self) -> &str { "bank_accounts" }
//! #     async fn apply(
//! #         &self,
//! #         _: &mut sqlx::PgConnection,
//! #         _: &projectionist_core::Envelope<serde_json::Value>,
//! #     ) -> Result<projectionist_core::Outcome, projectionist_core::ApplyError> {
//! #         todo!()
//! #     }
//! # }
//! #[tokio::main]
//! async fn main() -> std::process::ExitCode {
//!     projectionist_cli::App::new("bank-accounts").projection(BankAccounts, ["bank.accounts"]).main().await
//! }
//! ```

mod config;
mod http;
mod kafka;
mod progress;
mod publish;
mod status;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use progress::ProgressDisplay;
use projectionist_kafka::{Engine, EngineConfig, KafkaClientConfig, Registration};
use projectionist_postgres::{PgPool, PgProjection};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// A projection binary's command line.
pub struct App {
    name: &'static str,
    registrations: Vec<Registration>,
}

#[derive(Parser)]
#[command(version, about = "Project versioned events from Kafka into PostgreSQL read models.")]
struct Cli {
    /// PostgreSQL connection URL (never printed).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, global = true, display_order = 100)]
    database_url: Option<String>,
    /// Settings file (TOML; `config example` prints a documented one). The command line and
    /// the environment win over it, it wins over the defaults.
    #[arg(long, env = "PROJECTIONIST_CONFIG", global = true, value_name = "FILE", display_order = 100)]
    config: Option<PathBuf>,
    /// Log format on stderr (level from RUST_LOG, default info).
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value = "text", global = true, display_order = 100)]
    log_format: LogFormat,
    // Last: its heading applies to the arguments after it.
    #[command(flatten)]
    kafka: kafka::KafkaArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Create the engine tables and the registered projections' tables, after checking that
    /// the tables already there are as declared (a difference is refused, naming it).
    Migrate {
        /// Also add declared columns a table lacks, where that is safe: nullable and without
        /// a default (the rows already there get NULL in them).
        #[arg(long)]
        add_columns: bool,
    },
    /// Create the registered projections' topics through the admin API (existing ones are kept).
    CreateTopics {
        /// Partitions per new topic.
        #[arg(long, env = "PROJECTIONIST_PARTITIONS", default_value_t = 4)]
        partitions: i32,
        /// Replication factor of new topics.
        #[arg(long, default_value_t = 1)]
        replication: i32,
    },
    /// Consume and project until stopped (SIGINT/SIGTERM).
    Run(Box<config::RunOptions>),
    /// Build a projection's read model again from offset zero beside the live tables (in a
    /// schema of its own, read in a consumer group of its own) while `run` keeps the live
    /// ones current, then swap it in within one short transaction: readers see the old read
    /// model until the swap and the new one after, never an empty or partial one. Stopped
    /// or killed, the next `rebuild` resumes it. The replaced tables are kept:
    /// `--rollback` swaps them back, `--drop-old` removes them. Takes `run`'s settings.
    Rebuild(Box<RebuildArgs>),
    /// Publish envelopes from NDJSON (a file, or - for stdin) keyed by aggregate_id, with a
    /// transactional producer, one transaction per chunk (`publish --help` shows a line).
    Publish(publish::PublishArgs),
    /// Per projection and partition: stored checkpoint, broker high watermark, lag; then the
    /// aggregates parked and the events held for them.
    Status,
    /// Aggregates parked behind a version that never arrived (a gap) or behind a dead letter:
    /// why, since when, the version each waits for, the events held for it, and what resumes
    /// it. Publishing the missing version resumes one (its held events are then applied in
    /// version order); `parked skip` declares a version lost.
    Parked {
        /// Only this projection's.
        #[arg(long)]
        projection: Option<String>,
        /// One JSON object per aggregate and line, for scripts.
        #[arg(long)]
        json: bool,
        #[command(subcommand)]
        action: Option<ParkedCommand>,
    },
    /// Dead letters: events that can never apply as they stand (not an envelope, data that
    /// does not decode, a value the table refuses, …), kept with their exact bytes; an
    /// aggregate whose event it is waits behind it (see `parked`).
    #[command(subcommand)]
    DeadLetters(DeadLettersCommand),
    /// The settings file.
    #[command(subcommand)]
    Config(ConfigCommand),
}

#[derive(clap::Args)]
struct RebuildArgs {
    /// Swap back the tables the last rebuild replaced (while they are kept).
    #[arg(long, conflicts_with_all = ["drop_old", "abandon"])]
    rollback: bool,
    /// Remove the tables the last rebuild replaced (no rollback after this).
    #[arg(long, conflicts_with = "abandon")]
    drop_old: bool,
    /// Remove a rebuild's tables that were never swapped in (the next one starts over).
    #[arg(long)]
    abandon: bool,
    #[command(flatten)]
    run: config::RunOptions,
}

#[derive(Subcommand)]
enum ParkedCommand {
    /// Declare lost the version a parked aggregate waits for (its event will never come: it
    /// was never published, or only as a message that is no envelope): its gates move past
    /// that version without changing its rows, as a discard does, and the events held behind
    /// it are applied. Recorded with the reason (`dead-letters list --all`).
    Skip {
        /// The projection that parked it.
        projection: String,
        /// Its aggregate type.
        aggregate_type: String,
        /// Its aggregate id.
        aggregate_id: String,
        /// Why, as recorded.
        #[arg(long)]
        reason: String,
    },
}

#[derive(Subcommand)]
enum DeadLettersCommand {
    /// The open dead letters: id, projection, where it was read, aggregate and version,
    /// reason, attempts, the error.
    List {
        /// Only this projection's.
        #[arg(long)]
        projection: Option<String>,
        /// The retried and discarded ones too.
        #[arg(long)]
        all: bool,
        /// One JSON object per dead letter and line, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Decode and apply a dead letter again with this build (its upcasters included: ship
    /// the fix, then retry), then the events held behind it, in version order. One that
    /// still fails stays, with its attempts counted and the new error.
    Retry {
        /// Its id (from `dead-letters list`).
        #[arg(required_unless_present = "all")]
        id: Option<i64>,
        /// Every open dead letter of the registered projections, oldest first.
        #[arg(long, conflicts_with = "id")]
        all: bool,
    },
    /// Skip a dead letter's version on purpose, ACCEPTING ITS LOSS: the read model never
    /// sees that event; the aggregate's gates move past its version without changing its
    /// rows, and the events held behind it are applied. Recorded with the reason.
    Discard {
        /// Its id (from `dead-letters list`).
        id: i64,
        /// Why, as recorded.
        #[arg(long)]
        reason: String,
    },
    /// One dead letter in full: where it was read, its key, headers and payload as read,
    /// the error.
    Show {
        /// Its id (from `dead-letters list`).
        id: i64,
        /// As one JSON object.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Print a settings file with every field documented and set to its default (or
    /// commented out), to save and edit: `config example > projectionist.toml`.
    Example,
}

impl App {
    /// A binary called `name`.
    pub fn new(name: &'static str) -> Self {
        Self { name, registrations: Vec::new() }
    }

    /// Registers a projection consuming `topics`.
    pub fn projection<P, I, S>(mut self, projection: P, topics: I) -> Self
    where
        P: PgProjection,
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.registrations.push(Registration {
            projection: Arc::new(projection),
            topics: topics.into_iter().map(Into::into).collect(),
        });
        self
    }

    /// Parses the process arguments, runs the command, prints any error and returns the
    /// exit code: 0 on success, 1 on error, 2 when a partition was halted.
    pub async fn main(self) -> ExitCode {
        self.main_from(std::env::args_os()).await
    }

    /// As [`App::main`], with the given arguments (the first is the binary name).
    pub async fn main_from(self, args: impl IntoIterator<Item = OsString>) -> ExitCode {
        let matches = command().get_matches_from(args);
        let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
        let cli = match with_config_file(cli, &matches) {
            Ok(cli) => cli,
            Err(e) => {
                eprintln!("error: {e:#}");
                return ExitCode::FAILURE;
            }
        };
        init_tracing(cli.log_format);
        match self.execute(cli).await {
            Ok(code) => code,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        }
    }

    async fn execute(self, cli: Cli) -> anyhow::Result<ExitCode> {
        let client = cli.kafka.client();
        let postgres_only = matches!(cli.command, Command::Parked { .. } | Command::DeadLetters(_));
        if !matches!(cli.command, Command::Migrate { .. } | Command::Config(_)) && !postgres_only {
            cli.kafka.preflight(&client).await?;
        }
        match cli.command {
            Command::Migrate { add_columns } => {
                let pool = pool(&cli.database_url).await?;
                let projections: Vec<&dyn PgProjection> =
                    self.registrations.iter().map(|r| r.projection.as_ref()).collect();
                let mut options = projectionist_postgres::MigrateOptions::default();
                options.add_columns = add_columns;
                projectionist_postgres::migrate_with(&pool, &projections, options).await?;
                println!("Migrated engine tables and {} projection(s).", projections.len());
            }
            Command::CreateTopics { partitions, replication } => {
                let topics = self.topics();
                let created =
                    projectionist_kafka::topics::create_topics(&client, &topics, partitions, replication).await?;
                println!(
                    "Topics: {} created ({}), {} already present.",
                    created.len(),
                    created.join(", "),
                    topics.len() - created.len()
                );
            }
            Command::Run(args) => return self.run(&cli.database_url, client, *args).await,
            Command::Rebuild(args) => return self.rebuild(&cli.database_url, client, *args).await,
            Command::Publish(args) => return publish::publish(&client, args).await,
            Command::Config(ConfigCommand::Example) => print!("{}", config::EXAMPLE),
            Command::Status => {
                let pool = pool(&cli.database_url).await?;
                status::print(&pool, &client, &self.registrations).await?;
            }
            Command::Parked { projection, json, action: None } => {
                let pool = pool(&cli.database_url).await?;
                status::print_parked(&pool, projection.as_deref(), json).await?;
            }
            Command::Parked {
                action: Some(ParkedCommand::Skip { projection, aggregate_type, aggregate_id, reason }),
                ..
            } => {
                let pool = pool(&cli.database_url).await?;
                status::engine_tables(&pool).await?;
                let Some(registration) = self.registrations.iter().find(|r| r.projection.name() == projection) else {
                    bail!("projection {projection} is not one this binary runs");
                };
                let p = registration.projection.as_ref();
                let skipped =
                    projectionist_postgres::park::skip_gap(&pool, p, &aggregate_type, &aggregate_id, &reason).await?;
                let drained = skipped.drained.total();
                println!("{aggregate_type}/{aggregate_id}: the version it waited for skipped; {drained} held event(s) applied after it");
            }
            Command::DeadLetters(DeadLettersCommand::List { projection, all, json }) => {
                let pool = pool(&cli.database_url).await?;
                status::print_dead_letters(&pool, projection.as_deref(), all, json).await?;
            }
            Command::DeadLetters(DeadLettersCommand::Retry { id, all }) => {
                let pool = pool(&cli.database_url).await?;
                status::engine_tables(&pool).await?;
                let ids = match id {
                    Some(id) => vec![id],
                    None if all => {
                        let open = projectionist_postgres::park::dead_letters(&pool, None, false).await?;
                        open.iter().map(|d| d.id).collect()
                    }
                    None => bail!("name a dead letter, or --all"),
                };
                let mut failing = 0;
                for id in ids {
                    failing +=
                        usize::from(!self.resolve(&pool, id, projectionist_postgres::park::Resolve::Retry).await?);
                }
                if failing > 0 {
                    bail!("{failing} dead letter(s) still fail (`dead-letters show ID` gives the error)");
                }
            }
            Command::DeadLetters(DeadLettersCommand::Discard { id, reason }) => {
                let pool = pool(&cli.database_url).await?;
                status::engine_tables(&pool).await?;
                self.resolve(&pool, id, projectionist_postgres::park::Resolve::Discard { reason }).await?;
            }
            Command::DeadLetters(DeadLettersCommand::Show { id, json }) => {
                let pool = pool(&cli.database_url).await?;
                status::print_dead_letter(&pool, id, json).await?;
            }
        }
        Ok(ExitCode::SUCCESS)
    }

    /// Retries or discards dead letter `id` with its projection, and says what happened:
    /// whether it is resolved.
    async fn resolve(
        &self,
        pool: &PgPool,
        id: i64,
        action: projectionist_postgres::park::Resolve,
    ) -> anyhow::Result<bool> {
        let Some(letter) = projectionist_postgres::park::dead_letter(pool, id).await? else {
            bail!("no dead letter {id} (`dead-letters list` shows them)");
        };
        let Some(registration) = self.registrations.iter().find(|r| r.projection.name() == letter.projection) else {
            bail!("dead letter {id} is of projection {}, which this binary does not run", letter.projection);
        };
        let resolved =
            projectionist_postgres::park::resolve(pool, registration.projection.as_ref(), id, action).await?;
        let drained = resolved.drained.total();
        let what = match resolved.outcome {
            projectionist_core::Outcome::Applied => "applied".to_owned(),
            projectionist_core::Outcome::Ignored => "discarded".to_owned(),
            projectionist_core::Outcome::DeadLettered => {
                format!("still fails: {}", resolved.error.as_deref().unwrap_or("?"))
            }
            projectionist_core::Outcome::Parked => "parked: its own predecessor is missing (`parked`)".to_owned(),
            other => format!("{other} (the read model was past it already)"),
        };
        println!("dead letter {id}: {what}; {drained} held event(s) applied after it");
        Ok(resolved.outcome != projectionist_core::Outcome::DeadLettered)
    }

    /// The registrations named (`--projection`; none: all), or an error naming an unknown
    /// one, there or in `config`'s `per_projection`; `config` keeps the settings of those
    /// selected.
    fn select(self, names: Option<&[String]>, config: &mut EngineConfig) -> anyhow::Result<Vec<Registration>> {
        let own: Vec<String> = config.per_projection.keys().cloned().collect();
        self.check_names(&own, "per_projection")?;
        let selected: Vec<Registration> = match names {
            None | Some([]) => self.registrations,
            Some(names) => {
                self.check_names(names, "--projection")?;
                self.registrations.into_iter().filter(|r| names.iter().any(|n| n == r.projection.name())).collect()
            }
        };
        config.per_projection.retain(|name, _| selected.iter().any(|r| r.projection.name() == name));
        Ok(selected)
    }

    async fn rebuild(
        self,
        database_url: &Option<String>,
        client: KafkaClientConfig,
        args: RebuildArgs,
    ) -> anyhow::Result<ExitCode> {
        use projectionist_postgres::rebuild;
        if args.run.reset || args.run.from_beginning || args.run.exit_when_caught_up {
            bail!(
                "a rebuild reads from offset zero into tables of its own and ends with its swap: --reset, \
                 --from-beginning and --exit-when-caught-up are `run`'s"
            );
        }
        let mut config = args.run.engine_config(&client)?;
        let selected = self.select(args.run.projections.as_deref(), &mut config)?;
        let maintenance = args.rollback || args.drop_old || args.abandon;
        // Sized as `run`'s, and its shadow's as this one: the connections its warm-up opens
        // are then all its batches use (a pool allowed more opens them mid-run, each a TLS
        // set-up, while the batches wait).
        let connections = if maintenance {
            DEFAULT_POOL_SIZE
        } else {
            pool_size(&client, &selected, args.run.pg_max_connections).await
        };
        let pool = pool_of(database_url, connections).await?;
        status::engine_tables(&pool).await?;
        if !maintenance {
            // The rebuild's own metrics, and its shadow run's (ready: PostgreSQL answers).
            let readiness = Engine::new(pool.clone(), config.clone()).readiness();
            serve_metrics(args.run.metrics_addr.as_deref(), readiness, None).await?;
        }
        for r in selected {
            let name = r.projection.name().to_owned();
            if maintenance {
                let _lock = rebuild::lock(&pool, &name).await?;
                if args.rollback {
                    rebuild::rollback(&pool, r.projection.as_ref()).await?;
                    println!("{name}: the tables the last rebuild replaced are live again, with their checkpoints.");
                } else if args.drop_old {
                    let dropped = rebuild::drop_old(&pool, &name).await?;
                    println!(
                        "{name}: {}",
                        if dropped { "the replaced tables are removed." } else { "no replaced tables kept." }
                    );
                } else {
                    let dropped = rebuild::abandon(&pool, &name).await?;
                    println!(
                        "{name}: {}",
                        if dropped { "the unfinished rebuild is removed." } else { "no unfinished rebuild." }
                    );
                }
                continue;
            }
            let mut config = config.for_projection(&name);
            // Its dead letters were produced to the topic when first met.
            config.dead_letter_topic = None;
            let started = Instant::now();
            let folded = Arc::new(std::sync::atomic::AtomicU64::new(0));
            let reporter = tokio::spawn(report_rebuild(pool.clone(), client.clone(), r.clone(), folded.clone()));
            let (projection, topics) = (r.projection, r.topics);
            let rebuilt =
                projectionist_kafka::rebuild::rebuild(&pool, config, projection, topics, &folded, shutdown_signal())
                    .await;
            reporter.abort();
            let _ = reporter.await;
            let rebuilt = rebuilt?;
            match rebuilt {
                projectionist_kafka::rebuild::Rebuilt::Swapped { resumed, .. } => println!(
                    "{name}: rebuilt{} in {:.1}s and swapped in; the replaced tables are kept for `rebuild --rollback` \
                     (`rebuild --drop-old` removes them).",
                    if resumed { " (resumed)" } else { "" },
                    started.elapsed().as_secs_f64()
                ),
                projectionist_kafka::rebuild::Rebuilt::Stopped => {
                    println!(
                        "{name}: stopped before its swap; the live tables are untouched, and `rebuild` resumes it."
                    );
                    return Ok(ExitCode::from(130));
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    }

    /// An error naming the first of `names` (given by `source`) that is not registered.
    fn check_names(&self, names: &[String], source: &str) -> anyhow::Result<()> {
        for name in names {
            if !self.registrations.iter().any(|r| r.projection.name() == name) {
                let known: Vec<&str> = self.registrations.iter().map(|r| r.projection.name()).collect();
                bail!("{source}: no projection named {name:?} in {}; registered: {}", self.name, known.join(", "));
            }
        }
        Ok(())
    }

    fn topics(&self) -> Vec<&str> {
        let mut topics: Vec<&str> =
            self.registrations.iter().flat_map(|r| r.topics.iter().map(String::as_str)).collect();
        topics.sort_unstable();
        topics.dedup();
        topics
    }

    async fn run(
        self,
        database_url: &Option<String>,
        client: KafkaClientConfig,
        args: config::RunOptions,
    ) -> anyhow::Result<ExitCode> {
        let mut config = args.engine_config(&client)?;
        let selected = self.select(args.projections.as_deref(), &mut config)?;
        let connections = pool_size(&client, &selected, args.pg_max_connections).await;
        let pool = pool_of(database_url, connections).await?;
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
        let mut engine = Engine::new(pool, config);
        for r in selected {
            engine = engine.register(r.projection, r.topics);
        }
        serve_metrics(args.metrics_addr.as_deref(), engine.readiness(), Some(waits)).await?;
        let started = Instant::now();
        let what = if args.from_beginning || args.reset { "Replaying" } else { "Projecting" };
        let mut progress = ProgressDisplay::new(what, "offsets", target);
        let reporter = tokio::spawn(report_progress(engine.stats(), progress.clone()));
        let report = engine.run(shutdown_signal()).await;
        reporter.abort();
        let _ = reporter.await;
        let report = report?;
        let advanced: u64 =
            report.projections.iter().map(|(_, s)| s.advanced.load(std::sync::atomic::Ordering::Relaxed)).sum();
        progress.finish_quiet(advanced);
        let elapsed = started.elapsed().as_secs_f64();
        for (name, stats) in &report.projections {
            let c = stats.outcomes();
            let read = stats.read.load(std::sync::atomic::Ordering::Relaxed);
            let offsets = stats.advanced.load(std::sync::atomic::Ordering::Relaxed);
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
            let drained = stats.drained.load(std::sync::atomic::Ordering::Relaxed);
            let dead = stats.dead_letters.load(std::sync::atomic::Ordering::Relaxed);
            let mut parked = String::new();
            if c.parked + drained > 0 {
                parked = format!(", parked {} (`parked` lists them), held ones applied {drained}", c.parked);
            }
            if dead > 0 {
                parked.push_str(&format!(", dead letters {dead} (`dead-letters list`)"));
            }
            println!(
                "{name}: read {read} events in {elapsed:.2}s ({:.0}/s; checkpoints moved {offsets} offsets, \
                transaction markers included): applied {}, duplicates skipped {}, stale skipped {}, ignored \
                {}{ignored_types}{parked}{halted}",
                read as f64 / elapsed.max(1e-9),
                c.applied,
                c.duplicate,
                c.stale,
                c.ignored
            );
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

/// The command line [`App`] parses (flags, subcommands and the environment variables they
/// read), to check a deployment's arguments and environment without running anything.
pub fn command() -> clap::Command {
    let command = config::with_defaults_shown(Cli::command());
    // The Kafka options are global (so that they may come before or after the subcommand),
    // and `migrate` uses no Kafka client: its help leaves them out. A subcommand's own
    // argument of the same id takes the place of the global one there.
    let kafka: Vec<clap::Arg> = command
        .get_arguments()
        .filter(|a| a.get_help_heading() == Some(kafka::KAFKA_HEADING))
        .map(|a| a.clone().hide(true))
        .collect();
    // `rebuild` takes `run`'s settings but those that say where `run` starts and stops.
    let rebuild = |rebuild: clap::Command| {
        ["from_beginning", "reset", "exit_when_caught_up"]
            .into_iter()
            .fold(rebuild, |c, id| c.mut_arg(id, |a| a.hide(true)))
    };
    command.mut_subcommand("migrate", |migrate| migrate.args(kafka)).mut_subcommand("rebuild", rebuild)
}

/// Applies `--config FILE`, if given, where the command line and the environment left
/// defaults.
fn with_config_file(mut cli: Cli, matches: &clap::ArgMatches) -> anyhow::Result<Cli> {
    let Some(path) = &cli.config else { return Ok(cli) };
    let file = config::ConfigFile::load(path)?;
    if let Some(brokers) = &file.brokers {
        if !config::given(matches, "brokers") {
            cli.kafka.brokers = brokers.clone();
        }
    }
    cli.kafka.file_properties = file.kafka;
    match (&mut cli.command, matches.subcommand()) {
        (Command::Run(args), Some(("run", run))) => {
            let mut options = file.run;
            options.update_from_arg_matches(run)?;
            **args = options;
        }
        (Command::Rebuild(args), Some(("rebuild", rebuild))) => {
            let mut options = file.run;
            options.update_from_arg_matches(rebuild)?;
            args.run = options;
        }
        _ => {}
    }
    Ok(cli)
}

/// Updates the progress line from the engine's counters while a run works: offsets the
/// checkpoints moved past, the same measure as the target (transaction markers take offsets
/// too, so counting messages read would end short of 100 %).
async fn report_progress(stats: Vec<Arc<projectionist_kafka::Stats>>, mut progress: ProgressDisplay) {
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let advanced: u64 = stats.iter().map(|s| s.advanced.load(std::sync::atomic::Ordering::Relaxed)).sum();
        progress.update(advanced);
    }
}

/// Serves /metrics, /health, /ready and (with `waits`) /wait on `addr` (default
/// [`config::DEFAULT_METRICS_ADDR`]; `off`: nothing), ready as `readiness` says.
async fn serve_metrics(
    addr: Option<&str>,
    readiness: projectionist_kafka::Readiness,
    waits: Option<http::Waits>,
) -> anyhow::Result<()> {
    let addr = addr.unwrap_or(config::DEFAULT_METRICS_ADDR);
    if addr == "off" {
        return Ok(());
    }
    let parsed = addr.parse().map_err(|_| anyhow::anyhow!("--metrics-addr {addr:?} is not host:port or off"))?;
    let handle = http::install_recorder()?;
    let served = if waits.is_some() { "/metrics, /health, /ready and /wait" } else { "/metrics, /health and /ready" };
    let bound = http::serve(parsed, handle, readiness, waits).await?;
    tracing::info!(address = %bound, "Serving {served}.");
    Ok(())
}

/// Shows a rebuild's progress (a bar on a terminal, a log line every 5 s otherwise): its
/// shadow's checkpoints, plus the offsets it has `folded` and not yet written, against the
/// high watermarks at start, counted from where it starts (a resumed rebuild's rate and ETA
/// are its own).
async fn report_rebuild(
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

/// Messages between each partition's start (checkpoint, or low watermark when replaying)
/// and its high watermark now: the run's target. `None` when the broker cannot say.
async fn progress_target(
    pool: &PgPool,
    client: &KafkaClientConfig,
    registrations: &[Registration],
    replay: bool,
) -> Option<u64> {
    let positions = status::positions(pool, client, registrations).await.ok()?;
    let start = |p: &status::Position| if replay { p.low } else { p.checkpoint.unwrap_or(p.low) };
    Some(positions.iter().map(|p| (p.high - start(p)).max(0) as u64).sum())
}

/// Pool size for commands other than `run` and `rebuild`, and for those when the broker
/// cannot say how many partitions there are.
const DEFAULT_POOL_SIZE: u32 = 8;

/// The pool size of `run` and `rebuild`: `pg_max_connections` when given, else one
/// connection per partition of the registrations' topics (each applies its batches on its
/// own) plus two, at most 64.
async fn pool_size(client: &KafkaClientConfig, registrations: &[Registration], pg_max_connections: Option<u32>) -> u32 {
    match pg_max_connections {
        Some(n) => n.max(1),
        None => partitions(client, registrations).await.map_or(DEFAULT_POOL_SIZE, |n| (n + 2).min(64)),
    }
}

/// Partitions of the registrations' topics: the most a process can be assigned.
async fn partitions(client: &KafkaClientConfig, registrations: &[Registration]) -> Option<u32> {
    let mut n = 0;
    for r in registrations {
        for topic in &r.topics {
            let (c, t) = (client.clone(), topic.clone());
            n += tokio::task::spawn_blocking(move || projectionist_kafka::topics::partitions(c, &t))
                .await
                .ok()?
                .ok()?
                .len() as u32;
        }
    }
    Some(n)
}

async fn pool(url: &Option<String>) -> anyhow::Result<PgPool> {
    pool_of(url, DEFAULT_POOL_SIZE).await
}

async fn pool_of(url: &Option<String>, max_connections: u32) -> anyhow::Result<PgPool> {
    let Some(url) = url else { bail!("no database: set DATABASE_URL or pass --database-url") };
    // The URL may hold a password: errors below never repeat it.
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    if !matches!(scheme, "postgres" | "postgresql") {
        bail!(
            "DATABASE_URL is not a PostgreSQL URL (its scheme is {scheme:?}): expected \
             postgres://USER:PASSWORD@HOST:PORT/DATABASE"
        );
    }
    let options =
        PgConnectOptions::from_str(url).map_err(|_| anyhow::anyhow!("DATABASE_URL is not a valid PostgreSQL URL"))?;
    let where_ = format!("{}:{}/{}", options.get_host(), options.get_port(), options.get_database().unwrap_or("?"));
    reachable(&options).await.map_err(|e| anyhow::anyhow!("cannot connect to PostgreSQL at {where_}: {e}"))?;
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await
        // One line, the cause said once (sqlx's errors repeat their source in Display).
        .map_err(|e| anyhow::anyhow!("cannot connect to PostgreSQL at {where_}: {}", pg_connect_reason(&e)))
}

/// Whether PostgreSQL's host answers on its port, within a few seconds: the pool keeps
/// retrying a refused connection until its acquire timeout and then says only "pool timed
/// out", so a wrong host or port is found here first, with the system's reason. (A Unix
/// socket directory is left to the pool.)
async fn reachable(options: &PgConnectOptions) -> Result<(), String> {
    const WITHIN: Duration = Duration::from_secs(5);
    let host = options.get_host();
    if host.starts_with('/') {
        return Ok(());
    }
    match tokio::time::timeout(WITHIN, tokio::net::TcpStream::connect((host, options.get_port()))).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {}s", WITHIN.as_secs())),
    }
}

fn pg_connect_reason(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Tls(inner) => format!("TLS failed (check sslmode, sslrootcert, sslcert, sslkey): {inner}"),
        other => other.to_string(),
    }
}

fn init_tracing(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(progress::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}

#[cfg(test)]
mod tests {
    fn help(args: &[&str]) -> String {
        let err = super::command().try_get_matches_from(args).expect_err("--help ends parsing");
        assert_eq!(err.kind(), clap::error::ErrorKind::DisplayHelp);
        err.render().to_string()
    }

    #[test]
    fn each_command_lists_its_own_options_first_and_kafka_ones_only_where_a_client_is_used() {
        let migrate = help(&["p", "migrate", "--help"]);
        assert!(migrate.contains("--add-columns") && migrate.contains("--database-url"), "{migrate}");
        assert!(!migrate.contains("--kafka-") && !migrate.contains("Kafka connection"), "{migrate}");
        let run = help(&["p", "run", "--help"]);
        let at = |what: &str| run.find(what).unwrap_or_else(|| panic!("{what} in {run}"));
        assert!(at("--batch-max-events") < at("--database-url"), "own options before the global ones:\n{run}");
        assert!(at("--database-url") < at("Kafka connection:"), "{run}");
        assert!(at("Kafka connection:") < at("--kafka-sasl-password"), "{run}");
        // Still accepted by migrate, e.g. from a shared environment or script.
        super::command().try_get_matches_from(["p", "--brokers", "b:1", "migrate"]).unwrap();
    }
}
