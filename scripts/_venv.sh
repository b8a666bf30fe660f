# Sourced by scripts/test.sh and scripts/demo.sh: make ./.venv with everything flower needs.
# Needs only python3. pip keeps its wheel cache (~/.cache/pip), so a second setup is quick.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FLOWER_VENV:-$ROOT/.venv}"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
STAMP="$VENV/.flower-installed"
if [ ! -f "$STAMP" ] || [ "$ROOT/pyproject.toml" -nt "$STAMP" ]; then
    "$VENV/bin/python" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
    "$VENV/bin/python" -m pip install --quiet -e "$ROOT[test,dev]"
    touch "$STAMP"
fi
PY="$VENV/bin/python"
