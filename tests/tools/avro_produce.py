"""Publishes projectionist envelopes (JSON lines on stdin) as Avro, written by Confluent's own
AvroSerializer against a schema registry (Confluent's REST API) and produced by Confluent's
client: the value an Avro record of the envelope, `data` a union of the bank's event records;
the key the aggregate id as an Avro string. Each schema version adds a field with a default:
2 adds `channel` to the money events, 3 adds `note` to the opening.

Usage: python avro_produce.py BROKERS TOPIC REGISTRY_URL VERSION < envelopes.jsonl
"""

import json
import sys

from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext


def schema(version):
    opened = [{"name": "owner", "type": "string"}]
    money = [{"name": "amount", "type": "long"}]
    if version >= 2:
        money.append({"name": "channel", "type": "string", "default": "web"})
    if version >= 3:
        opened.append({"name": "note", "type": "string", "default": ""})
    data = [
        {"type": "record", "name": "AccountOpened", "fields": opened},
        {"type": "record", "name": "Money", "fields": money},
        {"type": "record", "name": "AccountClosed", "fields": []},
    ]
    fields = [{"name": n, "type": "string"} for n in ("id", "aggregate_type", "aggregate_id")]
    fields += [{"name": "version", "type": "long"}, {"name": "type", "type": "string"}]
    fields += [{"name": "occurred_at", "type": "string"}, {"name": "data", "type": data}]
    return {"type": "record", "name": "AccountEnvelope", "namespace": "bank", "fields": fields}


def branch(envelope, version):
    data = dict(envelope["data"])
    if envelope["type"] == "AccountOpened":
        if version >= 3:
            data["note"] = "v3"
        return ("bank.AccountOpened", data)
    if envelope["type"] in ("MoneyDeposited", "MoneyWithdrawn"):
        if version >= 2:
            data["channel"] = "app"
        return ("bank.Money", data)
    return ("bank.AccountClosed", data)


def main():
    brokers, topic, url, version = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    registry = SchemaRegistryClient({"url": url})
    values = AvroSerializer(registry, json.dumps(schema(version)))
    keys = AvroSerializer(registry, json.dumps("string"))
    producer = Producer({"bootstrap.servers": brokers, "enable.idempotence": True})
    errors = []
    for line in sys.stdin:
        envelope = json.loads(line)
        envelope["data"] = branch(envelope, version)
        key = keys(envelope["aggregate_id"], SerializationContext(topic, MessageField.KEY))
        value = values(envelope, SerializationContext(topic, MessageField.VALUE))
        producer.produce(topic, key=key, value=value, on_delivery=lambda err, _m: err and errors.append(err))
        producer.poll(0)
    if producer.flush(30):
        sys.exit(f"not delivered in 30 s (does {topic} exist?)")
    if errors:
        sys.exit(f"not delivered: {errors[:3]}")


if __name__ == "__main__":
    main()
