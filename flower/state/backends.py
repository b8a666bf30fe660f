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
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from .._errors import FlowerError
from ..i18n import define, t

if TYPE_CHECKING:
    from ..cache import CacheStore
    from .eventlog import EventLog
    from .lineage import Lineage
    from .manifest import Manifest
    from .postgres import PostgresState
    from .records import LedgerRow
    from .registry import Registry
    from .seam import EventRows, LedgerRows, Sessions, WorkerRows

STATE_ENV = "FLOWER_STATE"

__all__ = [
    "STATE_ENV",
    "LocalState",
    "RunState",
    "Scope",
    "SharedState",
    "open_state",
    "state_url",
    "through_outage",
]

T = TypeVar("T")

define(
    {
        "state.scope.run_dir": ("运行目录", "RUN_DIR"),
        "state.waiting": (
            "{error};最多再等它 {seconds} 秒(Ctrl-C 停止)",
            "{error}; waiting up to {seconds} s for it to come back (Ctrl-C to stop)",
        ),
        "state.scope.workspace": ("工作区", "WORKSPACE"),
        "state.scope.run_dir.noun": ("运行目录", "run directory"),
        "state.scope.workspace.noun": ("工作区", "workspace"),
        "state.damaged": ("{db} 读不了:{why}", "{db} cannot be read: {why}"),
        "state.damaged.hint": (
            "flower-super status 会说明它怎么了",
            "flower-super status says what is wrong with it",
        ),
        "state.is_file": ("{path} 是文件,不是运行目录", "{path} is a file, not a run directory"),
        "state.is_file.hint": (
            "用 -r 指定 flower 运行时用的目录(默认 ./runs)",
            "pass -r with the directory flower ran in (default ./runs)",
        ),
        "state.no_dir": ("{path} 没有运行目录", "no run directory at {path}"),
        "state.no_dir.hint": (
            "在启动 flower 的目录里运行,或用 -r DIR 指定",
            "run from the directory you started flower in, or pass -r DIR",
        ),
        "state.not_shared": (
            "集群需要 PostgreSQL 里的运行状态(--state 或 FLOWER_STATE),不能用本地文件",
            "a cluster needs the run state in PostgreSQL (--state or FLOWER_STATE), "
            "not local files",
        ),
        "state.not_shared.hint": (
            "supervisor 和每个 worker 用同一个 postgresql://… 地址",
            "give the supervisor and every worker the same postgresql://… URL",
        ),
    }
)


@dataclass(frozen=True)
class Scope:
    """What one run state holds, as a person names it on the command line: ``-r RUN_DIR``
    (the run_dir's files) or ``-w WORKSPACE`` (the workspace's rows in a database)."""

    option: str  # "-r" | "-w"
    path: Path
    default: Path  # what the option means when it is not given (in the current directory)
    label_key: str  # the catalogue's name for what the option takes

    @property
    def label(self) -> str:
        return t(self.label_key)

    @property
    def noun(self) -> str:
        """What it is, in a sentence ("run directory", "workspace")."""
        return t(f"{self.label_key}.noun")

    def args(self) -> list[str]:
        """The option that points a command at this state, when it is not the default."""
        return [] if self.path == self.default else [self.option, str(self.path)]


