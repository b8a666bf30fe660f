"""Reading a run_dir the way a test or the demo judges it, without touching the writers."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any


def transcript(run_dir: str | Path, session_id: str) -> list[dict[str, Any]]:
    """The main transcript of ``session_id`` as ``sessions.db`` holds it (opened read-only)."""
    db = Path(run_dir) / "sessions.db"
    if not db.exists():
        return []
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        rows = conn.execute(
            "SELECT data FROM entries WHERE key LIKE ? ORDER BY seq", (f"%/{session_id}",)
        ).fetchall()
    except sqlite3.Error:
        return []
    finally:
        conn.close()
    return [json.loads(r[0]) for r in rows]


def has_tool_result(run_dir: str | Path, session_id: str) -> bool:
    """Has ``sessions.db`` recorded a tool result in this session yet?

    Measured: the CLI persists a turn 60-90 ms after it has already sent the next request,
    so a kill drill that must not lose a finished tool call waits for this first.
    """
    return any('"tool_result"' in json.dumps(e) for e in transcript(run_dir, session_id))
