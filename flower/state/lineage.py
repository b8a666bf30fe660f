"""Lineage: which session each step used, kept across processes in ``runs/lineage.json``.

The file is ``{"workspace": abs path, "woke": N, "steps": {step name: session_id}}``. It is
the only thing continuity needs beyond ``sessions.db`` (seed 000), so it is written the
instant a session id is known, through a temp file and an atomic replace, under a file lock
so concurrent flowers merge their entries instead of overwriting each other.

Two invariants from seed 000 shape every method here:

1. Write the moment the id is known; a failed write (any ``OSError``) never stops the step.
2. Anything that does not match (another workspace, a session gone from the store, a corrupt
   file) means "start fresh" -- continuity is a bonus and must never block work.

Neither is ever silent: each is one warning line on the ``flower`` logger (the supervisor
prints them on the terminal), and a file that does not match is set aside beside itself,
never deleted. A store that cannot answer whether a session exists is not a session that is
gone: the entry is kept, with a warning.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._errors import RunDirBusy
from ..i18n import define, t
from ..util.fsutil import FILE_MODE, atomic_write_text, private_dir, set_aside
from ..util.lazylog import lazy_logger
from .errors import StateUnavailable
from .lineage_file import JUDGE_MARK as JUDGE_MARK
from .lineage_file import LINEAGE_NAME as LINEAGE_NAME
from .lineage_file import _read_file, _State
from .lineage_file import bare_name as bare_name
from .lineage_file import damage as damage
from .lineage_file import peek as peek
from .manifest import deferred_signals
from .records import LineageDoc
from .registry import Registry

if TYPE_CHECKING:
    from .seam import LineageRows

log = lazy_logger("flower.lineage")  # logging loads when something is logged

define(
    {
        "lineage.unchecked": (
            "查不了步骤 {step!r} 在 sessions.db 里的会话 {session}({kind}: {error});先留着它",
            "could not check step {step!r}'s session {session} in sessions.db ({kind}: {error}); "
            "keeping it",
        ),
        "lineage.waiting": (
            "{path} 暂时连不上({error});醒来前最多等它 {wait:.0f} 秒",
            "{path} cannot be reached ({error}); waiting up to {wait:.0f} s for it before waking",
        ),
        "lineage.not_updated": (
            "更新不了 {path}({error});这次运行没法在那里记下它的会话",
            "could not update {path} ({error}); this run cannot record its sessions there",
        ),
        "lineage.gone": (
            "{path} 里步骤 {steps} 的会话在 sessions.db 里已经没有了;{kept};这些步骤开一条新会话",
            "{path} names sessions that sessions.db no longer has for step {steps}; {kept}; "
            "those steps start a new session",
        ),
        "lineage.gone.kept": (
            "留了一份副本 {path}",
            "kept a copy as {path}",
        ),
        "lineage.gone.in_db": (
            "数据库里留着旧的那份",
            "the database keeps the old one",
        ),
        "lineage.gone.not_kept": (
            "副本没留成({error})",
            "could not keep a copy ({error})",
        ),
        "lineage.why.workspace": (
            "属于工作区 {workspace},不是这个",
            "belongs to workspace {workspace}, not this one",
        ),
        "lineage.set_aside": (
            "{path} {why};已留作 {aside},这次运行从头开始",
            "{path} {why}; kept it as {aside} and this run starts fresh",
        ),
        "lineage.set_aside_failed": (
            "{path} {why};挪不到一边({error});从头开始",
            "{path} {why}; could not set it aside ({error}); starting fresh",
        ),
        "lineage.unwritten": (
            "写不了 {path}({error});这次运行要是被杀掉,下次启动就接不上它的会话",
            "could not write {path} ({error}); if this run is killed, the next start cannot "
            "continue its sessions",
        ),
    }
)

# filelock's default 50 ms poll gave 0.3-1.5 s waits with four contenders on this machine.
LOCK_POLL_S = 0.002
# A lock held this long means a stuck holder; remember() then gives up (and swallows it).
LOCK_TIMEOUT_S = 10.0
# A wake reads which session each step continues: a database that is away is waited for this
# long (an outage that began since the run state was opened) before the start goes on without.
WAKE_WAIT_S = 30.0


def _of(name: str, steps: set[str]) -> bool:
    """Is the lineage entry ``name`` one of ``steps``'s: a step, or an item of a map step
    (``read[3]`` belongs to ``read``)?"""
    if name in steps:
        return True
    head, bracket, rest = name.partition("[")
    return bool(bracket) and rest.endswith("]") and head in steps


def same_workspace(a: str, b: str) -> bool:
    """True when two workspace paths give the same SDK project key (sessions are keyed by it)."""
    if a == b:
        return True
    try:
        # Imported here: loading claude_agent_sdk costs about a second, and equal strings
        # (the common case) never need it.
        from claude_agent_sdk._internal.sessions import project_key_for_directory
    except ImportError:  # pragma: no cover - the SDK is a hard dependency
        return os.path.realpath(a) == os.path.realpath(b)
    return project_key_for_directory(a) == project_key_for_directory(b)


@dataclass
class Lineage:
    """The step-name -> session-id map of one workspace: waking, remembering, forgetting and
    checking, written once over a backend's :class:`~.seam.LineageRows` (``lineage.json`` in
    a run_dir, :class:`FileLineageRows`; a database's row per workspace).

    The documented fields are ``path`` (the file; None when a database keeps it),
    ``workspace``, ``steps`` and ``woke``; :meth:`open` reads one. ``Lineage(path, workspace)``
    keeps it in that file; the run state passes ``rows`` and ``workspace_id`` instead.
    ``has_session(sid)`` (usually ``Runtime.has_session``) decides whether a remembered session
    still exists; entries failing it are not used. ``run_id`` is this flower's own registry
    record, so :meth:`bump` does not mistake itself for another live holder.
    """

    path: Path | None
    workspace: Path
    steps: dict[str, str] = field(default_factory=dict)
    woke: int = 0
    has_session: Callable[[str], bool] | None = field(default=None, repr=False, compare=False)
    run_id: str | None = field(default=None, repr=False, compare=False)
    rows: LineageRows | None = field(default=None, repr=False, compare=False)
    workspace_id: str = field(default="", repr=False, compare=False)

    def __post_init__(self) -> None:
        self.workspace = Path(os.path.abspath(os.fspath(self.workspace)))
        if self.rows is None:
            if self.path is None:
                raise TypeError("Lineage needs a path (lineage.json) or rows")
            self.path = Path(self.path)
            self.rows = FileLineageRows(self.path, self.workspace)
        else:
            self.path = self.rows.path
        self._rows: LineageRows = self.rows
        self._write_failed = False  # warned once: a run whose lineage cannot be written
        self._written: dict[str, str] = {}  # entries this object put on record

    @property
    def where(self) -> str:
        """Where this lineage is kept, for people."""
        return self._rows.where

    @classmethod
    def open(
        cls,
        run_dir: str | Path,
        workspace: str | Path,
        *,
        has_session: Callable[[str], bool] | None = None,
        run_id: str | None = None,
    ) -> Lineage:
        """``<run_dir>/lineage.json`` as far as it is usable for ``workspace``: a missing,
        unreadable or foreign file gives an empty one. Reads only; never raises."""
        lineage = cls(
            Path(run_dir) / LINEAGE_NAME, Path(workspace), has_session=has_session, run_id=run_id
        )
        lineage.load()
        return lineage

    # -- reading ------------------------------------------------------------------------

    def load(self) -> dict[str, str]:
        """Read-only: the usable steps (also kept in ``self.steps``/``self.woke``).

        Never writes and never raises: a missing, corrupt or foreign file, or a database that
        cannot be reached, gives ``{}``.
        """
        try:
            doc = self._rows.read(self.workspace_id)
        except StateUnavailable:
            doc = None
        if doc is None:
            self.woke, self.steps = 0, {}
        else:
            self.woke, self.steps = doc.woke, self._alive(doc.steps)
        return dict(self.steps)

    def _alive(self, steps: dict[str, str]) -> dict[str, str]:
        """Keep only the entries whose session the store still has (or cannot say)."""
        if self.has_session is None:
            return dict(steps)
        return {name: sid for name, sid in steps.items() if self._has(name, sid)}

    def _has(self, name: str, sid: str) -> bool:
        try:
            return bool(self.has_session(sid))  # type: ignore[misc]
        except Exception as exc:  # noqa: BLE001 - a store that cannot answer is not "gone"
            log.warning(
                "%s",
                t("lineage.unchecked", step=name, session=sid, kind=type(exc).__name__, error=exc),
            )
            return True

    # -- waking -------------------------------------------------------------------------

    def bump(self, mine: Iterable[str] = ()) -> int:
        """Count one more start (the first run is 1), write it, and return the count.

        Raises :class:`flower.RunDirBusy` only when the file belongs to another workspace and
        a live flower still holds this run_dir for it; otherwise a foreign or broken file
        means a fresh start (set aside, one warning). ``mine`` are the steps of the starting
        flow: for those whose session the store no longer has, a copy is kept for a person
        and one warning says they start fresh. A database that is away is waited for (up to
        :data:`WAKE_WAIT_S`, one warning); a lineage that cannot be written does not stop the
        start.
        """
        from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

        woken = False

        def wake() -> int:
            nonlocal woken
            with self._rows.update(self.workspace_id, self.run_id) as box:
                self._wake(box, set(mine))
                woken = True
            return self.woke

        def away(exc: BaseException) -> bool:  # not read yet: waiting costs nothing
            return isinstance(exc, StateUnavailable) and not woken

        def say(state: Any) -> None:
            if state.attempt_number == 1 and state.outcome is not None:
                error = _why(state.outcome.exception())
                log.warning(
                    "%s", t("lineage.waiting", path=self.where, error=error, wait=WAKE_WAIT_S)
                )

        try:
            # A database that is away at a wake is waited for, as for a model API: reading
            # it as "no lineage" would start every step in a new session.
            return Retrying(
                retry=retry_if_exception(away),
                wait=wait_exponential(multiplier=0.1, min=0.1, max=2.0),
                stop=stop_after_delay(WAKE_WAIT_S),
                before_sleep=say,
                reraise=True,
            )(wake)
        except (OSError, StateUnavailable) as exc:
            if woken:  # counted, but the count could not be written
                self._warn_write(exc)
                return self.woke
            log.warning("%s", t("lineage.not_updated", path=self.where, error=_why(exc)))
            self._write_failed = True
            self.load()
            self.woke += 1
            return self.woke

    def _wake(self, box: list[LineageDoc | None], mine: set[str]) -> None:
        doc = box[0]
        self.woke = (doc.woke if doc else 0) + 1
        stored = dict(doc.steps) if doc else {}
        wanted = {n: sid for n, sid in stored.items() if _of(n, mine)} if mine else stored
        self.steps = self._alive(wanted)
        gone = {n: sid for n, sid in stored.items() if _of(n, mine) and n not in self.steps}
        if gone:
            # A copy keeps the old ids for a person; the entries go: no live flower uses these
            # steps (a start that would is refused), and an entry left in place would be
            # reported again at every start.
            names = ", ".join(f"{n!r} ({sid})" for n, sid in gone.items())
            kept = self._rows.keep_copy(self.workspace_id)
            log.warning("%s", t("lineage.gone", path=self.where, steps=names, kept=kept))
            stored = {n: sid for n, sid in stored.items() if n not in gone}
        box[0] = LineageDoc(workspace=str(self.workspace), woke=self.woke, steps=stored)

    # -- remembering --------------------------------------------------------------------

    def remember(self, step: str, session_id: str) -> None:
        """Record ``step``'s session the instant it is known; never raises ``OSError``.

        Suffixed labels (``#retryN``, ``#roundN``) record under the bare step name; judge
        labels are ignored. Entries other flowers wrote meanwhile are kept (merged by the
        rows). A database that cannot be reached keeps the entry on this machine and
        delivers it, in order, when it is back.
        """
        key = bare_name(step)
        if key is None or not session_id:
            return
        if self._written.get(key) == session_id:
            return  # this very entry is on record already (a step reports its session twice)
        self.steps[key] = session_id
        try:
            self._rows.put(self.workspace_id, str(self.workspace), self.woke, key, session_id)
            self._written[key] = session_id
        except (OSError, StateUnavailable) as exc:
            self._warn_write(exc)

    def forget(self, step: str, session_id: str) -> None:
        """``step``'s session ``session_id`` cannot be resumed (the CLI has no conversation
        for it): drop the entry, unless it names another session by now; never raises
        ``OSError``. Kept through an outage like :meth:`remember`."""
        key = bare_name(step)
        if key is None or not session_id:
            return
        if self.steps.get(key) == session_id:
            del self.steps[key]
        self._written.pop(key, None)
        try:
            self._rows.drop(self.workspace_id, key, session_id)
        except (OSError, StateUnavailable) as exc:
            self._warn_write(exc)

    def _warn_write(self, exc: BaseException) -> None:
        if not self._write_failed:  # once per run: every later write would say the same
            self._write_failed = True
            log.warning("%s", t("lineage.unwritten", path=self.where, error=_why(exc)))

    # -- starting over ------------------------------------------------------------------

    def archive(self, into: str | Path, *, extra: list[Path] | None = None) -> Path:
        """``--new``: keep the lineage (and move the ``extra`` files that exist) into
        ``<into>/<YYYYmmdd-HHMMSS>/`` (created owner-only; ``-2``, ``-3`` … when taken); a
        database keeps its copy under that folder's name.

        Nothing is deleted and no session is touched; afterwards ``steps`` is empty and
        ``woke`` is 0. Returns that directory, which exists only when something was moved.
        Raises OSError (or StateUnavailable): a person asked for a fresh start and must not
        silently get the old conversation back.
        """
        target = _unused(Path(into) / time.strftime("%Y%m%d-%H%M%S"))
        self._rows.archive(self.workspace_id, target)
        _move_existing([Path(p) for p in extra or ()], target)
        self.steps, self.woke = {}, 0
        return target


class FileLineageRows:
    """Lineage in ``<run_dir>/lineage.json`` (the module docstring), for one workspace: a
    file another workspace wrote reads as none, and is set aside (never deleted) when this
    one writes; a damaged file likewise. One read-modify-write at a time across processes,
    under a file lock. ``workspace_id`` is not needed: a run_dir's file names its workspace
    by path."""

    def __init__(self, path: Path, workspace: Path) -> None:
        self.path: Path | None = Path(path)
        self._file = Path(path)
        self.run_dir = self._file.parent
        self.workspace = workspace
        self.where = str(self._file)
        # filelock costs ~15 ms to import; peek() and damage() (what status reads) never lock
        from filelock import FileLock

        self._lock = FileLock(
            f"{self._file}.lock", timeout=LOCK_TIMEOUT_S, mode=FILE_MODE, poll_interval=LOCK_POLL_S
        )

    def read(self, workspace_id: str) -> LineageDoc | None:
        state = _read_file(self._file)[0]
        if state is None or not self._ours(state.workspace):
            return None
        return LineageDoc(state.workspace, state.woke, dict(state.steps))

    @contextlib.contextmanager
    def update(
        self, workspace_id: str, run_id: str | None = None
    ) -> Iterator[list[LineageDoc | None]]:
        with self._locked():
            self._drop_stale_tmp()
            state = self._read_for_update()
            if state is not None and not self._ours(state.workspace):
                self._refuse_if_held(run_id)
                self._set_aside("workspace", t("lineage.why.workspace", workspace=state.workspace))
                state = None
            box: list[LineageDoc | None] = [
                None if state is None else LineageDoc(state.workspace, state.woke, state.steps)
            ]
            yield box
            doc = box[0]
            if doc is not None:
                self._write(doc.woke, doc.steps)

    def put(self, workspace_id: str, workspace: str, woke: int, step: str, sid: str) -> None:
        with self._locked():
            state = self._read_for_update()
            if state is not None and self._ours(state.workspace):
                woke, steps = state.woke, dict(state.steps)
            else:
                if state is not None:  # another workspace took the file over since we woke
                    self._set_aside("workspace", f"belongs to workspace {state.workspace} now")
                steps = {}
            steps[step] = sid
            self._write(woke, steps)

    def drop(self, workspace_id: str, step: str, sid: str) -> None:
        with self._locked():
            state = self._read_for_update()
            if state is None or not self._ours(state.workspace) or state.steps.get(step) != sid:
                return
            self._write(state.woke, {k: v for k, v in state.steps.items() if k != step})

    def keep_copy(self, workspace_id: str) -> str:
        """A copy of the file beside it, named ``lineage.json.gone-<stamp>``; what to say."""
        import shutil  # with bz2 and lzma, ~2 ms that readers such as status never use

        try:
            aside = _unused(
                self._file.with_name(f"{LINEAGE_NAME}.gone-{time.strftime('%Y%m%d-%H%M%S')}")
            )
            shutil.copyfile(self._file, aside)
            os.chmod(aside, FILE_MODE)
            return t("lineage.gone.kept", path=aside)
        except OSError as exc:
            return t("lineage.gone.not_kept", error=exc.strerror or exc)

    def archive(self, workspace_id: str, into: Path) -> bool:
        if not self.run_dir.is_dir():
            return False
        with self._lock, deferred_signals():
            return bool(_move_existing([self._file], into))

    # -- the file ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """One read-modify-write at a time, across processes."""
        private_dir(self.run_dir)
        with self._lock, deferred_signals():
            yield

    def _ours(self, workspace: str) -> bool:
        try:
            return same_workspace(workspace, str(self.workspace))
        except (OSError, ValueError):
            return False

    def _refuse_if_held(self, run_id: str | None) -> None:
        """Raise RunDirBusy if a live flower holds this run_dir for another workspace."""
        for rec in Registry(self.run_dir).live(exclude=run_id):
            theirs = os.path.abspath(rec.workspace) if rec.workspace else ""
            if theirs and not self._ours(theirs):
                raise RunDirBusy(
                    f"run_dir {self.run_dir} is in use by flower pid {rec.pid} "
                    f"for workspace {theirs}",
                    hint="use another --run-dir (-r), or wait for that flower to finish or stop it",
                )

    def _read_for_update(self) -> _State | None:
        """Read under the lock; a file that exists but is unusable is moved aside, not lost."""
        if not self._file.exists():
            return None
        state, problem = _read_file(self._file)
        if state is None:
            self._set_aside("corrupt", problem)
        return state

    def _set_aside(self, reason: str, why: str) -> None:
        """Move the file beside itself (``lineage.json.<reason>-<stamp>``), saying so."""
        try:
            aside = set_aside(self._file, reason)
        except OSError as exc:
            log.warning("%s", t("lineage.set_aside_failed", path=self._file, why=why, error=exc))
            return
        log.warning("%s", t("lineage.set_aside", path=self._file, why=why, aside=aside))

    def _drop_stale_tmp(self) -> None:
        """Remove temp files of writers killed mid-write: every writer holds the lock we hold."""
        for tmp in self.run_dir.glob(f".{LINEAGE_NAME}.*.tmp"):
            with contextlib.suppress(OSError):
                tmp.unlink()

    def _write(self, woke: int, steps: dict[str, str]) -> None:
        doc = {"workspace": str(self.workspace), "woke": woke, "steps": steps}
        atomic_write_text(self._file, json.dumps(doc, ensure_ascii=False, indent=2) + "\n")


def _unused(path: Path) -> Path:
    """``path``, or ``path-2``, ``path-3`` … the first that does not exist."""
    target, n = path, 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}-{n}")
    return target


def _move_existing(sources: list[Path], into: Path) -> list[Path]:
    """Move each existing file into ``into`` without overwriting anything already there."""
    present = [p for p in sources if p.exists()]
    if not present:
        return []
    import shutil

    private_dir(into)
    moved = []
    for src in present:
        target = into / src.name
        n = 1
        while target.exists():
            n += 1
            target = into / f"{src.stem}-{n}{src.suffix}"
        moved.append(Path(shutil.move(os.fspath(src), os.fspath(target))))
    return moved


def _why(exc: BaseException) -> str:
    return str(getattr(exc, "strerror", None) or exc)
