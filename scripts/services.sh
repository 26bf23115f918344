#!/usr/bin/env bash
# Brings up the services projectionist's tests, demo and bench need, idempotently:
#   PostgreSQL (Debian's packages): installed if missing, started if stopped, left alone if
#   running; role and database `projectionist` (password `projectionist`, CREATEDB and
#   CREATEROLE so the redaction test can make a role with a password of its own, and so
#   `#[sqlx::test]` can make a fresh database per test).
#   A Kafka broker, chosen in this order:
#     1. KAFKA_BROKERS set by the user: that broker; none is started.
#     2. Apache Kafka (services/apache-kafka.sh): one KRaft node on 127.0.0.1:9092 from Maven
#        Central's jars, its log on disk under $STATE_DIR/main. Needs Java 17+ and Maven.
#     3. tansu (services/tansu.sh): a Kafka-protocol stand-in, with a line saying what was
#        missing and which tests that costs.
#   Something already listening on 127.0.0.1:9092 is left alone and used.
#   Build prerequisites: librdkafka is built against Debian's OpenSSL and libcurl (TLS, SCRAM,
#   OAUTHBEARER/OIDC), so libssl-dev, libcurl4-openssl-dev and pkg-config are installed if
#   missing.
# With --tls, also what the TLS and SASL tests need, all on 127.0.0.1: a test CA, broker and
#   client certificates under $STATE_DIR/tls; a mutual-TLS broker listener (19093) and a SASL
#   listener (19094; PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512, with a test user) — Apache
#   Kafka's own, or tansu behind stunnel and a tansu with --authentication; and a second
#   local PostgreSQL cluster on 5433 with a test-CA server certificate that requires client
#   certificates.
# With --build-deps, only the build prerequisites (for CI's lint steps), and nothing printed.
# With --start-broker, --stop-broker or --restart-broker [main|faults]: only that Apache Kafka
#   instance, stopped by the pid recorded when it was started, never by a name (`faults` is
#   a second broker on 29092 that the broker fault tests stop and start).
# With --start-cluster or --stop-cluster: the fault suite's three-node KRaft cluster (node1,
#   node2, node3 on 39092, 39192, 39292; prints KAFKA_CLUSTER_BROKERS), started together or
#   stopped by their recorded pids; --start-broker nodeN starts one again, --kill-broker
#   INSTANCE SIGKILLs one by its recorded pid (a crash).
# With --start-postgres or --crash-postgres: only the fault suite's PostgreSQL cluster
#   (projectionist_faults, on 5435), started (created first if needed; prints PG_FAULTS_URL)
#   or crashed (an immediate stop of that cluster's own postmaster).
# With --kafka-connect: only Kafka Connect's and Debezium's JDBC sink's jars for the bench's
#   peer arm, fetched once (prints KAFKA_CONNECT_LIBS and KAFKA_CONNECT_PLUGINS; fails saying
#   why when Java 17 or Maven is missing).
# With --registry or --stop-registry: only Apicurio Registry (services/apicurio-registry.sh),
#   the schema registry of the format tests (issue 68): fetched from Maven Central once, run
#   in memory on 127.0.0.1:8181 (management 8182) with Java 21+ and a small heap, global
#   compatibility BACKWARD; prints SCHEMA_REGISTRY_URL (its Confluent-compatible API).
#   Stopped by the pid recorded when it was started.
# With --outbox-postgres or --stop-outbox-postgres: only the outbox chain's PostgreSQL cluster
#   (projectionist_outbox, on 5436, wal_level=logical; role projectionist with REPLICATION),
#   created once, started if stopped (prints OUTBOX_PG_URL), or stopped. Its outbox table:
#   services/outbox.sql.
# With --start-connect NAME, --stop-connect NAME, --kill-connect NAME or --drop-connect NAME:
#   one Kafka Connect worker of the outbox chain (services/debezium-outbox.sh): Debezium's
#   PostgreSQL source with its outbox event router, reading $OUTBOX_TABLE (public.outbox) of
#   database $OUTBOX_DB (projectionist) on 5436 into topic $OUTBOX_TOPIC (NAME) of
#   $KAFKA_BROKERS, through slot and publication outbox_NAME, its offsets in a file under
#   $STATE_DIR/outbox/NAME. Start waits for the task to run and prints OUTBOX_CONNECT_PID,
#   OUTBOX_CONNECT_URL and OUTBOX_CONNECT_LOG; stop (TERM) and kill (KILL, a crash) use the
#   recorded pid; drop stops it and forgets its slot, publication and offsets. More settings
#   and the messages' shape: the head of services/debezium-outbox.sh.
# With --python-producers: only a Python venv in the cache with Confluent's client (Avro,
#   Protobuf, JSON Schema serializers) and the CloudEvents SDK at pinned versions
#   (services/python-producers.txt), made once; prints PROJECTIONIST_PYTHON.
# With --jaeger or --stop-jaeger: only Jaeger v2 (services/jaeger.sh), the trace receiver of
#   the tracing tests, built from the Go module proxy once; prints OTLP_GRPC_ENDPOINT,
#   OTLP_HTTP_ENDPOINT and JAEGER_QUERY_URL.
# With --browser: only the browser tests' headless browser (services/browser.sh): Debian's
#   Chromium, installed if missing, and a Python venv in the cache with Playwright at pinned
#   versions (services/browser-requirements.txt), made once; Playwright's own browser builds
#   are never fetched. Prints PROJECTIONIST_BROWSER_PYTHON and PROJECTIONIST_CHROMIUM.
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
PG_FAULTS_PORT=${PG_FAULTS_PORT:-5435}
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
        as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start >&2 9>&- || true
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

