# Sourced by scripts/test.sh and scripts/demo.sh: make ./.venv with exactly the versions CI
# tested. Needs only python3 (and then the venv's own pip). pip keeps its wheel cache
# (~/.cache/pip), so a second setup is quick.
#
# requirements.lock pins every package flower, its tests and its checks need (the `test` and
# `dev` extras, every transitive one) with the sha256 of every file of each release on PyPI;
# pip installs it with --require-hashes, so what lands here is what CI ran, byte for byte, or
# nothing. It is written by `uv pip compile --universal --generate-hashes` (scripts/upgrade.sh
# installs uv for that, and moves the lock only after `bash scripts/test.sh --latest` passed):
# uv resolves one lock for every platform and CPython 3.11+ at once, where pip-tools resolves
# for the machine it runs on only (a lock made on x86_64 Linux could lack what another
# platform or Python needs), and it writes pip's own requirements format, so installing from
# the lock needs no uv. flower itself goes in editable, without dependencies: the lock has them.
#
# The venv is brought to the lock whenever pyproject.toml or requirements.lock differ from what
# it was made with (the stamp holds their checksum): pip upgrades and downgrades what it must,
# a venv made before the lock existed included.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FLOWER_VENV:-$ROOT/.venv}"
LOCK="$ROOT/requirements.lock"
STAMP="$VENV/.flower-installed"
# Say what happens while pip is quiet (the catalogue's words, with the system's python3).
_say() { PYTHONPATH="$ROOT" python3 -m supervisor.commands.bootstrap "$@" || true; }
# pip as this machine configures it (its find-links and extra indexes too), less its warning
# about each configured local index that lacks the package (one line per package on some).
_pip() {
    local status=0 err
    err="$(mktemp)"
    "$VENV/bin/python" -m pip "$@" 2>"$err" || status=$?
    grep -v "is ignored: it is neither a file nor a directory" "$err" >&2 || true
    rm -f "$err"
    return "$status"
}
_wanted="$(cat "$ROOT/pyproject.toml" "$LOCK" | cksum)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$_wanted" ]; then
    BEGAN=$SECONDS
    if [ -f "$STAMP" ]; then _say venv.updating "venv=$VENV"; else _say venv.making "venv=$VENV"; fi
    if [ ! -x "$VENV/bin/python" ]; then
        python3 -m venv "$VENV"
    fi
    _pip install --quiet --upgrade pip >/dev/null 2>&1 || true
    _pip install --quiet --require-hashes -r "$LOCK"
    _pip install --quiet --no-deps -e "$ROOT"
    # The lock must satisfy pyproject.toml (a range changed, a dependency added: the lock moves
    # with it, through scripts/upgrade.sh).
    if ! _checked="$(_pip check)"; then
        echo "$_checked" >&2
        echo "requirements.lock does not satisfy pyproject.toml (above): move the lock with it:" \
            "bash scripts/test.sh --latest, then bash scripts/upgrade.sh" >&2
        exit 1
    fi
    printf '%s\n' "$_wanted" >"$STAMP"
    _say venv.ready "venv=$VENV" "s=$((SECONDS - BEGAN))" \
        "sdk=$("$VENV/bin/python" "$ROOT/scripts/pins.py" sdk 2>/dev/null || true)"
fi
PY="$VENV/bin/python"
