//! A secret given in the wrong shape (a colon for `=`, a settings file that does not parse,
//! a URL without its scheme) is refused by setting name: the value never reaches stdout or
//! stderr. Each run fails before it reaches PostgreSQL or Kafka.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_bank-accounts");

/// The value each test hides; no message may hold it.
const SECRET: &str = "Sw0rdf1sh-never-shown";

/// The settings that may hold a secret: librdkafka's, and those a Java client's file brings.
const SECRET_KEYS: &[&str] = &[
    "sasl.password",
    "ssl.key.password",
    "ssl.keystore.password",
    "ssl.truststore.password",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.config",
    "sasl.oauthbearer.extensions",
    "sasl.jaas.config",
    "ssl.key.pem",
];

/// Runs the binary with `args` (and `DATABASE_URL`): whether it succeeded, its stdout and stderr.
fn run(args: &[&str], database_url: &str) -> (bool, String) {
    let out = Command::new(BIN)
        .args(args)
        .env("DATABASE_URL", database_url)
        .env("KAFKA_BROKERS", "127.0.0.1:1")
        .env("KAFKA_CONNECT_TIMEOUT_SECS", "1")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

fn assert_hidden(what: &str, (ok, output): (bool, String), named: &str) {
    assert!(!ok, "{what} was accepted:\n{output}");
    assert!(!output.contains(SECRET), "{what} printed the secret:\n{output}");
    assert!(output.contains(named), "{what} does not name {named}:\n{output}");
}

#[test]
fn a_malformed_secret_is_refused_by_name_never_repeated() {
    let database_url = "postgres://projectionist:projectionist@127.0.0.1:1/projectionist";
    let dir = std::env::temp_dir().join(format!("projectionist-secrets-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("projectionist.toml");
    for key in SECRET_KEYS {
        let colon = format!("{key}:{SECRET}");
        assert_hidden(&colon, run(&["--kafka-property", &colon, "status"], database_url), key);
        // Unknown to librdkafka (a typo): refused at the client's creation, naming the key.
        let typo = format!("{key}x={SECRET}");
        assert_hidden(&typo, run(&["--kafka-property", &typo, "status"], database_url), key);
        for broken in [
            format!("[kafka]\n\"{key}\" = {SECRET}\n"),
            format!("[kafka]\n\"{key}\": \"{SECRET}\"\n"),
            format!("[kafka]\n\"{key}\" = \"{SECRET}\n"),
            format!("[kafka]\n\"{key}\" = \"\"\"\nx\npassword=\"{SECRET}\\q\";\n\"\"\"\n"),
            format!("[kafka]\n\"{key}\" = 4242{SECRET}\n"),
        ] {
            std::fs::write(&file, &broken).unwrap();
            let output = run(&["--config", file.to_str().unwrap(), "status"], database_url);
            assert!(output.1.contains(file.to_str().unwrap()), "names the file:\n{}", output.1);
            assert_hidden(&broken, output, key);
        }
    }
    let no_scheme = format!("projectionist:{SECRET}@127.0.0.1:1/projectionist?options=http://x");
    assert_hidden("a URL without its scheme", run(&["migrate"], &no_scheme), "DATABASE_URL");
    std::fs::remove_dir_all(&dir).unwrap();
}
