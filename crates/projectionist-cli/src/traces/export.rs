//! The exporter's bounded queue and its counts: a span that cannot wait or be sent is
//! dropped and counted, never waited for.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{BatchSpanProcessor, Span, SpanData, SpanExporter, SpanProcessor};
use opentelemetry_sdk::Resource;
use projectionist_kafka::metrics::{TRACE_SPANS_DROPPED as SPANS_DROPPED, TRACE_SPANS_EXPORTED as SPANS_EXPORTED};

/// How often, at most, a warning says spans are being dropped.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Finished spans not yet handed to the exporter, bounded; and the throttled warning.
#[derive(Debug, Clone)]
pub(crate) struct Queued(Arc<Shared>);

#[derive(Debug)]
struct Shared {
    count: AtomicUsize,
    max: usize,
    endpoint: String,
    /// When the last warning was given, and the spans dropped since.
    warned: Mutex<(Option<Instant>, u64)>,
}

impl Queued {
    pub(crate) fn new(max: usize, endpoint: &str) -> Self {
        let shared =
            Shared { count: AtomicUsize::new(0), max, endpoint: endpoint.to_owned(), warned: Mutex::default() };
        Self(Arc::new(shared))
    }

    /// Takes a place for one span; `false` (counted as dropped) when the queue is full.
    fn take(&self) -> bool {
        if self.0.count.fetch_add(1, Ordering::AcqRel) < self.0.max {
            return true;
        }
        self.0.count.fetch_sub(1, Ordering::AcqRel);
        self.dropped(1, "queue_full", "the export queue is full (the collector is slow or away)");
        false
    }

    /// Gives back the places of `n` spans handed to the exporter.
    fn release(&self, n: usize) {
        let _ = self.0.count.fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| Some(c.saturating_sub(n)));
    }

    /// Counts `n` spans dropped for `reason`, and warns at most once a minute.
    fn dropped(&self, n: u64, reason: &'static str, why: &str) {
        metrics::counter!(SPANS_DROPPED, "reason" => reason).increment(n);
        let Ok(mut warned) = self.0.warned.lock() else { return };
        warned.1 += n;
        if warned.0.is_some_and(|at| at.elapsed() < WARN_EVERY) {
            return;
        }
        let (endpoint, spans) = (&self.0.endpoint, warned.1);
        *warned = (Some(Instant::now()), 0);
        tracing::warn!(
            %endpoint,
            spans,
            reason,
            "Trace spans dropped: {why}. The pipeline goes on unslowed; projectionist_trace_spans_dropped_total counts \
             them (this warning comes at most once a minute)."
        );
    }
}

/// The SDK's batch processor behind the bounded queue: a span that finds it full is
/// dropped here, so the processor's own channel never fills.
#[derive(Debug)]
pub(crate) struct Bounded {
    inner: BatchSpanProcessor,
    queued: Queued,
}

impl Bounded {
    pub(crate) fn new(inner: BatchSpanProcessor, queued: Queued) -> Self {
        Self { inner, queued }
    }
}

impl SpanProcessor for Bounded {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if span.span_context.is_sampled() && self.queued.take() {
            self.inner.on_end(span);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The OTLP exporter, counting what it sends and what the collector did not take.
#[derive(Debug)]
pub(crate) struct Counted<E> {
    inner: E,
    queued: Queued,
}

impl<E> Counted<E> {
    pub(crate) fn new(inner: E, queued: Queued) -> Self {
        Self { inner, queued }
    }
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len();
        self.queued.release(n);
        let result = self.inner.export(batch).await;
        match &result {
            Ok(()) => metrics::counter!(SPANS_EXPORTED).increment(n as u64),
            Err(e) => self.queued.dropped(n as u64, "export_failed", &format!("the collector did not take them: {e}")),
        }
        result
    }

    fn shutdown_with_timeout(&mut self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&mut self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

#[cfg(test)]
mod tests {
    use super::Queued;

    #[test]
    fn the_queue_drops_past_its_bound_and_frees_places_as_spans_are_sent() {
        let queued = Queued::new(2, "http://collector:4318/v1/traces");
        assert!(queued.take() && queued.take());
        assert!(!queued.take(), "the third waits for no place");
        queued.release(2);
        assert!(queued.take());
        queued.release(5);
        assert_eq!(queued.0.count.load(std::sync::atomic::Ordering::Acquire), 0, "never below zero");
    }
}
