"""The two homes of a run's state, behind one interface: :func:`open_state`.

Everything a run persists is reached through the object :func:`open_state` returns — by the
Runtime and its step loop, the Workflow, the supervisor and ``status``/``show``/``logs``/
``cancel`` alike — and none of them asks which it got:

- :class:`LocalState` (the default, no configuration): the files of one run_dir, exactly as
  flower has always written them (``sessions.db``, ``lineage.json``, ``manifest.json``,
  ``flowers/``, ``cache/``, ``logs/<run>/events.jsonl``). A run_dir written before this seam
  existed wakes after it.
- :class:`SharedState`: one PostgreSQL database (:mod:`flower.state.postgres`) holding every
  workspace that uses it, each under its identity (:mod:`flower.state.identity`). Nothing of
  the run's state is written under the run_dir then; only the step logs (``<run_dir>/logs/
  <run>/<step>.log``, a child's stdout and stderr) and the children's temporary files stay
  on the machine that ran them.

Which one: ``state`` given to :func:`open_state` (``--state URL``, ``Runtime(state=…)``), else
``FLOWER_STATE`` (the environment, or any ``.env`` of the credentials' lookup order, which
``Runtime`` loads first), else local.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

STATE_ENV = "FLOWER_STATE"

__all__ = ["STATE_ENV", "LocalState", "SharedState", "open_state", "state_url"]


def state_url(given: str | None = None) -> str | None:
    """The state URL in effect: ``given``, else ``$FLOWER_STATE``; None (or "") = local."""
    url = given if given is not None else os.environ.get(STATE_ENV)
    return url.strip() or None if url else None


def open_state(
    state: Any = None, *, run_dir: str | Path, workspace: str | Path, create: bool = True
) -> Any:
    """The run state for ``workspace``: an object already opened (returned as is), a URL, or
    None for ``$FLOWER_STATE`` / local files in ``run_dir``. A URL that is not PostgreSQL's,
    a refused password, a database that is down: one FlowerError line with a hint.
    ``create=False`` (readers such as ``status``) never writes the workspace's identity."""
    if state is not None and not isinstance(state, str):
        return state
    url = state_url(state)
    if url is None:
        return LocalState(run_dir, workspace)
    return SharedState(url, run_dir=run_dir, workspace=workspace, create=create)


class LocalState:
    """The files of one run_dir (see the module docstring)."""

    kind = "local"

    def __init__(self, run_dir: str | Path, workspace: str | Path) -> None:
        self.run_dir = Path(run_dir).expanduser().absolute()
        self.workspace = Path(workspace).expanduser().resolve()
        self.where = str(self.run_dir)
        self._sessions: Any = None
        self._ledger: Any = None
        self._workspace_id: str | None = None

    def __repr__(self) -> str:
        return f"LocalState({self.where!r})"

    @property
    def workspace_id(self) -> str:
        """The workspace's identity: its path's key unless a file in it says otherwise."""
        if self._workspace_id is None:
            from .identity import workspace_id

            self._workspace_id = workspace_id(self.workspace, create=False)
        return self._workspace_id

    # -- sessions -----------------------------------------------------------------------

    @property
    def sessions(self) -> Any:
        """``<run_dir>/sessions.db`` (a damaged one is set aside and a fresh one started),
        seen through the workspace's identity."""
        if self._sessions is None:
            from .identity import Rekeyed, path_key

            store = self._open_sqlite()
            alias, ident = path_key(self.workspace), self.workspace_id
            self._sessions = store if alias == ident else Rekeyed(store, alias, ident)
        return self._sessions

    @property
    def ledger(self) -> Any:
        if self._ledger is None:
            from .sqlite import SqliteLedgerRows

            store = self.sessions
            self._ledger = SqliteLedgerRows(getattr(store, "inner", store))
        return self._ledger

    def _open_sqlite(self) -> Any:
        from .stores import local_sessions

        return local_sessions(self.run_dir)

    # -- the run's records -----------------------------------------------------------------

    def lineage(self, *, has_session: Any = None, run_id: str | None = None) -> Any:
        from .lineage import LINEAGE_NAME, Lineage

        return Lineage(
            self.run_dir / LINEAGE_NAME, self.workspace, has_session=has_session, run_id=run_id
        )

    def peek_lineage(self) -> dict[str, Any]:
        """The lineage as it stands, unchecked (``status``, ``show``)."""
        from .lineage import peek

        return peek(self.run_dir)

    def manifest(self, run_id: str) -> Any:
        from .manifest import Manifest

        return Manifest(self.run_dir, run_id)

    def manifest_rows(self) -> list[dict[str, Any]]:
        from .manifest import read_manifest

        return read_manifest(self.run_dir) if self.run_dir.is_dir() else []

    @property
    def registry(self) -> Any:
        from .registry import Registry

        return Registry(self.run_dir)

    @property
    def cache(self) -> Any:
        from ..cache import CacheStore

        return CacheStore(self.run_dir / "cache")

    def event_log(self, run_id: str) -> Any:
        from .eventlog import EventLog

        return EventLog.open(self.run_dir, run_id)

    def events_of(self, run_id: str) -> Any:
        """Where ``logs`` reads the run's events: the file's path."""
        from .eventlog import events_path

        return events_path(self.run_dir, run_id)

    def settle(self, timeout: float) -> bool:
        """Files are written where they belong as they happen: nothing is ever waiting."""
        return True

    def close(self) -> None:
        if self._sessions is not None:
            self._sessions.close()


