#!/usr/bin/env bash
# The bench command: brings up the services, builds the projector in release mode, then
# prints throughput figures and ratios, every arm on the same generated stream (see
# benches/throughput.rs for the sizes: BENCH_DELIVERIES, BENCH_RSS_DELIVERIES, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/services.sh)"
export DATABASE_URL KAFKA_BROKERS
cargo build --release --locked -p bank-accounts --bin bank-accounts -p order-status --bin order-status
# BANK_ACCOUNTS_BIN, when set, is the projector measured (another build, to compare).
export BANK_ACCOUNTS_BIN="${BANK_ACCOUNTS_BIN:-$PWD/target/release/bank-accounts}"
export ORDER_STATUS_BIN="${ORDER_STATUS_BIN:-$PWD/target/release/order-status}"
cargo bench --locked --bench throughput
