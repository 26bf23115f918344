use super::*;
use clap::FromArgMatches;

/// `run`'s options and engine configuration from a settings file and a command line.
fn run_options(file: &str, argv: &[&str]) -> anyhow::Result<(RunOptions, EngineConfig)> {
    let path = std::env::temp_dir().join(format!("projectionist-run-{}-{}.toml", std::process::id(), argv.len()));
    std::fs::write(&path, file)?;
    let mut args = vec!["bin", "--config", path.to_str().unwrap(), "--brokers", "b:1"];
    args.extend(&argv[1..]);
    let matches = crate::command().try_get_matches_from(args)?;
    let cli = crate::with_config_file(crate::Cli::from_arg_matches(&matches)?, &matches);
    std::fs::remove_file(&path)?;
    let crate::Command::Run(options) = cli?.command else { panic!("not run") };
    let engine = options.engine_config(&KafkaClientConfig::new("b:1"))?;
    Ok((*options, engine))
}

#[test]
fn the_file_fills_what_the_command_line_does_not_give() {
    let file = "[run]\nbatch_max_events = 42\nmax_retries = 9\ngroup_instance_id = \"p-0\"\nprojections = [\"a\"]\n";
    let (options, engine) = run_options(file, &["bin", "run", "--max-retries", "3", "--from-beginning"]).unwrap();
    assert_eq!(engine.batch_max_events, 42, "from the file");
    assert_eq!(engine.max_retries, 3, "the command line wins");
    assert_eq!(engine.group_instance_id.as_deref(), Some("p-0"));
    assert!(engine.from_beginning && !engine.exit_when_caught_up);
    assert_eq!(options.projections.as_deref(), Some(&["a".to_owned()][..]));
    let (options, engine) = run_options("", &["bin", "run"]).unwrap();
    assert_eq!(engine.batch_max_events, EngineConfig::DEFAULT_BATCH_MAX_EVENTS, "default");
    assert_eq!(engine.retry_backoff_ms, EngineConfig::DEFAULT_RETRY_BACKOFF_MS);
    assert_eq!((engine.client.brokers.as_str(), options.projections), ("b:1", None));
}

#[test]
fn a_projections_own_settings_come_from_the_file_and_the_command_line() {
    let file = "[run]\non_gap = \"park\"\nmax_dead_letters = 5\n[run.per_projection.a]\non_gap = \"halt\"\n\
                max_held_per_aggregate = 7\nmax_dead_letter_bytes = 100\n";
    let argv = [
        "bin",
        "run",
        "--projection-setting",
        "a.max_held_per_aggregate=9",
        "--projection-setting",
        "b.on_poison=halt",
        "--projection-setting",
        "b.dead_letter_payload_max_bytes=64",
    ];
    let (_, engine) = run_options(file, &argv).unwrap();
    let a = engine.for_projection("a");
    assert_eq!((a.on_gap, a.max_held_per_aggregate), (OnGap::Halt, 9), "the command line wins");
    assert_eq!(a.on_poison, OnPoison::DeadLetter, "the engine's where unset");
    let b = engine.for_projection("b");
    assert_eq!((b.on_gap, b.on_poison), (OnGap::Park, OnPoison::Halt));
    assert_eq!((a.max_dead_letters, a.max_dead_letter_bytes), (5, 100), "the engine's, and its own");
    let bytes = EngineConfig::DEFAULT_MAX_DEAD_LETTER_BYTES;
    assert_eq!((b.max_dead_letter_bytes, b.dead_letter_payload_max_bytes), (bytes, Some(64)));
    let err = run_options("", &["bin", "run", "--projection-setting", "a.on_gapp=halt"]).err().unwrap();
    assert!(format!("{err:#}").contains("unknown field `on_gapp`"), "{err:#}");
    assert!(run_options("", &["bin", "run", "--projection-setting", "on_gap=halt"]).is_err());
}

#[test]
fn topic_formats_come_from_the_file_and_the_command_line() {
    use projectionist_core::format::Format;
    let file =
        "[topics.orders]\nformat = \"cloudevents\"\nversion = \"seq\"\n[topics.payments]\nformat = \"cloudevents\"\n";
    let path = std::env::temp_dir().join(format!("projectionist-topics-{}.toml", std::process::id()));
    std::fs::write(&path, file).unwrap();
    let argv = ["bin", "--config", path.to_str().unwrap(), "--topic-format", "payments=envelope", "status"];
    let matches = crate::command().try_get_matches_from(argv).unwrap();
    let cli = crate::with_config_file(crate::Cli::from_arg_matches(&matches).unwrap(), &matches).unwrap();
    std::fs::remove_file(&path).unwrap();
    let formats = cli.formats().unwrap();
    let Format::CloudEvents(orders) = formats.of("orders") else { panic!("{formats:?}") };
    assert_eq!(orders.version, "seq", "the file's fields");
    assert_eq!(formats.of("payments"), &Format::Envelope, "the command line wins");
    let bad = crate::command().try_get_matches_from(["bin", "--topic-format", "orders=avro", "status"]);
    assert!(bad.unwrap_err().to_string().contains("envelope, cloudevents, axon or debezium"));
}

