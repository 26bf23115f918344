#!/usr/bin/env bash
# The bench command: brings up the services, then prints throughput figures and ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/services.sh)"
export DATABASE_URL KAFKA_BROKERS
cargo bench --locked --bench throughput
