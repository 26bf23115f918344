//! Traces over OTLP: the engine's `tracing` spans (a batch, a rebuild's rounds and swap)
//! exported to an OpenTelemetry collector, off unless an endpoint is configured.
//!
//! Settings follow OpenTelemetry's environment variables (`OTEL_EXPORTER_OTLP_ENDPOINT`,
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, `OTEL_EXPORTER_OTLP_PROTOCOL`, `OTEL_SERVICE_NAME`,
//! `OTEL_TRACES_SAMPLER`, `OTEL_BSP_MAX_QUEUE_SIZE`, `OTEL_SDK_DISABLED`, …), with the
//! `--otlp-*` flags over them and the settings file's `[traces]` table under them.
//!
//! Exporting never holds up a batch: finished spans wait in a bounded queue for a
//! background thread to send them; when the queue is full, or the collector does not take
//! them, they are dropped, counted in `projectionist_trace_spans_dropped_total`, and a
//! warning says so at most once a minute.

mod export;

use std::time::Duration;

use anyhow::{bail, Context};
use opentelemetry_otlp::{Protocol, WithExportConfig as _};
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use serde::Deserialize;

/// The heading the trace options are listed under in `--help`.
const TRACES_HEADING: &str = "Traces (OpenTelemetry)";

/// The queue of finished spans, unless `OTEL_BSP_MAX_QUEUE_SIZE` or the file says otherwise
/// (OpenTelemetry's default).
const QUEUE_SIZE: usize = 2048;

/// Where traces go: the flags, over OpenTelemetry's environment, over the file.
#[derive(clap::Args, Default)]
#[command(next_help_heading = TRACES_HEADING)]
pub(crate) struct TraceArgs {
    /// Export traces over OTLP to this collector: its base URL (gRPC `http://host:4317`,
    /// HTTP `http://host:4318`). Off unless set here, in `OTEL_EXPORTER_OTLP_ENDPOINT` (or
    /// `…_TRACES_ENDPOINT`) or in the settings file's `[traces]` table.
    #[arg(long, global = true, value_name = "URL")]
    otlp_endpoint: Option<String>,
    /// `grpc` or `http/protobuf` (default; also `OTEL_EXPORTER_OTLP_PROTOCOL`).
    #[arg(long, global = true, value_name = "grpc|http/protobuf")]
    otlp_protocol: Option<String>,
    /// The share of batches traced, 0 to 1 (default 1; `OTEL_TRACES_SAMPLER` also sets it).
    #[arg(long, global = true, value_name = "RATIO")]
    trace_sample_ratio: Option<f64>,
    /// The settings file's `[traces]` table.
    #[arg(skip)]
    pub(crate) file: Option<TracesConfig>,
}

/// The settings file's `[traces]` table.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TracesConfig {
    /// The collector's base URL (as `OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub endpoint: Option<String>,
    /// `grpc` or `http/protobuf`.
    pub protocol: Option<String>,
    /// The `service.name` of the spans (default: the binary's name).
    pub service_name: Option<String>,
    /// The share of batches traced, 0 to 1.
    pub sample_ratio: Option<f64>,
    /// How many finished spans may wait to be sent before more are dropped.
    pub queue_size: Option<usize>,
}

/// The exporter's settings, resolved.
#[derive(Debug, PartialEq)]
pub(crate) struct Traces {
    /// The URL spans are sent to (for HTTP, with its `/v1/traces` path).
    pub endpoint: String,
    pub protocol: Protocol,
    /// Set unless OpenTelemetry's environment names the service.
    pub service_name: Option<String>,
    /// Set unless `OTEL_TRACES_SAMPLER` chooses the sampler (the SDK reads it then).
    pub sample_ratio: Option<f64>,
    pub queue_size: usize,
}

