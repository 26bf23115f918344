# Apicurio Registry, the schema registry of the format tests (issue 68): sourced by
# scripts/services.sh (which defines log, listening, STATE_DIR and HERE, and sources
# apache-kafka.sh first for CACHE_DIR).
#
# The published Quarkus app (io.apicurio:apicurio-registry-app, classifier `all`, tar.gz) is
# fetched from Maven Central once (hashes checked) and unpacked into the cache
# (scripts/services/apicurio-registry.pom.xml). It runs on Java 21 or later, in memory (H2:
# every schema is gone when it stops), on 127.0.0.1 only, with a small heap; its pid and
# output are under $STATE_DIR/registry, and only that pid is ever stopped. Tests use its
# Confluent-compatible API (`/apis/ccompat/v7`), printed as SCHEMA_REGISTRY_URL.

APICURIO_VERSION=3.3.3
APICURIO_HOME=$CACHE_DIR/apicurio-registry-$APICURIO_VERSION
APICURIO_JAR=$APICURIO_HOME/app/quarkus-run.jar
# 8181 for the API; Quarkus opens a second port for health and metrics (9000 by default),
# put on 8182. Neither is used by the brokers (9092/9093, 19092–19094, 29092/29093,
# 39092–39293) or the PostgreSQL clusters (5432, 5433, 5435).
REGISTRY_PORT=${REGISTRY_PORT:-8181}
REGISTRY_MANAGEMENT_PORT=${REGISTRY_MANAGEMENT_PORT:-8182}
REGISTRY_HEAP=${REGISTRY_HEAP:-256m}
REGISTRY_DIR=$STATE_DIR/registry
REGISTRY_URL=http://$KAFKA_HOST:$REGISTRY_PORT/apis/ccompat/v7

