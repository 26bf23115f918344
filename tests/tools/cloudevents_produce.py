"""Publishes projectionist envelopes (JSON lines on stdin) as CloudEvents, written by the
official CloudEvents SDK's Kafka binding and produced by Confluent's client: even lines in
structured mode, odd lines in binary mode. The aggregate travels as CloudEvents attributes:
`subject` (its id, also the message key), the extensions `aggregatetype` and `sequence` (its
version); `id` is `<aggregate id>/<version>`, not a UUID.

Usage: python cloudevents_produce.py BROKERS TOPIC < envelopes.jsonl
"""

import json
import sys
from datetime import datetime

from cloudevents.core.bindings import kafka as ce_kafka
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from confluent_kafka import Producer


def main():
    brokers, topic = sys.argv[1], sys.argv[2]
    producer = Producer({"bootstrap.servers": brokers, "enable.idempotence": True})
    errors = []
    fmt = JSONFormat()
    for n, line in enumerate(sys.stdin):
        envelope = json.loads(line)
        event = CloudEvent(
            attributes={
                "type": envelope["type"],
                "source": "/projectionist/tests",
                "id": f"{envelope['aggregate_id']}/{envelope['version']}",
                "subject": envelope["aggregate_id"],
                "aggregatetype": envelope["aggregate_type"],
                "sequence": envelope["version"],
                "time": datetime.fromisoformat(envelope["occurred_at"].replace("Z", "+00:00")),
                "datacontenttype": "application/json",
            },
            data=envelope["data"],
        )
        to_kafka = ce_kafka.to_structured if n % 2 == 0 else ce_kafka.to_binary
        message = to_kafka(event, fmt)
        producer.produce(
            topic,
            key=envelope["aggregate_id"],
            value=message.value,
            headers=list(message.headers.items()),
            on_delivery=lambda err, _msg: err and errors.append(err),
        )
        producer.poll(0)
    producer.flush(30)
    if errors:
        sys.exit(f"delivery failed: {errors[0]}")


if __name__ == "__main__":
    main()
