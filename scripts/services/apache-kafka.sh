# Apache Kafka on this machine: sourced by scripts/services.sh (which defines log, listening,
# make_certs, STATE_DIR, KAFKA_HOST and HERE).
#
# One KRaft node, broker and controller in one JVM, from the jars Maven Central publishes
# (org.apache.kafka:kafka_2.13, the release tarball's libs/), fetched once into a cache folder.
# Its log lives on disk under $STATE_DIR/<instance>, so a restart keeps every topic; its pid is
# recorded there, and only that pid is ever stopped.
#
# Instances: `main` (127.0.0.1:9092, plus a mutual-TLS listener and a SASL listener for the
# TLS/SASL tests) and `faults` (127.0.0.1:29092, plaintext only), which the broker fault tests
# stop and start while every other test goes on against `main`.

APACHE_KAFKA_VERSION=3.9.1
APACHE_KAFKA_HEAP=${APACHE_KAFKA_HEAP:-768m}
CACHE_DIR=${PROJECTIONIST_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/projectionist}
APACHE_KAFKA_LIBS=$CACHE_DIR/apache-kafka-$APACHE_KAFKA_VERSION/libs
# The SASL listener's user, for SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN alike (a test account).
KAFKA_SASL_TEST_USER=projectionist
KAFKA_SASL_TEST_PASSWORD=projectionist-kafka-test

# Why Apache Kafka cannot run here, or nothing when it can.
apache_kafka_missing() {
    local version
    command -v java >/dev/null 2>&1 || { echo "no java on PATH"; return; }
    version=$(java -version 2>&1 | awk -F'"' '/version/ {print $2; exit}')
    [ "${version%%.*}" -ge 17 ] 2>/dev/null || { echo "Java $version (Apache Kafka $APACHE_KAFKA_VERSION needs 17 or later)"; return; }
    [ -f "$APACHE_KAFKA_LIBS/.complete" ] && return
    command -v mvn >/dev/null 2>&1 || { echo "no mvn on PATH to fetch its jars"; return; }
}

# Copies the broker's jars from Maven Central (hashes checked) into the cache, once.
fetch_apache_kafka() {
    [ -f "$APACHE_KAFKA_LIBS/.complete" ] && return 0
    log "Fetching Apache Kafka $APACHE_KAFKA_VERSION's jars from Maven Central into $APACHE_KAFKA_LIBS (once)."
    rm -rf "$APACHE_KAFKA_LIBS"
    mkdir -p "$APACHE_KAFKA_LIBS"
    if ! mvn -q -B --strict-checksums -f "$HERE/services/apache-kafka.pom.xml" dependency:copy-dependencies \
        -Dkafka.version="$APACHE_KAFKA_VERSION" -DoutputDirectory="$APACHE_KAFKA_LIBS" >"$CACHE_DIR/maven.log" 2>&1; then
        log "Maven could not fetch Apache Kafka's jars: $(grep -m1 ERROR "$CACHE_DIR/maven.log" || tail -n1 "$CACHE_DIR/maven.log")"
        return 1
    fi
    touch "$APACHE_KAFKA_LIBS/.complete"
}

# instance → "port controller-port"
apache_kafka_ports() {
    case $1 in
        main) echo "$KAFKA_PORT ${KAFKA_CONTROLLER_PORT:-9093}" ;;
        faults) echo "${KAFKA_FAULTS_PORT:-29092} ${KAFKA_FAULTS_CONTROLLER_PORT:-29093}" ;;
        *) log "No Apache Kafka instance '$1' (main or faults)."; exit 2 ;;
    esac
}

apache_kafka_pid() { # instance → the pid we recorded, if that process is still our broker
    local dir=$STATE_DIR/$1 pid
    pid=$(cat "$dir/kafka.pid" 2>/dev/null) || return 1
    tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -q -- "$dir/server.properties" && echo "$pid"
}

write_apache_kafka_config() { # instance dir port controller-port
    local instance=$1 dir=$2 port=$3 controller=$4 tls=$STATE_DIR/tls
    local listeners="PLAINTEXT://$KAFKA_HOST:$port,CONTROLLER://$KAFKA_HOST:$controller"
    local advertised="PLAINTEXT://$KAFKA_HOST:$port"
    if [ "$instance" = main ]; then
        listeners+=",SSL://$KAFKA_HOST:$TLS_PORT,SASL_PLAINTEXT://$KAFKA_HOST:$SASL_PORT"
        advertised+=",SSL://$KAFKA_HOST:$TLS_PORT,SASL_PLAINTEXT://$KAFKA_HOST:$SASL_PORT"
    fi
    cat >"$dir/server.properties" <<CONF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@$KAFKA_HOST:$controller
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listeners=$listeners
advertised.listeners=$advertised
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT
log.dirs=$dir/data
num.partitions=1
# One node: the internal topics cannot have more replicas; transactions need min ISR 1.
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
# Tests join groups all the time: no wait for more members.
group.initial.rebalance.delay.ms=0
# The product creates its topics explicitly (create-topics, publish), as in docker-compose.yml.
auto.create.topics.enable=false
CONF
    [ "$instance" = main ] || return 0
    cat "$tls/broker.key" "$tls/broker.pem" >"$dir/broker-keystore.pem"
    cat >>"$dir/server.properties" <<CONF
# Mutual TLS: the test CA's broker certificate, client certificates from the same CA required.
listener.name.ssl.ssl.keystore.type=PEM
listener.name.ssl.ssl.keystore.location=$dir/broker-keystore.pem
listener.name.ssl.ssl.truststore.type=PEM
listener.name.ssl.ssl.truststore.location=$tls/ca.pem
listener.name.ssl.ssl.client.auth=required
# SASL: SCRAM users are added when the log folder is formatted; PLAIN's are listed here.
listener.name.sasl_plaintext.sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512
listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$KAFKA_SASL_TEST_USER="$KAFKA_SASL_TEST_PASSWORD";
listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
CONF
}

