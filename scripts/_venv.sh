# Sourced by scripts/test.sh and scripts/demo.sh: make ./.venv with everything flower needs.
# Needs only python3. pip keeps its wheel cache (~/.cache/pip), so a second setup is quick.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FLOWER_VENV:-$ROOT/.venv}"
STAMP="$VENV/.flower-installed"
# Say what happens while pip is quiet (the catalogue's words, with the system's python3).
_say() { PYTHONPATH="$ROOT" python3 -m supervisor.commands.bootstrap "$@" || true; }
if [ ! -f "$STAMP" ] || [ "$ROOT/pyproject.toml" -nt "$STAMP" ]; then
    BEGAN=$SECONDS
    if [ -f "$STAMP" ]; then _say venv.updating "venv=$VENV"; else _say venv.making "venv=$VENV"; fi
    if [ ! -x "$VENV/bin/python" ]; then
        python3 -m venv "$VENV"
    fi
    "$VENV/bin/python" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
    "$VENV/bin/python" -m pip install --quiet -e "$ROOT[test,dev]"
    touch "$STAMP"
    _say venv.ready "venv=$VENV" "s=$((SECONDS - BEGAN))"
fi
PY="$VENV/bin/python"
