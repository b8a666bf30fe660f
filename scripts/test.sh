#!/usr/bin/env bash
# Run the whole test suite (sets up ./.venv first). Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "$0")/_venv.sh"
cd "$ROOT"
exec "$PY" -m pytest "$@"