# Whether PostgreSQL is a local cluster we administer (the clusters below need one).
pg_ours() { pg_server_installed && as_postgres psql -tAc 'SELECT 1' -d postgres >/dev/null 2>&1; }
pg_version() { ls /usr/lib/postgresql | sort -V | tail -n 1; }

# Starts our cluster $1, which listens on port $2, and waits for it to answer.
start_cluster() {
    as_root pg_ctlcluster --skip-systemctl-redirect "$(pg_version)" "$1" start >&2 9>&-
    for _ in $(seq 1 60); do pg_isready -q -h "$PG_HOST" -p "$2" && break; sleep 0.5; done
}

# Role $PG_USER (CREATEDB) on the cluster on port $1.
ensure_role_on() {
    as_postgres psql -q -p "$1" -d postgres -c \
        "DO \$\$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_USER') THEN CREATE ROLE $PG_USER LOGIN CREATEDB PASSWORD '$PG_USER'; END IF; END\$\$;" >&2
}

# A second local cluster whose server certificate comes from the test CA (Debian's snakeoil
# one is trusted system-wide, so a wrong-CA test needs a certificate of our own) and which
# asks for a client certificate from the same CA. Skipped when PostgreSQL is not ours.
ensure_tls_postgres() {
    local dir=$STATE_DIR/tls version conf
    if ! pg_ours; then
        log "PostgreSQL is not a local cluster here: PostgreSQL TLS tests will be skipped."
        return
    fi
    version=$(pg_version)
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
        start_cluster projectionist_tls "$PG_TLS_PORT"
    fi
    ensure_role_on "$PG_TLS_PORT"
    echo "export PG_TLS_URL=postgres://$PG_USER:$PG_USER@$PG_HOST:$PG_TLS_PORT/postgres"
}

# The fault suite's own cluster, projectionist_faults on $PG_FAULTS_PORT, which it crashes
# (`--crash-postgres`: an immediate stop, no clean shutdown, through pg_ctl and the cluster's
# own postmaster.pid) so that nothing else loses its database. Created and started here;
# prints PG_FAULTS_URL. Only where PostgreSQL is a local cluster we administer.
start_faults_postgres() {
    local version conf
    if ! pg_ours; then
        log "PostgreSQL is not a local cluster here: no faults cluster."
        return 1
    fi
    version=$(pg_version)
    conf=/etc/postgresql/$version/projectionist_faults
    if [ ! -d "$conf" ]; then
        log "Creating PostgreSQL $version cluster projectionist_faults on port $PG_FAULTS_PORT."
        as_root pg_createcluster -p "$PG_FAULTS_PORT" "$version" projectionist_faults >&2
        printf "listen_addresses = '%s'\nfsync = on\n" "$PG_HOST" | as_root tee "$conf/conf.d/faults.conf" >/dev/null
        printf 'local all postgres peer\nhost all all %s/32 scram-sha-256\n' "$PG_HOST" \
            | as_root tee "$conf/pg_hba.conf" >/dev/null
    fi
    pg_isready -q -h "$PG_HOST" -p "$PG_FAULTS_PORT" 2>/dev/null || start_cluster projectionist_faults "$PG_FAULTS_PORT"
    ensure_role_on "$PG_FAULTS_PORT"
    echo "export PG_FAULTS_URL=postgres://$PG_USER:$PG_USER@$PG_HOST:$PG_FAULTS_PORT/postgres"
}

crash_faults_postgres() {
    log "Crashing PostgreSQL cluster projectionist_faults (immediate stop)."
    as_root pg_ctlcluster --skip-systemctl-redirect "$(pg_version)" projectionist_faults stop -m immediate >&2
}

