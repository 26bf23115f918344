# Jaeger v2, the trace receiver of the tracing tests (issue 69): sourced by
# scripts/services.sh (which defines log, listening, STATE_DIR and HERE, and sources
# apache-kafka.sh first for CACHE_DIR).
#
# Built once from the Go module proxy (`go get -tool` of cmd/jaeger at a pinned version, then
# `go build`: about five minutes on 2 cores) into the cache. It runs its default all-in-one
# configuration: in-memory storage, OTLP over gRPC (4317) and HTTP (4318), the query API and
# UI (16686). Its pid and output are under $STATE_DIR/jaeger, and only that pid is ever
# stopped. Prints OTLP_GRPC_ENDPOINT, OTLP_HTTP_ENDPOINT and JAEGER_QUERY_URL.

JAEGER_VERSION=v1.75.0
JAEGER_HOME=$CACHE_DIR/jaeger-$JAEGER_VERSION
JAEGER_BIN=$JAEGER_HOME/jaeger
JAEGER_DIR=$STATE_DIR/jaeger
JAEGER_QUERY_URL=http://$KAFKA_HOST:16686

# Builds the binary into the cache, once.
build_jaeger() {
    [ -x "$JAEGER_BIN" ] && return 0
    command -v go >/dev/null 2>&1 || { log "Jaeger is not in $JAEGER_HOME and there is no go on PATH to build it."; return 1; }
    log "Building Jaeger $JAEGER_VERSION from the Go module proxy into $JAEGER_HOME (once; about five minutes)."
    rm -rf "$JAEGER_HOME" && mkdir -p "$JAEGER_HOME/src"
    if ! (cd "$JAEGER_HOME/src" && go mod init jaeger-build \
        && go get -tool "github.com/jaegertracing/jaeger/cmd/jaeger@$JAEGER_VERSION" \
        && go build -o "$JAEGER_BIN.partial" github.com/jaegertracing/jaeger/cmd/jaeger) \
        >"$CACHE_DIR/go-jaeger.log" 2>&1; then
        log "Could not build Jaeger: $(tail -n 3 "$CACHE_DIR/go-jaeger.log")"
        return 1
    fi
    mv "$JAEGER_BIN.partial" "$JAEGER_BIN"
}

jaeger_pid() { # → the pid we recorded, if that process is still our Jaeger
    local pid
    pid=$(cat "$JAEGER_DIR/jaeger.pid" 2>/dev/null) || return 1
    tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -q -- "$JAEGER_BIN" && echo "$pid"
}

jaeger_answers() { curl -sf -o /dev/null --max-time 2 "$JAEGER_QUERY_URL/api/services"; }

jaeger_env() {
    echo "export OTLP_GRPC_ENDPOINT=http://$KAFKA_HOST:4317 OTLP_HTTP_ENDPOINT=http://$KAFKA_HOST:4318 JAEGER_QUERY_URL=$JAEGER_QUERY_URL"
}

# Starts Jaeger unless it runs already, waits until its query API answers (60 s at most).
start_jaeger() {
    local pid port
    command -v curl >/dev/null 2>&1 || { log "Jaeger's readiness check needs curl, which is not on PATH."; return 1; }
    if pid=$(jaeger_pid); then
        log "Jaeger (pid $pid) already runs; leaving it as it is."
        jaeger_env
        return 0
    fi
    for port in 4317 4318 16686; do
        if listening "$KAFKA_HOST" "$port"; then
            log "Something this script did not start listens on $KAFKA_HOST:$port; not starting Jaeger."
            return 1
        fi
    done
    build_jaeger || return 1
    mkdir -p "$JAEGER_DIR"
    log "Starting Jaeger $JAEGER_VERSION (log: $JAEGER_DIR/jaeger.log)."
    nohup setsid "$JAEGER_BIN" >>"$JAEGER_DIR/jaeger.log" 2>&1 </dev/null 9>&- &
    pid=$!
    echo "$pid" >"$JAEGER_DIR/jaeger.pid"
    for _ in $(seq 1 120); do
        jaeger_answers && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    if ! jaeger_answers; then
        log "Jaeger did not answer on $JAEGER_QUERY_URL/api/services; the end of $JAEGER_DIR/jaeger.log:"
        tail -n 30 "$JAEGER_DIR/jaeger.log" >&2
        kill -0 "$pid" 2>/dev/null && { log "Stopping it (pid $pid)."; kill -TERM "$pid"; }
        return 1
    fi
    log "Jaeger ready (pid $pid)."
    jaeger_env
}

# Stops Jaeger by the pid we recorded.
stop_jaeger() {
    local pid
    pid=$(jaeger_pid) || { log "Jaeger is not running (no live pid recorded)."; return; }
    log "Stopping Jaeger (pid $pid)."
    kill -TERM "$pid"
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || { rm -f "$JAEGER_DIR/jaeger.pid"; return 0; }; sleep 0.5; done
    kill -KILL "$pid"
    rm -f "$JAEGER_DIR/jaeger.pid"
}
