"""End-to-end helpers for a flower whose run state is in PostgreSQL (``FLOWER_STATE``).

:class:`PgFlower` is :class:`tests.e2e.Flower` with the state read where the backend keeps
it: lineage, manifest rows and transcripts by SQL on the test's own database (``pg_dsn``),
never through flower's own code. It sets ``FLOWER_STATE`` in the environment of every
command it runs, as a person would. :func:`run_state_files` names what a run left under the
run_dir that only local state may write (``sessions.db``, ``lineage.json``,
``manifest.json``), wherever it is below.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg

from flower.services.model_server import ModelServer
from flower.state.identity import read_identity
from tests.e2e import Flower

#: backends a drill runs against: ``local`` (files under the run_dir), ``postgres``
STATES = ("local", "postgres")
#: files only the local backend writes under the run_dir
STATE_FILES = ("sessions.db", "lineage.json", "manifest.json")
SCHEMA = "flower"  # the default schema (FLOWER_STATE names no other)


def run_state_files(runs: Path) -> list[str]:
    """Every file under ``runs`` named as one of :data:`STATE_FILES` (at any depth)."""
    if not runs.exists():
        return []
    return sorted(str(p.relative_to(runs)) for p in runs.rglob("*") if p.name in STATE_FILES)


class PgFlower(Flower):
    """A :class:`Flower` whose run state is in the PostgreSQL database ``dsn``."""

    def __init__(self, root: Path, server: ModelServer, *, state: str, **kw: Any) -> None:
        extra = {"FLOWER_STATE": state, **(kw.pop("extra_env", None) or {})}
        super().__init__(root, server, extra_env=extra, **kw)
        self.dsn = state

    def status(self, *extra: str, timeout: float = 30) -> tuple[int, str]:
        """``status`` names the workspace: against a database it shows the runs of the
        workspace (``-w``, default the current directory), and these commands run beside it,
        not in it (the run_dir names no runs there)."""
        where = () if "-w" in extra else ("-w", str(self.ws))
        return super().status(*where, *extra, timeout=timeout)

    def _rows(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            try:
                return conn.execute(sql.replace("{s}", SCHEMA), params).fetchall()
            except psycopg.errors.UndefinedTable:  # no flower has connected yet
                return []

    def workspace_id(self) -> str | None:
        """The identity the workspace carries (written by the first run on a database)."""
        return read_identity(self.ws)

    def lineage(self) -> dict[str, Any]:
        """The workspace's lineage row, in ``lineage.json``'s shape; raises LookupError
        while there is none (as reading a missing ``lineage.json`` raises)."""
        ws_id = self.workspace_id()
        rows = self._rows(
            "SELECT workspace, woke, steps FROM {s}.lineage WHERE workspace_id = %s", (ws_id,)
        )
        if not rows:
            raise LookupError(f"no lineage row for workspace {ws_id!r}")
        ((workspace, woke, steps),) = rows
        return {"workspace": workspace, "woke": woke, "steps": steps}

    def manifest(self) -> list[dict[str, Any]]:
        ws_id = self.workspace_id()
        rows = self._rows(
            "SELECT row FROM {s}.manifest WHERE workspace_id = %s ORDER BY id", (ws_id,)
        )
        return [row for (row,) in rows]

    def transcript(self, session_id: str) -> list[dict[str, Any]]:
        """The session's main transcript (key ``<project>/<session>``), in order."""
        rows = self._rows(
            "SELECT data FROM {s}.entries WHERE key LIKE %s ORDER BY seq", (f"%/{session_id}",)
        )
        return [json.loads(data) for (data,) in rows]

    def has_tool_result(self, session_id: str) -> bool:
        return any('"tool_result"' in json.dumps(e) for e in self.transcript(session_id))

    def ledger(self, session_id: str) -> list[dict[str, Any]]:
        """The session's tool calls as the ledger holds them, oldest first."""
        rows = self._rows(
            "SELECT tool_use_id, name, state, content FROM {s}.tool_calls"
            " WHERE session_id = %s ORDER BY started_at",
            (session_id,),
        )
        keys = ("tool_use_id", "name", "state", "content")
        return [dict(zip(keys, row, strict=True)) for row in rows]

    def events(self, run: str) -> list[dict[str, Any]]:
        """The run's event log, in order."""
        rows = self._rows("SELECT event FROM {s}.events WHERE run = %s ORDER BY pos", (run,))
        return [event for (event,) in rows]

    def assert_state_home(self) -> None:
        """Nothing of the run's state was written under the run_dir."""
        found = run_state_files(self.runs)
        assert not found, f"run state written under the run_dir with FLOWER_STATE set: {found}"
        assert self.workspace_id(), "the workspace carries no identity"
        assert self.lineage()["steps"], "the database holds no lineage for the workspace"
