# The headless browser of the browser tests: Debian's Chromium (the `chromium` package, at
# /usr/bin/chromium), installed if missing, driven by Playwright for Python from a venv under
# the cache, made once from the pins in scripts/services/browser-requirements.txt. Playwright's
# own browser builds (`playwright install`) are never fetched: tests launch Chromium with
# executable_path=$PROJECTIONIST_CHROMIUM. Sourced by scripts/services.sh (which defines log,
# as_root and HERE, and sources apache-kafka.sh first for CACHE_DIR). Prints
# PROJECTIONIST_BROWSER_PYTHON and PROJECTIONIST_CHROMIUM.

BROWSER_REQUIREMENTS=$HERE/services/browser-requirements.txt
BROWSER_CHROMIUM=/usr/bin/chromium

# Installs Debian's Chromium unless it is there; `apt-get update` only when a first install fails.
ensure_chromium() {
    [ -x "$BROWSER_CHROMIUM" ] && return 0
    command -v apt-get >/dev/null 2>&1 \
        || { log "The browser tests need Chromium at $BROWSER_CHROMIUM, and there is no apt-get to install it."; return 1; }
    log "Installing Chromium from Debian's packages."
    if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >&2; then
        log "Installing Chromium failed; updating the package lists and trying again."
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 \
            && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >&2 \
            || { log "Could not install Debian's chromium package; the browser tests need it at $BROWSER_CHROMIUM."; return 1; }
    fi
    [ -x "$BROWSER_CHROMIUM" ] \
        || { log "Debian's chromium package is installed but $BROWSER_CHROMIUM is missing."; return 1; }
}

# Makes Playwright's venv unless it is there already.
ensure_playwright() {
    local python=${PYTHON:-python3} version hash
    command -v "$python" >/dev/null 2>&1 || { log "Playwright for Python needs Python 3.10 or later; there is no $python on PATH."; return 1; }
    version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    # playwright 1.65 and greenlet 3.5 require Python 3.10.
    "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
        || { log "Playwright for Python needs Python 3.10 or later; $python is $version."; return 1; }
    hash=$(sha256sum <"$BROWSER_REQUIREMENTS" | cut -c1-12)
    # One venv per pin set and Python version: changing either makes a new one.
    BROWSER_VENV=$CACHE_DIR/browser-py$version-$hash
    if [ ! -f "$BROWSER_VENV/.complete" ]; then
        log "Making a Python $version venv with Playwright's pinned packages in $BROWSER_VENV (once)."
        rm -rf "$BROWSER_VENV"
        mkdir -p "$CACHE_DIR"
        if ! { "$python" -m venv "$BROWSER_VENV" && "$BROWSER_VENV/bin/python" -m pip install -q --disable-pip-version-check \
            --no-input -r "$BROWSER_REQUIREMENTS"; } >"$CACHE_DIR/pip-browser.log" 2>&1; then
            log "Could not install Playwright for Python: $(grep -m1 -i error "$CACHE_DIR/pip-browser.log" || tail -n1 "$CACHE_DIR/pip-browser.log")"
            return 1
        fi
        touch "$BROWSER_VENV/.complete"
    else
        log "Playwright's venv is there already ($BROWSER_VENV)."
    fi
}

# Chromium and Playwright's venv; prints PROJECTIONIST_BROWSER_PYTHON and PROJECTIONIST_CHROMIUM.
ensure_browser() {
    ensure_chromium || return 1
    ensure_playwright || return 1
    log "Browser ready: $("$BROWSER_CHROMIUM" --version 2>/dev/null || echo "$BROWSER_CHROMIUM"), Playwright from $BROWSER_VENV."
    echo "export PROJECTIONIST_BROWSER_PYTHON=$BROWSER_VENV/bin/python PROJECTIONIST_CHROMIUM=$BROWSER_CHROMIUM"
}
