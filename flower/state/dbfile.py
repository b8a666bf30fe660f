"""Is ``sessions.db`` a usable SQLite file? Cheap checks that need neither SQLite nor the SDK.

``flower-super status`` asks without opening the database (it must answer at once and never
import the SDK); the store asks before it connects, because SQLite opens a file that was cut
short without complaint and only fails, mid-run, on the first page that is missing.

A damaged database is set aside beside itself, with its ``-wal`` and ``-shm`` files (a stale
WAL next to a fresh database would be replayed into it), never deleted.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..util.fsutil import set_aside

if TYPE_CHECKING:
    from .records import LedgerRow

HEADER = b"SQLite format 3\x00"

#: Can the CLI resume ``:sid``: is there a main transcript of it under project ``:pk`` (any
#: project when null) that holds a conversation, i.e. at least one ``user`` entry (the
#: prompt)? The store's ``has_session`` and ``status`` ask the same question. Entries alone
#: are not enough: Claude Code 2.1.337 writes an ``api-request-route`` entry before the
#: prompt, and a session killed between the two answers ``No conversation found`` on resume
#: (measured; 2.1.332 wrote the prompt first). The first user entry is among a transcript's
#: first few, so the scan in ``seq`` order stops at once.
SESSION_EXISTS = (
    "SELECT 1 FROM meta m WHERE m.session_id = :sid AND m.subpath IS NULL"
    " AND (:pk IS NULL OR m.project_key = :pk)"
    " AND EXISTS (SELECT 1 FROM entries e WHERE e.key = m.key"
    " AND CASE WHEN json_valid(e.data) THEN json_extract(e.data, '$.type') END = 'user')"
    " LIMIT 1"
)
HEADER_BYTES = 100
SIDECARS = ("-wal", "-shm")


def damage(path: str | Path) -> str | None:
    """What is wrong with the database file at ``path`` (None: missing, empty or plausible).

    Checks the header's magic string and, when no write-ahead log holds newer pages, that
    the file is as long as its header says (a file cut short opens fine and fails later).
    """
    p = Path(path)
    try:
        with open(p, "rb") as f:
            head = f.read(HEADER_BYTES)
        size = p.stat().st_size
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if not head:
        return None  # SQLite makes an empty file a new database
    if len(head) < HEADER_BYTES or not head.startswith(HEADER):
        return "is not a usable SQLite database (it has no SQLite header)"
    page_size = int.from_bytes(head[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(head[28:32], "big")
    counter_valid = head[24:28] == head[92:96]  # the header's page count is current
    if counter_valid and pages and not _wal_has_frames(p) and size < pages * page_size:
        return f"is not a usable SQLite database (cut short: {size} of {pages * page_size} bytes)"
    return None


def has_transcript(path: str | Path, session_id: str) -> bool | None:
    """:data:`SESSION_EXISTS` under any project, read-only and without the SDK (for
    ``status``); None when the file cannot be asked."""
    return has_transcripts(path, [session_id])[session_id]


def has_transcripts(path: str | Path, session_ids: Iterable[str]) -> dict[str, bool | None]:
    """:func:`has_transcript` of each of ``session_ids``, over one read-only connection."""
    ids = list(session_ids)
    p = Path(path)
    if not p.exists():
        return dict.fromkeys(ids, False)
    import sqlite3  # ~7 ms: loaded by the callers that open a database, not by every import

    out: dict[str, bool | None] = {}
    try:
        conn = sqlite3.connect(f"{p.as_uri()}?mode=ro", uri=True, timeout=1.0)
        try:
            for sid in ids:
                row = conn.execute(SESSION_EXISTS, {"sid": sid, "pk": None}).fetchone()
                out[sid] = row is not None
        finally:
            conn.close()
    except sqlite3.Error:
        return dict.fromkeys(ids, None)
    return out


def read_transcript(run_dir: str | Path, session_id: str) -> list[dict[str, Any]]:
    """The main transcript of ``session_id`` as ``<run_dir>/sessions.db`` holds it, opened
    read-only and without the SDK (``show``, the demo); [] when there is none."""
    db = Path(run_dir) / "sessions.db"
    if not db.exists():
        return []
    import json
    import sqlite3

    try:
        conn = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=5)
        try:
            rows = conn.execute(
                "SELECT data FROM entries WHERE key LIKE ? ORDER BY seq", (f"%/{session_id}",)
            ).fetchall()
        finally:
            conn.close()
    except sqlite3.Error:
        return []
    return [json.loads(r[0]) for r in rows]


def read_tool_calls(run_dir: str | Path, session_id: str) -> list[LedgerRow]:
    """The tool ledger's main-thread rows of ``session_id`` in ``<run_dir>/sessions.db``,
    oldest first, read-only and without the SDK; [] when there is none (no file, or one
    older than the ledger)."""
    db = Path(run_dir) / "sessions.db"
    if not db.exists():
        return []
    import sqlite3

    from .records import LedgerRow

    names = [f.name for f in fields(LedgerRow)]
    try:
        conn = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=5)
        try:
            rows = conn.execute(
                f"SELECT {', '.join(names)} FROM tool_calls"
                " WHERE session_id = ? AND agent_id IS NULL ORDER BY started_at",
                (session_id,),
            ).fetchall()
        finally:
            conn.close()
    except sqlite3.Error:
        return []
    out = []
    for row in rows:
        record = dict(zip(names, row, strict=True))
        record["is_error"] = bool(record["is_error"])
        out.append(LedgerRow(**record))
    return out


def _wal_has_frames(path: Path) -> bool:
    try:
        return os.path.getsize(f"{path}-wal") > 0
    except OSError:
        return False


def set_aside_database(path: str | Path, reason: str = "corrupt") -> Path:
    """Move the database and its ``-wal``/``-shm`` files beside themselves; returns the new
    database path (the sidecars follow its name, so SQLite finds them if it is opened)."""
    p = Path(path)
    aside = set_aside(p, reason)
    for suffix in SIDECARS:
        side = Path(f"{p}{suffix}")
        if side.exists():
            os.replace(side, f"{aside}{suffix}")
    return aside
