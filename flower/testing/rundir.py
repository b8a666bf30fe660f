"""Reading a run_dir the way a test judges it, without touching the writers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flower.state.dbfile import read_transcript


def transcript(run_dir: str | Path, session_id: str) -> list[dict[str, Any]]:
    """The main transcript of ``session_id`` as ``sessions.db`` holds it (opened read-only)."""
    return read_transcript(run_dir, session_id)


def has_tool_result(run_dir: str | Path, session_id: str) -> bool:
    """Has ``sessions.db`` recorded a tool result in this session yet?

    Measured: the CLI persists a turn 60-90 ms after it has already sent the next request,
    so a kill drill that must not lose a finished tool call waits for this first.
    """
    return any('"tool_result"' in json.dumps(e) for e in transcript(run_dir, session_id))
