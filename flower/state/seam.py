"""The run-state seam: what a backend must store for flower, and nothing about how.

Everything a run persists goes through one :class:`RunState`: the session transcripts (the
SDK's ``SessionStore``), the tool ledger's rows, lineage, manifest rows, the run registry,
the cross-run cache and the event log. Two backends implement it: local files under the
run_dir (the embedded default, :mod:`flower.state.local`) and one PostgreSQL database
(:mod:`flower.state.postgres`). The logic above the seam (which session a step continues,
the wake count, what a manifest row holds, when a cache entry is fresh, who is live) is
written once and never asks which backend it has.

Scope: a local backend holds one run_dir (any workspace that uses it, as today); the
PostgreSQL backend holds every workspace that uses the database, each under its
*workspace id* (:mod:`flower.state.identity`), so every call that reads or writes
workspace-scoped state names it.

Fencing: an attempt that writes a session holds an *epoch* (:meth:`Sessions.begin_attempt`,
a number from the backend that only grows). Claiming a session (:meth:`Sessions.claim`) or
writing to it (a transcript append, a ledger row) records the epoch; a write that carries a
lower epoch than the session's is refused with :class:`Superseded` and writes nothing. An
object that never began an attempt has epoch 0 (``status``, ``show``, the supervisor, an
export, a library user's own store): it reads anything and writes only sessions that no
attempt owns yet. Deleting a session is not fenced (a person's decision, not an
attempt's). The local backend has one machine and one writer per session (the supervisor
sees to it): its epochs are never refused.

This module imports nothing of flower's step machinery; backends import it, never the
other way round. The errors (:mod:`.errors`) and row records (:mod:`.records`) live in
modules of their own, light to import, and are re-exported here: the protocols need the
SDK's ``SessionStore``, ``status`` must not load it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from claude_agent_sdk.types import SessionKey, SessionStore, SessionStoreEntry

from ..cache.store import CacheRows
from .errors import StateUnavailable, Superseded
from .records import LedgerRow, LineageDoc

__all__ = [
    "CacheRows",
    "EventRows",
    "LedgerRow",
    "LedgerRows",
    "LineageDoc",
    "LineageRows",
    "ManifestRows",
    "RegistryRows",
    "RunState",
    "Sessions",
    "StateUnavailable",
    "Superseded",
]


# ---------------------------------------------------------------------------------------
# sessions
# ---------------------------------------------------------------------------------------


@runtime_checkable
class Sessions(SessionStore, Protocol):
    """The SDK's ``SessionStore`` with every optional method, plus what flower asks of it.

    Entries are deduplicated by ``uuid`` per key (an entry without one always appends);
    ``load`` returns them in append order, deep-equal to what was appended.
    """

    def has_session(self, project_key: str | None, session_id: str) -> bool:
        """A main transcript of ``session_id`` with at least one entry is stored under
        ``project_key`` (None: under any). Raises what the backend raises: a store that
        cannot answer is not a session that is gone."""
        ...

    def load_sync(self, key: SessionKey) -> list[SessionStoreEntry] | None:
        """``load`` for callers outside an event loop."""
        ...

    def last_context(self, project_key: str, session_id: str, *, scan: int = 60) -> int:
        """Tokens the model saw on the session's last real turn (see SqliteSessionStore)."""
        ...

    def projects(self) -> list[str]:
        """Every project key stored, sorted."""
        ...

    def close(self) -> None:
        """Close this process's connections (a later call opens new ones)."""
        ...

    # -- fencing ---------------------------------------------------------------------

    def begin_attempt(self) -> int:
        """A new epoch for the attempt running in this process (greater than every epoch
        handed out before, by any process); every later write of this object carries it."""
        ...

    def claim(self, session_id: str) -> None:
        """Make this object's epoch the session's owner before resuming it: raises
        :class:`Superseded` when a newer epoch owns it already."""
        ...


# ---------------------------------------------------------------------------------------
# the tool ledger (flower.state.ledger keeps the logic; a backend keeps the rows)
# ---------------------------------------------------------------------------------------


class LedgerRows(Protocol):
    """Where the tool ledger's rows live (fenced like the session they belong to)."""

    async def started(self, row: LedgerRow) -> None:
        """Insert a started call; a row that exists already is left as it is."""
        ...

    async def finished(self, row: LedgerRow) -> None:
        """Insert or update the call's end: state, response, content, is_error, ended_at."""
        ...

    def exact(self, tool_use_id: str, content: str, is_error: bool) -> None:
        """Replace a finished call's content with what the model was really sent. One try,
        never a wait (called on the loop that answers the CLI's hooks); may raise."""
        ...

    def by_ids(self, ids: Sequence[str]) -> list[LedgerRow]: ...

    def in_session(self, session_id: str, since: float) -> list[LedgerRow]:
        """Main-thread calls (``agent_id`` None) of the session that started at ``since``
        or later, oldest first."""
        ...


# ---------------------------------------------------------------------------------------
# lineage, manifest, registry, cache, events
# ---------------------------------------------------------------------------------------


