"""Both session backends for tests that hold the store layers to the same rules on each.

``backend`` (a fixture, parametrized ``sqlite`` / ``postgres``): stores of that backend for
one test. ``open(name)`` gives a session store and its tool ledger's rows (the seam's
``Sessions`` and ``LedgerRows``); the same name is the same data, as another process would
open it: ``runs/<name>.db`` under the test's ``tmp_path``, or schema ``<name>`` of the
test's own PostgreSQL database (``pg_dsn``). Every store opened is closed afterwards.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flower.state.prune import PruningSessionStore
from flower.state.seam import LedgerRows, Sessions
from flower.state.sqlite import SqliteLedgerRows, SqliteSessionStore

BACKENDS = ("sqlite", "postgres")


class Backend:
    def __init__(self, kind: str, tmp_path: Path, dsn: str | None) -> None:
        self.kind = kind
        self.tmp_path = tmp_path
        self.dsn = dsn
        self._opened: list[Sessions] = []

    def __repr__(self) -> str:
        return self.kind

    def open(self, name: str = "sessions") -> tuple[Sessions, LedgerRows]:
        if self.kind == "sqlite":
            store = SqliteSessionStore(self.tmp_path / "runs" / f"{name}.db")
            self._opened.append(store)
            return store, SqliteLedgerRows(store)
        from flower.state.postgres import PostgresState

        state = PostgresState(f"{self.dsn}?schema={name}")
        self._opened.append(state.sessions)
        return state.sessions, state.ledger

    def pruning(self, name: str = "sessions", **kw: Any) -> PruningSessionStore:
        """The pruning layer over ``open(name)``, spilling under ``tmp_path/ws``."""
        sessions, rows = self.open(name)
        kw.setdefault("workspace", self.tmp_path / "ws")
        return PruningSessionStore(sessions, ledger=rows, **kw)

    def stored(self, name: str = "sessions") -> list[str]:
        """The ``data`` column of the entries table, in order: every entry as the backend
        holds it, read by SQL without flower."""
        if self.kind == "sqlite":
            with sqlite3.connect(self.tmp_path / "runs" / f"{name}.db") as conn:
                return [d for (d,) in conn.execute("SELECT data FROM entries ORDER BY seq")]
        import psycopg

        with psycopg.connect(str(self.dsn)) as pg:
            return [d for (d,) in pg.execute(f"SELECT data FROM {name}.entries ORDER BY seq")]

    def close(self) -> None:
        for store in self._opened:
            store.close()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    dsn = request.getfixturevalue("pg_dsn") if request.param == "postgres" else None
    made = Backend(request.param, tmp_path, dsn)
    yield made
    made.close()
