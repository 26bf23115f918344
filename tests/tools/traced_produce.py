"""Publishes projectionist envelopes (JSON lines on stdin), each inside a producer span of
OpenTelemetry's Python SDK, exported over OTLP/HTTP to a collector; the span's W3C trace
context goes with the message, as OpenTelemetry's propagator writes it: in the `traceparent`
(and `tracestate`) headers for even lines, in the envelope's `metadata` for odd ones.
Produced by Confluent's client, keyed by the aggregate id. Prints one line per event:
`{"id": ..., "trace_id": ...}`.

Usage: python traced_produce.py BROKERS TOPIC OTLP_HTTP_ENDPOINT SERVICE_NAME < envelopes.jsonl
"""

import json
import sys

from confluent_kafka import Producer
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator


def main():
    brokers, topic, endpoint, service = sys.argv[1:5]
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces")))
    tracer = provider.get_tracer("traced_produce")
    propagator = TraceContextTextMapPropagator()
    producer = Producer({"bootstrap.servers": brokers, "enable.idempotence": True})
    errors = []
    for n, line in enumerate(sys.stdin):
        envelope = json.loads(line)
        attributes = {"messaging.system": "kafka", "messaging.destination.name": topic}
        with tracer.start_as_current_span(f"send {topic}", kind=trace.SpanKind.PRODUCER, attributes=attributes) as span:
            context = {}
            propagator.inject(context)
            context["tracestate"] = "producer=traced"
            headers = []
            if n % 2 == 0:
                headers = [(name, value.encode()) for name, value in context.items()]
            else:
                envelope["metadata"] = dict(envelope.get("metadata") or {}, **context)
            producer.produce(
                topic,
                key=envelope["aggregate_id"].encode(),
                value=json.dumps(envelope).encode(),
                headers=headers,
                on_delivery=lambda err, _m: err and errors.append(err),
            )
            producer.poll(0)
            trace_id = format(span.get_span_context().trace_id, "032x")
        print(json.dumps({"id": envelope["id"], "trace_id": trace_id}))
    if producer.flush(30):
        sys.exit(f"not delivered in 30 s (does {topic} exist?)")
    if errors:
        sys.exit(f"not delivered: {errors[:3]}")
    provider.shutdown()


if __name__ == "__main__":
    main()
