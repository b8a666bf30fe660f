"""The registry of flowers that ran in a run_dir: ``runs/flowers/<run id>.json``.

Each supervisor process (each run id) owns exactly one record and is the only writer of it,
so records need no lock: every write is an atomic replace of the whole (small) file. Readers
(``status``, a start checking for live holders) list the directory.

A record is *alive* when its pid exists **and** that process started when the record says
(psutil's create_time), so a recycled pid is never mistaken for the flower. A record written on
another machine (its ``host`` is not this one: a registry shared through PostgreSQL) cannot be
asked about its pid: it is alive while its lease runs, that is while its supervisor touched it
within :data:`LEASE_S` (it does every few seconds).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..i18n import define, t
from ..util.fsutil import atomic_write_text, private_dir, set_aside
from ..util.lazylog import lazy_logger

if TYPE_CHECKING:
    from .seam import RegistryRows

log = lazy_logger("flower")  # logging loads when something is logged

define(
    {
        "registry.set_aside": (
            "{path} 不是 flower 的记录;已留作 {aside}",
            "{path} is not a flower record; kept it as {aside}",
        ),
        "registry.set_aside_failed": (
            "{path} 不是 flower 的记录,也挪不到一边({error})",
            "{path} is not a flower record and cannot be set aside ({error})",
        ),
    }
)

FLOWERS_DIRNAME = "flowers"

# States a record can be in; "running" is only ever true of a live process.
RUNNING = "running"
FINISHED = "finished"
FAILED = "failed"
KILLED = "killed"
INTERRUPTED = "interrupted"
# What status, show and logs call a run whose process is gone mid-run, or was interrupted.
RESUMABLE = "interrupted-resumable"
# A record from another machine is alive while it was touched this recently (the supervisor
# touches its record every 5 s; a few missed beats are a busy machine, not a dead one).
LEASE_S = 30.0


def this_host() -> str:
    """This machine's name, as records say where they were written (``gethostname``'s
    answer, read without importing socket: ~2.5 ms status and show do not need)."""
    return os.uname().nodename


def new_run_id(now: float | None = None) -> str:
    """A process marker: ``YYYYmmdd-HHMMSS-<6 hex>``."""
    import secrets  # hashlib and hmac: ~5 ms that status and cancel never need

    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now if now is not None else time.time()))
    return f"{stamp}-{secrets.token_hex(3)}"


def process_started(pid: int) -> float | None:
    """The start time psutil reports for ``pid``, or None if there is no such process."""
    import psutil  # ~14 ms: loaded only when a process is asked about

    try:
        return psutil.Process(pid).create_time()
    except (psutil.Error, OSError):
        return None


def is_alive(pid: int, started: float | None) -> bool:
    """True when ``pid`` runs and is the very process that started at ``started``."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)  # no such process: the common case for status, without psutil's import
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        pass  # someone else's process, or an odd platform: psutil decides
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        created = proc.create_time()
    except (psutil.Error, OSError):
        return False
    return started is None or abs(created - started) < 0.05


@dataclass
class FlowerRecord:
    """One flower process that used this run_dir."""

    run: str
    flow: str
    pid: int
    pid_started: float | None
    workspace: str
    started_at: float
    command: list[str] = field(default_factory=list)  # argv that resumes it
    cwd: str = ""
    steps: list[str] = field(default_factory=list)  # the flow's bare step names
    state: str = RUNNING
    step: str | None = None  # label of the attempt in flight
    session_id: str | None = None
    attempt: int = 0
    woke: int = 0
    updated_at: float = 0.0
    ended_at: float | None = None
    exit_code: int | None = None
    # step name -> {"hash": input hash, "result": StepResult dict, "value": ctx value}
    completed: dict[str, dict[str, Any]] = field(default_factory=dict)
    # seed 004's reuse report: per step, reused or ran (and why), in the order they came.
    reuse: list[dict[str, Any]] = field(default_factory=list)
    host: str = ""  # the machine it runs on ("" in records older than shared state)
    workspace_id: str = ""  # the workspace's identity (flower.state.identity)
    heartbeat_at: float = 0.0  # when it was last touched, in the backend's clock
    # attempts running on a cluster: label -> {"id": activity id, "host", "pid", "worker"}
    placed: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The words the run was started with (``ctx["_ask"]``: after ``start``/``flower``); None
    # in records older than it, and for a run given none.
    ask: str | None = None

    @property
    def alive(self) -> bool:
        if self.host and self.host != this_host():
            return self.state == RUNNING and lease_alive(self.heartbeat_at or self.updated_at)
        return is_alive(self.pid, self.pid_started)

    def to_dict(self) -> dict[str, Any]:
        """Its fields (their values are JSON already; lists and dicts are shared)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FlowerRecord:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


class Registry:
    """Who ran here: the run records of one run_dir (``Registry(run_dir)``, its
    ``flowers/`` files) or of one workspace in a database (``Registry(rows=…)``, the seam's
    :class:`~.seam.RegistryRows`). What a record holds, when it is written and which one is
    live is decided here, once; the rows only keep them."""

    def __init__(
        self,
        run_dir: str | Path | None = None,
        *,
        rows: RegistryRows | None = None,
        workspace_id: str = "",
        where: str = "",
    ) -> None:
        if rows is None:
            if run_dir is None:
                raise TypeError("Registry needs a run_dir or rows")
            rows = FileRegistryRows(Path(run_dir))
        self.rows = rows
        self.workspace_id = workspace_id  # "" with files: a run_dir holds whoever ran in it
        self.where = where or str(getattr(rows, "where", ""))

    def write(self, record: FlowerRecord) -> None:
        """Replace this run's record (only its own process calls this)."""
        record.updated_at = time.time()
        record.host = record.host or this_host()
        if self.workspace_id:
            record.workspace_id = self.workspace_id
        data = record.to_dict()
        self.rows.write(data)  # sets heartbeat_at, in the backend's clock
        record.heartbeat_at = float(data.get("heartbeat_at") or record.updated_at)

    def remove(self, run_id: str) -> None:
        """Forget a run's record (a start that was refused leaves no trace)."""
        self.rows.remove(run_id)

    def get(self, run_id: str) -> FlowerRecord | None:
        return _record(self.rows.get(run_id))

    def records(self) -> list[FlowerRecord]:
        """Every readable record, oldest start first. Unreadable ones are skipped (see
        :meth:`damaged`)."""
        out = [r for data in self.rows.records(self.workspace_id or None) if (r := _record(data))]
        out.sort(key=lambda r: (r.started_at, r.run))
        return out

    def damaged(self) -> list[Path]:
        """Records kept as files that are not a flower record (a database keeps none)."""
        return self.rows.damaged()

    def set_aside_damaged(self) -> list[Path]:
        """Move damaged records beside themselves (never deleted), one warning each."""
        moved = []
        for path in self.damaged():
            try:
                aside = set_aside(path, "corrupt")
            except OSError as exc:
                log.warning("%s", t("registry.set_aside_failed", path=path, error=exc))
                continue
            log.warning("%s", t("registry.set_aside", path=path, aside=aside))
            moved.append(aside)
        return moved

    def locked(self) -> Any:
        """The lock that makes "is anyone live here? then I am" atomic across processes."""
        return self.rows.locked(self.workspace_id)

    def live(self, *, exclude: str | None = None) -> list[FlowerRecord]:
        """Flowers running right now: the record says running and its process is alive.

        A record that ended (finished, failed, killed) holds nothing even if its process
        lives on, e.g. a library user running two flows one after the other.
        """
        return live_of(self.records(), exclude)