class SharedState:
    """One PostgreSQL database, seen from one workspace (see the module docstring)."""

    kind = "postgres"

    def __init__(
        self, url: str, *, run_dir: str | Path, workspace: str | Path, create: bool = True
    ) -> None:
        from .postgres import PostgresState

        self.rows = PostgresState(url)
        self.where = self.rows.where
        self.run_dir = Path(run_dir).expanduser().absolute()
        self.workspace = Path(workspace).expanduser().resolve()
        self._create = create
        self._workspace_id: str | None = None
        self._sessions: Any = None

    def __repr__(self) -> str:
        return f"SharedState({self.where!r})"

    @property
    def workspace_id(self) -> str:
        """The workspace's identity, written into it the first time it keeps state here."""
        if self._workspace_id is None:
            from .identity import workspace_id

            self._workspace_id = workspace_id(self.workspace, create=self._create)
        return self._workspace_id

    @property
    def sessions(self) -> Any:
        if self._sessions is None:
            from .identity import Rekeyed, path_key

            self._sessions = Rekeyed(
                self.rows.sessions, path_key(self.workspace), self.workspace_id
            )
        return self._sessions

    @property
    def ledger(self) -> Any:
        self.sessions  # noqa: B018 - the ledger shares the store's epoch
        return self.rows.ledger

    def lineage(self, *, has_session: Any = None, run_id: str | None = None) -> Any:
        from .lineage import Lineage

        return Lineage(
            None,
            self.workspace,
            has_session=has_session,
            run_id=run_id,
            rows=self.rows.lineage,
            workspace_id=self.workspace_id,
        )

    def peek_lineage(self) -> dict[str, Any]:
        doc = self.rows.lineage.read(self.workspace_id)
        if doc is None:
            return {}
        return {"workspace": doc.workspace, "woke": doc.woke, "steps": dict(doc.steps)}

    def manifest(self, run_id: str) -> Any:
        from .manifest import SharedManifest

        return SharedManifest(
            self.rows.manifest, self.workspace_id, run_id, f"{self.where} (manifest)"
        )

    def manifest_rows(self) -> list[dict[str, Any]]:
        return list(self.rows.manifest.rows(self.workspace_id))

    @property
    def registry(self) -> Any:
        from .registry import SharedRegistry

        return SharedRegistry(self.rows.registry, self.workspace_id, f"{self.where} (runs)")

    @property
    def cache(self) -> Any:
        from ..cache import SharedCacheStore

        return SharedCacheStore(self.rows.cache, self.workspace_id)

    def event_log(self, run_id: str) -> Any:
        from .eventlog import SharedEventLog

        return SharedEventLog(self.rows.events, run_id, f"{self.where} (events)")

    def events_of(self, run_id: str) -> Any:
        return (self.rows.events, run_id)

    def settle(self, timeout: float) -> bool:
        """What an outage of the database left on this machine (this process's spool, and
        the spools of step children that ended meanwhile), delivered once it is back:
        waits up to ``timeout`` s; True when nothing is left on the machine."""
        return bool(self.rows.settle(timeout))

    def close(self) -> None:
        self.rows.close()
