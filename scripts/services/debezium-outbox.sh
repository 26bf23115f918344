# The Debezium outbox chain (outbox → relay → broker → idempotent consumer): sourced by
# scripts/services.sh (which defines log, listening, as_root, as_postgres, pg_ours,
# pg_version, start_cluster, STATE_DIR, PG_HOST, PG_USER, PG_DB, KAFKA_HOST and HERE, and
# sources apache-kafka.sh and kafka-connect.sh first for CACHE_DIR, KAFKA_CONNECT_LIBS and
# fetch_jars).
#
# A PostgreSQL cluster `projectionist_outbox` on 127.0.0.1:5436 with wal_level=logical, and
# Kafka Connect standalone workers, one per caller's name, each running Debezium's PostgreSQL
# source connector on one outbox table (scripts/services/outbox.sql) through the outbox event
# router, to one topic. The worker's jars (kafka-connect.pom.xml) and the connector's plugin
# folder (debezium-postgres-source.pom.xml) are fetched from Maven Central once (hashes
# checked). A worker's files live under $STATE_DIR/outbox/<name>: its configs, its log, its
# pid, its REST port and its source offsets (a file, so a worker started again after a kill
# resumes from the last offsets it flushed and sends again what came after them). Only the
# recorded pid is ever stopped or killed.
#
# What a message looks like (StringConverter for key and value, Connect's default
# SimpleHeaderConverter for headers; all UTF-8 text):
#   key    the row's aggregateid
#   value  the row's payload, as PostgreSQL prints the jsonb (e.g. {"amount": 5, "id": "a1"})
#   headers id (the row's uuid), eventType (type), aggregateType (aggregatetype),
#          version (decimal), occurredAt (occurred_at, RFC 3339 in UTC, microseconds)
#   timestamp when Debezium read the change (not stable across re-sends: use occurredAt)
# A re-sent message is the same but for its timestamp. The first start of a worker takes the
# rows already in the table too (snapshot.mode=initial; in the table's order, not the
# commits'), then streams each committed insert in commit order.
#
# Settings of --start-connect (environment): OUTBOX_DB (projectionist), OUTBOX_TABLE
# (public.outbox), OUTBOX_TOPIC (the name), OUTBOX_PARTITIONS (1: when Connect makes the
# topic; one the caller made is used as it is), OUTBOX_OFFSET_FLUSH_MS (1000: how often
# offsets are saved, so what a kill re-sends), OUTBOX_CONNECT_PORT (a free one from 18083),
# KAFKA_BROKERS (127.0.0.1:9092), OUTBOX_CONNECT_HEAP (256m).

DEBEZIUM_VERSION=3.6.1.Final
OUTBOX_PG_PORT=${OUTBOX_PG_PORT:-5436}
OUTBOX_PLUGINS=$CACHE_DIR/debezium-postgres-$DEBEZIUM_VERSION/plugins
OUTBOX_CONNECT_HEAP=${OUTBOX_CONNECT_HEAP:-256m}

# The cluster projectionist_outbox on $OUTBOX_PG_PORT (made once, started if stopped), with
# logical decoding, role $PG_USER (REPLICATION, CREATEDB) and database $PG_DB.
start_outbox_postgres() {
    local version conf
    pg_ours || { log "PostgreSQL is not a local cluster here: no outbox cluster."; return 1; }
    version=$(pg_version)
    conf=/etc/postgresql/$version/projectionist_outbox
    if [ ! -d "$conf" ]; then
        log "Creating PostgreSQL $version cluster projectionist_outbox on port $OUTBOX_PG_PORT (wal_level=logical)."
        as_root pg_createcluster -p "$OUTBOX_PG_PORT" "$version" projectionist_outbox >&2
        printf "listen_addresses = '%s'\nwal_level = logical\nmax_replication_slots = 32\nmax_wal_senders = 32\n" "$PG_HOST" \
            | as_root tee "$conf/conf.d/outbox.conf" >/dev/null
        printf 'local all postgres peer\nhost all all %s/32 scram-sha-256\n' "$PG_HOST" \
            | as_root tee "$conf/pg_hba.conf" >/dev/null
    fi
    pg_isready -q -h "$PG_HOST" -p "$OUTBOX_PG_PORT" 2>/dev/null || start_cluster projectionist_outbox "$OUTBOX_PG_PORT"
    pg_isready -q -h "$PG_HOST" -p "$OUTBOX_PG_PORT" || { log "The outbox cluster did not come up on port $OUTBOX_PG_PORT."; return 1; }
    as_postgres psql -q -v ON_ERROR_STOP=1 -p "$OUTBOX_PG_PORT" -d postgres >&2 <<SQL
DO \$\$BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_USER') THEN
    CREATE ROLE $PG_USER LOGIN REPLICATION CREATEDB PASSWORD '$PG_USER';
  ELSE
    ALTER ROLE $PG_USER LOGIN REPLICATION CREATEDB PASSWORD '$PG_USER';
  END IF;
END\$\$;
SQL
    if ! as_postgres psql -tA -p "$OUTBOX_PG_PORT" -d postgres -c "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'" | grep -q 1; then
        as_postgres createdb -p "$OUTBOX_PG_PORT" -O "$PG_USER" "$PG_DB"
    fi
    echo "export OUTBOX_PG_URL=postgres://$PG_USER:$PG_USER@$PG_HOST:$OUTBOX_PG_PORT/$PG_DB"
}

