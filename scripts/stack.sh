# Sourced by the scripts in this folder: brings up the local default stack (PostgreSQL on this
# machine and the Google Cloud Pub/Sub emulator) and stops, at exit, only what it started.

set -euo pipefail

# Starts the installed PostgreSQL cluster if nothing answers on 127.0.0.1:5432, with
# pg_stat_statements loaded (the load harness reports where PostgreSQL's time went from it, and
# its smoke tests check that report): on a cluster without it, it is added to
# shared_preload_libraries and the cluster restarted once.
ensure_postgres() {
    if [[ -n "${DATABASE_URL:-}" ]]; then
        return
    fi
    local version
    version=$(ls /etc/postgresql | sort -V | tail -1)
    if ! pg_isready -q -h 127.0.0.1 -p 5432; then
        echo "stack: starting PostgreSQL" >&2
        pg_ctlcluster --skip-systemctl-redirect "$version" main start
        wait_for_postgres
    fi
    local preload
    preload=$(psql -h 127.0.0.1 -U postgres -d postgres -XAtc "SHOW shared_preload_libraries")
    if [[ ",${preload// /}," != *,pg_stat_statements,* ]]; then
        echo "stack: loading pg_stat_statements (restarting PostgreSQL once)" >&2
        psql -h 127.0.0.1 -U postgres -d postgres -Xqc \
            "ALTER SYSTEM SET shared_preload_libraries = '${preload:+$preload,}pg_stat_statements'"
        pg_ctlcluster --skip-systemctl-redirect "$version" main restart
        wait_for_postgres
    fi
}

wait_for_postgres() {
    for _ in $(seq 1 60); do
        pg_isready -q -h 127.0.0.1 -p 5432 && return
        sleep 0.5
    done
    echo "stack: PostgreSQL did not come up on 127.0.0.1:5432" >&2
    exit 1
}

emulator_launcher() {
    if [[ -n "${COURIER_PUBSUB_EMULATOR:-}" ]]; then
        echo "$COURIER_PUBSUB_EMULATOR"
        return
    fi
    local relative=platform/pubsub-emulator/bin/cloud-pubsub-emulator
    if [[ -x "/usr/lib/google-cloud-sdk/$relative" ]]; then
        echo "/usr/lib/google-cloud-sdk/$relative"
        return
    fi
    local root
    root=$(gcloud info --format='value(installation.sdk_root)')
    echo "$root/$relative"
}

# Uses PUBSUB_EMULATOR_HOST when set; otherwise starts the emulator on a free port, exports
# PUBSUB_EMULATOR_HOST and stops the emulator when the calling script exits.
ensure_emulator() {
    if [[ -n "${PUBSUB_EMULATOR_HOST:-}" ]]; then
        return
    fi
    local launcher port log
    launcher=$(emulator_launcher)
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    log="${TMPDIR:-/tmp}/courier-emulator-$port.log"
    echo "stack: starting the Pub/Sub emulator on 127.0.0.1:$port (log: $log)" >&2
    JAVA_OPTS="${JAVA_OPTS:--Xmx1g}" setsid "$launcher" --host=127.0.0.1 --port="$port" >"$log" 2>&1 &
    STACK_EMULATOR_PID=$!
    trap stop_emulator EXIT
    for _ in $(seq 1 120); do
        if curl -fsS "http://127.0.0.1:$port/" >/dev/null 2>&1; then
            export PUBSUB_EMULATOR_HOST="127.0.0.1:$port"
            return
        fi
        sleep 0.5
    done
    echo "stack: the emulator did not answer within 60 s; see $log" >&2
    exit 1
}

# The emulator keeps a thread for every ordering key of every subscription that ever held a
# message, and frees none of them (deleting the subscription does not either): after a whole
# test run it holds ~6,400 threads and burns over a core of this 2-core machine while idle, which
# slowed every later test and made loaded ones time out. Long runs start it afresh between parts.
# An emulator named by the caller's PUBSUB_EMULATOR_HOST is left alone.
restart_emulator() {
    if [[ -z "${STACK_EMULATOR_PID:-}" ]]; then
        return
    fi
    stop_emulator
    unset PUBSUB_EMULATOR_HOST STACK_EMULATOR_PID
    ensure_emulator
}

stop_emulator() {
    if [[ -n "${STACK_EMULATOR_PID:-}" ]]; then
        kill -- -"$STACK_EMULATOR_PID" 2>/dev/null || true
        for _ in $(seq 1 20); do
            kill -0 "$STACK_EMULATOR_PID" 2>/dev/null || return 0
            sleep 0.25
        done
        kill -9 -- -"$STACK_EMULATOR_PID" 2>/dev/null || true
    fi
}

