#!/usr/bin/env bash
# The offline demo: no API key, no network (sets up ./.venv first).
set -euo pipefail
source "$(dirname "$0")/_venv.sh"
cd "$ROOT"
exec "$VENV/bin/flower-super" demo "$@"
