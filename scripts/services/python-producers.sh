# The Python producers of the format tests (issue 68): Confluent's client with its Avro,
# Protobuf and JSON Schema serializers (confluent-kafka[avro,protobuf,json]) and the
# CloudEvents SDK, in a venv under the cache, made once from the pins in
# scripts/services/python-producers.txt. Sourced by scripts/services.sh (which defines log
# and HERE, and sources apache-kafka.sh first for CACHE_DIR). Prints PROJECTIONIST_PYTHON.

PYTHON_PRODUCERS_REQUIREMENTS=$HERE/services/python-producers.txt

# Makes the venv unless it is there already; prints PROJECTIONIST_PYTHON.
ensure_python_producers() {
    local python=${PYTHON:-python3} version hash venv
    command -v "$python" >/dev/null 2>&1 || { log "The Python producers need Python 3.10 or later; there is no $python on PATH."; return 1; }
    version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    # cloudevents 2.x requires Python 3.10.
    "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
        || { log "The Python producers need Python 3.10 or later; $python is $version."; return 1; }
    hash=$(cat "$PYTHON_PRODUCERS_REQUIREMENTS" | sha256sum | cut -c1-12)
    # One venv per pin set and Python version: changing either makes a new one.
    venv=$CACHE_DIR/python-producers-py$version-$hash
    if [ ! -f "$venv/.complete" ]; then
        log "Making a Python $version venv with the producers' pinned packages in $venv (once)."
        rm -rf "$venv"
        mkdir -p "$CACHE_DIR"
        if ! { "$python" -m venv "$venv" && "$venv/bin/python" -m pip install -q --disable-pip-version-check \
            --no-input -r "$PYTHON_PRODUCERS_REQUIREMENTS"; } >"$CACHE_DIR/pip-python-producers.log" 2>&1; then
            log "Could not install the Python producers: $(grep -m1 -i error "$CACHE_DIR/pip-python-producers.log" || tail -n1 "$CACHE_DIR/pip-python-producers.log")"
            return 1
        fi
        touch "$venv/.complete"
    else
        log "The Python producers' venv is there already ($venv)."
    fi
    echo "export PROJECTIONIST_PYTHON=$venv/bin/python"
}
