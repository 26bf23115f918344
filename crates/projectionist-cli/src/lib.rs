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

mod args;
mod config;
mod console;
mod held;
mod http;
mod kafka;
mod pool;
mod progress;
mod publish;
mod rebuild;
mod reference;
mod registry;
mod repair;
mod run;
mod status;
mod traces;
mod unechoed;

use std::ffi::OsString;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::bail;
use clap::FromArgMatches;
use projectionist_kafka::{EngineConfig, Registration};
use projectionist_postgres::PgProjection;

pub use args::command;
use args::{with_config_file, Cli, Command, ConfigCommand, LogFormat};

/// A projection binary's command line.
pub struct App {
    name: &'static str,
    registrations: Vec<Registration>,
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
                eprintln!("error: {}", one_line(&e));
                return ExitCode::FAILURE;
            }
        };
        let exporting = match init_tracing(cli.log_format, &cli.traces, self.name) {
            Ok(exporting) => exporting,
            Err(e) => {
                eprintln!("error: {}", one_line(&e));
                return ExitCode::FAILURE;
            }
        };
        let code = match self.execute(cli).await {
            Ok(code) => code,
            Err(e) => {
                eprintln!("error: {}", one_line(&e));
                ExitCode::FAILURE
            }
        };
        if let Some(exporting) = exporting {
            exporting.shutdown().await;
        }
        code
    }

    async fn execute(mut self, cli: Cli) -> anyhow::Result<ExitCode> {
        let client = cli.kafka.client();
        // Each projection reads its topics as they are said to carry the envelope: in `run`
        // and `rebuild`, and where a held event or a dead letter is read again.
        let formats = cli.formats()?;
        for r in &mut self.registrations {
            r.projection = projectionist_postgres::Formatted::wrap(r.projection.clone(), &formats);
        }
        // `run` takes a stop from its first moments (see `run::Signals`).
        let signals = matches!(cli.command, Command::Run(_)).then(run::Signals::listen).transpose()?;
        let postgres_only = matches!(cli.command, Command::Parked { .. } | Command::DeadLetters(_));
        if !matches!(cli.command, Command::Migrate { .. } | Command::Config(_)) && !postgres_only {
            cli.kafka.preflight(&client).await?;
        }
        match cli.command {
            Command::Migrate { add_columns } => {
                let pool = pool::open(&cli.database_url).await?;
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
            Command::Run(args) => {
                let signals = signals.map_or_else(run::Signals::listen, Ok)?;
                return self.run(&cli.database_url, client, *args, signals).await;
            }
            Command::Rebuild(args) => return self.rebuild(&cli.database_url, client, *args).await,
            Command::Publish(args) => return publish::publish(&client, args).await,
            Command::Config(ConfigCommand::Example) => print!("{}", config::example()),
            Command::Config(ConfigCommand::Reference) => print!("{}", reference::page()),
            Command::Status => {
                let pool = pool::open(&cli.database_url).await?;
                status::print(&pool, &client, &self.registrations).await?;
            }
            Command::Parked { projection, json, action } => {
                self.parked(&pool::open(&cli.database_url).await?, projection, json, action).await?
            }
            Command::DeadLetters(command) => self.dead_letters(&pool::open(&cli.database_url).await?, command).await?,
        }
        Ok(ExitCode::SUCCESS)
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
}

/// `e` and its causes on one line, as `{e:#}` prints them, without a cause whose text the
/// line already holds (an error that says its source in its own message would otherwise
/// read twice).
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
    }
    line
}

/// The log on stderr (its level from `RUST_LOG`) and, when configured, traces over OTLP
/// (the engine's spans at `info`, whatever the log's level, and warnings of other crates).
fn init_tracing(
    format: LogFormat,
    traces: &traces::TraceArgs,
    binary: &str,
) -> anyhow::Result<Option<traces::Exporting>> {
    use std::io::IsTerminal;
    use tracing::level_filters::LevelFilter;
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::prelude::*;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    let log = tracing_subscriber::fmt::layer().with_writer(progress::stderr).with_ansi(std::io::stderr().is_terminal());
    let log = match format {
        LogFormat::Text => log.boxed(),
        LogFormat::Json => log.json().boxed(),
    };
    let (exporting, export) = match traces.resolve(|name| std::env::var(name).ok(), binary)? {
        Some(traces) => {
            let (exporting, layer) = traces.start()?;
            let ours = Targets::new().with_default(LevelFilter::WARN).with_target("projectionist", LevelFilter::INFO);
            (Some(exporting), Some(layer.with_filter(ours)))
        }
        None => (None, None),
    };
    let _ = tracing_subscriber::registry().with(log.with_filter(filter)).with(export).try_init();
    Ok(exporting)
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_error_reads_once_with_the_causes_it_does_not_already_say() {
        let rebuild =
            projectionist_postgres::RebuildError { projection: "p".into(), problem: "kept in schema old".into() };
        let e = anyhow::Error::new(projectionist_kafka::Error::from(projectionist_postgres::Error::from(rebuild)));
        assert_eq!(super::one_line(&e), "rebuild of projection p: kept in schema old");
        // A message that already says its cause: the cause is not said again.
        let e = anyhow::Error::new(std::io::Error::other("refused")).context("cannot connect: refused");
        assert_eq!(super::one_line(&e), "cannot connect: refused");
        let e = anyhow::Error::new(std::io::Error::other("refused")).context("cannot connect").context("migrate");
        assert_eq!(super::one_line(&e), "migrate: cannot connect: refused");
    }

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
