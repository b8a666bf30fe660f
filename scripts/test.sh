#!/usr/bin/env bash
# The whole check (sets up ./.venv first): style (ruff), formatting (ruff format), types
# (mypy), then the test suite. Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "$0")/_venv.sh"
cd "$ROOT"
echo "== ruff check" && "$VENV/bin/ruff" check .
echo "== ruff format --check" && "$VENV/bin/ruff" format --check .
echo "== mypy" && "$VENV/bin/mypy"
echo "== pytest" && exec "$PY" -m pytest "$@"