class RunState(Protocol):
    """One run's state, as :func:`open_state` returns it: everything a run persists, and
    the questions ``status``/``show``/``logs``/``cancel``, the starter flow, the supervisor
    and the workers ask of it. Two implementations (:class:`LocalState`,
    :class:`SharedState`); no caller asks which it has."""

    where: str  # for people: the run_dir, or the URL with its password masked
    run_dir: Path
    workspace: Path
    #: other machines see it (a cluster's workers and their mailboxes need that)
    shared: bool

    @property
    def workspace_id(self) -> str: ...

    @property
    def scope(self) -> Scope: ...

    @property
    def sessions(self) -> Sessions: ...

    @property
    def ledger(self) -> LedgerRows: ...

    def lineage(self, *, has_session: Any = None, run_id: str | None = None) -> Lineage: ...

    def peek_lineage(self) -> dict[str, Any]: ...

    def manifest(self, run_id: str) -> Manifest: ...

    def manifest_rows(self) -> list[dict[str, Any]]: ...

    @property
    def manifest_where(self) -> Path | str: ...

    @property
    def registry(self) -> Registry: ...

    @property
    def cache(self) -> CacheStore: ...

    def event_log(self, run_id: str) -> EventLog: ...

    @property
    def events(self) -> EventRows: ...

    def events_where(self, run_id: str) -> str: ...

    def has_events(self, run_id: str) -> bool: ...

    @property
    def mailboxes(self) -> EventRows: ...

    @property
    def workers(self) -> WorkerRows: ...

    def transcript(self, session_id: str) -> list[dict[str, Any]]: ...

    def tool_calls(self, session_id: str) -> list[LedgerRow]: ...

    def resumable(self, session_id: str) -> bool: ...

    def present(self) -> None: ...

    def problems(self, steps: dict[str, str]) -> list[dict[str, str]]: ...

    def set_aside(self) -> list[str]: ...

    def settle(self, timeout: float) -> bool: ...

    def workspaces(self) -> list[RunState]: ...

    def patient(
        self, wait_s: float, waiting: Callable[[str], None] | None = None
    ) -> AbstractContextManager[None]:
        """Within it, a read the state cannot answer because it cannot be reached is tried
        again (:func:`through_outage`, one line to ``waiting`` for the block) instead of
        raising at once: what a start reads after its state opened and before its run
        begins (the run then waits through an outage its own way)."""
        ...

    def close(self) -> None: ...


def state_url(given: str | None = None) -> str | None:
    """The state URL in effect: ``given``, else ``$FLOWER_STATE``; None (or "") = local."""
    url = given if given is not None else os.environ.get(STATE_ENV)
    return url.strip() or None if url else None


def open_state(
    state: RunState | str | None = None,
    *,
    run_dir: str | Path,
    workspace: str | Path,
    create: bool = True,
    wait_s: float = 0.0,
    waiting: Callable[[str], None] | None = None,
) -> RunState:
    """The run state for ``workspace``: an object already opened (returned as is), a URL, or
    None for ``$FLOWER_STATE`` / local files in ``run_dir``. A URL that is not PostgreSQL's,
    a refused password, a database that is down: one FlowerError line with a hint.
    ``create=False`` (readers such as ``status``) never writes the workspace's identity.

    ``wait_s`` > 0: a database that cannot be reached (down, restarting: a
    :class:`StateUnavailable`) is tried again, backing off, for up to that long before its
    line is raised; ``waiting`` gets one line saying so when the first try fails. A refused
    password or a missing database is raised at once: waiting would not change it."""
    if state is not None and not isinstance(state, str):
        return state
    url = state_url(state)
    if url is None:
        return LocalState(run_dir, workspace)
    return through_outage(
        lambda: SharedState(url, run_dir=run_dir, workspace=workspace, create=create),
        wait_s=wait_s,
        waiting=waiting,
    )


def through_outage(
    work: Callable[[], T], *, wait_s: float, waiting: Callable[[str], None] | None = None
) -> T:
    """``work()``, tried again, backing off, while the state cannot be reached (down,
    restarting: a :class:`StateUnavailable`) for up to ``wait_s`` before that error is
    raised; ``waiting`` gets one line saying so when the first try fails. Any other error
    (a refused password, a missing database) is raised at once: waiting would not change
    it."""
    if wait_s <= 0:
        return work()
    from tenacity import (
        RetryCallState,
        Retrying,
        retry_if_exception_type,
        stop_after_delay,
        wait_exponential,
    )

    from .errors import StateUnavailable

    def say(retry: RetryCallState) -> None:
        failure = retry.outcome.exception() if retry.outcome else None
        if retry.attempt_number == 1 and waiting is not None and failure is not None:
            waiting(t("state.waiting", error=str(failure).rstrip("."), seconds=round(wait_s)))

    for attempt in Retrying(
        retry=retry_if_exception_type(StateUnavailable),
        stop=stop_after_delay(wait_s),
        wait=wait_exponential(multiplier=0.25, min=0.25, max=2.0),
        before_sleep=say,
        reraise=True,
    ):
        with attempt:
            return work()
    raise AssertionError("unreachable: tenacity reraises the last failure")


