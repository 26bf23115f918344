use super::*;
use serde::Deserialize;

#[derive(Debug, Deserialize, Serialize, PartialEq)]
#[serde(tag = "type", content = "data")]
enum Ev {
    Opened { owner: String },
    Deposited { amount: i64 },
    Closed {},
}

fn good() -> Value {
    serde_json::json!({
        "id": "6f1c2d9e-8a6b-4c1e-9d0a-2b3c4d5e6f70", "aggregate_type": "account",
        "aggregate_id": "acc-1", "version": 3, "type": "Deposited",
        "occurred_at": "2026-11-21T10:00:00Z", "data": {"amount": 500}
    })
}

/// An envelope read lazily is the envelope read whole, its data still text; it fails
/// where and as the whole one does; and its event decodes from the text as from the
/// tree, with the same errors.
#[test]
fn a_lazy_envelope_reads_as_a_raw_one_and_its_event_decodes_the_same() {
    let bytes = serde_json::to_vec(&good()).unwrap();
    let lazy = LazyEnvelope::from_slice(&bytes).unwrap();
    assert_eq!(lazy.data.get(), r#"{"amount":500}"#);
    assert_eq!(lazy.clone().into_raw().unwrap(), RawEnvelope::from_slice(&bytes).unwrap());
    let raw = RawEnvelope::from_slice(&bytes).unwrap();
    assert_eq!(LazyEnvelope::from(raw.clone()).into_raw().unwrap(), raw, "a RawEnvelope made lazy and back");
    for bad in [&b"[1]"[..], b"{\"id\":", b"", br#"{"version": 0}"#] {
        let (lazy, raw) = (LazyEnvelope::from_slice(bad).unwrap_err(), RawEnvelope::from_slice(bad).unwrap_err());
        assert_eq!(lazy.to_string(), raw.to_string());
    }
    let mut no_data = good();
    no_data.as_object_mut().unwrap().remove("data");
    let no_data = serde_json::to_vec(&no_data).unwrap();
    assert_eq!(
        LazyEnvelope::from_slice(&no_data).unwrap_err().to_string(),
        RawEnvelope::from_slice(&no_data).unwrap_err().to_string()
    );
    let decoder = EventDecoder::<Ev>::new();
    let cases = [
        ("Deposited", r#"{"amount": 500}"#),
        ("Deposited", r#"{"amount": "a lot"}"#),
        ("Deposited", r#"{"amount": 1.5}"#),
        ("Deposited", r#"{}"#),
        ("Deposited", r#"null"#),
        ("Deposited", r#"{"amount": 5, "extra": [1, {"a": null}]}"#),
        ("Opened", r#"{"owner": "caf\u00e9 \"x\""}"#),
        ("Opened", r#"[1, 2]"#),
        ("Closed", r#"{}"#),
        ("Deposited", r#"{"amount": 1, "amount": 2}"#),
        ("Nope", r#"{}"#),
    ];
    for (event_type, text) in cases {
        let raw = serde_json::value::RawValue::from_string(text.to_owned()).unwrap();
        let from_text = decoder.event_from_json(event_type, &raw).map_err(|e| e.to_string());
        let from_tree = decoder.event(event_type, serde_json::from_str(text).unwrap()).map_err(|e| e.to_string());
        assert_eq!(from_text, from_tree, "{event_type} {text}");
    }
}

/// A lazy envelope is read first as producers write envelopes, then, failing that, field
/// by field: whichever way, it is what the field-by-field reading gives, or fails as it
/// fails, whatever each field holds.
#[test]
fn a_lazy_envelope_reads_every_field_as_the_checked_reading_does() {
    let json = |t: &str| -> Value { serde_json::from_str(t).unwrap() };
    let any = ["null", "true", "7", "1.5", "\"\"", "\" \"", "[1]", "{}", "{\"a\": 1}"];
    let mut fields: Vec<(&str, Vec<Value>)> = vec![
        ("id", vec![json("\"6F1C2D9E8A6B4C1E9D0A2B3C4D5E6F70\""), json("\"6f1c2d9e-8a6b-4c1e-9d0a\"")]),
        ("aggregate_type", vec![json("\"acc\\u0000\""), json("\"acc\\u0001\""), json("\"a\\\"b\"")]),
        ("aggregate_id", vec!["k".repeat(crate::MAX_KEY_BYTES).into(), "k".repeat(crate::MAX_KEY_BYTES + 1).into()]),
        ("version", vec![0.into(), (-1).into(), 1.into(), u64::MAX.into(), json("\"3\""), json("3.0")]),
        ("type", vec![json("\"\\t\""), json("\"Dep\\u00e9sited\"")]),
        ("occurred_at", vec![json("\"2026-11-21T12:00:00+02:00\""), json("\"2026-11-21\"")]),
        ("data", vec![json("{\"amount\": \"\\u00e9\"}")]),
        ("metadata", vec![json("{\"trace\": {\"a\": [1]}}")]),
        ("extra", vec![]),
    ];
    for (_, values) in &mut fields {
        values.extend(any.iter().map(|t| json(t)));
    }
    let mut texts: Vec<Vec<u8>> = vec![
        b" \n{\"id\": 1}".to_vec(),
        b"[\"6f1c2d9e-8a6b-4c1e-9d0a-2b3c4d5e6f70\", \"account\"]".to_vec(),
        serde_json::to_string(&good()).unwrap().replacen('{', "{\"version\": 2, ", 1).into_bytes(),
    ];
    for (field, values) in &fields {
        let mut absent = good();
        absent.as_object_mut().unwrap().remove(*field);
        texts.push(serde_json::to_vec(&absent).unwrap());
        for value in values {
            let mut v = good();
            v[*field] = value.clone();
            texts.push(serde_json::to_vec(&v).unwrap());
        }
    }
    let mut taken = 0;
    for text in &texts {
        let lazy = LazyEnvelope::from_slice(text).and_then(LazyEnvelope::into_raw).map_err(|e| e.to_string());
        let checked = RawEnvelope::from_slice(text).map_err(|e| e.to_string());
        assert_eq!(lazy, checked, "{}", String::from_utf8_lossy(text));
        taken += usize::from(checked.is_ok());
    }
    assert!(taken > 10 && taken + 10 < texts.len(), "{taken} of {} taken", texts.len());
}

/// Data that is JSON by its grammar but not a JSON value serde_json can hold (a number
/// out of range, a lone surrogate, nesting past 128 levels) is refused by both readings,
/// with the same error, wherever it sits in `data`; the lazy reading never hands on data
/// that its event's decoding or [`LazyEnvelope::into_raw`] could not read.
#[test]
fn hostile_data_is_refused_by_both_readings_alike() {
    let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    let hostile = ["1e400", "-1e400", &"9".repeat(400), "\"\\ud83d\"", "\"\\udc00 x\"", &deep];
    let good = serde_json::to_string(&good()).unwrap();
    for value in hostile {
        for data in [value.to_owned(), format!("{{\"amount\": {value}}}"), format!("{{\"x\": [{{\"y\": {value}}}]}}")] {
            let text = good.replace(r#"{"amount":500}"#, &data);
            assert!(text.contains(&data), "{text}");
            let checked = RawEnvelope::from_slice(text.as_bytes()).map_err(|e| e.to_string());
            let lazy = LazyEnvelope::from_slice(text.as_bytes()).and_then(LazyEnvelope::into_raw);
            let lazy = lazy.map_err(|e| e.to_string());
            assert!(checked.is_err(), "{text}");
            assert_eq!(lazy, checked, "{text}");
        }
    }
}

fn err_with(f: impl FnOnce(&mut Map<String, Value>)) -> String {
    let mut v = good();
    f(v.as_object_mut().unwrap());
    RawEnvelope::from_value(v).unwrap_err().to_string()
}

/// The shipped JSON Schema says what the decoder does: the same fields, the same
/// required ones, the version's lower bound, metadata an object or null.
#[test]
fn the_json_schema_matches_the_decoder() {
    let schema: Value = serde_json::from_str(include_str!("../../envelope.schema.json")).unwrap();
    let mut full = good();
    full["metadata"] = serde_json::json!({"correlation_id": "c-1"});
    let fields: std::collections::BTreeSet<&String> = full.as_object().unwrap().keys().collect();
    let properties: std::collections::BTreeSet<&String> = schema["properties"].as_object().unwrap().keys().collect();
    assert_eq!(properties, fields, "the schema's properties are the envelope's fields");
    let required: Vec<&str> = schema["required"].as_array().unwrap().iter().map(|r| r.as_str().unwrap()).collect();
    for field in fields {
        let mut without = full.clone();
        without.as_object_mut().unwrap().remove(field);
        let refused = RawEnvelope::from_value(without).is_err();
        assert_eq!(refused, required.contains(&field.as_str()), "required: {field}");
    }
    assert_eq!(schema["properties"]["version"]["minimum"], 1);
    for (version, ok) in [(0, false), (1, true)] {
        let mut v = full.clone();
        v["version"] = version.into();
        assert_eq!(RawEnvelope::from_value(v).is_ok(), ok, "version {version}");
    }
    assert_eq!(schema["properties"]["metadata"]["type"], serde_json::json!(["object", "null"]));
    let mut null_metadata = full.clone();
    null_metadata["metadata"] = Value::Null;
    assert!(RawEnvelope::from_value(null_metadata).is_ok());
}

#[test]
fn decodes_a_valid_envelope_into_the_typed_event() {
    let raw = RawEnvelope::from_slice(&serde_json::to_vec(&good()).unwrap()).unwrap();
    assert_eq!(raw.version, 3);
    assert_eq!(raw.metadata, None);
    match raw.decode::<Ev>().unwrap() {
        Decoded::Event(env) => {
            assert_eq!(env.event, Ev::Deposited { amount: 500 });
            assert_eq!(env.aggregate_id, "acc-1");
        }
        other => panic!("expected an event, got {other:?}"),
    }
}

#[test]
fn round_trips_through_the_wire_format() {
    let mut v = good();
    v["metadata"] = serde_json::json!({"trace": "t-1"});
    let raw = RawEnvelope::from_value(v).unwrap();
    let again = RawEnvelope::from_slice(&raw.to_json()).unwrap();
    assert_eq!(raw, again);
    let Decoded::Event(env) = again.decode::<Ev>().unwrap() else { panic!() };
    assert_eq!(env.to_raw(), raw);
}

#[test]
fn errors_name_the_field_and_the_problem() {
    assert_eq!(
        err_with(|o| {
            o.insert("version".into(), 0.into());
        }),
        "field `version`: must be >= 1, got 0"
    );
    assert_eq!(
        err_with(|o| {
            o.insert("version".into(), (-4).into());
        }),
        "field `version`: must be >= 1, got -4"
    );
    assert_eq!(
        err_with(|o| {
            o.insert("version".into(), "3".into());
        }),
        "field `version`: must be an integer >= 1, got a string"
    );
    assert!(err_with(|o| {
        o.insert("version".into(), serde_json::json!(1.5));
    })
    .contains("must be an integer >= 1, got 1.5"));
    assert_eq!(
        err_with(|o| {
            o.remove("aggregate_id");
        }),
        "field `aggregate_id`: missing"
    );
    assert_eq!(
        err_with(|o| {
            o.insert("aggregate_id".into(), "".into());
        }),
        "field `aggregate_id`: must not be empty"
    );
    assert_eq!(
        err_with(|o| {
            o.insert("aggregate_id".into(), "k".repeat(crate::MAX_KEY_BYTES + 1).into());
        }),
        "field `aggregate_id`: the value is 1025 bytes long, longer than the 1024 bytes a key may have"
    );
    assert!(err_with(|o| {
        o.insert("aggregate_type".into(), "acc\0".into());
    })
    .starts_with("field `aggregate_type`: the value holds a NUL character"));
    assert!(err_with(|o| {
        o.insert("id".into(), "nope".into());
    })
    .starts_with("field `id`: not a UUID"));
    assert!(err_with(|o| {
        o.insert("occurred_at".into(), "yesterday".into());
    })
    .starts_with("field `occurred_at`: not an RFC 3339"));
    assert_eq!(
        err_with(|o| {
            o.remove("data");
        }),
        "field `data`: missing"
    );
    assert_eq!(
        err_with(|o| {
            o.insert("metadata".into(), 7.into());
        }),
        "field `metadata`: must be an object, got a number"
    );
    assert_eq!(
        err_with(|o| {
            o.insert("type".into(), Value::Null);
        }),
        "field `type`: missing"
    );
}

#[test]
fn rejects_non_objects_and_broken_json_without_panicking() {
    assert_eq!(
        RawEnvelope::from_slice(b"[1,2]").unwrap_err().to_string(),
        "envelope must be a JSON object, got an array"
    );
    assert!(RawEnvelope::from_slice(b"{\"id\":").unwrap_err().to_string().starts_with("invalid JSON"));
    assert!(RawEnvelope::from_slice(b"").is_err());
}

#[test]
fn bytes_that_are_not_utf8_are_refused_saying_where_and_escapes_still_read() {
    let mut bytes = serde_json::to_vec(&good()).unwrap();
    let at = bytes.windows(4).position(|w| w == b"acc-").expect("the aggregate id");
    bytes[at] = 0xff;
    let err = LazyEnvelope::from_slice(&bytes).unwrap_err().to_string();
    assert!(err.starts_with("invalid JSON") && err.contains("line 1 column"), "{err}");
    let mut v = good();
    v["aggregate_id"] = "\u{e9}t\u{e9} \"quoted\"".into();
    // The accents written as JSON escapes: read as text, they are still unescaped.
    let text = serde_json::to_string(&v).unwrap().replace('\u{e9}', "\\u00e9");
    assert!(text.contains(r#""\u00e9t\u00e9 \"quoted\"""#), "{text}");
    let lazy = LazyEnvelope::from_slice(text.as_bytes()).unwrap();
    assert_eq!(lazy.aggregate_id, "\u{e9}t\u{e9} \"quoted\"");
}

#[test]
fn unknown_event_types_are_unhandled_not_errors() {
    let mut v = good();
    v["type"] = "SomethingElse".into();
    let raw = RawEnvelope::from_value(v).unwrap();
    assert!(matches!(raw.decode::<Ev>().unwrap(), Decoded::Ignored(_)));
}

#[test]
fn one_decoder_for_a_batch_moves_what_in_place_decoding_copies() {
    let decoder = EventDecoder::<Ev>::new();
    assert!(decoder.handles("Opened") && decoder.handles("Deposited") && !decoder.handles("SomethingElse"));
    let mut opened = good();
    opened["type"] = "Opened".into();
    opened["data"] = serde_json::json!({"owner": "ann"});
    for v in [good(), opened] {
        let raw = RawEnvelope::from_value(v).unwrap();
        let in_place = raw.event::<Ev>().unwrap().expect("handled");
        let Decoded::Event(moved) = decoder.decode(raw).unwrap() else { panic!("not decoded") };
        assert_eq!(moved, in_place);
    }
    let err = decoder.event("Deposited", serde_json::json!({"amount": "lots"})).unwrap_err().to_string();
    assert!(err.contains("Deposited") && err.contains("invalid type"), "{err}");
    // Not an enum tagged by `type`: every event is offered to it.
    assert!(EventDecoder::<Value>::new().handles("Anything"));
}

#[test]
fn a_known_type_with_bad_data_is_an_error_naming_the_type() {
    let mut v = good();
    v["data"] = serde_json::json!({"amount": "lots"});
    let err = RawEnvelope::from_value(v).unwrap().decode::<Ev>().unwrap_err().to_string();
    // The field inside `data` is named, not only `data`.
    assert!(err.starts_with("field `data.amount` of event type Deposited: invalid type"), "{err}");
    let decoder = EventDecoder::<Ev>::new();
    let data = serde_json::value::RawValue::from_string(r#"{"amount": "lots"}"#.into()).unwrap();
    let lazy = decoder.event_from_json("Deposited", &data).unwrap_err().to_string();
    assert_eq!(lazy, err, "the engine's path says the same");
    let missing = decoder.event("Deposited", serde_json::json!({})).unwrap_err().to_string();
    assert_eq!(missing, "field `data` of event type Deposited: missing field `amount`");
}
