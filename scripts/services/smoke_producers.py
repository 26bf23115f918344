"""A hand check of the format tests' producers (issue 68); the tests of the next step replace it.

Run it with the venv `scripts/services.sh --python-producers` makes, against the registry
`scripts/services.sh --registry` starts and the broker `scripts/services.sh` starts:

    eval "$(scripts/services.sh)" "$(scripts/services.sh --registry)" "$(scripts/services.sh --python-producers)"
    "$PROJECTIONIST_PYTHON" scripts/services/smoke_producers.py

It creates two topics of its own (a random suffix), and:
  1. registers an Avro schema through Confluent's AvroSerializer (subject `<topic>-value`)
     against SCHEMA_REGISTRY_URL, produces 3 records, reads them back with AvroDeserializer
     and prints the schema id; then checks that the registry accepts the schema evolved by a
     field with a default and refuses one evolved by a required field (BACKWARD);
  2. produces one CloudEvent in structured mode and one in binary mode with the CloudEvents
     SDK's Kafka binding, prints the headers and value of each, and reads both back.
The topics are deleted at the end. Exits non-zero on any mismatch.

The CloudEvents SDK is 2.x: its Kafka binding is `cloudevents.core.bindings.kafka`
(`to_structured`, `to_binary`, taking a format such as `JSONFormat()`); 1.x's
`cloudevents.kafka` lives on as `cloudevents.v1.kafka`.
"""

import json
import os
import struct
import sys
import uuid

from cloudevents.core.bindings import kafka as ce_kafka
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

BROKERS = os.environ.get("KAFKA_BROKERS", "127.0.0.1:9092")
REGISTRY = os.environ["SCHEMA_REGISTRY_URL"]
SUFFIX = uuid.uuid4().hex[:8]
AVRO_TOPIC = f"smoke-avro-{SUFFIX}"
CE_TOPIC = f"smoke-cloudevents-{SUFFIX}"

SCHEMA = {
    "type": "record",
    "name": "Deposited",
    "namespace": "projectionist.smoke",
    "fields": [
        {"name": "account", "type": "string"},
        {"name": "amount", "type": "long"},
    ],
}


def read_back(topic, count):
    consumer = Consumer({
        "bootstrap.servers": BROKERS,
        "group.id": f"smoke-{SUFFIX}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })
    consumer.subscribe([topic])
    messages = []
    for _ in range(60):
        msg = consumer.poll(1.0)
        if msg is None:
            if len(messages) >= count:
                break
            continue
        if msg.error():
            raise RuntimeError(msg.error())
        messages.append(msg)
        if len(messages) == count:
            break
    consumer.close()
    if len(messages) != count:
        sys.exit(f"read {len(messages)} messages back from {topic}, expected {count}")
    return messages


def produce(producer, topic, **kwargs):
    errors = []
    producer.produce(topic, on_delivery=lambda err, _msg: err and errors.append(err), **kwargs)
    producer.flush(10)
    if errors:
        raise RuntimeError(errors[0])


def main():
    admin = AdminClient({"bootstrap.servers": BROKERS})
    for future in admin.create_topics([NewTopic(t, 1, 1) for t in (AVRO_TOPIC, CE_TOPIC)]).values():
        future.result(10)
    producer = Producer({"bootstrap.servers": BROKERS, "enable.idempotence": True})
    try:
        avro(producer)
        cloudevents(producer)
    finally:
        for future in admin.delete_topics([AVRO_TOPIC, CE_TOPIC]).values():
            future.result(10)


def avro(producer):
    registry = SchemaRegistryClient({"url": REGISTRY})
    schema_str = json.dumps(SCHEMA)
    serializer = AvroSerializer(registry, schema_str)  # auto.register.schemas: True
    deserializer = AvroDeserializer(registry)
    ctx = SerializationContext(AVRO_TOPIC, MessageField.VALUE)
    records = [{"account": f"acc-{i}", "amount": 100 * i} for i in (1, 2, 3)]
    ids = set()
    for i, record in enumerate(records):
        payload = serializer(record, ctx)
        magic, schema_id = struct.unpack(">bI", payload[:5])
        assert magic == 0, payload[:5]
        ids.add(schema_id)
        produce(producer, AVRO_TOPIC, key=record["account"], value=payload)
    assert len(ids) == 1, ids
    schema_id = ids.pop()
    latest = registry.get_latest_version(f"{AVRO_TOPIC}-value")
    print(f"avro: registered subject {AVRO_TOPIC}-value, schema id {schema_id} "
          f"(latest version {latest.version}, id {latest.schema_id}); produced {len(records)} records to {AVRO_TOPIC}")
    got = [deserializer(m.value(), SerializationContext(AVRO_TOPIC, MessageField.VALUE))
           for m in read_back(AVRO_TOPIC, len(records))]
    assert got == records, got
    print(f"avro: read back with AvroDeserializer: {got}")

    # The registry's compatibility (BACKWARD, set by services.sh): a field with a default is
    # accepted, a required field is refused.
    evolved = dict(SCHEMA, fields=SCHEMA["fields"] + [{"name": "currency", "type": "string", "default": "EUR"}])
    evolved_id = registry.register_schema(f"{AVRO_TOPIC}-value", Schema(json.dumps(evolved), "AVRO"))
    print(f"avro: evolved by a field with a default: accepted, schema id {evolved_id}")
    breaking = dict(SCHEMA, fields=SCHEMA["fields"] + [{"name": "branch", "type": "string"}])
    try:
        registry.register_schema(f"{AVRO_TOPIC}-value", Schema(json.dumps(breaking), "AVRO"))
        sys.exit("avro: a required field was accepted; the registry's compatibility is not BACKWARD")
    except SchemaRegistryError as e:
        print(f"avro: evolved by a required field: refused (HTTP {e.http_status_code})")


def cloudevents(producer):
    fmt = JSONFormat()
    sent = {}
    for mode, to_kafka in (("structured", ce_kafka.to_structured), ("binary", ce_kafka.to_binary)):
        event = CloudEvent(
            attributes={
                "type": "com.example.account.deposited",
                "source": "/projectionist/smoke",
                "id": f"{mode}-{SUFFIX}",
                "subject": "acc-1",
                "datacontenttype": "application/json",
            },
            data={"account": "acc-1", "amount": 100},
        )
        message = to_kafka(event, fmt)
        print(f"cloudevents {mode}: key={message.key!r}")
        print(f"cloudevents {mode}: headers={message.headers!r}")
        print(f"cloudevents {mode}: value={message.value!r}")
        produce(producer, CE_TOPIC, key=message.key, value=message.value, headers=list(message.headers.items()))
        sent[mode] = event

    for m, mode in zip(read_back(CE_TOPIC, 2), ("structured", "binary")):
        message = ce_kafka.KafkaMessage(headers=dict(m.headers() or []), key=m.key(), value=m.value())
        from_kafka = ce_kafka.from_structured if mode == "structured" else ce_kafka.from_binary
        event = from_kafka(message, fmt)
        assert event.get_id() == sent[mode].get_id(), (event.get_id(), sent[mode].get_id())
        assert event.get_data() == sent[mode].get_data(), event.get_data()
        print(f"cloudevents {mode}: read back id={event.get_id()} type={event.get_type()} data={event.get_data()}")


if __name__ == "__main__":
    main()