class LineageRows(Protocol):
    """Where a workspace's lineage document lives (:class:`flower.state.lineage.Lineage`
    keeps the rules). A local run_dir's file holds one workspace's (another's reads as none
    and is set aside when written); a database holds one per workspace id."""

    path: Path | None  # the file, None when a database keeps it
    where: str  # for people

    def read(self, workspace_id: str) -> LineageDoc | None:
        """The workspace's lineage, None if it has none. Raises StateUnavailable."""
        ...

    def update(
        self, workspace_id: str, run_id: str | None = None
    ) -> contextlib.AbstractContextManager[list[LineageDoc | None]]:
        """A wake's read-modify-write under a lock other writers of the same workspace wait
        on: yields a one-item list holding the current doc (or None); whatever the list holds
        when the block ends is written (None: nothing is written). A local file another
        workspace wrote is set aside first, or :class:`flower.RunDirBusy` raised when a live
        flower other than ``run_id`` still holds it. The block may use the backend's
        synchronous methods but must not await its coroutines."""
        ...

    def put(self, workspace_id: str, workspace: str, woke: int, step: str, sid: str) -> None:
        """Name ``step``'s session ``sid``, merged with the entries others wrote (a first
        entry makes the doc, with ``workspace`` and ``woke``). Durable before it returns —
        a database that cannot be reached keeps it on this machine, in order, and delivers
        it when back. Raises OSError only when it cannot be kept anywhere."""
        ...

    def drop(self, workspace_id: str, step: str, sid: str) -> None:
        """Drop ``step``'s entry if it still names ``sid``; kept like :meth:`put`."""
        ...

    def keep_copy(self, workspace_id: str) -> str:
        """Before a wake drops entries whose sessions are gone: keep a copy of the doc for
        a person; returns what to tell them."""
        ...

    def archive(self, workspace_id: str, into: Path) -> bool:
        """``--new``: keep the current doc under ``into`` (a local file moves into that
        folder, created owner-only; a database keeps it under the folder's name) and drop
        it; False when there was none. Raises OSError / StateUnavailable."""
        ...


class ManifestRows(Protocol):
    def append(self, workspace_id: str, row: dict[str, Any]) -> None:
        """One more row (a StepResult's fields plus ``run``, ``duration_s``, …)."""
        ...

    def rows(self, workspace_id: str | None = None) -> list[dict[str, Any]]:
        """Every row in the order written; one workspace's, or all of them."""
        ...

    def check(self) -> None:
        """Make sure rows can be appended before a run spends anything (a damaged file is
        set aside and a fresh one started; a database has nothing to check)."""
        ...


class RegistryRows(Protocol):
    """Who ran here. A record is a :class:`flower.state.registry.FlowerRecord` as a dict,
    with ``host`` and ``heartbeat_at`` set by the backend on every write.

    The record names its workspace by a ``workspace_id`` key (``records(workspace_id)``
    filters on it; PostgreSQL falls back to ``workspace``, the path, when it is missing).
    ``heartbeat_at`` is epoch seconds in the backend's clock (the database server's for
    PostgreSQL), so leases written from several machines compare on one clock."""

    def write(self, record: dict[str, Any]) -> None: ...

    def get(self, run: str) -> dict[str, Any] | None: ...

    def records(self, workspace_id: str | None = None) -> list[dict[str, Any]]:
        """Oldest start first."""
        ...

    def remove(self, run: str) -> None: ...

    def heartbeat(self, run: str) -> None:
        """The run's process is alive (its lease goes on)."""
        ...

    @contextlib.contextmanager
    def locked(self, workspace_id: str) -> Iterator[None]:
        """Check-then-register as one step for concurrent starts in one workspace."""
        ...

    def damaged(self) -> list[Path]:
        """Records kept as files that are not a flower record ([] where none can be)."""
        ...


class EventRows(Protocol):
    def append(self, run: str, event: dict[str, Any]) -> None:
        """One line of the run's event log (``flower.state.eventlog.line``'s object)."""
        ...

    def read(self, run: str, after: int = 0) -> list[tuple[int, dict[str, Any]]]:
        """The run's events after position ``after``, each with its position (positions
        only grow; they need not be consecutive)."""
        ...

    def wait(self, run: str, after: int, timeout: float) -> bool:
        """Until the run has an event after ``after`` (True) or ``timeout`` passes."""
        ...

    def changed(self, timeout: float, runs: AbstractSet[str]) -> set[str] | None:
        """Until one of ``runs`` (the runs the caller follows) gets an event, ``timeout``
        passes or :meth:`nudge` is called: those of ``runs`` that got one since the last
        call (an empty set: none came), a run the last call did not name counting as one
        (nobody listened for it before); or None when this backend cannot say which (look
        at every run you follow). None is missed between two calls, and an event of a run
        nobody follows wakes nobody."""
        ...

    def nudge(self) -> None:
        """End a :meth:`changed` wait now (safe from any thread): the runs followed have
        changed."""
        ...


class WorkerRows(Protocol):
    """A cluster's workers as each last reported itself (a shared state's only)."""

    def report(self, name: str, queue: str, started_at: float, record: dict[str, Any]) -> None:
        """Insert or replace ``name``'s row with its heartbeat now."""
        ...

    def stopped(self, name: str) -> None:
        """``name`` has stopped (its row stays a while, marked)."""
        ...

    def rows(self, queue: str | None = None) -> list[dict[str, Any]]:
        """Every worker's row (``queue``'s only, when given), with ``name``, ``queue``,
        ``host``, ``started_at``, ``heartbeat_at``, ``stopped_at`` and ``now`` (the
        state's clock, to judge silence by)."""
        ...

    def kept(self) -> tuple[int, int]:
        """This machine's writes waiting for the state to take them: (processes, bytes)."""
        ...


class RunState(Protocol):
    """One backend: everything a run persists."""

    kind: str  # "local" | "postgres"
    where: str  # for people: the run_dir, or the URL with its password masked

    @property
    def sessions(self) -> Sessions: ...

    @property
    def ledger(self) -> LedgerRows: ...

    @property
    def lineage(self) -> LineageRows: ...

    @property
    def manifest(self) -> ManifestRows: ...

    @property
    def registry(self) -> RegistryRows: ...

    @property
    def cache(self) -> CacheRows: ...

    @property
    def events(self) -> EventRows: ...

    def close(self) -> None: ...
