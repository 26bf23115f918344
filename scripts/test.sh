#!/usr/bin/env bash
# The test command: brings up the services, then runs every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/services.sh)"
export DATABASE_URL
# Postgres tests each create a database; two test threads keep the 2-core machines responsive.
cargo test --workspace --locked -- --test-threads="${TEST_THREADS:-4}" "$@"
