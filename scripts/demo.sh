#!/usr/bin/env bash
# The demo: services up, migrate, publish a generated bank-account stream (thousands of
# events across hundreds of accounts, with duplicates and re-sent events mixed in), project
# it, and show the summary and a few rows of the read model.
set -euo pipefail
cd "$(dirname "$0")/.."
ACCOUNTS=${ACCOUNTS:-400}
MAX_EVENTS=${MAX_EVENTS:-30}

step() { printf '\n==> %s\n' "$*"; }

step "Services (PostgreSQL, Kafka-protocol broker)"
eval "$(scripts/services.sh)"
export DATABASE_URL KAFKA_BROKERS

step "Building the bank-accounts projector and its event generator"
# The generator is test data made with the test kit: it is built only with the `generate` feature.
cargo build --locked -p bank-accounts --features generate --bins

# Where cargo put them (CARGO_TARGET_DIR, if set).
debug="${CARGO_TARGET_DIR:-target}/debug"
BIN="$debug/bank-accounts"
events=$(mktemp --suffix=.ndjson)
trap 'rm -f "$events"' EXIT

step "Migrating and creating topics"
$BIN migrate
$BIN create-topics

step "Generating $ACCOUNTS accounts' events (with duplicates and re-sent events)"
"$debug/generate-bank-events" --accounts "$ACCOUNTS" --max-events "$MAX_EVENTS" --seed "${SEED:-42}" >"$events"

step "Publishing with a transactional producer"
$BIN publish --topic bank.accounts "$events"

step "Projecting (rebuilding bank_accounts from offset zero)"
RUST_LOG=${RUST_LOG:-info} $BIN run --reset --exit-when-caught-up

step "Where the projection stands"
$BIN status

step "A few rows of the read model (compare the totals with the expectation printed at generation)"
psql "$DATABASE_URL" -P pager=off -c "SELECT account_id, owner, balance, status, version FROM bank_accounts ORDER BY version DESC, account_id LIMIT 8"
psql "$DATABASE_URL" -P pager=off -c "SELECT count(*) AS accounts, sum(balance) AS total_balance_cents, sum(version) AS events_applied FROM bank_accounts"
