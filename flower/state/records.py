"""The run state's row records, light to import (the backends' row stores build them
without the SDK). :mod:`flower.state.seam` re-exports them with the protocols."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LedgerRow", "LineageDoc"]


@dataclass(frozen=True)
class LedgerRow:
    """One tool call as stored. JSON columns are JSON text (as written by the ledger)."""

    tool_use_id: str
    session_id: str
    agent_id: str | None
    name: str
    input: str  # JSON text
    state: str  # started | done | failed | interrupted
    started_at: float
    message: str | None = None  # JSON text
    response: str | None = None  # JSON text
    content: str | None = None  # JSON text
    is_error: bool = False
    ended_at: float | None = None


@dataclass
class LineageDoc:
    """What lineage stores for one workspace: ``lineage.json``'s three fields."""

    workspace: str  # the workspace as the writer saw it (an absolute path)
    woke: int
    steps: dict[str, str]
