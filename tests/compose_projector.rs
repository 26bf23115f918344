//! The projector service of docker-compose.yml, checked by behaviour without Docker: its
//! `command` and `environment` are handed to the CLI's own argument parser, which must
//! accept every invocation and take every variable (a renamed variable would otherwise be
//! ignored silently in the container).
//!
//! clap reads `env = "..."` values from the process environment, so this binary sets the
//! service's environment on its own process: it holds this one test only, and nothing else
//! reads the environment meanwhile.

use std::collections::BTreeMap;

use clap::parser::ValueSource;
use clap::{ArgMatches, Command};

/// Variables the projector reads outside the argument parser: the log filter's (checked on
/// its own below), and the traces exporter's, read as OpenTelemetry defines them
/// (projectionist-cli's `traces` module and its tests).
const NOT_CLAP: &[&str] = &["RUST_LOG", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL"];

fn compose_projector() -> serde_yaml::Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docker-compose.yml");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let compose: serde_yaml::Value = serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    compose["services"]["projector"].clone()
}

/// The CLI invocations of the service's `command` (`sh -c 'a && b && exec c'`).
fn invocations(service: &serde_yaml::Value) -> Vec<Vec<String>> {
    let command: Vec<&str> = service["command"]
        .as_sequence()
        .expect("projector.command is a list")
        .iter()
        .map(|s| s.as_str().expect("a string"))
        .collect();
    let [sh, "-c", script] = command[..] else { panic!("projector.command is not sh -c SCRIPT: {command:?}") };
    assert_eq!(sh, "sh");
    assert!(!script.contains(['\'', '"', '$', ';', '|']), "a script this test can split: {script}");
    script
        .split("&&")
        .map(|step| {
            let words: Vec<String> = step.split_whitespace().map(String::from).collect();
            match words.split_first() {
                Some((exec, rest)) if exec == "exec" => rest.to_vec(),
                _ => words,
            }
        })
        .collect()
}

/// Every variable the parser took from the environment for `matches`, with its value.
fn taken_from_env(command: &Command, matches: &ArgMatches, taken: &mut BTreeMap<String, String>) {
    for arg in command.get_arguments() {
        let (Some(var), id) = (arg.get_env(), arg.get_id().as_str()) else { continue };
        if matches.value_source(id) == Some(ValueSource::EnvVariable) {
            let values: Vec<String> =
                matches.get_raw(id).into_iter().flatten().map(|v| v.to_string_lossy().into_owned()).collect();
            taken.insert(var.to_string_lossy().into_owned(), values.join(","));
        }
    }
    if let Some((name, sub)) = matches.subcommand() {
        taken_from_env(command.find_subcommand(name).expect("matched subcommand"), sub, taken);
    }
}

/// Every variable any argument of `command` or its subcommands reads.
fn read_by_parser(command: &Command, vars: &mut Vec<String>) {
    vars.extend(command.get_arguments().filter_map(|a| a.get_env()).map(|v| v.to_string_lossy().into_owned()));
    for sub in command.get_subcommands() {
        read_by_parser(sub, vars);
    }
}

#[test]
fn the_projector_service_command_and_environment_are_accepted_by_the_cli() {
    let service = compose_projector();
    let environment: BTreeMap<String, String> = service["environment"]
        .as_mapping()
        .expect("projector.environment is a map")
        .iter()
        .map(|(k, v)| (k.as_str().expect("a name").to_owned(), v.as_str().expect("a string value").to_owned()))
        .collect();

    // The container's environment only: nothing the parser reads may come from this machine's.
    let mut known = Vec::new();
    read_by_parser(&projectionist::cli::command(), &mut known);
    for var in known {
        std::env::remove_var(var);
    }
    for (var, value) in &environment {
        std::env::set_var(var, value);
    }

    let invocations = invocations(&service);
    let subcommands: Vec<&str> = invocations.iter().map(|i| i.get(1).map_or("", String::as_str)).collect();
    assert_eq!(subcommands, ["migrate", "create-topics", "run"], "what the projector runs");
    let mut taken = BTreeMap::new();
    for args in &invocations {
        // The binary the image installs (examples/bank-accounts/Dockerfile) under this name.
        assert_eq!(args[0], "bank-accounts", "{args:?}");
        let mut command = projectionist::cli::command();
        let matches = command.try_get_matches_from_mut(args).unwrap_or_else(|e| panic!("{args:?}:\n{e}"));
        taken_from_env(&command, &matches, &mut taken);
    }

    for (var, value) in &environment {
        if NOT_CLAP.contains(&var.as_str()) {
            continue;
        }
        assert_eq!(taken.get(var), Some(value), "the projector's CLI takes {var}={value} from the environment");
    }
    // RUST_LOG goes to the log filter.
    if let Some(filter) = environment.get("RUST_LOG") {
        tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|e| panic!("RUST_LOG={filter}: {e}"));
    }
}
