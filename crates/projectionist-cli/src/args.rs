//! The command line: its flags, subcommands and the environment variables they read, and
//! the settings file merged under them.

use std::path::PathBuf;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

use projectionist_core::format::{Format, Formats};

use crate::{config, kafka, publish};

#[derive(Parser)]
#[command(version, about = "Project versioned events from Kafka into PostgreSQL read models.")]
pub(crate) struct Cli {
    /// PostgreSQL connection URL (never printed).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, global = true, display_order = 100)]
    pub(crate) database_url: Option<String>,
    /// Settings file (TOML; `config example` prints a documented one). The command line and
    /// the environment win over it, it wins over the defaults.
    #[arg(long, env = "PROJECTIONIST_CONFIG", global = true, value_name = "FILE", display_order = 100)]
    pub(crate) config: Option<PathBuf>,
    /// Log format on stderr (level from RUST_LOG, default info).
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value = "text", global = true, display_order = 100)]
    pub(crate) log_format: LogFormat,
    /// How a topic's messages carry the envelope: `TOPIC=FORMAT`, `FORMAT` one of `envelope`
    /// (projectionist's own JSON envelope, the default), `cloudevents`, `axon` and `debezium`; repeatable. The
    /// settings file's `[topics."TOPIC"]` tables also set a format's fields.
    #[arg(long = "topic-format", value_name = "TOPIC=FORMAT", value_parser = topic_format, global = true, display_order = 100)]
    pub(crate) topic_formats: Vec<(String, Format)>,
    /// The settings file's `[topics]` tables (the flag wins for a topic).
    #[arg(skip)]
    pub(crate) file_topics: Formats,
    #[command(flatten)]
    pub(crate) registry: crate::registry::RegistryArgs,
    #[command(flatten)]
    pub(crate) traces: crate::traces::TraceArgs,
    // Last: its heading applies to the arguments after it.
    #[command(flatten)]
    pub(crate) kafka: kafka::KafkaArgs,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
pub(crate) enum Command {
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
    /// `--rollback` swaps them back, `--drop-old` removes them; `--verify` compares instead
    /// of swapping. Takes `run`'s settings.
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
pub(crate) struct RebuildArgs {
    /// Swap back the tables the last rebuild replaced (while they are kept).
    #[arg(long, conflicts_with_all = ["drop_old", "abandon"])]
    pub(crate) rollback: bool,
    /// Remove the tables the last rebuild replaced (no rollback after this).
    #[arg(long, conflicts_with = "abandon")]
    pub(crate) drop_old: bool,
    /// Remove a rebuild's tables that were never swapped in (the next one starts over).
    #[arg(long)]
    pub(crate) abandon: bool,
    /// Build the read model again from offset zero as a rebuild does, but instead of
    /// swapping it in, compare it with the live tables once both have read to the same
    /// offsets: print the rows that differ (how many per table, the first ones with both
    /// values, and the command that repairs only their aggregates) and exit with status 1
    /// when any do. The live tables are not touched. Kept when they differ, the rebuilt
    /// tables are what `rebuild` then swaps in.
    #[arg(long, conflicts_with_all = ["rollback", "drop_old", "abandon"])]
    pub(crate) verify: bool,
    /// Repair one aggregate instead of the whole read model: its rows derived again from its
    /// events alone, read from the partitions its id can be on as a key, then put in place
    /// in one transaction beside a live `run`. Repeat for several. Refused for a projection
    /// with fan-in or custom tables (rebuild it whole).
    #[arg(
        long,
        num_args = 2,
        value_names = ["TYPE", "ID"],
        action = clap::ArgAction::Append,
        conflicts_with_all = ["rollback", "drop_old", "abandon", "verify"]
    )]
    pub(crate) aggregate: Vec<String>,
    /// With --aggregate: read every partition of the topics, not only those its id can be on
    /// (the topic was repartitioned, or is keyed by something else than the aggregate id).
    #[arg(long, requires = "aggregate")]
    pub(crate) all_partitions: bool,
    #[command(flatten)]
    pub(crate) run: config::RunOptions,
}

