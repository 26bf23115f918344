"""Serializes one value with Confluent's own serializers against a registry; prints its hex.

Usage: serialize.py URL KIND SUBJECT_TOPIC
KIND: avro-v1, avro-v2 (adds `currency` with a default, drops `legacy`), protobuf (a nested
message), jsonschema. Prints one line: the serialized bytes in hex.
"""
import json
import sys

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.serialization import MessageField, SerializationContext

url, kind, topic = sys.argv[1:4]
client = SchemaRegistryClient({"url": url})
ctx = SerializationContext(topic, MessageField.VALUE)

V1 = {"type": "record", "name": "Opened", "namespace": "bank", "fields": [
    {"name": "id", "type": "long"},
    {"name": "owner", "type": ["null", "string"], "default": None},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "legacy", "type": "string", "default": ""}]}
V2 = dict(V1, fields=V1["fields"][:3] + [{"name": "currency", "type": "string", "default": "EUR"}])

if kind in ("avro-v1", "avro-v2"):
    from confluent_kafka.schema_registry.avro import AvroSerializer
    import datetime
    schema, value = (V1, {"legacy": "old"}) if kind == "avro-v1" else (V2, {"currency": "USD"})
    value.update(id=7, owner="ada", at=datetime.datetime(2024, 1, 2, 3, 4, 5, 678000, tzinfo=datetime.timezone.utc))
    data = AvroSerializer(client, json.dumps(schema))(value, ctx)
elif kind == "protobuf":
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    file = descriptor_pb2.FileDescriptorProto(name="shop_order.proto", package="shop", syntax="proto3")
    order = file.message_type.add(name="Order")
    order.field.add(name="order_id", number=1, type=9, label=1)
    line = order.nested_type.add(name="Line")
    line.field.add(name="sku", number=1, type=9, label=1)
    line.field.add(name="quantity", number=2, type=3, label=1)
    order.field.add(name="lines", number=2, type=11, label=3, type_name=".shop.Order.Line")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    Line = message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order.Line"))
    # The nested message itself: its indexes are [0, 0], not the single 0 of the first.
    data = ProtobufSerializer(Line, client, {"use.deprecated.format": False})(Line(sku="ab-1", quantity=3), ctx)
elif kind == "jsonschema":
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    schema = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}}
    data = JSONSerializer(json.dumps(schema), client)({"id": 1, "name": "ada"}, ctx)
else:
    sys.exit(f"unknown kind {kind}")
print(data.hex())
