use super::*;

#[test]
fn bootstrap_addresses_leave_out_schemes_and_user_info() {
    let brokers = "a:9092, sasl_ssl://bob:pw@b:9093,,c:1";
    assert_eq!(bootstrap_addresses(brokers), ["a:9092", "b:9093", "c:1"]);
}

#[test]
fn debug_shows_harmless_values_and_hides_secrets() {
    let cfg = KafkaClientConfig::new("sasl://bob:hunter2@broker:9093")
        .with_property("security.protocol", "SASL_SSL")
        .with_property("sasl.mechanism", "SCRAM-SHA-512")
        .with_property("sasl.username", "bob")
        .with_property("sasl.password", "hunter2")
        .with_property("ssl.key.password", "keypass-hunter2")
        .with_property("sasl.oauthbearer.client.secret", "oauth-hunter2");
    let shown = format!("{cfg:?}");
    assert!(!shown.contains("hunter2") && !shown.contains("bob"), "{shown}");
    assert!(shown.contains("SASL_SSL") && shown.contains("SCRAM-SHA-512") && shown.contains("broker:9093"), "{shown}");
    assert!(shown.contains("sasl.oauthbearer.client.secret") && shown.contains("ssl.key.password"), "{shown}");
}

#[test]
fn properties_override_defaults_but_not_the_brokers() {
    let cfg = KafkaClientConfig::new("a:1").with_property("linger.ms", "7").with_property("bootstrap.servers", "b:2");
    let c = cfg.client_config_with_defaults(&[("linger.ms", "5"), ("acks", "all")]);
    assert_eq!((c.get("linger.ms"), c.get("acks"), c.get("bootstrap.servers")), (Some("7"), Some("all"), Some("a:1")));
}

#[test]
fn classifies_librdkafka_reasons() {
    use ConnectFailure::*;
    let cases = [
        (
            Some(RDKafkaErrorCode::SSL),
            "ssl://127.0.0.1:19093/bootstrap: SSL handshake failed: error:0A000086:SSL \
            routines::certificate verify failed: broker certificate could not be verified",
            Certificate,
        ),
        (
            Some(RDKafkaErrorCode::SSL),
            "SSL handshake failed: error:0A00045C:SSL routines::tlsv13 alert \
            certificate required",
            TlsHandshake,
        ),
        (
            Some(RDKafkaErrorCode::BrokerTransportFailure),
            "ssl://127.0.0.1:19093/bootstrap: Receive failed: error:0A000412:SSL routines::sslv3 \
            alert bad certificate: SSL alert number 42 (after 11ms in state APIVERSION_QUERY)",
            TlsHandshake,
        ),
        (
            Some(RDKafkaErrorCode::Authentication),
            "SASL authentication error: Authentication failed during \
            authentication due to invalid credentials with SASL mechanism SCRAM-SHA-256",
            Authentication,
        ),
        (
            Some(RDKafkaErrorCode::BrokerTransportFailure),
            "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 \
            failed: Connection refused",
            Unreachable,
        ),
    ];
    for (code, reason, want) in cases {
        assert_eq!(ConnectFailure::classify(code, reason), want, "{reason}");
    }
}

#[test]
fn scrubs_secret_values_from_messages() {
    let cfg = KafkaClientConfig::new("b:1")
        .with_property("sasl.password", "hunter2")
        .with_property("security.protocol", "SASL_SSL");
    assert_eq!(cfg.scrub("bad hunter2 over SASL_SSL".into()), "bad <redacted> over SASL_SSL");
}

#[test]
fn a_refused_property_is_named_without_its_value_however_short() {
    for key in ["sasl.passwordx", "enable.sasl.oauthbearer.unsecure.jwt"] {
        let cfg = KafkaClientConfig::new("127.0.0.1:1").with_property(key, "q7z");
        let err = cfg.preflight(Duration::from_secs(1)).unwrap_err().to_string();
        assert!(err.contains(key) && !err.contains("q7z"), "{err}");
    }
    let cfg = KafkaClientConfig::new("127.0.0.1:1").with_property("security.protocol", "q7z");
    let err = cfg.preflight(Duration::from_secs(1)).unwrap_err().to_string();
    assert!(err.contains("security.protocol") && err.contains("q7z"), "a harmless value is shown: {err}");
}

/// librdkafka was built with what managed services need: OpenSSL (SSL, SCRAM) and
/// libcurl (the OIDC client-credentials flow of OAUTHBEARER).
#[test]
fn librdkafka_accepts_tls_scram_and_oidc_settings() {
    for props in [
        &[("security.protocol", "SSL"), ("ssl.endpoint.identification.algorithm", "https")][..],
        &[
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "SCRAM-SHA-256"),
            ("sasl.username", "u"),
            ("sasl.password", "p"),
        ][..],
        &[
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "SCRAM-SHA-512"),
            ("sasl.username", "u"),
            ("sasl.password", "p"),
        ][..],
        &[
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "PLAIN"),
            ("sasl.username", "u"),
            ("sasl.password", "p"),
        ][..],
        &[
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "OAUTHBEARER"),
            ("sasl.oauthbearer.method", "oidc"),
            ("sasl.oauthbearer.client.id", "id"),
            ("sasl.oauthbearer.client.secret", "secret"),
            ("sasl.oauthbearer.token.endpoint.url", "https://127.0.0.1:1/token"),
        ][..],
    ] {
        let mut cfg = KafkaClientConfig::new("127.0.0.1:1");
        for (k, v) in props {
            cfg = cfg.with_property(*k, *v);
        }
        let made: std::result::Result<BaseConsumer, _> = cfg.client_config().create();
        assert!(made.is_ok(), "{props:?}: {:?}", made.err());
    }
}
