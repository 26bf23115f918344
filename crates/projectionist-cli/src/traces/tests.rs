use std::collections::HashMap;

use opentelemetry_otlp::Protocol;

use super::{TraceArgs, Traces, TracesConfig};

fn resolve(args: &TraceArgs, env: &[(&str, &str)]) -> anyhow::Result<Option<Traces>> {
    let env: HashMap<String, String> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    args.resolve(|name| env.get(name).cloned(), "bank-accounts")
}

#[test]
fn off_unless_an_endpoint_is_configured_and_off_when_opentelemetry_says_so() {
    assert_eq!(resolve(&TraceArgs::default(), &[]).unwrap(), None);
    let on = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")];
    assert!(resolve(&TraceArgs::default(), &on).unwrap().is_some());
    for off in [("OTEL_SDK_DISABLED", "true"), ("OTEL_TRACES_EXPORTER", "none")] {
        assert_eq!(resolve(&TraceArgs::default(), &[on[0], off]).unwrap(), None, "{off:?}");
    }
}

#[test]
fn a_base_url_gets_the_traces_path_over_http_and_the_traces_own_url_is_kept() {
    let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/")];
    let traces = resolve(&TraceArgs::default(), &env).unwrap().unwrap();
    assert_eq!((traces.endpoint.as_str(), traces.protocol), ("http://c:4318/v1/traces", Protocol::HttpBinary));
    let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t/x")];
    assert_eq!(resolve(&TraceArgs::default(), &env).unwrap().unwrap().endpoint, "http://t/x");
    let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")];
    let traces = resolve(&TraceArgs::default(), &env).unwrap().unwrap();
    assert_eq!((traces.endpoint.as_str(), traces.protocol), ("http://c:4317", Protocol::Grpc));
}

#[test]
fn the_flags_win_over_the_environment_which_wins_over_the_file() {
    let file = TracesConfig {
        endpoint: Some("http://file:4317".into()),
        protocol: Some("grpc".into()),
        service_name: Some("from-file".into()),
        sample_ratio: Some(0.5),
        queue_size: Some(10),
    };
    let args = TraceArgs { file: Some(file), ..TraceArgs::default() };
    let traces = resolve(&args, &[]).unwrap().unwrap();
    assert_eq!(
        traces,
        Traces {
            endpoint: "http://file:4317".into(),
            protocol: Protocol::Grpc,
            service_name: Some("from-file".into()),
            sample_ratio: Some(0.5),
            queue_size: 10,
        }
    );
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ("OTEL_SERVICE_NAME", "from-env"),
        ("OTEL_TRACES_SAMPLER", "always_off"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "7"),
    ];
    let traces = resolve(&args, &env).unwrap().unwrap();
    assert_eq!(traces.endpoint, "http://env:4318/v1/traces");
    assert_eq!((traces.service_name, traces.sample_ratio, traces.queue_size), (None, None, 7), "the SDK reads them");
    let flags = TraceArgs {
        otlp_endpoint: Some("http://flag:4317".into()),
        otlp_protocol: Some("grpc".into()),
        trace_sample_ratio: Some(0.01),
        ..args
    };
    let traces = resolve(&flags, &env).unwrap().unwrap();
    assert_eq!((traces.endpoint.as_str(), traces.protocol), ("http://flag:4317", Protocol::Grpc));
    assert_eq!(traces.sample_ratio, Some(0.01));
    let binary = resolve(&TraceArgs::default(), &[env[0]]).unwrap().unwrap();
    assert_eq!(binary.service_name.as_deref(), Some("bank-accounts"), "the binary's name by default");
}

#[test]
fn a_setting_that_is_not_valid_is_named() {
    let on = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318");
    let e = resolve(&TraceArgs::default(), &[on, ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")]).unwrap_err();
    assert!(e.to_string().contains("\"http/json\"") && e.to_string().contains("grpc"), "{e}");
    let ratio = TraceArgs { trace_sample_ratio: Some(1.5), ..TraceArgs::default() };
    assert!(resolve(&ratio, &[on]).unwrap_err().to_string().contains("1.5"));
    let e = resolve(&TraceArgs::default(), &[on, ("OTEL_BSP_MAX_QUEUE_SIZE", "lots")]).unwrap_err();
    assert!(format!("{e:#}").contains("OTEL_BSP_MAX_QUEUE_SIZE \"lots\""), "{e:#}");
}