# Installs the Debian package $1 (for the tool $2, named in the error), quietly; as root, or
# through sudo.
apt_install() (
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    log=$(mktemp)
    trap 'rm -f "$log"' EXIT
    if ! { $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq \
        && $sudo env DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -qq --no-install-recommends "$1"; } >"$log" 2>&1; then
        cat "$log" >&2
        echo "could not install $2 (Debian package $1)" >&2
        exit 1
    fi
)

# promtool (Debian package prometheus) for the alert-rule tests (deploy/prometheus/check.sh).
# Installed only when missing. The package's Prometheus server must not start: a policy-rc.d
# forbids service starts during the install, and a systemd unit is stopped and disabled.
ensure_promtool() (
    command -v promtool >/dev/null 2>&1 && exit 0
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    policy=/usr/sbin/policy-rc.d
    if [ ! -e "$policy" ]; then
        trap '$sudo rm -f "$policy"' EXIT
        printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
        $sudo chmod 755 "$policy"
    fi
    apt_install prometheus promtool
    if [ -d /run/systemd/system ]; then
        $sudo systemctl disable --now prometheus >/dev/null 2>&1 || true
    fi
    command -v promtool >/dev/null 2>&1
)

# The Python (psycopg), Node (pg), Java (JDBC) and Go (pgx) producers of
# framework/courier/tests/sql_producers.rs: a virtualenv with tests/clients/requirements.txt and
# node_modules from package-lock.json, both inside tests/clients/ (git-ignored) and installed
# again only when their pins change; Debian's JDBC driver (the JDK is the emulator's), Go and
# pgx v4 (Debian's Go libraries live in /usr/share/gocode, read in GOPATH mode).
STACK_SCRIPTS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ensure_producer_clients() (
    set -euo pipefail
    clients="$STACK_SCRIPTS_DIR/../framework/courier/tests/clients"
    cd "$clients"
    log=$(mktemp)
    trap 'rm -f "$log"' EXIT
    if ! cmp -s requirements.txt .venv/requirements.installed 2>/dev/null; then
        echo "stack: installing the Python producer's packages (tests/clients/.venv)" >&2
        rm -rf .venv
        if ! { python3 -m venv .venv && .venv/bin/pip install -q --disable-pip-version-check \
            -r requirements.txt; } >"$log" 2>&1; then
            cat "$log" >&2
            echo "could not install tests/clients/requirements.txt" >&2
            exit 1
        fi
        cp requirements.txt .venv/requirements.installed
    fi
    if [[ ! -f /usr/share/java/postgresql.jar ]]; then
        echo "stack: installing Debian's PostgreSQL JDBC driver for the Java producer" >&2
        apt_install libpostgresql-jdbc-java "the Java producer's JDBC driver"
    fi
    if ! command -v go >/dev/null || [[ ! -d /usr/share/gocode/src/github.com/jackc/pgx/v4 ]]; then
        echo "stack: installing Debian's Go and pgx for the Go producer" >&2
        apt_install golang-go "the Go producer's compiler"
        apt_install golang-github-jackc-pgx-v4-dev "the Go producer's PostgreSQL driver"
    fi
    if ! cmp -s package-lock.json node_modules/.package-lock.installed 2>/dev/null; then
        echo "stack: installing the Node producer's packages (tests/clients/node_modules)" >&2
        if ! npm ci --no-audit --no-fund >"$log" 2>&1; then
            cat "$log" >&2
            echo "could not install tests/clients/package-lock.json" >&2
            exit 1
        fi
        cp package-lock.json node_modules/.package-lock.installed
    fi
)

# The browser test of the operator console (framework/courier-cli/tests/console_browser.rs):
# Debian's chromium (installed when missing, as promtool is) and playwright-core, pinned in
# tests/browser/package-lock.json, into tests/browser/node_modules (git-ignored; installed again
# only when the pin changes). playwright-core is the library alone: it downloads no browser.
ensure_console_browser() (
    set -euo pipefail
    if [ ! -x "${CHROMIUM:-/usr/bin/chromium}" ]; then
        echo "stack: installing Debian's chromium for the console's browser test" >&2
        apt_install chromium chromium
    fi
    cd "$STACK_SCRIPTS_DIR/../framework/courier-cli/tests/browser"
    if ! cmp -s package-lock.json node_modules/.package-lock.installed 2>/dev/null; then
        echo "stack: installing playwright-core for the console's browser test (tests/browser/node_modules)" >&2
        log=$(mktemp)
        trap 'rm -f "$log"' EXIT
        if ! npm ci --no-audit --no-fund >"$log" 2>&1; then
            cat "$log" >&2
            echo "could not install framework/courier-cli/tests/browser/package-lock.json" >&2
            exit 1
        fi
        cp package-lock.json node_modules/.package-lock.installed
    fi
)