# Stops the outbox cluster (a fast shutdown), if it runs.
stop_outbox_postgres() {
    pg_isready -q -h "$PG_HOST" -p "$OUTBOX_PG_PORT" 2>/dev/null || return 0
    log "Stopping PostgreSQL cluster projectionist_outbox."
    as_root pg_ctlcluster --skip-systemctl-redirect "$(pg_version)" projectionist_outbox stop -m fast >&2
}

# The worker's jars and the connector's plugin folder, fetched once.
fetch_debezium_outbox() {
    local missing jackson
    missing=$(kafka_connect_missing)
    [ -z "$missing" ] || { log "Kafka Connect cannot run here: $missing."; return 1; }
    [ -f "$OUTBOX_PLUGINS/.complete" ] && [ -f "$KAFKA_CONNECT_LIBS/.complete" ] && return 0
    fetch_jars "$HERE/services/kafka-connect.pom.xml" "$KAFKA_CONNECT_LIBS" -Dkafka.version="$APACHE_KAFKA_VERSION" || return 1
    # One jackson-databind, the worker's (see fetch_kafka_connect).
    jackson=$(basename "$(ls "$KAFKA_CONNECT_LIBS"/jackson-databind-*.jar)" .jar)
    fetch_jars "$HERE/services/debezium-postgres-source.pom.xml" "$OUTBOX_PLUGINS/debezium-connector-postgres" \
        -Ddebezium.version="$DEBEZIUM_VERSION" -Djackson.version="${jackson#jackson-databind-}" || return 1
    touch "$OUTBOX_PLUGINS/.complete"
}

# A worker's name: it names the connector, the slot and publication, and the state folder.
outbox_name() { # name
    [[ $1 =~ ^[a-z0-9_]{1,40}$ ]] && return
    log "A Connect worker's name is 1 to 40 of a-z, 0-9 and _ (it names a replication slot): not '$1'."
    exit 2
}

outbox_connect_pid() { # name → the pid we recorded, if that process is still that worker
    local dir=$STATE_DIR/outbox/$1 pid
    pid=$(cat "$dir/connect.pid" 2>/dev/null) || return 1
    tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -q -- "$dir/worker.properties" && echo "$pid"
}

