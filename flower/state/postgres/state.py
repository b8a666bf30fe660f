"""``PostgresState``: everything a run persists, in one PostgreSQL database (the seam's
``RunState`` with ``kind == "postgres"``)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from .db import Database, Patience
from .rows import (
    PostgresCacheRows,
    PostgresEventRows,
    PostgresLedgerRows,
    PostgresLineageRows,
    PostgresManifestRows,
    PostgresRegistryRows,
    PostgresWorkerRows,
)
from .url import StateURL, parse_state_url

if TYPE_CHECKING:
    from .sessions import PostgresSessionStore

__all__ = ["PostgresState"]


class PostgresState:
    """The run state of every workspace that uses one database.

    ``url``: a ``postgresql://`` URL (or a parsed :class:`StateURL`). The constructor
    connects and brings the schema up to date, so every error a person can cause (a URL
    that is not PostgreSQL's, a refused password, a database that does not exist, a server
    that is down, a schema from a newer flower) is raised here as one line with a hint.
    ``where`` is the URL with its password masked, for people.

    :attr:`sessions` and :attr:`ledger` share one epoch: ``sessions.begin_attempt()`` fences
    the ledger's writes too. All objects share this process's one connection. The session
    store (and with it the SDK) is loaded on first use of :attr:`sessions` or
    :attr:`ledger`: ``status`` reading the registry and the manifest does without both.
    """

    kind = "postgres"

    def __init__(self, url: str | StateURL) -> None:
        parsed = url if isinstance(url, StateURL) else parse_state_url(url)
        self._db = Database.shared(parsed)
        self._db.open()
        self.url = parsed
        self.where = parsed.masked()
        self._made = threading.Lock()
        self._sessions: PostgresSessionStore | None = None
        self._ledger: PostgresLedgerRows | None = None
        self._lineage = PostgresLineageRows(self._db, f"{self.where} (lineage)")
        self._manifest = PostgresManifestRows(self._db)
        self._registry = PostgresRegistryRows(self._db)
        self._cache = PostgresCacheRows(self._db, f"{self.where} (cache)")
        self._events = PostgresEventRows(self._db)
        self._workers = PostgresWorkerRows(self._db)

    def __repr__(self) -> str:
        return f"PostgresState({self.where!r})"

    @contextlib.contextmanager
    def patient(self, patience: Patience) -> Iterator[None]:
        """Reads of this process (:meth:`Database.run`) go through ``patience`` within."""
        before, self._db.patience = self._db.patience, patience
        try:
            yield
        finally:
            self._db.patience = before

    @property
    def sessions(self) -> PostgresSessionStore:
        with self._made:  # one store per state: the ledger shares its epoch
            if self._sessions is None:
                from .sessions import PostgresSessionStore

                self._sessions = PostgresSessionStore.on(self._db)
            return self._sessions

    @property
    def ledger(self) -> PostgresLedgerRows:
        sessions = self.sessions
        with self._made:
            if self._ledger is None:
                self._ledger = PostgresLedgerRows(self._db, sessions)
            return self._ledger

    @property
    def lineage(self) -> PostgresLineageRows:
        return self._lineage

    @property
    def manifest(self) -> PostgresManifestRows:
        return self._manifest

    @property
    def registry(self) -> PostgresRegistryRows:
        return self._registry

    @property
    def cache(self) -> PostgresCacheRows:
        return self._cache

    @property
    def events(self) -> PostgresEventRows:
        return self._events

    @property
    def workers(self) -> PostgresWorkerRows:
        return self._workers

    def settle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the database to take what this process and dead
        processes kept on this machine during an outage (:meth:`.db.Database.settle`);
        True when nothing is left."""
        return self._db.settle(timeout)

    def close(self) -> None:
        """Close this process's connections (a later call opens new ones)."""
        self._db.close()
