//! The batch span's links to the traces its events came from.
//!
//! A producer that traces its requests puts its span's W3C trace context on each message:
//! the `traceparent` and `tracestate` headers, or (CloudEvents' distributed tracing
//! extension, or a producer's own envelope) `traceparent` and `tracestate` in the envelope's
//! `metadata`. A batch span is linked to those contexts, the first [`MAX_LINKS`] distinct
//! ones of the batch, as OpenTelemetry's messaging conventions link a batch to the messages
//! it processed. Nothing is read unless the batch span is sampled.

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The most producers' contexts one batch span links to (OpenTelemetry's default limit of
/// links per span is 128 too).
pub(crate) const MAX_LINKS: usize = 128;

/// Links `span` to the producers' `contexts` its messages carry (see the module's head, and
/// [`producer_context`]): the first [`MAX_LINKS`] distinct ones, if `span` is sampled (else
/// `contexts` is not read).
pub(crate) fn link_producers(span: &tracing::Span, contexts: impl Iterator<Item = SpanContext>) {
    if !span.context().span().span_context().is_sampled() {
        return;
    }
    let mut linked: Vec<(TraceId, SpanId)> = Vec::new();
    for context in contexts {
        if linked.len() == MAX_LINKS {
            break;
        }
        let id = (context.trace_id(), context.span_id());
        if !linked.contains(&id) {
            linked.push(id);
            span.add_link(context);
        }
    }
}

/// The current (batch) span marked as failed, with an event saying where the partition
/// halted (`offset`, `aggregate`), what `kind` of halt and why (the log says it too, outside
/// the span).
pub(crate) fn halted(offset: i64, aggregate: &str, kind: &'static str, reason: &str) {
    use opentelemetry::KeyValue;
    let span = tracing::Span::current();
    let attributes = vec![
        KeyValue::new("projectionist.halt.offset", offset),
        KeyValue::new("projectionist.halt.aggregate", aggregate.to_owned()),
        KeyValue::new("projectionist.halt.kind", kind),
        KeyValue::new("projectionist.halt.reason", reason.to_owned()),
    ];
    span.add_event("partition halted", attributes);
    span.set_status(opentelemetry::trace::Status::error(reason.to_owned()));
}

/// The producer's context a message carries: its `traceparent` and `tracestate` headers'
/// (`header` reads one by name), else its envelope metadata's (`field` reads one).
pub(crate) fn producer_context<'a>(
    header: impl Fn(&str) -> Option<&'a str>,
    field: impl Fn(&str) -> Option<&'a str>,
) -> Option<SpanContext> {
    if let Some(parent) = header("traceparent") {
        return context(parent, header("tracestate"));
    }
    context(field("traceparent")?, field("tracestate"))
}

/// A W3C `traceparent` (`00-<trace id>-<parent id>-<flags>`) and its `tracestate` as a
/// remote span context; `None` when it is not one (a bad `tracestate` is left out).
pub(crate) fn context(traceparent: &str, tracestate: Option<&str>) -> Option<SpanContext> {
    let mut parts = traceparent.trim().split('-');
    let (version, trace_id, span_id, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    // Version 00 has exactly four parts; a later version may add more (and "ff" is invalid).
    let more = parts.next().is_some();
    if !hex(version, 2) || version == "ff" || (more && version == "00") {
        return None;
    }
    if !hex(trace_id, 32) || !hex(span_id, 16) || !hex(flags, 2) {
        return None;
    }
    let trace_id = TraceId::from_hex(trace_id).ok()?;
    let span_id = SpanId::from_hex(span_id).ok()?;
    let flags = TraceFlags::new(u8::from_str_radix(flags, 16).ok()? & TraceFlags::SAMPLED.to_u8());
    let state = tracestate.and_then(|s| s.parse::<TraceState>().ok()).unwrap_or_default();
    let context = SpanContext::new(trace_id, span_id, flags, true, state);
    context.is_valid().then_some(context)
}

#[cfg(test)]
mod tests {
    use super::context;

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

    #[test]
    fn a_w3c_traceparent_reads_as_a_remote_context() {
        let c = context(&format!("00-{TRACE}-00f067aa0ba902b7-01"), Some("vendor=a1")).unwrap();
        assert_eq!((c.trace_id().to_string(), c.span_id().to_string()), (TRACE.into(), "00f067aa0ba902b7".into()));
        assert!(c.is_sampled() && c.is_remote());
        assert_eq!(c.trace_state().get("vendor"), Some("a1"));
        let unsampled = context(&format!("00-{TRACE}-00f067aa0ba902b7-00"), Some("not a state")).unwrap();
        assert!(!unsampled.is_sampled() && unsampled.trace_state().header().is_empty());
        // A later version may carry more parts.
        assert!(context(&format!("01-{TRACE}-00f067aa0ba902b7-01-more"), None).is_some());
    }

    #[test]
    fn what_is_not_a_traceparent_is_none() {
        for bad in [
            String::new(),
            "00".into(),
            format!("00-{TRACE}-00f067aa0ba902b7"),
            format!("00-{TRACE}-00f067aa0ba902b7-01-extra"),
            format!("ff-{TRACE}-00f067aa0ba902b7-01"),
            format!("00-{}-00f067aa0ba902b7-01", TRACE.to_uppercase()),
            format!("00-{}-00f067aa0ba902b7-01", "0".repeat(32)),
            format!("00-{TRACE}-0000000000000000-01"),
            format!("00-{TRACE}-00f067aa0ba902b-01"),
            format!("00-{TRACE}-00f067aa0ba902b7-0x"),
            "00-ééééééééééééééééééééééééééééééé-00f067aa0ba902b7-01".into(),
        ] {
            assert!(context(&bad, None).is_none(), "{bad:?}");
        }
    }
}