# The REST port of a worker: $OUTBOX_CONNECT_PORT, else the one it had, else a free one.
outbox_connect_port() { # dir
    local port
    [ -n "${OUTBOX_CONNECT_PORT:-}" ] && { echo "$OUTBOX_CONNECT_PORT"; return; }
    port=$(cat "$1/rest.port" 2>/dev/null) && ! listening "$KAFKA_HOST" "$port" && { echo "$port"; return; }
    for port in $(seq 18083 18183); do
        grep -qsx "$port" "$STATE_DIR"/outbox/*/rest.port && continue
        listening "$KAFKA_HOST" "$port" || { echo "$port"; return; }
    done
    log "No free port in 18083–18183 for Kafka Connect's REST API."
    return 1
}

# The worker's, the connector's and log4j's configurations, in the worker's folder.
write_outbox_connect_config() { # name dir port
    local name=$1 dir=$2 port=$3 table=${OUTBOX_TABLE:-public.outbox}
    cat >"$dir/worker.properties" <<CONF
bootstrap.servers=${KAFKA_BROKERS:-$KAFKA_HOST:$KAFKA_PORT}
key.converter=org.apache.kafka.connect.storage.StringConverter
value.converter=org.apache.kafka.connect.storage.StringConverter
header.converter=org.apache.kafka.connect.storage.SimpleHeaderConverter
offset.storage.file.filename=$dir/offsets
offset.flush.interval.ms=${OUTBOX_OFFSET_FLUSH_MS:-1000}
plugin.path=$OUTBOX_PLUGINS
plugin.discovery=service_load
listeners=http://$KAFKA_HOST:$port
CONF
    cat >"$dir/connector.properties" <<CONF
name=$name
connector.class=io.debezium.connector.postgresql.PostgresConnector
tasks.max=1
database.hostname=$PG_HOST
database.port=$OUTBOX_PG_PORT
database.user=$PG_USER
database.password=$PG_USER
database.dbname=${OUTBOX_DB:-$PG_DB}
topic.prefix=outbox_$name
plugin.name=pgoutput
slot.name=outbox_$name
publication.name=outbox_$name
publication.autocreate.mode=filtered
table.include.list=$table
snapshot.mode=initial
tombstones.on.delete=false
# No __debezium.context.* headers (connector name, task, run id) beside the router's.
extended.headers.enabled=false
# Connect makes the topic if it is missing (the broker does not make topics on its own).
topic.creation.default.partitions=${OUTBOX_PARTITIONS:-1}
topic.creation.default.replication.factor=1
transforms=outbox
transforms.outbox.type=io.debezium.transforms.outbox.EventRouter
transforms.outbox.route.topic.replacement=${OUTBOX_TOPIC:-$name}
transforms.outbox.table.fields.additional.placement=type:header:eventType,aggregatetype:header:aggregateType,version:header:version,occurred_at:header:occurredAt
transforms.outbox.table.expand.json.payload=false
CONF
    printf '%s\n' 'log4j.rootLogger=INFO, file' 'log4j.appender.file=org.apache.log4j.FileAppender' \
        "log4j.appender.file.File=$dir/connect.log" 'log4j.appender.file.layout=org.apache.log4j.PatternLayout' \
        'log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n' \
        'log4j.logger.org.apache.kafka.clients=WARN' 'log4j.logger.org.apache.kafka.common=WARN' \
        'log4j.logger.org.reflections=ERROR' 'log4j.logger.org.eclipse.jetty=WARN' >"$dir/log4j.properties"
}

# Starts worker `name` unless it runs already, waits until its connector's task runs (180 s
# at most), and prints where it is.
start_outbox_connect() { # name
    local name=$1 dir=$STATE_DIR/outbox/$1 pid port
    outbox_name "$name"
    if pid=$(outbox_connect_pid "$name"); then
        port=$(cat "$dir/rest.port")
        log "Kafka Connect ($name, pid $pid) already runs; leaving it as it is."
    else
        command -v curl >/dev/null 2>&1 || { log "The worker's readiness check needs curl, which is not on PATH."; return 1; }
        fetch_debezium_outbox || return 1
        mkdir -p "$dir"
        port=$(outbox_connect_port "$dir") || return 1
        echo "$port" >"$dir/rest.port"
        echo "${OUTBOX_DB:-$PG_DB}" >"$dir/db"
        write_outbox_connect_config "$name" "$dir" "$port"
        log "Starting Kafka Connect ($name: ${OUTBOX_DB:-$PG_DB}.${OUTBOX_TABLE:-public.outbox} → ${OUTBOX_TOPIC:-$name}; REST $KAFKA_HOST:$port; log $dir/connect.log)."
        echo "=== start $(date -Is)" >>"$dir/connect.log"
        : >"$dir/connect.out"
        nohup setsid java "-Xmx$OUTBOX_CONNECT_HEAP" -Xms64m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
            "-Dlog4j.configuration=file:$dir/log4j.properties" -cp "$KAFKA_CONNECT_LIBS/*" \
            org.apache.kafka.connect.cli.ConnectStandalone "$dir/worker.properties" "$dir/connector.properties" \
            >>"$dir/connect.out" 2>&1 </dev/null 9>&- &
        pid=$!
        echo "$pid" >"$dir/connect.pid"
        wait_outbox_connect "$name" "$pid" "$port" || return 1
    fi
    echo "export OUTBOX_CONNECT_PID=$pid OUTBOX_CONNECT_URL=http://$KAFKA_HOST:$port OUTBOX_CONNECT_LOG=$dir/connect.log"
}

# The state of the connector's first task, from the worker's REST API, or nothing.
outbox_task_state() { # name port
    curl -sf --max-time 2 "http://$KAFKA_HOST:$2/connectors/$1/status" 2>/dev/null \
        | grep -o '"tasks":\[{[^]]*"state":"[A-Z]*"' | grep -o '[A-Z]*"$' | tr -d '"'
}

# Waits until the task is RUNNING; on failure says why, names the log and stops the worker.
wait_outbox_connect() { # name pid port
    local name=$1 pid=$2 port=$3 dir=$STATE_DIR/outbox/$1 state= since
    for _ in $(seq 1 360); do
        state=$(outbox_task_state "$name" "$port")
        [ "$state" = RUNNING ] && { log "Kafka Connect ($name, pid $pid) runs its connector."; return 0; }
        [ "$state" = FAILED ] && break
        kill -0 "$pid" 2>/dev/null || { state="exited"; break; }
        sleep 0.5
    done
    log "Kafka Connect ($name) did not run its connector (task ${state:-not started in 180 s}); see $dir/connect.log" \
        "and $dir/connect.out. Its last errors:"
    since=$(grep -n '^=== start' "$dir/connect.log" | tail -n 1 | cut -d: -f1)
    { tail -n +"${since:-1}" "$dir/connect.log"; cat "$dir/connect.out"; } 2>/dev/null | grep -E 'ERROR|Exception' | tail -n 10 >&2
    kill -0 "$pid" 2>/dev/null && { log "Stopping it (pid $pid)."; kill -TERM "$pid"; }
    return 1
}

# SIGKILLs worker `name` by its recorded pid (a crash: offsets not flushed since are lost).
kill_outbox_connect() { # name
    local pid
    outbox_name "$1"
    pid=$(outbox_connect_pid "$1") || { log "Kafka Connect ($1) is not running (no live pid recorded)."; return 0; }
    log "Killing Kafka Connect ($1, pid $pid)."
    kill -KILL "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
}

# Stops worker `name` by its recorded pid (it flushes its offsets); killed after 30 s.
stop_outbox_connect() { # name
    local pid
    outbox_name "$1"
    pid=$(outbox_connect_pid "$1") || { log "Kafka Connect ($1) is not running (no live pid recorded)."; return 0; }
    log "Stopping Kafka Connect ($1, pid $pid)."
    kill -TERM "$pid"
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
    log "Kafka Connect ($1, pid $pid) did not stop in 30 s; killing it."
    kill -KILL "$pid"
}

# Stops worker `name`, drops its replication slot (which would keep WAL forever) and its
# publication, and removes its folder (offsets included): the next start begins afresh.
drop_outbox_connect() { # name
    local name=$1 dir=$STATE_DIR/outbox/$1 db
    stop_outbox_connect "$name"
    db=$(cat "$dir/db" 2>/dev/null || echo "${OUTBOX_DB:-$PG_DB}")
    if pg_isready -q -h "$PG_HOST" -p "$OUTBOX_PG_PORT" 2>/dev/null; then
        log "Dropping replication slot and publication outbox_$name."
        as_postgres psql -q -p "$OUTBOX_PG_PORT" -d postgres -c \
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = 'outbox_$name'" >/dev/null
        if as_postgres psql -tA -p "$OUTBOX_PG_PORT" -d postgres -c "SELECT 1 FROM pg_database WHERE datname = '$db'" | grep -q 1; then
            as_postgres psql -q -p "$OUTBOX_PG_PORT" -d "$db" -c "DROP PUBLICATION IF EXISTS outbox_$name" >&2
        fi
    else
        log "The outbox cluster is down: replication slot outbox_$name is left (drop it with the cluster up)."
    fi
    rm -rf "$dir"
}