#[test]
fn help_shows_the_engines_defaults() {
    let mut command = crate::command();
    let help = command.find_subcommand_mut("run").unwrap().render_long_help().to_string();
    for default in [
        format!("[default: {}]", EngineConfig::DEFAULT_BATCH_MAX_EVENTS),
        format!("[default: {}]", EngineConfig::DEFAULT_RETRY_BACKOFF_MS),
        format!("[default: {DEFAULT_METRICS_ADDR}]"),
    ] {
        assert!(help.contains(&default), "{default} not in:\n{help}");
    }
}

#[test]
fn the_files_kafka_properties_reach_every_client_below_the_command_line() {
    let file = "brokers = \"file:9092\"\n[kafka]\n\"client.rack\" = \"a\"\n\"client.id\" = \"from-file\"\n";
    let path = std::env::temp_dir().join(format!("projectionist-config-{}.toml", std::process::id()));
    std::fs::write(&path, file).unwrap();
    let argv = ["bin", "--config", path.to_str().unwrap(), "--kafka-property", "client.rack=b", "status"];
    let matches = crate::command().try_get_matches_from(argv).unwrap();
    let cli = crate::with_config_file(crate::Cli::from_arg_matches(&matches).unwrap(), &matches).unwrap();
    std::fs::remove_file(&path).unwrap();
    let client = cli.kafka.client().client_config();
    assert_eq!(client.get("client.rack"), Some("b"), "the command line wins");
    assert_eq!(client.get("client.id"), Some("from-file"));
    if std::env::var_os("KAFKA_BROKERS").is_none() {
        assert_eq!(cli.kafka.brokers, "file:9092", "the file wins over the default");
    }
}

#[test]
fn unknown_fields_are_rejected_by_name_and_line() {
    let err = load_error("[run]\nbatch_max_event = 1\n");
    assert!(err.contains("unknown field `batch_max_event`") && err.contains("line 2"), "{err}");
    let err = load_error("broker = \"x\"\n");
    assert!(err.contains("unknown field `broker`"), "{err}");
    let err = load_error("[run]\nreset = true\n");
    assert!(err.contains("unknown field `reset`"), "a reset is asked for on the command line only: {err}");
}

/// The settings that may hold a secret: the `[kafka]` table's (librdkafka's and those a
/// Java client's file would bring) and `brokers` (a URL may hold a password).
const SECRET_KEYS: &[&str] = &[
    "sasl.password",
    "ssl.key.password",
    "ssl.keystore.password",
    "ssl.truststore.password",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.config",
    "sasl.oauthbearer.extensions",
    "sasl.jaas.config",
    "ssl.key.pem",
    "ssl_key",
];

/// Files that do not parse, each with `SECRET` where the secret stands.
const BROKEN: &[&str] = &[
    "[kafka]\n\"KEY\" = SECRET\n",
    "[kafka]\n\"KEY\": \"SECRET\"\n",
    "[kafka]\n\"KEY\" = \"SECRET\n",
    "[kafka]\n\"KEY\" = 'SECRET\n",
    "[kafka]\n\"KEY\" = \"SE\\qCRET\"\n",
    "[kafka]\n\"KEY\" = \"\"\"\nrequired\npassword=\"SE\\qCRET\";\n\"\"\"\n",
    "[kafka]\n\"KEY\" = 4242SECRET\n",
    "[kafka]\n\"KEY\" = \"SECRET\"\n\"KEY\" = \"SECRET\"\n",
    "[kafka]\n\"KEY\" = 4242\n",
    "[kafka]\n\"KEY\" = [\"SECRET\"]\n",
    "[kafka]\n\"KEY\" = { v = \"SECRET\" }\n",
    "kafka = \"SECRET\"\n",
    "[kafka]\n\"KEY\" = \"SECRET\" x\n",
];

/// `text`'s error as `--config` reports it.
fn load_error(text: &str) -> String {
    static FILES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = FILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("projectionist-error-{}-{n}.toml", std::process::id()));
    std::fs::write(&path, text).unwrap();
    let err = ConfigFile::load(&path).err().map(|e| format!("{e:#}"));
    std::fs::remove_file(&path).unwrap();
    err.unwrap_or_else(|| panic!("{text:?} parsed"))
}

#[test]
fn a_settings_files_errors_name_the_setting_never_its_value() {
    for key in SECRET_KEYS {
        for broken in BROKEN {
            let text = broken.replace("KEY", key).replace("SECRET", "Sw0rdf1sh-file");
            let err = load_error(&text);
            assert!(!err.contains("Sw0rdf1sh") && !err.contains("4242"), "{text:?} echoed its value: {err}");
            assert!(err.contains("line "), "{text:?}: no line in {err}");
            assert!(err.contains(key) || !broken.contains("KEY"), "{text:?}: {key} not named in {err}");
        }
    }
    let err = load_error("brokers = \"SASL://u:Sw0rdf1sh-file@b:9092\" x\n");
    assert!(!err.contains("Sw0rdf1sh") && err.contains("`brokers`"), "{err}");
    let err = load_error("brokers = 4242\n");
    assert!(!err.contains("4242") && err.contains("brokers"), "{err}");
    let err = load_error("[run]\non_gap = \"Sw0rdf1sh-file\"\n");
    assert!(!err.contains("Sw0rdf1sh") && err.contains("on_gap") && err.contains("unknown variant"), "{err}");
}
