#!/usr/bin/env bash
# The test command: brings up the services (PostgreSQL, the broker, and the TLS terminator
# and extra brokers of the TLS/SASL tests), then runs every test of the workspace. Tests
# that need a broker feature the broker lacks are listed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/services.sh --tls)"
export DATABASE_URL KAFKA_BROKERS KAFKA_TLS_BROKERS KAFKA_TLS_CA KAFKA_TLS_WRONG_CA KAFKA_TLS_CLIENT_CERT KAFKA_TLS_CLIENT_KEY KAFKA_SASL_BROKERS
export PG_TLS_URL=${PG_TLS_URL:-}
export PROJECTIONIST_SKIP_LOG="$PWD/target/skipped-tests.log"
mkdir -p target && : >"$PROJECTIONIST_SKIP_LOG"
# Each Postgres test makes its own database and each Kafka test its own topics and group,
# so test binaries run their tests in parallel; 4 threads suit the 2-core machines.
cargo test --workspace --locked -- --test-threads="${TEST_THREADS:-4}" "$@"
if [ -s "$PROJECTIONIST_SKIP_LOG" ]; then
    echo
    echo "Skipped at run time ($(wc -l <"$PROJECTIONIST_SKIP_LOG") test(s)), with the reason:"
    sed 's/^/  SKIPPED /' "$PROJECTIONIST_SKIP_LOG"
fi
