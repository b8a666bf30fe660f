"""Session stores: SQLite at the bottom, trimming and pruning layered on top (seed 003)."""

from __future__ import annotations

from typing import Any

SESSIONS_DB = "sessions.db"


def open_store(runtime: Any) -> Any:
    """The store a Runtime always uses: the outermost layer available, on run_dir/sessions.db."""
    from .sqlite import SqliteSessionStore

    return SqliteSessionStore(runtime.run_dir / SESSIONS_DB)