# Starts an instance unless it runs already; waits until it serves requests.
start_apache_kafka() { # instance
    local instance=$1 dir=$STATE_DIR/$1 port controller pid
    read -r port controller <<<"$(apache_kafka_ports "$instance")"
    if pid=$(apache_kafka_pid "$instance"); then
        log "Apache Kafka ($instance, pid $pid) already runs on $KAFKA_HOST:$port; leaving it as it is."
        return
    fi
    fetch_apache_kafka || return 1
    mkdir -p "$dir"
    [ "$instance" = main ] && make_certs
    write_apache_kafka_config "$instance" "$dir" "$port" "$controller"
    printf '%s\n' 'log4j.rootLogger=WARN, stdout' 'log4j.logger.kafka.server.KafkaRaftServer=INFO' \
        'log4j.appender.stdout=org.apache.log4j.ConsoleAppender' \
        'log4j.appender.stdout.layout=org.apache.log4j.PatternLayout' \
        'log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n' >"$dir/log4j.properties"
    local java=(java "-Xmx$APACHE_KAFKA_HEAP" -Xms256m -XX:+UseG1GC "-Dlog4j.configuration=file:$dir/log4j.properties" -cp "$APACHE_KAFKA_LIBS/*")
    if [ ! -f "$dir/data/meta.properties" ]; then
        local scram=()
        for mechanism in SCRAM-SHA-256 SCRAM-SHA-512; do
            scram+=(--add-scram "$mechanism=[name=$KAFKA_SASL_TEST_USER,password=$KAFKA_SASL_TEST_PASSWORD]")
        done
        log "Formatting Apache Kafka's log folder $dir/data."
        "${java[@]}" kafka.tools.StorageTool format -t "$("${java[@]}" kafka.tools.StorageTool random-uuid)" \
            -c "$dir/server.properties" "${scram[@]}" >"$dir/format.log" 2>&1 \
            || { log "Formatting failed; see $dir/format.log."; return 1; }
    fi
    log "Starting Apache Kafka $APACHE_KAFKA_VERSION ($instance) on $KAFKA_HOST:$port (log: $dir/server.log)."
    local since=0
    [ -f "$dir/server.log" ] && since=$(wc -l <"$dir/server.log")
    nohup setsid "${java[@]}" kafka.Kafka "$dir/server.properties" >>"$dir/server.log" 2>&1 </dev/null 9>&- &
    echo $! >"$dir/kafka.pid"
    for _ in $(seq 1 240); do
        tail -n +"$((since + 1))" "$dir/server.log" | grep -q 'Kafka Server started' && { log "Apache Kafka ready."; return; }
        kill -0 "$(cat "$dir/kafka.pid")" 2>/dev/null || break
        sleep 0.5
    done
    log "Apache Kafka ($instance) did not start; the end of $dir/server.log:"
    tail -n 20 "$dir/server.log" >&2
    return 1
}

# Stops an instance by the pid we recorded (a controlled shutdown; killed after 60 s).
stop_apache_kafka() { # instance
    local pid
    pid=$(apache_kafka_pid "$1") || { log "Apache Kafka ($1) is not running (no live pid recorded)."; return; }
    log "Stopping Apache Kafka ($1, pid $pid)."
    kill -TERM "$pid"
    for _ in $(seq 1 120); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
    log "Apache Kafka ($1, pid $pid) did not stop in 60 s; killing it."
    kill -KILL "$pid"
}

apache_kafka_env() { # instance
    local port
    read -r port _ <<<"$(apache_kafka_ports "$1")"
    if [ "$1" = faults ]; then
        echo "export KAFKA_FAULTS_BROKERS=$KAFKA_HOST:$port"
        return
    fi
    local tls=$STATE_DIR/tls
    echo "export KAFKA_TLS_BROKERS=$KAFKA_HOST:$TLS_PORT"
    echo "export KAFKA_TLS_CA=$tls/ca.pem KAFKA_TLS_WRONG_CA=$tls/wrong-ca.pem"
    echo "export KAFKA_TLS_CLIENT_CERT=$tls/client.pem KAFKA_TLS_CLIENT_KEY=$tls/client.key"
    echo "export KAFKA_SASL_BROKERS=$KAFKA_HOST:$SASL_PORT"
    echo "export KAFKA_SASL_TEST_USER=$KAFKA_SASL_TEST_USER KAFKA_SASL_TEST_PASSWORD=$KAFKA_SASL_TEST_PASSWORD"
}