class LocalState:
    """The files of one run_dir (see the module docstring)."""

    shared = False

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
    def scope(self) -> Scope:
        return Scope("-r", self.run_dir, (Path.cwd() / "runs").absolute(), "state.scope.run_dir")

    @property
    def workspace_id(self) -> str:
        """The workspace's identity: its path's key unless a file in it says otherwise."""
        if self._workspace_id is None:
            from .identity import workspace_id

            self._workspace_id = workspace_id(self.workspace, create=False)
        return self._workspace_id

    # -- sessions -----------------------------------------------------------------------

    @property
    def sessions(self) -> Sessions:
        """``<run_dir>/sessions.db`` (a damaged one is set aside and a fresh one started),
        seen through the workspace's identity."""
        if self._sessions is None:
            from .identity import Rekeyed, path_key

            store = self._open_sqlite()
            alias, ident = path_key(self.workspace), self.workspace_id
            self._sessions = store if alias == ident else Rekeyed(store, alias, ident)
        return cast("Sessions", self._sessions)

    @property
    def ledger(self) -> LedgerRows:
        if self._ledger is None:
            from .sqlite import SqliteLedgerRows

            store: Any = self.sessions
            self._ledger = SqliteLedgerRows(getattr(store, "inner", store))
        return cast("LedgerRows", self._ledger)

    def _open_sqlite(self) -> Any:
        from .stores import local_sessions

        return local_sessions(self.run_dir)

    # -- the run's records -----------------------------------------------------------------

    def lineage(self, *, has_session: Any = None, run_id: str | None = None) -> Lineage:
        from .lineage import LINEAGE_NAME, Lineage

        return Lineage(
            self.run_dir / LINEAGE_NAME, self.workspace, has_session=has_session, run_id=run_id
        )

    def peek_lineage(self) -> dict[str, Any]:
        """The lineage as it stands, unchecked (``status``, ``show``)."""
        from .lineage_file import peek

        return peek(self.run_dir)

    def manifest(self, run_id: str) -> Manifest:
        from .manifest import Manifest

        return Manifest(self.run_dir, run_id)

    def manifest_rows(self) -> list[dict[str, Any]]:
        from .manifest import read_manifest

        return read_manifest(self.run_dir) if self.run_dir.is_dir() else []

    @property
    def manifest_where(self) -> Path | str:
        from .manifest import MANIFEST_NAME

        return self.run_dir / MANIFEST_NAME

    @property
    def registry(self) -> Registry:
        from .registry import Registry

        return Registry(self.run_dir)

    @property
    def cache(self) -> CacheStore:
        from ..cache import CacheStore

        return CacheStore(self.run_dir / "cache")

    def event_log(self, run_id: str) -> EventLog:
        from .eventlog import EventLog

        return EventLog.open(self.run_dir, run_id)

    @property
    def events(self) -> EventRows:
        """Every run's events, read as rows (``logs``): the run_dir's event files."""
        from .eventlog import FileEventRows

        return FileEventRows(self.run_dir)

    def events_where(self, run_id: str) -> str:
        from .eventlog import events_path

        return str(events_path(self.run_dir, run_id))

    def has_events(self, run_id: str) -> bool:
        from .eventlog import events_path

        return events_path(self.run_dir, run_id).exists()

    @property
    def mailboxes(self) -> EventRows:
        """A run_dir's files are this machine's only: a cluster cannot use them."""
        raise FlowerError(t("state.not_shared"), hint=t("state.not_shared.hint"))

    @property
    def workers(self) -> WorkerRows:
        """No cluster's workers report to a run_dir's files."""
        raise FlowerError(t("state.not_shared"), hint=t("state.not_shared.hint"))

    def transcript(self, session_id: str) -> list[dict[str, Any]]:
        """``session_id``'s main transcript, read-only and without the SDK (``show``); a
        damaged ``sessions.db`` is one FlowerError line."""
        from .dbfile import damage, read_transcript

        db = self.run_dir / "sessions.db"
        why = damage(db)
        if why:
            raise FlowerError(t("state.damaged", db=db, why=why), hint=t("state.damaged.hint"))
        return read_transcript(self.run_dir, session_id)

    def tool_calls(self, session_id: str) -> list[LedgerRow]:
        from .dbfile import read_tool_calls

        return read_tool_calls(self.run_dir, session_id)

    def resumable(self, session_id: str) -> bool:
        """Does the store still hold ``session_id`` (True when it cannot say: a store that
        cannot answer is not a session that is gone)?"""
        from .dbfile import has_transcript

        return has_transcript(self.run_dir / "sessions.db", session_id) is not False

    # -- what a person who looks is told (``status``) ----------------------------------------

    def present(self) -> None:
        """Is there a run directory to look at? One FlowerError line if not."""
        if self.run_dir.exists() and not self.run_dir.is_dir():
            raise FlowerError(t("state.is_file", path=self.run_dir), hint=t("state.is_file.hint"))
        if not self.run_dir.is_dir():
            raise FlowerError(t("state.no_dir", path=self.run_dir), hint=t("state.no_dir.hint"))

    def problems(self, steps: dict[str, str]) -> list[dict[str, str]]:
        """Every run-state file that a start would set aside or start fresh from, and why
        (``steps``: the lineage's step names and sessions)."""
        from . import lineage_file as lineage
        from . import manifest
        from .dbfile import damage, has_transcripts
        from .stores import SESSIONS_DB

        run_dir = self.run_dir
        db = run_dir / SESSIONS_DB
        db_problem = damage(db)
        found = [
            (run_dir / lineage.LINEAGE_NAME, lineage.damage(run_dir)),
            (run_dir / manifest.MANIFEST_NAME, manifest.damage(run_dir)),
            (db, db_problem),
            *((path, "is not a flower record") for path in self.registry.damaged()),
        ]
        if not db_problem:
            # A store that cannot be asked (None) is not a session that is gone: status
            # reports what it knows. Unlike a start it does not know the workspace's project
            # key: any project counts.
            stored = has_transcripts(db, steps.values())
            gone = [f"{name!r} ({sid})" for name, sid in steps.items() if stored[sid] is False]
            if gone:
                why = f"names sessions that {SESSIONS_DB} does not have, for step {', '.join(gone)}"
                found.append((run_dir / lineage.LINEAGE_NAME, why))
        return [{"file": str(path), "problem": why} for path, why in found if why]

    def set_aside(self) -> list[str]:
        """The files a start set aside (damaged, torn, another workspace's, gone)."""
        import re

        # what set_aside() names the files it moves: <name>.<reason>-<YYYYmmdd-HHMMSS>[-N]
        aside = re.compile(r"\.(corrupt|torn|workspace|gone)-\d{8}-\d{6}(-\d+)?(-wal|-shm)?$")
        out: list[str] = []
        from .registry import FLOWERS_DIRNAME

        for where in (self.run_dir, self.run_dir / FLOWERS_DIRNAME):
            try:
                names = sorted(p.name for p in where.iterdir())
            except OSError:
                continue
            out += [str(where / n) for n in names if aside.search(n)]
        return out

    def settle(self, timeout: float) -> bool:
        """Files are written where they belong as they happen: nothing is ever waiting."""
        return True

    def workspaces(self) -> list[RunState]:
        """Every workspace this state holds runs of, each as a state of its own: a run_dir
        holds whoever ran in it, so it is one."""
        return [self]

    def patient(
        self, wait_s: float, waiting: Callable[[str], None] | None = None
    ) -> AbstractContextManager[None]:
        """A run_dir's files are there or not: nothing to wait for."""
        return nullcontext()

    def close(self) -> None:
        if self._sessions is not None:
            self._sessions.close()