# The major version of a java binary, or nothing.
java_major() {
    local version
    version=$("$1" -version 2>&1 | awk -F'"' '/version/ {print $2; exit}')
    version=${version#1.}
    echo "${version%%[.+-]*}"
}

# Sets REGISTRY_JAVA to a java of version 21 or later: $REGISTRY_JAVA if set, then
# $JAVA_HOME, the java on PATH, and the newest JDK under /usr/lib/jvm. Fails saying what
# it found otherwise.
find_registry_java() {
    local candidate major seen=()
    local candidates=("${REGISTRY_JAVA:-}" "${JAVA_HOME:+$JAVA_HOME/bin/java}" "$(command -v java 2>/dev/null)")
    candidates+=($(ls -d /usr/lib/jvm/*/bin/java 2>/dev/null | sort -rV))
    for candidate in "${candidates[@]}"; do
        [ -n "$candidate" ] && [ -x "$candidate" ] || continue
        major=$(java_major "$candidate")
        if [ "${major:-0}" -ge 21 ] 2>/dev/null; then
            REGISTRY_JAVA=$candidate
            return 0
        fi
        seen+=("$candidate (Java ${major:-unknown})")
    done
    log "Apicurio Registry $APICURIO_VERSION needs Java 21 or later, and none was found" \
        "(looked at REGISTRY_JAVA, JAVA_HOME, PATH and /usr/lib/jvm; found: ${seen[*]:-no java at all})." \
        "Install a JDK 21+ (e.g. Debian's openjdk-21-jdk-headless or a Temurin 21/25) or set REGISTRY_JAVA."
    return 1
}

# Unpacks the registry into the cache, once.
fetch_apicurio_registry() {
    [ -f "$APICURIO_HOME/.complete" ] && return 0
    command -v mvn >/dev/null 2>&1 || { log "Apicurio Registry is not in $APICURIO_HOME and there is no mvn on PATH to fetch it."; return 1; }
    log "Fetching Apicurio Registry $APICURIO_VERSION from Maven Central into $APICURIO_HOME (once; about 150 MB)."
    rm -rf "$APICURIO_HOME"
    mkdir -p "$APICURIO_HOME"
    if ! mvn -q -B --strict-checksums -f "$HERE/services/apicurio-registry.pom.xml" dependency:unpack \
        -Dapicurio.version="$APICURIO_VERSION" -Dregistry.dir="$APICURIO_HOME/app" \
        -Dregistry.markers="$APICURIO_HOME/markers" >"$CACHE_DIR/maven-apicurio-registry.log" 2>&1 \
        || [ ! -f "$APICURIO_JAR" ]; then
        log "Maven could not fetch Apicurio Registry: $(grep -m1 ERROR "$CACHE_DIR/maven-apicurio-registry.log" || tail -n1 "$CACHE_DIR/maven-apicurio-registry.log")"
        return 1
    fi
    touch "$APICURIO_HOME/.complete"
}

registry_pid() { # → the pid we recorded, if that process is still our registry
    local pid
    pid=$(cat "$REGISTRY_DIR/registry.pid" 2>/dev/null) || return 1
    tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -q -- "$APICURIO_JAR" && echo "$pid"
}

registry_answers() { curl -sf -o /dev/null --max-time 2 "$REGISTRY_URL/subjects"; }

# Starts the registry unless it runs already, waits until its ccompat API answers (120 s at
# most), and prints SCHEMA_REGISTRY_URL.
start_registry() {
    local pid since=0
    command -v curl >/dev/null 2>&1 || { log "The registry's readiness check needs curl, which is not on PATH."; return 1; }
    if pid=$(registry_pid); then
        log "Apicurio Registry (pid $pid) already runs on $KAFKA_HOST:$REGISTRY_PORT; leaving it as it is."
    else
        if listening "$KAFKA_HOST" "$REGISTRY_PORT"; then
            log "Something this script did not start listens on $KAFKA_HOST:$REGISTRY_PORT; not starting a registry there" \
                "(set REGISTRY_PORT to use another port)."
            return 1
        fi
        find_registry_java || return 1
        fetch_apicurio_registry || return 1
        mkdir -p "$REGISTRY_DIR"
        [ -f "$REGISTRY_DIR/registry.log" ] && since=$(wc -l <"$REGISTRY_DIR/registry.log")
        log "Starting Apicurio Registry $APICURIO_VERSION on $KAFKA_HOST:$REGISTRY_PORT with $REGISTRY_JAVA" \
            "(Java $(java_major "$REGISTRY_JAVA"); log: $REGISTRY_DIR/registry.log)."
        # In memory (H2), the API and the management port (health, metrics) on 127.0.0.1 only,
        # no access log and no audit line per request (io.apicurio at WARN).
        # Compatibility: Apicurio's global default is NONE (Confluent's is BACKWARD). We set
        # the global compatibility rule to BACKWARD, Confluent's default, so a schema evolved
        # by adding a field with a default is accepted and one adding a required field (no
        # default) is refused with 409, as against a Confluent registry.
        nohup setsid "$REGISTRY_JAVA" "-Xmx$REGISTRY_HEAP" -Xms64m -XX:+UseSerialGC \
            -Dquarkus.http.host="$KAFKA_HOST" -Dquarkus.http.port="$REGISTRY_PORT" \
            -Dquarkus.management.host="$KAFKA_HOST" -Dquarkus.management.port="$REGISTRY_MANAGEMENT_PORT" \
            -Dapicurio.storage.kind=sql -Dapicurio.storage.sql.kind=h2 \
            -Dapicurio.datasource.url=jdbc:h2:mem:registry \
            -Dapicurio.rules.global.compatibility=BACKWARD \
            -Dquarkus.http.access-log.enabled=false \
            '-Dquarkus.log.category."io.apicurio".level=WARN' \
            -jar "$APICURIO_JAR" >>"$REGISTRY_DIR/registry.log" 2>&1 </dev/null 9>&- &
        pid=$!
        echo "$pid" >"$REGISTRY_DIR/registry.pid"
        for _ in $(seq 1 240); do
            registry_answers && break
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.5
        done
        if ! registry_answers; then
            log "Apicurio Registry did not answer on $REGISTRY_URL/subjects; the end of $REGISTRY_DIR/registry.log:"
            tail -n +"$((since + 1))" "$REGISTRY_DIR/registry.log" | tail -n 30 >&2
            kill -0 "$pid" 2>/dev/null && { log "Stopping it (pid $pid)."; kill -TERM "$pid"; }
            return 1
        fi
        log "Apicurio Registry ready (pid $pid)."
    fi
    echo "export SCHEMA_REGISTRY_URL=$REGISTRY_URL"
}

# Stops the registry by the pid we recorded (killed after 30 s).
stop_registry() {
    local pid
    pid=$(registry_pid) || { log "Apicurio Registry is not running (no live pid recorded)."; return; }
    log "Stopping Apicurio Registry (pid $pid)."
    kill -TERM "$pid"
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || { rm -f "$REGISTRY_DIR/registry.pid"; return 0; }; sleep 0.5; done
    log "Apicurio Registry (pid $pid) did not stop in 30 s; killing it."
    kill -KILL "$pid"
    rm -f "$REGISTRY_DIR/registry.pid"
}
