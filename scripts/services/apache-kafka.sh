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
# stop and start while every other test goes on against `main`; and `node1`, `node2`, `node3`
# (127.0.0.1:39092, 39192, 39292): a three-node KRaft cluster (each node broker and controller,
# internal topics replicated three times, min ISR 2, small heaps) for the fault suite's
# partition-leader scenario, started together (`start_apache_kafka_cluster`).

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
        node[123]) echo "39$((${1#node} - 1))92 39$((${1#node} - 1))93" ;;
        *) log "No Apache Kafka instance '$1' (main, faults, node1, node2 or node3)."; exit 2 ;;
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
    local node=1 voters="1@$KAFKA_HOST:$controller" replicas=1
    if [[ $instance == node? ]]; then
        node=${instance#node} voters="1@$KAFKA_HOST:39093,2@$KAFKA_HOST:39193,3@$KAFKA_HOST:39293" replicas=3
    fi
    cat >"$dir/server.properties" <<CONF
process.roles=broker,controller
node.id=$node
controller.quorum.voters=$voters
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listeners=$listeners
advertised.listeners=$advertised
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT
log.dirs=$dir/data
num.partitions=1
# One node: the internal topics cannot have more replicas; transactions need min ISR 1.
# The cluster's nodes: three replicas, two in sync for a write to count.
offsets.topic.replication.factor=$replicas
transaction.state.log.replication.factor=$replicas
transaction.state.log.min.isr=$(( replicas > 1 ? 2 : 1 ))
min.insync.replicas=$(( replicas > 1 ? 2 : 1 ))
# The log cleaner's buffer (128 MiB by default) within the small heap of a cluster's node.
log.cleaner.dedupe.buffer.size=$(( replicas > 1 ? 16777216 : 134217728 ))
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
    launch_apache_kafka "$1" && wait_apache_kafka "$1"
}

# Starts the three nodes of the cluster (none waits for the others: a node serves once a
# majority of the controllers is up), then waits for each.
start_apache_kafka_cluster() {
    local node
    for node in node1 node2 node3; do launch_apache_kafka "$node" || return 1; done
    for node in node1 node2 node3; do wait_apache_kafka "$node" || return 1; done
}

# Stops the cluster's nodes together (by their recorded pids): one stopped alone after the
# others cannot finish a controlled shutdown without a quorum. Killed after 60 s.
stop_apache_kafka_cluster() {
    local node pid pids=()
    for node in node1 node2 node3; do
        pid=$(apache_kafka_pid "$node") || continue
        log "Stopping Apache Kafka ($node, pid $pid)."
        kill -TERM "$pid"
        pids+=("$pid")
    done
    for pid in "${pids[@]}"; do
        for _ in $(seq 1 120); do kill -0 "$pid" 2>/dev/null || continue 2; sleep 0.5; done
        log "Apache Kafka (pid $pid) did not stop in 60 s; killing it."
        kill -KILL "$pid"
    done
}

# SIGKILLs an instance by the pid we recorded: a crash, no controlled shutdown.
kill_apache_kafka() { # instance
    local pid
    pid=$(apache_kafka_pid "$1") || { log "Apache Kafka ($1) is not running (no live pid recorded)."; return; }
    log "Killing Apache Kafka ($1, pid $pid)."
    kill -KILL "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
}

# Starts an instance's JVM unless it runs already (`wait_apache_kafka` waits for it).
launch_apache_kafka() { # instance
    local instance=$1 dir=$STATE_DIR/$1 port controller pid heap=$APACHE_KAFKA_HEAP
    read -r port controller <<<"$(apache_kafka_ports "$instance")"
    rm -f "$dir/starting"
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
    [[ $instance == node? ]] && heap=${APACHE_KAFKA_NODE_HEAP:-256m}
    local java=(java "-Xmx$heap" -Xms128m -XX:+UseG1GC "-Dlog4j.configuration=file:$dir/log4j.properties" -cp "$APACHE_KAFKA_LIBS/*")
    if [ ! -f "$dir/data/meta.properties" ]; then
        local scram=()
        for mechanism in SCRAM-SHA-256 SCRAM-SHA-512; do
            scram+=(--add-scram "$mechanism=[name=$KAFKA_SASL_TEST_USER,password=$KAFKA_SASL_TEST_PASSWORD]")
        done
        log "Formatting Apache Kafka's log folder $dir/data."
        local id=$STATE_DIR/$instance.cluster-id
        # The cluster's nodes share one cluster id.
        [[ $instance == node? ]] && id=$STATE_DIR/cluster.cluster-id
        [ -s "$id" ] || "${java[@]}" kafka.tools.StorageTool random-uuid >"$id"
        "${java[@]}" kafka.tools.StorageTool format -t "$(cat "$id")" \
            -c "$dir/server.properties" "${scram[@]}" >"$dir/format.log" 2>&1 \
            || { log "Formatting failed; see $dir/format.log."; return 1; }
    fi
    log "Starting Apache Kafka $APACHE_KAFKA_VERSION ($instance) on $KAFKA_HOST:$port (log: $dir/server.log)."
    local since=0
    [ -f "$dir/server.log" ] && since=$(wc -l <"$dir/server.log")
    echo "$since" >"$dir/starting"
    nohup setsid "${java[@]}" kafka.Kafka "$dir/server.properties" >>"$dir/server.log" 2>&1 </dev/null 9>&- &
    echo $! >"$dir/kafka.pid"
}

# Waits until an instance `launch_apache_kafka` started serves requests (at once when it
# was running already).
wait_apache_kafka() { # instance
    local instance=$1 dir=$STATE_DIR/$1 since
    since=$(cat "$dir/starting" 2>/dev/null) || return 0
    rm -f "$dir/starting"
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
    if [[ $1 == node? ]]; then
        echo "export KAFKA_CLUSTER_BROKERS=$KAFKA_HOST:39092,$KAFKA_HOST:39192,$KAFKA_HOST:39292"
        return
    fi
    local tls=$STATE_DIR/tls
    echo "export KAFKA_TLS_BROKERS=$KAFKA_HOST:$TLS_PORT"
    echo "export KAFKA_TLS_CA=$tls/ca.pem KAFKA_TLS_WRONG_CA=$tls/wrong-ca.pem"
    echo "export KAFKA_TLS_CLIENT_CERT=$tls/client.pem KAFKA_TLS_CLIENT_KEY=$tls/client.key"
    echo "export KAFKA_SASL_BROKERS=$KAFKA_HOST:$SASL_PORT"
    echo "export KAFKA_SASL_TEST_USER=$KAFKA_SASL_TEST_USER KAFKA_SASL_TEST_PASSWORD=$KAFKA_SASL_TEST_PASSWORD"
}
