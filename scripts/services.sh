#!/usr/bin/env bash
# Brings up the services projectionist's tests and demo need, idempotently:
#   PostgreSQL (Debian's packages): installed if missing, started if stopped, left alone if
#   running; role and database `projectionist` (password `projectionist`, CREATEDB so
#   `#[sqlx::test]` can make a fresh database per test).
# Prints the environment to use (`eval "$(scripts/services.sh)"`); progress goes to stderr.
set -euo pipefail

PG_HOST=127.0.0.1
PG_PORT=${PG_PORT:-5432}
PG_USER=projectionist
PG_DB=projectionist

log() { printf '[services] %s\n' "$*" >&2; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
as_postgres() { as_root runuser -u postgres -- "$@"; }

pg_server_installed() { compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null; }

ensure_postgres() {
    if pg_isready -q -h "$PG_HOST" -p "$PG_PORT" 2>/dev/null; then
        log "PostgreSQL already answers on $PG_HOST:$PG_PORT; leaving it as it is."
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
    CREATE ROLE $PG_USER LOGIN CREATEDB PASSWORD '$PG_USER';
  ELSE
    ALTER ROLE $PG_USER LOGIN CREATEDB PASSWORD '$PG_USER';
  END IF;
END\$\$;
SQL
    if ! as_postgres psql -tA -d postgres -c "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'" | grep -q 1; then
        as_postgres createdb -O "$PG_USER" "$PG_DB"
    fi
    log "PostgreSQL ready: database $PG_DB, role $PG_USER."
}

ensure_postgres
echo "export DATABASE_URL=postgres://$PG_USER:$PG_USER@$PG_HOST:$PG_PORT/$PG_DB"
