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
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._errors import RunDirBusy
from ..i18n import define, t
from ..util.fsutil import FILE_MODE, atomic_write_text, private_dir, set_aside
from ..util.lazylog import lazy_logger
from .errors import StateUnavailable
from .manifest import deferred_signals
from .registry import Registry

log = lazy_logger("flower.lineage")  # logging loads when something is logged

define(
    {
        "lineage.unchecked": (
            "查不了步骤 {step!r} 在 sessions.db 里的会话 {session}({kind}: {error});先留着它",
            "could not check step {step!r}'s session {session} in sessions.db ({kind}: {error}); "
            "keeping it",
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

LINEAGE_NAME = "lineage.json"
JUDGE_MARK = "·判定"
# filelock's default 50 ms poll gave 0.3-1.5 s waits with four contenders on this machine.
LOCK_POLL_S = 0.002
# A lock held this long means a stuck holder; remember() then gives up (and swallows it).
LOCK_TIMEOUT_S = 10.0

_SUFFIX = re.compile(r"#(?:retry|round)\d+$")


def _of(name: str, steps: set[str]) -> bool:
    """Is the lineage entry ``name`` one of ``steps``'s: a step, or an item of a map step
    (``read[3]`` belongs to ``read``)?"""
    if name in steps:
        return True
    head, bracket, rest = name.partition("[")
    return bool(bracket) and rest.endswith("]") and head in steps


def bare_name(label: str) -> str | None:
    """The lineage key of a step-attempt label, or None when it must never be recorded.

    ``name``, ``name#retryN`` and ``name#roundN`` all map to ``name``; a judge label
    (``name·判定#N``, anything containing ``·判定``) maps to None: the judge is always a
    fresh session and never enters lineage.
    """
    if not label or JUDGE_MARK in label:
        return None
    return _SUFFIX.sub("", label) or None


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
class _State:
    """A well-formed lineage file as read from disk (steps not yet checked against the store)."""

    workspace: str
    woke: int = 0
    steps: dict[str, str] = field(default_factory=dict)


SHAPE = 'does not have the shape {"workspace": path, "woke": N, "steps": {step: session}}'


def _diagnose(text: str) -> tuple[_State | None, str]:
    """The file's content if it has the right shape, else None and what is wrong with it."""
    if not text.strip():
        return None, "is empty"
    try:
        data = json.loads(text)
    except ValueError:
        return None, "is not valid JSON (damaged, or cut short mid-write)"
    if not isinstance(data, dict):
        return None, SHAPE
    workspace, woke, steps = data.get("workspace"), data.get("woke", 0), data.get("steps", {})
    if not isinstance(workspace, str) or not workspace:
        return None, SHAPE
    if type(woke) is not int or woke < 0 or not isinstance(steps, dict):
        return None, SHAPE
    good = {k: v for k, v in steps.items() if isinstance(v, str) and v}
    return _State(workspace, woke, good), ""


def _parse(text: str) -> _State | None:
    """The file's content if it has the right shape, else None (= start fresh)."""
    return _diagnose(text)[0]


def _read_file(path: Path) -> tuple[_State | None, str]:
    """A lineage file's content and, when it has none usable, why ('' when it is missing)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, ""
    except UnicodeDecodeError:
        return None, "is not UTF-8 text"
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror or exc})"
    return _diagnose(text)


def damage(run_dir: str | Path) -> str | None:
    """What is wrong with ``<run_dir>/lineage.json`` (None when it is missing or well-formed)."""
    return _read_file(Path(run_dir) / LINEAGE_NAME)[1] or None


def peek(run_dir: str | Path) -> dict[str, Any]:
    """``lineage.json`` as it stands (workspace, woke, steps), not checked against any store
    or workspace; ``{}`` when missing or malformed. For readers such as ``status``."""
    try:
        state = _parse((Path(run_dir) / LINEAGE_NAME).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return {}
    return (
        {}
        if state is None
        else {"workspace": state.workspace, "woke": state.woke, "steps": state.steps}
    )


@dataclass
class Lineage:
    """The step-name -> session-id map of one workspace, stored in ``<run_dir>/lineage.json``.

    The documented fields are ``path`` (the file), ``workspace``, ``steps`` and ``woke``;
    :meth:`open` reads one. ``has_session(sid)`` (usually ``Runtime.has_session``) decides
    whether a remembered session still exists; entries failing it are not used. ``run_id`` is
    this flower's own registry record, so :meth:`bump` does not mistake itself for another
    live holder.
    """

    path: Path
    workspace: Path
    steps: dict[str, str] = field(default_factory=dict)
    woke: int = 0
    has_session: Callable[[str], bool] | None = field(default=None, repr=False, compare=False)
    run_id: str | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        self.workspace = Path(os.path.abspath(os.fspath(self.workspace)))
        self.run_dir = self.path.parent
        self._write_failed = False  # warned once: a run whose lineage cannot be written
        self._written: dict[str, str] = {}  # entries this object put on disk
        # filelock costs ~15 ms to import; peek() and damage() (what status reads) never lock
        from filelock import FileLock

        self._lock = FileLock(
            f"{self.path}.lock", timeout=LOCK_TIMEOUT_S, mode=FILE_MODE, poll_interval=LOCK_POLL_S
        )

    @property
    def where(self) -> str:
        """Where this lineage is kept, for people."""
        return str(self.path)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """One read-modify-write at a time, across processes."""
        private_dir(self.run_dir)
        with self._lock, deferred_signals():
            yield

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

        Never writes and never raises: a missing, corrupt or foreign file gives ``{}``.
        """
        state = self._read()
        if state is None or not self._ours(state.workspace):
            self.woke, self.steps = 0, {}
        else:
            self.woke, self.steps = state.woke, self._alive(state.steps)
        return dict(self.steps)

    def _read(self) -> _State | None:
        return self._read_diagnosed()[0]

    def _read_diagnosed(self) -> tuple[_State | None, str]:
        return _read_file(self.path)

    def _ours(self, workspace: str) -> bool:
        try:
            return same_workspace(workspace, str(self.workspace))
        except (OSError, ValueError):
            return False

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
        flow: for those whose session the store no longer has, a copy of the file is kept
        beside it and one warning says they start fresh. A run_dir that cannot be written
        does not stop the start.
        """
        try:
            with self._locked():
                return self._wake_locked(set(mine))
        except (OSError, StateUnavailable) as exc:
            log.warning("%s", t("lineage.not_updated", path=self.where, error=_why(exc)))
            self._write_failed = True
            self.load()
            self.woke += 1
            return self.woke

    def _wake_locked(self, mine: set[str]) -> int:
        self._drop_stale_tmp()
        state = self._read_for_update()
        if state is not None and not self._ours(state.workspace):
            self._refuse_if_held()
            self._set_aside("workspace", t("lineage.why.workspace", workspace=state.workspace))
            state = None
        self.woke = (state.woke if state else 0) + 1
        file_steps = state.steps if state else {}
        wanted = {n: sid for n, sid in file_steps.items() if _of(n, mine)} if mine else file_steps
        self.steps = self._alive(wanted)
        gone = {n: sid for n, sid in file_steps.items() if _of(n, mine) and n not in self.steps}
        if gone:
            self._keep_copy_of_gone(gone)
            # Ours to drop: no live flower uses these steps (a start that would is refused),
            # and an entry left in place would be reported again at every start.
            file_steps = {n: sid for n, sid in file_steps.items() if n not in gone}
        try:
            self._write(self.woke, file_steps)
        except (OSError, StateUnavailable) as exc:
            self._warn_write(exc)
        return self.woke

    def _keep_copy_of_gone(self, gone: dict[str, str]) -> None:
        """Entries naming sessions the store no longer has: those steps start fresh. The
        file stays (other flows' entries are in it) and loses those entries, so a copy keeps
        the old ids for a person to look at."""
        import shutil  # with bz2 and lzma, ~2 ms that readers such as status never use

        names = ", ".join(f"{n!r} ({sid})" for n, sid in gone.items())
        try:
            aside = _unused(
                self.path.with_name(f"{LINEAGE_NAME}.gone-{time.strftime('%Y%m%d-%H%M%S')}")
            )
            shutil.copyfile(self.path, aside)
            os.chmod(aside, FILE_MODE)
            kept = t("lineage.gone.kept", path=aside)
        except OSError as exc:
            kept = t("lineage.gone.not_kept", error=exc.strerror or exc)
        log.warning("%s", t("lineage.gone", path=self.path, steps=names, kept=kept))

    def _refuse_if_held(self) -> None:
        """Raise RunDirBusy if a live flower holds this run_dir for another workspace."""
        for rec in Registry(self.run_dir).live(exclude=self.run_id):
            theirs = os.path.abspath(rec.workspace) if rec.workspace else ""
            if theirs and not self._ours(theirs):
                raise RunDirBusy(
                    f"run_dir {self.run_dir} is in use by flower pid {rec.pid} "
                    f"for workspace {theirs}",
                    hint="use another --run-dir (-r), or wait for that flower to finish or stop it",
                )

    def _read_for_update(self) -> _State | None:
        """Read under the lock; a file that exists but is unusable is moved aside, not lost."""
        if not self.path.exists():
            return None
        state, problem = self._read_diagnosed()
        if state is None:
            self._set_aside("corrupt", problem)
        return state

    def _set_aside(self, reason: str, why: str) -> None:
        """Move the file beside itself (``lineage.json.<reason>-<stamp>``), saying so."""
        try:
            aside = set_aside(self.path, reason)
        except OSError as exc:
            log.warning("%s", t("lineage.set_aside_failed", path=self.path, why=why, error=exc))
            return
        log.warning("%s", t("lineage.set_aside", path=self.path, why=why, aside=aside))

    def _drop_stale_tmp(self) -> None:
        """Remove temp files of writers killed mid-write: every writer holds the lock we hold."""
        for tmp in self.run_dir.glob(f".{LINEAGE_NAME}.*.tmp"):
            with contextlib.suppress(OSError):
                tmp.unlink()

    # -- remembering --------------------------------------------------------------------

    def remember(self, step: str, session_id: str) -> None:
        """Record ``step``'s session the instant it is known; never raises ``OSError``.

        Suffixed labels (``#retryN``, ``#roundN``) record under the bare step name; judge
        labels are ignored. Entries other flowers wrote meanwhile are kept (re-read under lock).
        """
        key = bare_name(step)
        if key is None or not session_id:
            return
        if self._written.get(key) == session_id:
            return  # this very entry is on disk already (a step reports its session twice)
        self.steps[key] = session_id
        try:
            with self._locked():
                self._merge_locked(key, session_id)
        except (OSError, StateUnavailable) as exc:
            self._warn_write(exc)

    def forget(self, step: str, session_id: str) -> None:
        """``step``'s session ``session_id`` cannot be resumed (the CLI has no conversation
        for it): drop the entry, unless it names another session by now; never raises
        ``OSError``. Entries other flowers wrote meanwhile are kept (re-read under lock)."""
        key = bare_name(step)
        if key is None or not session_id:
            return
        if self.steps.get(key) == session_id:
            del self.steps[key]
        self._written.pop(key, None)
        try:
            with self._locked():
                state = self._read_for_update()
                if state is None or not self._ours(state.workspace):
                    return
                if state.steps.get(key) != session_id:
                    return
                steps = {k: v for k, v in state.steps.items() if k != key}
                self._write(state.woke, steps)
        except (OSError, StateUnavailable) as exc:
            self._warn_write(exc)

    def _warn_write(self, exc: BaseException) -> None:
        if not self._write_failed:  # once per run: every later write would say the same
            self._write_failed = True
            log.warning("%s", t("lineage.unwritten", path=self.where, error=_why(exc)))

    def _merge_locked(self, key: str, session_id: str) -> None:
        state = self._read_for_update()
        if state is not None and self._ours(state.workspace):
            woke, steps = state.woke, dict(state.steps)
        else:
            if state is not None:  # another workspace took the file over since we woke
                self._set_aside("workspace", f"belongs to workspace {state.workspace} now")
            woke, steps = self.woke, {}
        steps[key] = session_id
        self._write(woke, steps)
        self._written[key] = session_id

    def _write(self, woke: int, steps: dict[str, str]) -> None:
        doc = {"workspace": str(self.workspace), "woke": woke, "steps": steps}
        atomic_write_text(self.path, json.dumps(doc, ensure_ascii=False, indent=2) + "\n")

    # -- starting over ------------------------------------------------------------------

    def archive(self, into: str | Path, *, extra: list[Path] | None = None) -> Path:
        """``--new``: move lineage.json and the ``extra`` files that exist into
        ``<into>/<YYYYmmdd-HHMMSS>/`` (created owner-only; ``-2``, ``-3`` … when taken).

        Nothing is deleted and ``sessions.db`` is never touched; afterwards ``steps`` is empty
        and ``woke`` is 0. Returns that directory, which exists only when something was
        moved. Raises OSError: a person asked for a fresh start and must not silently get
        the old conversation back.
        """
        target = _unused(Path(into) / time.strftime("%Y%m%d-%H%M%S"))
        sources = [self.path, *(Path(p) for p in extra or ())]
        if self.run_dir.is_dir():
            with self._lock, deferred_signals():
                _move_existing(sources, target)
        else:
            _move_existing(sources[1:], target)
        self.steps, self.woke = {}, 0
        return target


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


class SharedLineage(Lineage):
    """:class:`Lineage` kept in a database's rows (:class:`~.seam.LineageRows`), under the
    workspace's identity: the same waking, remembering and checking, with the database's
    per-workspace lock instead of a file lock. A workspace's row is only ever its own, so
    there is no other workspace's file to set aside and nothing torn to recover."""

    def __init__(
        self,
        rows: Any,
        workspace_id: str,
        workspace: Path,
        where: str,
        *,
        has_session: Callable[[str], bool] | None = None,
        run_id: str | None = None,
    ) -> None:
        self.rows, self.workspace_id, self._where = rows, workspace_id, where
        self._box: list[Any] = [None]
        super().__init__(Path(workspace), Path(workspace), has_session=has_session, run_id=run_id)

    def __post_init__(self) -> None:
        self.workspace = Path(os.path.abspath(os.fspath(self.workspace)))
        self.run_dir = self.path
        self._write_failed = False
        self._written = {}

    @property
    def where(self) -> str:
        return self._where

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self.rows.update(self.workspace_id) as box:
            self._box = box
            try:
                yield
            finally:
                self._box = [None]

    def _read_diagnosed(self) -> tuple[_State | None, str]:
        return _state_of(self.rows.read(self.workspace_id)), ""

    def _read_for_update(self) -> _State | None:
        return _state_of(self._box[0])

    def _ours(self, workspace: str) -> bool:
        return True  # the row is keyed by this workspace's identity

    def _write(self, woke: int, steps: dict[str, str]) -> None:
        from .records import LineageDoc

        self._box[0] = LineageDoc(workspace=str(self.workspace), woke=woke, steps=dict(steps))

    def _drop_stale_tmp(self) -> None:
        return None

    def _keep_copy_of_gone(self, gone: dict[str, str]) -> None:
        names = ", ".join(f"{n!r} ({sid})" for n, sid in gone.items())
        log.warning(
            "%s",
            t("lineage.gone", path=self.where, steps=names, kept=t("lineage.gone.in_db")),
        )

    def archive(self, into: str | Path, *, extra: list[Path] | None = None) -> Path:
        target = _unused(Path(into) / time.strftime("%Y%m%d-%H%M%S"))
        self.rows.archive(self.workspace_id, target.name)
        _move_existing([Path(p) for p in extra or ()], target)
        self.steps, self.woke = {}, 0
        return target


def _state_of(doc: Any) -> _State | None:
    if doc is None:
        return None
    return _State(str(doc.workspace), int(doc.woke), dict(doc.steps))
