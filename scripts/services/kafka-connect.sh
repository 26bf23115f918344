# Kafka Connect with Debezium's JDBC sink, for the bench's peer arm (benches/throughput/peer.rs):
# sourced by scripts/services.sh (which defines log and HERE, and sources apache-kafka.sh
# first for its version and cache folder).
#
# The worker's jars (org.apache.kafka:connect-runtime and connect-json, at the broker's
# version) and one Connect plugin folder (io.debezium:debezium-connector-jdbc with its
# dependencies and PostgreSQL's JDBC driver) are fetched from Maven Central once (hashes
# checked) into the cache. The bench starts and stops the worker itself, by its pid.

# Pinned. 3.6.1.Final, the newest, is not served by the registry our machines reach; the
# connector asks for Hibernate 7.2.6.Final, whose hibernate-agroal is not served either, so
# both Hibernate modules are pinned to 7.2.19.Final (the same 7.2 line).
DEBEZIUM_JDBC_VERSION=3.6.0.Final
DEBEZIUM_HIBERNATE_VERSION=7.2.19.Final
POSTGRESQL_JDBC_VERSION=42.7.7
KAFKA_CONNECT_LIBS=$CACHE_DIR/kafka-connect-$APACHE_KAFKA_VERSION/libs
KAFKA_CONNECT_PLUGINS=$CACHE_DIR/debezium-jdbc-$DEBEZIUM_JDBC_VERSION/plugins

# Why Kafka Connect cannot run here, or nothing when it can.
kafka_connect_missing() {
    local version
    command -v java >/dev/null 2>&1 || { echo "no java on PATH"; return; }
    version=$(java -version 2>&1 | awk -F'"' '/version/ {print $2; exit}')
    [ "${version%%.*}" -ge 17 ] 2>/dev/null || { echo "Java $version (Debezium $DEBEZIUM_JDBC_VERSION needs 17 or later)"; return; }
    [ -f "$KAFKA_CONNECT_LIBS/.complete" ] && [ -f "$KAFKA_CONNECT_PLUGINS/.complete" ] && return
    command -v mvn >/dev/null 2>&1 || { echo "no mvn on PATH to fetch its jars"; return; }
}

# Copies the pom's runtime dependencies into `out`, once: pom out maven-args...
fetch_jars() {
    local pom=$1 out=$2 name
    shift 2
    [ -f "$out/.complete" ] && return 0
    name=$(basename "$pom" .pom.xml)
    log "Fetching $name's jars from Maven Central into $out (once)."
    rm -rf "$out"
    mkdir -p "$out"
    if ! mvn -q -B --strict-checksums -f "$pom" dependency:copy-dependencies -DincludeScope=runtime \
        -DoutputDirectory="$out" "$@" >"$CACHE_DIR/maven-$name.log" 2>&1; then
        log "Maven could not fetch $name's jars: $(grep -m1 ERROR "$CACHE_DIR/maven-$name.log" || tail -n1 "$CACHE_DIR/maven-$name.log")"
        return 1
    fi
    touch "$out/.complete"
}

fetch_kafka_connect() {
    local missing jackson
    missing=$(kafka_connect_missing)
    [ -z "$missing" ] || { log "Kafka Connect cannot run here: $missing."; return 1; }
    fetch_jars "$HERE/services/kafka-connect.pom.xml" "$KAFKA_CONNECT_LIBS" -Dkafka.version="$APACHE_KAFKA_VERSION" || return 1
    # The plugin keeps its own jackson-datatype-jsr310 at the worker's Jackson version, and
    # uses the worker's Jackson otherwise (as Debezium's own plugin archives do): two copies
    # of jackson-databind break Hibernate's module lookup ("Jdk8Module not a subtype").
    jackson=$(basename "$(ls "$KAFKA_CONNECT_LIBS"/jackson-databind-*.jar)" .jar)
    fetch_jars "$HERE/services/debezium-jdbc-sink.pom.xml" "$KAFKA_CONNECT_PLUGINS/debezium-connector-jdbc" \
        -Ddebezium.version="$DEBEZIUM_JDBC_VERSION" -Dhibernate.version="$DEBEZIUM_HIBERNATE_VERSION" \
        -Dpostgresql.version="$POSTGRESQL_JDBC_VERSION" -Djackson.version="${jackson#jackson-databind-}" || return 1
    touch "$KAFKA_CONNECT_PLUGINS/.complete"
    echo "export KAFKA_CONNECT_LIBS=$KAFKA_CONNECT_LIBS KAFKA_CONNECT_PLUGINS=$KAFKA_CONNECT_PLUGINS"
    echo "export KAFKA_CONNECT_VERSIONS='Kafka Connect $APACHE_KAFKA_VERSION, Debezium JDBC sink $DEBEZIUM_JDBC_VERSION, Hibernate $DEBEZIUM_HIBERNATE_VERSION, PostgreSQL JDBC $POSTGRESQL_JDBC_VERSION'"
}
