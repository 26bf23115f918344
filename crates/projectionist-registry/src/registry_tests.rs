use proptest::prelude::*;

use super::*;

const AVRO: &str = r#"{"type":"record","name":"R","fields":[{"name":"n","type":"long"},{"name":"s","type":"string"},
    {"name":"xs","type":{"type":"array","items":["null","double"]}},{"name":"m","type":{"type":"map","values":"bytes"}}]}"#;
const PROTO: &str = "syntax = \"proto3\";\nmessage A { int64 n = 1; message B { repeated string s = 1; map<string, A> m = 2; } B b = 2; }\n";

fn registry() -> Registry {
    let registry = Registry::new(&RegistryConfig::new("http://127.0.0.1:9/ccompat")).unwrap();
    let entries = [
        (1, Entry::Ready(Arc::new(Compiled::Avro(Box::new(AvroSchema::parse(AVRO, &[]).unwrap()))))),
        (2, Entry::Ready(Arc::new(Compiled::Protobuf(ProtoSchema::compile(PROTO, &[]).unwrap())))),
        (3, Entry::Ready(Arc::new(Compiled::Json))),
        (4, Entry::Unknown),
        (5, Entry::Bad("it does not parse".into())),
    ];
    registry.cache.write().unwrap().extend(entries);
    registry
}

fn framed(id: u32, payload: &[u8]) -> Vec<u8> {
    let mut bytes = vec![0];
    bytes.extend(id.to_be_bytes());
    bytes.extend(payload);
    bytes
}

#[test]
fn decodes_each_kind_from_the_cache() {
    let registry = registry();
    // n = 1, s = "x", xs = [], m = {}
    let avro = registry.decode(&framed(1, &[2, 2, b'x', 0, 0])).unwrap();
    assert_eq!(avro, serde_json::json!({"n": 1, "s": "x", "xs": [], "m": {}}));
    let proto = registry.decode(&framed(2, &[0, 0x08, 5])).unwrap();
    assert_eq!(proto, serde_json::json!({"n": 5}));
    let json = registry.decode(&framed(3, br#"{"a":[1]}"#)).unwrap();
    assert_eq!(json, serde_json::json!({"a": [1]}));
}

#[test]
fn each_failure_in_its_class() {
    let registry = registry();
    let unknown = registry.decode(&framed(4, &[1])).unwrap_err();
    assert_eq!(unknown.to_string(), "schema id 4 is not in the registry at http://127.0.0.1:9/ccompat");
    assert!(registry.decode(&framed(5, &[])).unwrap_err().is_dead_letter());
    let short = registry.decode(&framed(1, &[2, 8, b'x'])).unwrap_err();
    assert!(matches!(short, Error::DoesNotFit { id: 1, .. }), "{short}");
    let not_json = registry.decode(&framed(3, b"{")).unwrap_err();
    assert!(not_json.to_string().starts_with("the bytes do not fit schema id 3: not JSON"), "{not_json}");
    assert!(matches!(registry.decode(&framed(6, &[])), Err(Error::NotPrepared { id: 6 })));
    assert!(matches!(registry.decode(b"{}"), Err(Error::NotWireFormat(_))));
}

#[tokio::test]
async fn a_registry_nobody_listens_on_is_unavailable() {
    let registry = Registry::new(&RegistryConfig::new("http://127.0.0.1:9").with_timeout_ms(2_000)).unwrap();
    let error = registry.prepare([7]).await.unwrap_err();
    assert!(error.is_retryable(), "{error}");
    // Nothing is remembered for an id the registry could not be asked about.
    assert!(matches!(registry.decode(&framed(7, &[])), Err(Error::NotPrepared { id: 7 })));
    // Ids already compiled are not asked for again.
    registry.cache.write().unwrap().insert(7, Entry::Ready(Arc::new(Compiled::Json)));
    registry.prepare([7]).await.unwrap();
}

#[test]
fn compile_by_type() {
    let fetched = |schema_type: Option<&str>, schema: &str| Fetched {
        schema: schema.into(),
        schema_type: schema_type.map(Into::into),
        references: Vec::new(),
    };
    assert!(matches!(compile(&fetched(None, "\"string\""), &[]), Ok(Compiled::Avro(_))));
    assert!(matches!(compile(&fetched(Some("PROTOBUF"), PROTO), &[]), Ok(Compiled::Protobuf(_))));
    assert!(matches!(compile(&fetched(Some("JSON"), "{}"), &[]), Ok(Compiled::Json)));
    assert!(compile(&fetched(Some("XML"), ""), &[]).is_err_and(|e| e.contains("XML")));
    assert!(compile(&fetched(None, "{"), &[]).is_err());
}

#[test]
fn reader_schema_settings() {
    let reader: ReaderSchema = serde_json::from_str(r#"{"subject":{"subject":"orders-value","version":2}}"#).unwrap();
    assert_eq!(reader, ReaderSchema::Subject { subject: "orders-value".into(), version: Some(2) });
    let latest: ReaderSchema = serde_json::from_str(r#"{"subject":{"subject":"orders-value"}}"#).unwrap();
    assert_eq!(latest, ReaderSchema::Subject { subject: "orders-value".into(), version: None });
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// Bytes from outside never panic, whatever follows a valid header.
    #[test]
    fn arbitrary_payloads_never_panic(id in 1u32..=6, payload in proptest::collection::vec(any::<u8>(), 0..64)) {
        let registry = registry();
        let _ = registry.decode(&framed(id, &payload));
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..16)) {
        let _ = registry().decode(&bytes);
    }
}
