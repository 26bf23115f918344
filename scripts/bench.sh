#!/usr/bin/env bash
# The bench command: brings up the services, builds the projector in release mode, then
# prints throughput figures and ratios, every arm on the same generated stream (see
# benches/throughput.rs for the sizes: BENCH_DELIVERIES, BENCH_RSS_DELIVERIES, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/services.sh)"
export DATABASE_URL KAFKA_BROKERS
# The peer arm's Kafka Connect and Debezium JDBC sink (BENCH_PEER=0 skips it): fetched once;
# where it cannot run (no Java 17 or Maven), the arm is skipped with the reason.
if [ "${BENCH_PEER:-1}" != 0 ]; then
    peer_env=$(scripts/services.sh --kafka-connect) && eval "$peer_env" \
        || echo "[bench] The peer arm is skipped: Kafka Connect cannot run here (above)." >&2
fi
# The Avro arm's schema registry and Confluent's Python serializer (BENCH_AVRO=0 skips it).
if [ "${BENCH_AVRO:-1}" != 0 ]; then
    avro_env=$(scripts/services.sh --registry && scripts/services.sh --python-producers) && eval "$avro_env" \
        || echo "[bench] The Avro arm is skipped: no registry or Python producers here (above)." >&2
fi
# The traces arm's receiver, Jaeger (BENCH_TRACES=0 skips it).
if [ "${BENCH_TRACES:-1}" != 0 ]; then
    traces_env=$(scripts/services.sh --jaeger) && eval "$traces_env" \
        || echo "[bench] The traces arm is skipped: Jaeger cannot start here (above)." >&2
fi
cargo build --release --locked -p bank-accounts --bin bank-accounts --bin account-states --bin bank-fleet -p order-status --bin order-status
# BANK_ACCOUNTS_BIN, when set, is the projector measured (another build, to compare);
# otherwise the binaries just built, where cargo put them (CARGO_TARGET_DIR, if set).
release="${CARGO_TARGET_DIR:-$PWD/target}/release"
export BANK_ACCOUNTS_BIN="${BANK_ACCOUNTS_BIN:-$release/bank-accounts}"
export ORDER_STATUS_BIN="${ORDER_STATUS_BIN:-$release/order-status}"
export ACCOUNT_STATES_BIN="${ACCOUNT_STATES_BIN:-$release/account-states}"
export BANK_FLEET_BIN="${BANK_FLEET_BIN:-$release/bank-fleet}"
cargo bench --locked --bench throughput