class FileRegistryRows:
    """The run records of one run_dir as files, ``flowers/<run>.json`` (the seam's
    :class:`~.seam.RegistryRows`): every write an atomic replace, read without a lock."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.dir = run_dir / FLOWERS_DIRNAME

    @property
    def where(self) -> str:
        return str(self.dir)

    def path_for(self, run_id: str) -> Path:
        return self.dir / f"{run_id}.json"

    def write(self, record: dict[str, Any]) -> None:
        private_dir(self.dir)
        record["heartbeat_at"] = record.get("updated_at") or time.time()
        # No indent: json's C encoder only runs without one, and a record is rewritten
        # several times per step (its ``completed`` grows with the flow).
        text = json.dumps(record, ensure_ascii=False, separators=(",", ":"))
        atomic_write_text(self.path_for(str(record["run"])), text, durable=False)

    def get(self, run: str) -> dict[str, Any] | None:
        return _load(self.path_for(run))

    def records(self, workspace_id: str | None = None) -> list[dict[str, Any]]:
        return [data for path in self._files() if (data := _load(path)) is not None]

    def remove(self, run: str) -> None:
        with contextlib.suppress(OSError):
            self.path_for(run).unlink()

    def heartbeat(self, run: str) -> None:
        """The record's own rewrite is its heartbeat (files have one clock: this machine's)."""

    def locked(self, workspace_id: str = "") -> Any:
        from filelock import FileLock

        private_dir(self.run_dir)
        return FileLock(str(self.run_dir / "flowers.lock"), mode=0o600, timeout=30)

    def damaged(self) -> list[Path]:
        """Record files that are not a flower record (every write is an atomic replace, so
        one is never caught half-written: these are damaged)."""
        return [p for p in self._files() if _record(_load(p)) is None and p.exists()]

    def _files(self) -> list[Path]:
        try:
            names = sorted(os.listdir(self.dir))
        except OSError:
            return []
        return [self.dir / n for n in names if n.endswith(".json")]


def live_of(records: list[FlowerRecord], exclude: str | None) -> list[FlowerRecord]:
    return [r for r in records if r.run != exclude and r.state == RUNNING and r.alive]


# The fields every reader relies on, with the types they must have.
_CHECKED: dict[str, type | tuple[type, ...]] = {
    "run": str,
    "flow": str,
    "pid": int,
    "workspace": str,
    "started_at": (int, float),
    "state": str,
    "steps": list,
    "command": list,
    "completed": dict,
}


def _load(path: Path) -> dict[str, Any] | None:
    """A record file's JSON object; None when it cannot be read as one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _record(data: dict[str, Any] | None) -> FlowerRecord | None:
    """The record ``data`` holds, if every field readers rely on has its type."""
    if data is None:
        return None
    try:
        record = FlowerRecord.from_dict(data)
    except (ValueError, TypeError):
        return None
    return _checked(record)


def _checked(record: FlowerRecord) -> FlowerRecord | None:
    """The record if every field readers rely on has its type, else None."""
    for name, kind in _CHECKED.items():
        value = getattr(record, name)
        if not isinstance(value, kind) or isinstance(value, bool):
            return None
    return record


def lease_alive(touched: float, now: float | None = None) -> bool:
    """Was a record touched within :data:`LEASE_S`?"""
    return (time.time() if now is None else now) - touched < LEASE_S


def state_of(r: FlowerRecord, alive: bool | None = None) -> str:
    """What status calls the state of ``r``: its record's, except that a run whose process
    is gone while it was running (or that was interrupted) is ``interrupted-resumable``.
    ``alive`` is what the caller already knows of its process (asked when None)."""
    if r.state == RUNNING:
        return RUNNING if (r.alive if alive is None else alive) else RESUMABLE
    if r.state == INTERRUPTED:
        return RESUMABLE
    return r.state  # finished / failed / killed
