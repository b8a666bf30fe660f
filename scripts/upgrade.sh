#!/usr/bin/env bash
# Move requirements.lock forward to the newest releases pyproject.toml allows, with hashes:
# only when `bash scripts/test.sh --latest` passed, on all the drills, for exactly the
# versions that are the newest now (.venv-latest/verdict.json); else one line saying why not.
#
# The lock is written by uv (`uv pip compile --universal --generate-hashes`, installed here
# into .venv-upgrade/, gitignored): one resolution for every platform and CPython 3.11+, with
# the hashes of every file of each release, in pip's requirements format, so installing it
# (scripts/_venv.sh) needs only pip. pip-tools would lock for this machine only.
# It locks what --latest tested (its venv's `pip freeze` as constraints), not what happens to
# be newest by now: a direct dependency released since refuses; run --latest again.
#
# Then: bash scripts/test.sh (it brings ./.venv to the new lock), set the README's "Which
# versions are tested" to the new SDK and CLI (tests/test_pins.py checks it), and commit.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
LATEST="$ROOT/.venv-latest"
TOOLS="$ROOT/.venv-upgrade"
UV_VERSION=0.13.9
if [ ! -x "$LATEST/bin/python" ]; then
    echo "run bash scripts/test.sh --latest first: there is no .venv-latest (no --latest run)" >&2
    exit 1
fi
pins() { "$LATEST/bin/python" scripts/pins.py "$@"; }
pins may-upgrade || exit 1
if ! "$TOOLS/bin/uv" --version 2>/dev/null | grep -q "^uv $UV_VERSION\b"; then
    echo "== installing uv $UV_VERSION into $TOOLS (it writes the lock; nothing installs with it)"
    rm -rf "$TOOLS"
    python3 -m venv "$TOOLS"
    "$TOOLS/bin/python" -m pip install --quiet "uv==$UV_VERSION" 2>&1 |
        { grep -v "is ignored: it is neither a file nor a directory" || true; }
fi
compile() {
    "$TOOLS/bin/uv" pip compile --quiet pyproject.toml --extra test --extra dev \
        --universal --python-version 3.11 --generate-hashes \
        --custom-compile-command "bash scripts/upgrade.sh" "$@"
}
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "== the newest releases pyproject.toml allows (uv pip compile --upgrade)"
compile --upgrade --refresh -o "$work/newest.txt"
pins may-upgrade --newest "$work/newest.txt" || exit 1
echo "== locking what --latest tested (.venv-latest/tested.txt), for every platform"
compile -c "$LATEST/tested.txt" -o "$work/lock.txt"
pins tidy "$work/lock.txt"
echo "== requirements.lock:"
pins changes requirements.lock "$work/lock.txt"
mv "$work/lock.txt" requirements.lock
echo "== requirements.lock moved forward: now bash scripts/test.sh (it brings ./.venv to it)," \
    "set README's \"Which versions are tested\" to the new SDK and CLI (tests/test_pins.py" \
    "checks it), and commit both"