class SharedState:
    """One PostgreSQL database, seen from one workspace (see the module docstring)."""

    shared = True

    def __init__(
        self,
        url: str,
        *,
        run_dir: str | Path,
        workspace: str | Path,
        create: bool = True,
        rows: PostgresState | None = None,
        workspace_id: str | None = None,
    ) -> None:
        if rows is None:
            from .postgres import PostgresState

            rows = PostgresState(url)
        self.rows = rows
        self.where = self.rows.where
        self.run_dir = Path(run_dir).expanduser().absolute()
        self.workspace = Path(workspace).expanduser().resolve()
        self._create = create
        self._workspace_id: str | None = workspace_id
        self._sessions: Any = None
        self._owns_rows = workspace_id is None

    def __repr__(self) -> str:
        return f"SharedState({self.where!r})"

    @property
    def scope(self) -> Scope:
        return Scope("-w", self.workspace, Path.cwd().resolve(), "state.scope.workspace")

    @property
    def workspace_id(self) -> str:
        """The workspace's identity, written into it the first time it keeps state here."""
        if self._workspace_id is None:
            from .identity import workspace_id

            self._workspace_id = workspace_id(self.workspace, create=self._create)
        return self._workspace_id

    @property
    def sessions(self) -> Sessions:
        if self._sessions is None:
            from .identity import Rekeyed, path_key

            self._sessions = Rekeyed(
                self.rows.sessions, path_key(self.workspace), self.workspace_id
            )
        return cast("Sessions", self._sessions)

    @property
    def ledger(self) -> LedgerRows:
        self.sessions  # noqa: B018 - the ledger shares the store's epoch
        return cast("LedgerRows", self.rows.ledger)

    def lineage(self, *, has_session: Any = None, run_id: str | None = None) -> Lineage:
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

    def manifest(self, run_id: str) -> Manifest:
        from .manifest import Manifest

        return Manifest(
            run_id=run_id,
            rows=self.rows.manifest,
            workspace_id=self.workspace_id,
            where=f"{self.where} (manifest)",
        )

    def manifest_rows(self) -> list[dict[str, Any]]:
        return list(self.rows.manifest.rows(self.workspace_id))

    @property
    def manifest_where(self) -> Path | str:
        return f"{self.where} (manifest)"

    @property
    def registry(self) -> Registry:
        from .registry import Registry

        return Registry(
            rows=self.rows.registry, workspace_id=self.workspace_id, where=f"{self.where} (runs)"
        )

    @property
    def cache(self) -> CacheStore:
        from ..cache import CacheStore

        return CacheStore(rows=self.rows.cache, workspace_id=self.workspace_id)

    def event_log(self, run_id: str) -> EventLog:
        from .eventlog import EventLog

        return EventLog.over_rows(self.rows.events, run_id, f"{self.where} (events)")

    @property
    def events(self) -> EventRows:
        return self.rows.events

    def events_where(self, run_id: str) -> str:
        return f"{self.where} (events)"

    def has_events(self, run_id: str) -> bool:
        """The event rows are there to read (or to follow) whenever the database is."""
        return True

    @property
    def mailboxes(self) -> EventRows:
        """Where a supervisor and a worker exchange an attempt's messages: event rows."""
        return self.rows.events

    @property
    def workers(self) -> WorkerRows:
        return cast("WorkerRows", self.rows.workers)

    def transcript(self, session_id: str) -> list[dict[str, Any]]:
        key = {"project_key": self.workspace_id, "session_id": session_id}
        return list(self.sessions.load_sync(key) or [])  # type: ignore[arg-type]

    def tool_calls(self, session_id: str) -> list[LedgerRow]:
        rows: list[LedgerRow] = self.ledger.in_session(session_id, 0.0)
        return rows

    def resumable(self, session_id: str) -> bool:
        try:
            return bool(self.sessions.has_session(None, session_id))
        except Exception:  # noqa: BLE001 - a store that cannot answer is not a session gone
            return True

    def present(self) -> None:
        """The database answered when it was opened: there is always something to see."""

    def problems(self, steps: dict[str, str]) -> list[dict[str, str]]:
        """Rows are never torn or set aside: a database keeps them whole."""
        return []

    def set_aside(self) -> list[str]:
        return []

    def settle(self, timeout: float) -> bool:
        """What an outage of the database left on this machine (this process's spool, and
        the spools of step children that ended meanwhile), delivered once it is back:
        waits up to ``timeout`` s; True when nothing is left on the machine."""
        return bool(self.rows.settle(timeout))

    def workspaces(self) -> list[RunState]:
        """Every workspace with runs in the database, each as a state of its own (this one
        first), sharing this one's connection; the others are never created or written."""
        out: list[RunState] = [self]
        seen = {self.workspace_id}
        for record in self.rows.registry.records(None):
            ws_id = str(record.get("workspace_id") or "")
            if not ws_id or ws_id in seen:
                continue
            seen.add(ws_id)
            view = SharedState(
                "",
                run_dir=self.run_dir,
                workspace=str(record.get("workspace") or ws_id),
                create=False,
                rows=self.rows,
                workspace_id=ws_id,
            )
            out.append(view)
        return out

    @contextmanager
    def patient(
        self, wait_s: float, waiting: Callable[[str], None] | None = None
    ) -> Iterator[None]:
        said: list[str] = []

        def once(line: str) -> None:  # one line for the block, however many reads wait
            if not said and waiting is not None:
                waiting(line)
            said.append(line)

        def patience(work: Callable[[], T]) -> T:
            return through_outage(work, wait_s=wait_s, waiting=once)

        with self.rows.patient(patience):
            yield

    def close(self) -> None:
        if self._owns_rows:
            self.rows.close()
