use super::*;

#[test]
fn debug_never_shows_secrets() {
    let cfg = EngineConfig::new("sasl://bob:hunter2@broker:9092")
        .with_kafka_property("security.protocol", "SASL_SSL")
        .with_kafka_property("sasl.password", "hunter2")
        .with_kafka_property("ssl.key.password", "hunter2-key")
        .with_kafka_property("ssl.key.pem", "-----BEGIN PRIVATE KEY-----hunter2")
        .with_kafka_property("sasl.oauthbearer.client.secret", "hunter2-oauth")
        .with_kafka_property("sasl.oauthbearer.config", "principal=bob token=hunter2");
    let shown = format!("{cfg:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(
        shown.contains("sasl.password")
            && shown.contains("sasl.oauthbearer.client.secret")
            && shown.contains("broker:9092"),
        "{shown}"
    );
    assert!(shown.contains("SASL_SSL"), "harmless values stay readable: {shown}");
}

#[test]
fn a_configured_group_id_gives_each_of_several_projections_a_group_of_its_own() {
    let cfg = EngineConfig::new("b").with_group_id("projector");
    assert_eq!(
        ["bank_accounts", "order_status"].map(|p| cfg.group_for(p)),
        ["projector.bank_accounts", "projector.order_status"]
    );
    assert_eq!(EngineConfig::new("b").group_for("orders"), "projectionist.orders");
}

#[test]
fn deserialises_with_defaults_and_rejects_unknown_fields() {
    let cfg: EngineConfig = serde_json::from_str(r#"{"brokers": "localhost:9092"}"#).unwrap();
    assert_eq!(
        (cfg.batch_max_events, cfg.batch_max_bytes, cfg.batch_max_wait_ms, cfg.max_retries),
        (5000, 4 << 20, 100, 5)
    );
    assert_eq!(cfg.group_for("bank_accounts"), "projectionist.bank_accounts");
    let err = serde_json::from_str::<EngineConfig>(r#"{"brokers": "x", "batch_size": 3}"#).unwrap_err();
    assert!(err.to_string().contains("unknown field `batch_size`"), "{err}");
    let err = serde_json::from_str::<EngineConfig>(r#"{"batch_max_events": 3}"#).unwrap_err();
    assert!(err.to_string().contains("missing field `brokers`"), "{err}");
}

#[test]
fn the_client_settings_are_flattened_in() {
    let text = r#"{"brokers": "b:1", "kafka": {"client.rack": "a"}, "group_id": "g"}"#;
    let cfg: EngineConfig = serde_json::from_str(text).unwrap();
    assert_eq!(cfg.client.brokers, "b:1");
    assert_eq!(cfg.client.properties.get("client.rack").map(String::as_str), Some("a"));
    let back = serde_json::to_value(&cfg).unwrap();
    assert_eq!(
        (&back["brokers"], &back["kafka"]["client.rack"], &back["group_id"]),
        (&"b:1".into(), &"a".into(), &"g".into())
    );
}
