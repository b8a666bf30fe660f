#!/usr/bin/env bash
# The whole check (sets up ./.venv first): style (ruff), formatting (ruff format), types
# (mypy), then the test suite. Extra arguments: pytest with them, instead of the suite.
set -euo pipefail
source "$(dirname "$0")/_venv.sh"
cd "$ROOT"
echo "== ruff check" && "$VENV/bin/ruff" check .
echo "== ruff format --check" && "$VENV/bin/ruff" format --check .
echo "== mypy" && "$VENV/bin/mypy"
if [ "$#" -gt 0 ]; then
    echo "== pytest $*" && exec "$PY" -m pytest "$@"
fi
# The whole suite: the unit tests as one job, each end-to-end file as its own, side by side
# (scripts/run_tests.py; FLOWER_TEST_WORKERS=1 runs them one after another).
echo "== pytest (scripts/run_tests.py)" && exec "$PY" scripts/run_tests.py