# Sets BROKER (apache-kafka-<version>, tansu, given or unknown) and starts it if needed.
ensure_broker() {
    if [ -n "${KAFKA_BROKERS:-}" ]; then
        log "Using the broker KAFKA_BROKERS names ($KAFKA_BROKERS); starting none."
        BROKER=given
        return
    fi
    KAFKA_BROKERS=$KAFKA_HOST:$KAFKA_PORT
    if apache_kafka_pid main >/dev/null; then
        start_apache_kafka main
        BROKER=apache-kafka-$APACHE_KAFKA_VERSION
        return
    fi
    if listening "$KAFKA_HOST" "$KAFKA_PORT"; then
        BROKER=unknown
        tansu_pid >/dev/null && BROKER=tansu
        log "A broker ($BROKER) already answers on $KAFKA_BROKERS; using it."
        return
    fi
    local missing
    missing=$(apache_kafka_missing)
    if [ -z "$missing" ]; then
        if start_apache_kafka main; then
            BROKER=apache-kafka-$APACHE_KAFKA_VERSION
            return
        fi
        missing="it did not start (see above)"
    fi
    log "Apache Kafka cannot run here: $missing. Falling back to tansu, a stand-in that hands" \
        "aborted transactions to read_committed readers and keeps topics in memory: the test of" \
        "aborted transactions and the broker fault tests (broker_faults) will be skipped."
    start_tansu_main
    BROKER=tansu
}

ensure_tls_brokers() {
    case $BROKER in
        apache-kafka-*) apache_kafka_env main ;;
        tansu) start_tansu_tls_services ;;
        *) log "The broker is not one this script started: the Kafka TLS and SASL tests need KAFKA_TLS_* and KAFKA_SASL_* set by you, or are skipped." ;;
    esac
}

source "$HERE/services/apache-kafka.sh"
source "$HERE/services/tansu.sh"
source "$HERE/services/kafka-connect.sh"
source "$HERE/services/apicurio-registry.sh"
source "$HERE/services/python-producers.sh"
source "$HERE/services/jaeger.sh"
source "$HERE/services/browser.sh"
source "$HERE/services/debezium-outbox.sh"

# One invocation at a time (tests start and stop brokers through this script, in parallel).
# What it starts in the background is started with the lock's descriptor closed (9>&-).
mkdir -p "$STATE_DIR"
exec 9>"$STATE_DIR/services.lock"
flock 9

case ${1:-} in
    --build-deps)
        ensure_build_deps
        exit 0
        ;;
    --start-broker | --stop-broker | --restart-broker)
        [ "$1" = --start-broker ] || stop_apache_kafka "${2:-main}"
        [ "$1" = --stop-broker ] || { start_apache_kafka "${2:-main}" && apache_kafka_env "${2:-main}"; }
        exit
        ;;
    --start-cluster)
        start_apache_kafka_cluster && apache_kafka_env node1
        exit
        ;;
    --stop-cluster)
        stop_apache_kafka_cluster
        exit
        ;;
    --kill-broker)
        kill_apache_kafka "${2:?which instance}"
        exit
        ;;
    --start-postgres)
        start_faults_postgres
        exit
        ;;
    --kafka-connect)
        fetch_kafka_connect
        exit
        ;;
    --crash-postgres)
        crash_faults_postgres
        exit
        ;;
    --registry)
        start_registry
        exit
        ;;
    --stop-registry)
        stop_registry
        exit
        ;;
    --python-producers)
        ensure_python_producers
        exit
        ;;
    --jaeger)
        start_jaeger
        exit
        ;;
    --stop-jaeger)
        stop_jaeger
        exit
        ;;
    --browser)
        ensure_browser
        exit
        ;;
    --outbox-postgres)
        start_outbox_postgres
        exit
        ;;
    --stop-outbox-postgres)
        stop_outbox_postgres
        exit
        ;;
    --start-connect)
        start_outbox_connect "${2:?which worker}"
        exit
        ;;
    --stop-connect)
        stop_outbox_connect "${2:?which worker}"
        exit
        ;;
    --kill-connect)
        kill_outbox_connect "${2:?which worker}"
        exit
        ;;
    --drop-connect)
        outbox_name "${2:?which worker}"
        drop_outbox_connect "$2"
        exit
        ;;
esac
ensure_build_deps
ensure_postgres
ensure_broker
echo "export KAFKA_BROKERS=$KAFKA_BROKERS PROJECTIONIST_BROKER=$BROKER"
echo "export DATABASE_URL=postgres://$PG_USER:$PG_USER@$PG_HOST:$PG_PORT/$PG_DB"
if [ "${1:-}" = --tls ]; then
    ensure_tls_brokers
    ensure_tls_postgres
fi
