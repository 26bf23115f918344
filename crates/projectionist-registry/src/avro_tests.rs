use apache_avro::{to_avro_datum, types::Record};

use super::*;

const V1: &str = r#"{"type":"record","name":"Opened","namespace":"bank","fields":[
    {"name":"id","type":"long"},
    {"name":"owner","type":["null","string"],"default":null},
    {"name":"kind","type":{"type":"enum","name":"Kind","symbols":["CHECKING","SAVINGS"]}},
    {"name":"at","type":{"type":"long","logicalType":"timestamp-millis"}},
    {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":9,"scale":2}},
    {"name":"tag","type":"bytes"},
    {"name":"legacy","type":"string","default":""}]}"#;

fn v1_bytes() -> Vec<u8> {
    let schema = Schema::parse_str(V1).unwrap();
    let mut record = Record::new(&schema).unwrap();
    record.put("id", 7i64);
    record.put("owner", Value::Union(1, Box::new(Value::String("ada".into()))));
    record.put("kind", Value::Enum(1, "SAVINGS".into()));
    record.put("at", Value::TimestampMillis(1_700_000_000_123));
    record.put("amount", Value::Decimal(apache_avro::Decimal::from(vec![0xff, 0x85]))); // -123
    record.put("tag", Value::Bytes(vec![1, 2, 255]));
    record.put("legacy", "old");
    to_avro_datum(&schema, record).unwrap()
}

#[test]
fn a_record_reads_as_a_serde_type_expects() {
    let json = AvroSchema::parse(V1, &[]).unwrap().decode(&v1_bytes(), None).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"id": 7, "owner": "ada", "kind": "SAVINGS", "at": "2023-11-14T22:13:20.123Z",
            "amount": "-1.23", "tag": "AQL/", "legacy": "old"})
    );
}

/// apache-avro 0.20 resolves a bytes decimal only when the value's byte length could hold
/// the schema's precision: a small amount in a wide decimal fails. Without a reader, it reads.
#[test]
fn apache_avro_refuses_to_resolve_a_short_decimal() {
    let reader = AvroSchema::parse(V1, &[]).unwrap();
    let error = AvroSchema::parse(V1, &[]).unwrap().decode(&v1_bytes(), Some(&reader)).unwrap_err();
    assert!(error.contains("Precision 9 too small"), "{error}");
}

#[test]
fn a_reader_schema_adds_defaults_and_drops_removed_fields() {
    let v1 = V1.replace(r#""precision":9"#, r#""precision":4"#);
    let v2 = v1.replace(
        r#"{"name":"legacy","type":"string","default":""}"#,
        r#"{"name":"currency","type":"string","default":"EUR"}"#,
    );
    let reader = AvroSchema::parse(&v2, &[]).unwrap();
    let json = AvroSchema::parse(&v1, &[]).unwrap().decode(&v1_bytes(), Some(&reader)).unwrap();
    assert_eq!(json["currency"], "EUR");
    assert!(json.get("legacy").is_none(), "{json}");
    assert_eq!(json["amount"], "-1.23");
}

#[test]
fn a_reader_without_a_default_for_a_new_field_says_so() {
    let v2 = V1.replace(r#"{"name":"legacy","type":"string","default":""}"#, r#"{"name":"currency","type":"string"}"#);
    let reader = AvroSchema::parse(&v2, &[]).unwrap();
    let error = AvroSchema::parse(V1, &[]).unwrap().decode(&v1_bytes(), Some(&reader)).unwrap_err();
    assert!(error.contains("reader's schema"), "{error}");
}

#[test]
fn cut_short_and_trailing_bytes_do_not_fit() {
    let schema = AvroSchema::parse(V1, &[]).unwrap();
    let bytes = v1_bytes();
    let short = schema.decode(&bytes[..bytes.len() - 2], None).unwrap_err();
    assert_eq!(short, "field `legacy`: the bytes end early");
    let shorter = schema.decode(&bytes[..3], None).unwrap_err();
    assert!(shorter.starts_with("field `owner`: the bytes end early"), "{shorter}");
    let mut longer = bytes.clone();
    longer.push(0);
    assert_eq!(schema.decode(&longer, None).unwrap_err(), "1 bytes left after the datum");
}

#[test]
fn references_supply_named_types() {
    let money = r#"{"type":"record","name":"Money","namespace":"bank","fields":[{"name":"cents","type":"long"}]}"#;
    let main = r#"{"type":"record","name":"Paid","namespace":"bank","fields":[{"name":"sum","type":"bank.Money"}]}"#;
    let schema = AvroSchema::parse(main, &[money.to_owned()]).unwrap();
    // sum.cents = 21 (zigzag 42)
    assert_eq!(schema.decode(&[42], None).unwrap(), serde_json::json!({"sum": {"cents": 21}}));
}

#[test]
fn logical_types_as_text() {
    assert_eq!(date(19_000), "2022-01-08");
    assert_eq!(time(3_723_004, 1_000_000, "%H:%M:%S%.3f"), "01:02:03.004");
    assert_eq!(time(-1, 1_000, "%H:%M:%S%.6f"), -1);
    assert_eq!(decimal_text("5", 3), "0.005");
    assert_eq!(decimal_text("-12345", 2), "-123.45");
    assert_eq!(decimal_text("42", 0), "42");
    assert_eq!(float(f64::NAN), "NaN");
    assert_eq!(float(f64::NEG_INFINITY), "-Infinity");
    assert_eq!(instant(DateTime::from_timestamp_micros(1), 1, SecondsFormat::Micros), "1970-01-01T00:00:00.000001Z");
    assert_eq!(local(DateTime::from_timestamp_millis(0), 0, "%.3f"), "1970-01-01T00:00:00.000");
}
