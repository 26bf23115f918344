"""Publishes projectionist envelopes (JSON lines on stdin) as Protobuf, written by Confluent's
own ProtobufSerializer against a schema registry (Confluent's REST API) and produced by
Confluent's client: the value an `AccountEnvelope` message whose `data` is a nested message
with every event's fields; the key the aggregate id as plain text (a topic's keys and values
need not share a format).

Usage: python protobuf_produce.py BROKERS TOPIC REGISTRY_URL < envelopes.jsonl
"""

import json
import sys

from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

STRING, INT64, MESSAGE, OPTIONAL = 9, 3, 11, 1


def envelope_class():
    """`bank.AccountEnvelope`, built from its descriptor (as protoc would generate it)."""
    file = descriptor_pb2.FileDescriptorProto(name="bank_envelope.proto", package="bank", syntax="proto3")
    message = file.message_type.add(name="AccountEnvelope")
    data = message.nested_type.add(name="Data")
    data.field.add(name="owner", number=1, type=STRING, label=OPTIONAL)
    data.field.add(name="amount", number=2, type=INT64, label=OPTIONAL)
    for number, name in enumerate(("id", "aggregate_type", "aggregate_id"), start=1):
        message.field.add(name=name, number=number, type=STRING, label=OPTIONAL)
    message.field.add(name="version", number=4, type=INT64, label=OPTIONAL)
    message.field.add(name="type", number=5, type=STRING, label=OPTIONAL)
    message.field.add(name="occurred_at", number=6, type=STRING, label=OPTIONAL)
    message.field.add(name="data", number=7, type=MESSAGE, label=OPTIONAL, type_name=".bank.AccountEnvelope.Data")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("bank.AccountEnvelope"))


def main():
    brokers, topic, url = sys.argv[1], sys.argv[2], sys.argv[3]
    Envelope = envelope_class()
    registry = SchemaRegistryClient({"url": url})
    values = ProtobufSerializer(Envelope, registry, {"use.deprecated.format": False})
    producer = Producer({"bootstrap.servers": brokers, "enable.idempotence": True})
    errors = []
    for line in sys.stdin:
        envelope = json.loads(line)
        data = Envelope.Data(**envelope.pop("data"))
        message = Envelope(data=data, **{k: envelope[k] for k in ("id", "aggregate_type", "aggregate_id", "version", "type", "occurred_at")})
        value = values(message, SerializationContext(topic, MessageField.VALUE))
        key = envelope["aggregate_id"].encode()
        producer.produce(topic, key=key, value=value, on_delivery=lambda err, _m: err and errors.append(err))
        producer.poll(0)
    if producer.flush(30):
        sys.exit(f"not delivered in 30 s (does {topic} exist?)")
    if errors:
        sys.exit(f"not delivered: {errors[:3]}")


if __name__ == "__main__":
    main()
