#!/usr/bin/env bash
# What a restart of `run` waits for before its partitions are assigned again, on the broker
# scripts/services.sh chooses (docs/brokers.md and docs/operations.md quote the figures):
# for each kind of restart, ROUNDS times, the seconds from the new process's start to its
# log's "Partition assigned." Then, with two members, what a joining member waits for under
# eager and cooperative rebalancing, and how many partitions the member already running
# gave up meanwhile. Needs a built bank-accounts (BIN, default target/release/bank-accounts).
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/services.sh)"
export DATABASE_URL KAFKA_BROKERS
BIN=${BIN:-$PWD/target/release/bank-accounts}
ROUNDS=${ROUNDS:-4}
work=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done; rm -rf "$work"' EXIT
export BANK_ACCOUNTS_TOPIC=timings.$RANDOM$RANDOM PROJECTIONIST_METRICS_ADDR=off RUST_LOG=info
"$BIN" migrate >"$work/migrate.log" 2>&1 || { cat "$work/migrate.log"; exit 1; }
"$BIN" create-topics --partitions 4 >/dev/null

# start NAME ARGS…: a runner in the background, its log in $work/NAME.log, its pid in $started.
start() {
    local name=$1
    shift
    "$BIN" run "$@" >"$work/$name.log" 2>&1 &
    started=$!
    pids+=("$started")
}

# Seconds since $1 (date +%s.%N) until "Partition assigned." appears in log $2.
until_assigned() {
    while ! grep -q 'Partition assigned\.' "$2"; do sleep 0.02; done
    awk -v now="$(date +%s.%N)" -v since="$1" 'BEGIN { print now - since }'
}

restart() { # kind signal args…
    local kind=$1 signal=$2 times=()
    shift 2
    for round in $(seq 1 "$ROUNDS"); do
        start "$kind-$round-a" "$@"
        until_assigned "$(date +%s.%N)" "$work/$kind-$round-a.log" >/dev/null
        kill "-$signal" "$started"
        wait "$started" 2>/dev/null || true
        local at
        at=$(date +%s.%N)
        start "$kind-$round-b" "$@"
        times+=("$(until_assigned "$at" "$work/$kind-$round-b.log")")
        kill -TERM "$started"
        wait "$started" 2>/dev/null || true
    done
    printf '%-34s %s s\n' "$kind" "$(printf '%.1f ' "${times[@]}")"
}

join() { # kind args…: a second member joins a running one
    local kind=$1
    shift
    start "$kind-a" "$@"
    local a=$started
    until_assigned "$(date +%s.%N)" "$work/$kind-a.log" >/dev/null
    local at
    at=$(date +%s.%N)
    start "$kind-b" "$@"
    local took
    took=$(until_assigned "$at" "$work/$kind-b.log")
    sleep 1
    printf '%-34s %.1f s; the running member gave up %s of its 4 partitions\n' "$kind" "$took" \
        "$(grep -c 'Partition revoked' "$work/$kind-a.log" || true)"
    kill -TERM "$a" "$started"
    wait "$a" "$started" 2>/dev/null || true
}

echo "On $PROJECTIONIST_BROKER ($KAFKA_BROKERS), $ROUNDS rounds each: seconds from start to 'Partition assigned.'"
restart "after SIGTERM, dynamic" TERM --group-id "g-term-$RANDOM"
restart "after SIGKILL, dynamic" KILL --group-id "g-kill-$RANDOM"
restart "after SIGTERM, static" TERM --group-id "g-sterm-$RANDOM" --group-instance-id one
restart "after SIGKILL, static" KILL --group-id "g-skill-$RANDOM" --group-instance-id one
join "join, eager (range)" --group-id "g-eager-$RANDOM"
join "join, cooperative-sticky" --group-id "g-coop-$RANDOM" --kafka-property partition.assignment.strategy=cooperative-sticky
