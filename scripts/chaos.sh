#!/usr/bin/env bash
# The fault suite at full strength (docs/testing.md#the-fault-suite): brings up the services,
# builds the projector with its kill points (the `fault-hooks` feature: never in a build you
# deploy), runs every scenario of examples/bank-accounts/tests/chaos.rs one at a time with
# CHAOS_FULL=1, and prints one row per scenario: what was done, how long the recovery took,
# accounts with an event lost or applied twice (both must be 0), how the partition accounts
# were checked (see examples/bank-accounts/tests/chaos/accounting.rs), pass or fail. The test
# command runs a short version of the same scenarios.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/services.sh)"
export DATABASE_URL KAFKA_BROKERS PROJECTIONIST_BROKER
export CHAOS_FULL=${CHAOS_FULL:-1}
export CHAOS_REPORT="$PWD/target/chaos-report.txt"
mkdir -p target && : >"$CHAOS_REPORT"
status=0
cargo test --locked -p bank-accounts --features fault-hooks --test chaos -- --test-threads=1 --include-ignored "$@" \
    || status=$?
echo
printf '%-40s | %-50s | %9s | %4s | %7s | %-7s | %s\n' scenario "what was done" recovery lost doubled counted result
printf '%s\n' "-----------------------------------------+----------------------------------------------------+-----------+------+---------+---------+-------"
cat "$CHAOS_REPORT"
exit "$status"
