//! The settings file `config example` prints, generated from the one schema: `run`'s options
//! (their help, flags and environment variables, as `--help` shows them) and the engine's
//! defaults. `examples/projectionist.toml` is this text; a test keeps it so.

use clap::CommandFactory;

use super::{ConfigFile, RunOptions};

/// What the file says before `run`'s options: how it is read, and the connection.
const HEAD: &str = r#"# Settings for a projector binary (`bank-accounts --config projectionist.toml run`); the
# binary prints this file with `config example`, generated from its options.
# Every field is optional; unknown fields are rejected. The command line and the environment
# win over this file, and this file over the built-in defaults shown here.

# Kafka bootstrap servers (--brokers, KAFKA_BROKERS).
brokers = "localhost:9092"

# librdkafka properties for every Kafka client (--kafka-property KEY=VALUE wins for a key).
# Keep secrets out of files kept in a repository: pass them in the environment instead
# (KAFKA_SASL_PASSWORD, KAFKA_SSL_KEY_PASSWORD, DATABASE_URL).
[kafka]
# "client.rack" = "eu-west-1a"
# "security.protocol" = "SASL_SSL"
# "sasl.mechanism" = "SCRAM-SHA-512"

[run]
"#;

/// A value to show, commented out, for the options without a default.
const SAMPLES: &[(&str, &str)] = &[
    ("projections", r#"["bank_accounts"]"#),
    ("group_id", r#""projectionist""#),
    ("group_instance_id", r#""projector-0""#),
    ("dead_letter_payload_max_bytes", "1048576"),
    ("dead_letter_topic", r#""projectionist.dead-letters""#),
    ("pg_max_connections", "16"),
];

/// The settings file with every field the file takes, each with its help and set to its
/// default (or commented out, with a sample value, when it has none).
pub(crate) fn example() -> String {
    let command = crate::args::Cli::command();
    let run = command.find_subcommand("run").expect("a run command");
    let defaults = RunOptions::defaults();
    let mut out = HEAD.to_owned();
    let mut per_projection = None;
    for arg in run.get_arguments().filter(|arg| in_the_file(arg.get_id().as_str())) {
        let id = arg.get_id().as_str();
        let help = arg.get_long_help().or(arg.get_help()).map(ToString::to_string).unwrap_or_default();
        let mut flags = vec![format!("--{}", arg.get_long().unwrap_or(id))];
        flags.extend(arg.get_env().map(|env| env.to_string_lossy().into_owned()));
        let said = format!("{} ({})", help.trim_end_matches('.'), flags.join(", "));
        if id == "projection_settings" {
            per_projection = Some(said);
            continue;
        }
        comment(&mut out, &said);
        match defaults.get(id) {
            Some(value) => out.push_str(&format!("{id} = {value}\n")),
            None => {
                let sample = SAMPLES.iter().find(|(key, _)| *key == id).map_or("…", |(_, sample)| sample);
                out.push_str(&format!("# {id} = {sample}\n"));
            }
        }
    }
    // A table: after every key of `[run]`.
    if let Some(said) = per_projection {
        comment(&mut out, &said);
        out.push_str("# [run.per_projection.order_status]\n# on_gap = \"halt\"\n");
    }
    out.push_str(TOPICS);
    out
}

/// The `[topics]` tables: how a topic's messages carry the envelope.
const TOPICS: &str = r#"
# How a topic's messages carry the envelope (--topic-format TOPIC=FORMAT wins for a topic).
# A topic not listed carries projectionist's own JSON envelope ("envelope"). CloudEvents, in
# structured or binary mode, names the attributes that hold the aggregate's id (without it:
# the message key), type and version; these are the defaults:
# [topics."orders"]
# format = "cloudevents"
# aggregate_id = "subject"
# aggregate_type = "aggregatetype"
# version = "sequence"
# Axon Framework's Kafka messages; the event type is the payload's simple class name, or
# its full name with event_type = "full":
# [topics."bank-events"]
# format = "axon"
# event_type = "simple"
# Debezium's outbox event router: the aggregate id as the key, the payload as the value, the
# event id in the header "id", the rest where table.fields.additional.placement puts it;
# these are the defaults (add a version column to the outbox table and place it):
# [topics."outbox.events"]
# format = "debezium"
# id = "header:id"
# aggregate_id = "key"
# aggregate_type = "header:aggregateType"
# version = "header:version"
# type = "header:eventType"
# occurred_at = "header:occurredAt"
# data = "value"
# Each field where you say (key, header:NAME, value, value:/json/pointer, const:TEXT):
# [topics."orders.outbox"]
# format = "mapped"
# id = "header:id"
# aggregate_id = "key"
# aggregate_type = "const:order"
# version = "value:/version"
# type = "header:eventType"
# occurred_at = "value:/occurred_at"
# data = "value:/payload"

# The schema registry of keys and values in Confluent's wire format (Avro, Protobuf, JSON
# Schema), read into JSON with the writer's schema; off unless a URL is given (the
# --schema-registry-* options win). Keep the password in the environment
# (SCHEMA_REGISTRY_PASSWORD), not in this file.
# [registry]
# url = "http://127.0.0.1:8081"
# username = "api-key"
# ca_file = "/etc/ssl/registry-ca.pem"
# client_identity_file = "/etc/ssl/registry-client.pem"
# timeout_ms = 10000

# Traces over OTLP to an OpenTelemetry collector: one span per batch, linked to the
# producers' traces; off unless an endpoint is given. OpenTelemetry's environment
# (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER, ...) and the --otlp-*
# options win.
# [traces]
# endpoint = "http://127.0.0.1:4317"
# protocol = "grpc"            # or "http/protobuf" (the default, port 4318)
# service_name = "bank-accounts"
# sample_ratio = 0.01
# queue_size = 2048
"#;

/// Whether the file takes the option `id` (the command line's own, such as `--reset`, are
/// refused there by name).
pub(crate) fn in_the_file(id: &str) -> bool {
    let key = if id == "projection_settings" { "per_projection" } else { id };
    match toml::from_str::<ConfigFile>(&format!("[run]\n{key} = 1\n")) {
        Ok(_) => true,
        Err(e) => !e.to_string().contains("unknown field"),
    }
}

/// `text` as comment lines of at most 92 columns.
fn comment(out: &mut String, text: &str) {
    let mut line = String::from("#");
    for word in text.split_whitespace() {
        if line.len() + 1 + word.len() > 92 && line.len() > 1 {
            out.push_str(&line);
            out.push('\n');
            line = String::from("#");
        }
        line.push(' ');
        line.push_str(word);
    }
    out.push_str(&line);
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use projectionist_kafka::{EngineConfig, KafkaClientConfig};

    use super::*;

    /// `examples/projectionist.toml` is what `config example` prints: regenerate it with
    /// `cargo run -p bank-accounts --bin bank-accounts -- config example > examples/projectionist.toml`.
    #[test]
    fn the_example_file_is_the_generated_one() {
        let file = include_str!("../../../../examples/projectionist.toml");
        assert!(
            file == example(),
            "examples/projectionist.toml differs from `config example`: regenerate it with `cargo run -p \
             bank-accounts -- config example > examples/projectionist.toml`"
        );
    }

    /// Every option the file takes is in it, and every default it shows is the engine's.
    #[test]
    fn the_example_names_every_option_with_its_default() {
        let text = example();
        let run = crate::args::Cli::command();
        let run = run.find_subcommand("run").unwrap();
        let mut named = 0;
        for id in run.get_arguments().map(|a| a.get_id().as_str()).filter(|id| in_the_file(id)) {
            let key = if id == "projection_settings" { "per_projection" } else { id };
            let shown = text.lines().any(|l| {
                let l = l.trim_start_matches("# ").trim_start_matches("[run.");
                l.starts_with(&format!("{key} = ")) || l.starts_with(&format!("{key}."))
            });
            assert!(shown, "the example does not show `{key}`");
            named += 1;
        }
        assert!(named >= 15, "only {named} options of run's found in the example");
        for (id, default) in RunOptions::defaults() {
            let line = format!("{id} = {default}");
            assert!(text.lines().any(|l| l == line), "the example should say `{line}`");
        }
        assert!(!text.contains("# reset") && !text.contains("from_beginning"), "the command line's own options");
    }

    #[test]
    fn the_example_is_valid() {
        let file: ConfigFile = toml::from_str(&example()).unwrap();
        assert!(file.brokers.is_some() && file.run.batch_max_events.is_some());
        let engine = file.run.engine_config(&KafkaClientConfig::new("b:1")).unwrap();
        assert_eq!(engine.batch_max_events, EngineConfig::DEFAULT_BATCH_MAX_EVENTS, "the file shows the defaults");
        let Err(err) = ConfigFile::load(Path::new("/nonexistent/projectionist.toml")) else { panic!("loaded") };
        assert!(format!("{err:#}").contains("/nonexistent/projectionist.toml"), "{err:#}");
    }
}
