//! docker-compose.yml (no Docker engine runs on our machines): its syntax checked against
//! the compose specification by the `compose_spec` crate, its ports and names against the
//! local services script, and its dashboard against the metrics the engine declares. The
//! projector's command and environment go through the CLI's parser in
//! `tests/compose_projector.rs`.

use std::collections::BTreeSet;

use compose_spec::Compose;

fn read(path: &str) -> String {
    std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn yaml(path: &str) -> serde_yaml::Value {
    serde_yaml::from_str(&read(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn the_compose_file_follows_the_compose_specification() {
    let compose: Compose =
        serde_yaml::from_str(&read("docker-compose.yml")).unwrap_or_else(|e| panic!("docker-compose.yml: {e}"));
    let names: BTreeSet<String> = compose.services.keys().map(|k| k.to_string()).collect();
    let want: BTreeSet<String> =
        ["grafana", "jaeger", "kafka", "postgres", "projector", "prometheus"].map(String::from).into();
    assert_eq!(names, want);
}

#[test]
fn the_compose_file_agrees_with_the_local_services_and_prometheus() {
    let compose = yaml("docker-compose.yml");
    let services = read("scripts/services.sh");
    let svc = |name: &str| compose["services"][name].clone();
    let env = |name: &str, key: &str| {
        svc(name)["environment"][key].as_str().unwrap_or_else(|| panic!("{name}.{key}")).to_owned()
    };
    let ports = |name: &str| {
        svc(name)["ports"].as_sequence().unwrap().iter().map(|p| p.as_str().unwrap().to_owned()).collect::<Vec<_>>()
    };

    // Same ports as scripts/services.sh.
    assert!(services.contains("KAFKA_PORT=${KAFKA_PORT:-9092}") && ports("kafka") == ["127.0.0.1:9092:9092"]);
    assert!(services.contains("PG_PORT=${PG_PORT:-5432}") && ports("postgres") == ["127.0.0.1:5432:5432"]);
    // Published on loopback only: /wait reveals checkpoints and versions, the password is known.
    for name in ["grafana", "kafka", "postgres", "projector", "prometheus"] {
        for port in ports(name) {
            assert!(port.starts_with("127.0.0.1:"), "{name} publishes {port} beyond loopback");
        }
    }
    // Same role, password and database.
    assert!(services.contains("PG_USER=projectionist") && services.contains("PG_DB=projectionist"));
    for key in ["POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB"] {
        assert_eq!(env("postgres", key), "projectionist", "{key}");
    }
    assert_eq!(env("projector", "DATABASE_URL"), "postgres://projectionist:projectionist@postgres:5432/projectionist");
    // Kafka advertises the same address the local broker uses, and transactions work on one broker.
    assert!(env("kafka", "KAFKA_ADVERTISED_LISTENERS").contains("EXTERNAL://127.0.0.1:9092"));
    assert!(services.contains("KAFKA_HOST=127.0.0.1"));
    assert_eq!(env("kafka", "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"), "1");
    assert_eq!(env("kafka", "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"), "1");
    assert!(env("kafka", "KAFKA_PROCESS_ROLES").contains("controller"), "KRaft mode");
    // The projector reaches Kafka's internal listener, and serves metrics where Prometheus
    // scrapes (that the CLI takes these variables: tests/compose_projector.rs).
    assert_eq!(env("projector", "KAFKA_BROKERS"), "kafka:19092");
    assert!(env("kafka", "KAFKA_LISTENERS").contains("INTERNAL://:19092"));
    assert_eq!(env("projector", "PROJECTIONIST_METRICS_ADDR"), "0.0.0.0:9464");
    // Traces go to the compose file's Jaeger, over gRPC on the port scripts/services.sh's has.
    assert_eq!(env("projector", "OTEL_EXPORTER_OTLP_ENDPOINT"), "http://jaeger:4317");
    assert_eq!(env("projector", "OTEL_EXPORTER_OTLP_PROTOCOL"), "grpc");
    assert!(read("scripts/services/jaeger.sh").contains("OTLP_GRPC_ENDPOINT=http://$KAFKA_HOST:4317"));
    assert!(ports("jaeger").contains(&"127.0.0.1:4317:4317".to_owned()));
    let prometheus = yaml("deploy/prometheus/prometheus.yml");
    assert_eq!(prometheus["scrape_configs"][0]["static_configs"][0]["targets"][0].as_str(), Some("projector:9464"));
    // Mounted files exist.
    for volume in svc("grafana")["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .chain(svc("prometheus")["volumes"].as_sequence().unwrap())
    {
        let host = volume.as_str().unwrap().split(':').next().unwrap().trim_start_matches("./");
        assert!(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(host).exists(), "{host}");
    }
    assert!(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/bank-accounts/Dockerfile").exists());
}

/// Collects the names of the metrics described to it.
#[derive(Default)]
struct Described(std::sync::Mutex<BTreeSet<String>>);

impl Described {
    fn add(&self, key: metrics::KeyName) {
        self.0.lock().unwrap().insert(key.as_str().to_owned());
    }
}

impl metrics::Recorder for Described {
    fn describe_counter(&self, key: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {
        self.add(key)
    }
    fn describe_gauge(&self, key: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {
        self.add(key)
    }
    fn describe_histogram(&self, key: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {
        self.add(key)
    }
    fn register_counter(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::noop()
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

#[test]
fn the_dashboard_only_charts_metrics_the_engine_declares() {
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("deploy/grafana/dashboards/projectionist.json")).unwrap();
    // What the engine describes to the installed recorder when `run` serves /metrics.
    let described = Described::default();
    metrics::with_local_recorder(&described, projectionist::kafka::metrics::describe);
    let declared = described.0.into_inner().unwrap();
    assert!(declared.contains("projectionist_events_applied_total"), "{declared:?}");
    let mut charted = BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            for word in expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("projectionist_"))
            {
                let base = word.trim_end_matches("_bucket").to_owned();
                assert!(declared.contains(&base), "dashboard charts {base}, which the engine does not declare");
                charted.insert(base);
            }
        }
    }
    for needed in [
        "projectionist_consumer_lag_messages",
        "projectionist_events_applied_total",
        "projectionist_events_skipped_total",
        "projectionist_events_ignored_total",
        "projectionist_aggregates_parked",
        "projectionist_events_held",
        "projectionist_dead_letters_total",
        "projectionist_batch_duration_seconds",
        "projectionist_trace_spans_dropped_total",
        "projectionist_console_actions_total",
    ] {
        assert!(charted.contains(needed), "the dashboard shows {needed}");
    }
}

#[test]
fn the_validator_rejects_what_compose_would() {
    let bad = [
        "services:\n  a:\n    image: x\n    portz: [\"1:1\"]\n",
        "services:\n  a:\n    image: x\n    ports: [\"not a port\"]\n",
        "services:\n  a:\n    image: x\n    depends_on:\n      b:\n        condition: service_sleepy\n",
    ];
    for text in bad {
        assert!(serde_yaml::from_str::<Compose>(text).is_err(), "accepted:\n{text}");
    }
}