#[derive(Subcommand)]
pub(crate) enum ParkedCommand {
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
pub(crate) enum DeadLettersCommand {
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
    /// Reclaim the space of resolved dead letters; open ones are never touched. Retried ones
    /// (and those a rebuild applied) are deleted. Discarded ones keep their record, by which a
    /// replay or rebuild skips their event again, but lose their payload (its length and
    /// SHA-256 stay).
    Purge {
        /// Only this projection's.
        #[arg(long)]
        projection: Option<String>,
        /// Only those resolved longer ago than this: `30d`, `12h`, `90m` or `45s`.
        #[arg(long, value_name = "DURATION", value_parser = age)]
        older_than: Option<std::time::Duration>,
    },
}

/// A duration as `--older-than` takes it: a whole number of days, hours, minutes or seconds
/// (`30d`, `12h`, `90m`, `45s`).
fn age(text: &str) -> Result<std::time::Duration, String> {
    let unit = |seconds: u64| text[..text.len() - 1].parse::<u64>().ok().and_then(|n| n.checked_mul(seconds));
    let seconds = match text.chars().last() {
        Some('d') => unit(86_400),
        Some('h') => unit(3_600),
        Some('m') => unit(60),
        Some('s') => unit(1),
        _ => None,
    };
    seconds.map(std::time::Duration::from_secs).ok_or_else(|| format!("{text:?}: expected e.g. 30d, 12h, 90m or 45s"))
}

#[derive(Subcommand)]
pub(crate) enum ConfigCommand {
    /// Print a settings file with every field documented and set to its default (or
    /// commented out), to save and edit: `config example > projectionist.toml`.
    Example,
    /// Print every setting, metric and HTTP endpoint as Markdown tables (docs/reference.md
    /// is this output).
    Reference,
}

/// The command line [`App`](crate::App) parses (flags, subcommands and the environment variables they
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
        [
            "from_beginning",
            "reset",
            "exit_when_caught_up",
            "console",
            "console_token",
            "console_payload",
            "console_remote",
        ]
        .into_iter()
        .fold(rebuild, |c, id| c.mut_arg(id, |a| a.hide(true)))
    };
    command.mut_subcommand("migrate", |migrate| migrate.args(kafka)).mut_subcommand("rebuild", rebuild)
}

/// Applies `--config FILE`, if given, where the command line and the environment left
/// defaults.
pub(crate) fn with_config_file(mut cli: Cli, matches: &clap::ArgMatches) -> anyhow::Result<Cli> {
    let Some(path) = &cli.config else { return Ok(cli) };
    let file = config::ConfigFile::load(path)?;
    if let Some(brokers) = &file.brokers {
        if !config::given(matches, "brokers") {
            cli.kafka.brokers = brokers.clone();
        }
    }
    cli.kafka.file_properties = file.kafka;
    cli.file_topics = file.topics;
    cli.registry.file = file.registry;
    cli.traces.file = file.traces;
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

impl Cli {
    /// How each topic's messages carry the envelope: the settings file's, the flags' over
    /// them; and the schema registry's client, if one is configured.
    pub(crate) fn formats(&self) -> anyhow::Result<Formats> {
        let mut formats = self.file_topics.clone();
        formats.extend(self.topic_formats.iter().cloned());
        Ok(match self.registry.schemas()? {
            Some(schemas) => formats.with_schemas(schemas),
            None => formats,
        })
    }
}

/// `--topic-format`'s `TOPIC=FORMAT`.
fn topic_format(arg: &str) -> Result<(String, Format), String> {
    let (topic, name) = arg.split_once('=').ok_or("expected TOPIC=FORMAT, e.g. orders=cloudevents")?;
    if topic.is_empty() {
        return Err("expected TOPIC=FORMAT: the topic is empty".into());
    }
    Ok((topic.to_owned(), Format::named(name)?))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn an_age_is_a_whole_number_and_a_unit() {
        assert_eq!(super::age("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(super::age("12h"), Ok(Duration::from_secs(12 * 3_600)));
        assert_eq!(super::age("90m"), Ok(Duration::from_secs(90 * 60)));
        assert_eq!(super::age("0s"), Ok(Duration::ZERO));
        for wrong in ["", "d", "12", "1.5h", "-1d", "3w", "99999999999999999999d", "1dé"] {
            assert!(super::age(wrong).is_err(), "{wrong:?}");
        }
    }
}