impl TraceArgs {
    /// The exporter's settings, `None` when traces are off; an error naming a setting
    /// that is not valid. `env` reads the environment; `binary` is the default service name.
    pub(crate) fn resolve(&self, env: impl Fn(&str) -> Option<String>, binary: &str) -> anyhow::Result<Option<Traces>> {
        let env = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        let file = self.file.clone().unwrap_or_default();
        if env("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
            || env("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"))
        {
            return Ok(None);
        }
        let protocol = (self.otlp_protocol.clone())
            .or_else(|| env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"))
            .or_else(|| env("OTEL_EXPORTER_OTLP_PROTOCOL"))
            .or(file.protocol);
        let protocol = match protocol.as_deref().map(str::trim) {
            None | Some("http/protobuf") => Protocol::HttpBinary,
            Some("grpc") => Protocol::Grpc,
            Some(other) => bail!("OTLP protocol {other:?}: projectionist sends `grpc` or `http/protobuf`"),
        };
        // A base URL gets the signal's path over HTTP; the traces' own URL is taken as it is.
        let base = |url: String| match protocol {
            Protocol::HttpBinary => format!("{}/v1/traces", url.trim_end_matches('/')),
            _ => url,
        };
        let endpoint = match (&self.otlp_endpoint, env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) {
            (Some(url), _) => base(url.clone()),
            (None, Some(url)) => url,
            (None, None) => match env("OTEL_EXPORTER_OTLP_ENDPOINT").or(file.endpoint) {
                Some(url) => base(url),
                None => return Ok(None),
            },
        };
        let named = env("OTEL_SERVICE_NAME").is_some()
            || env("OTEL_RESOURCE_ATTRIBUTES")
                .is_some_and(|a| a.split(',').any(|kv| kv.trim().starts_with("service.name=")));
        let service_name = (!named).then(|| file.service_name.unwrap_or_else(|| binary.to_owned()));
        let sample_ratio = match self.trace_sample_ratio {
            Some(ratio) => Some(ratio),
            None if env("OTEL_TRACES_SAMPLER").is_some() => None,
            None => file.sample_ratio,
        };
        if let Some(ratio) = sample_ratio.filter(|r| !(0.0..=1.0).contains(r)) {
            bail!("the traces' sample ratio {ratio} is not between 0 and 1");
        }
        let queue_size = match env("OTEL_BSP_MAX_QUEUE_SIZE") {
            Some(size) => size.trim().parse().with_context(|| format!("OTEL_BSP_MAX_QUEUE_SIZE {size:?}"))?,
            None => file.queue_size.unwrap_or(QUEUE_SIZE),
        };
        Ok(Some(Traces { endpoint, protocol, service_name, sample_ratio, queue_size: queue_size.max(1) }))
    }
}

/// A running exporter: flushed and stopped by [`Exporting::shutdown`].
pub(crate) struct Exporting {
    provider: SdkTracerProvider,
}

impl Traces {
    /// The exporter (nothing is sent until a span ends) and the layer that feeds it the
    /// engine's spans. Must be called inside the Tokio runtime (gRPC's connection runs there).
    pub(crate) fn start<S>(&self) -> anyhow::Result<(Exporting, impl tracing_subscriber::Layer<S>)>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        use opentelemetry::trace::TracerProvider as _;
        let builder = opentelemetry_otlp::SpanExporter::builder();
        let exporter = match self.protocol {
            Protocol::Grpc => {
                let mut builder = builder.with_tonic().with_endpoint(&self.endpoint);
                if self.endpoint.starts_with("https:") {
                    use opentelemetry_otlp::WithTonicConfig as _;
                    let tls = opentelemetry_otlp::tonic_types::transport::ClientTlsConfig::new().with_native_roots();
                    builder = builder.with_tls_config(tls);
                }
                builder.build()
            }
            _ => builder.with_http().with_protocol(Protocol::HttpBinary).with_endpoint(&self.endpoint).build(),
        }
        .with_context(|| format!("the OTLP exporter to {}", self.endpoint))?;
        let queued = export::Queued::new(self.queue_size, &self.endpoint);
        let batches = BatchConfigBuilder::default().with_max_queue_size(self.queue_size).build();
        let processor = BatchSpanProcessor::builder(export::Counted::new(exporter, queued.clone()))
            .with_batch_config(batches)
            .build();
        let mut resource = Resource::builder();
        if let Some(name) = &self.service_name {
            resource = resource.with_service_name(name.clone());
        }
        let mut provider = SdkTracerProvider::builder()
            .with_span_processor(export::Bounded::new(processor, queued))
            .with_resource(resource.build());
        if let Some(ratio) = self.sample_ratio {
            provider = provider.with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio))));
        }
        let provider = provider.build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("projectionist"));
        Ok((Exporting { provider }, layer))
    }
}

impl Exporting {
    /// Sends what is queued (waiting 5 s at most) and stops.
    pub(crate) async fn shutdown(self) {
        let provider = self.provider;
        let stopped = tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(Duration::from_secs(5)));
        if let Ok(Err(e)) = stopped.await {
            tracing::warn!(error = %e, "Traces not all sent before exiting.");
        }
    }
}

#[cfg(test)]
mod tests;
