"""The run manifest: ``runs/manifest.json``, one row per step attempt, shared by every flower.

A row is every StepResult field plus ``duration_s`` (a property ``asdict`` misses) and ``run``
(the writing process's id). Writing is append-only (seed 000: 追加不覆盖): other runs' rows stay
byte for byte, this run's rows are all the results it recorded, and any number of processes
write at once under a file lock.

Speed: re-reading and rewriting the array costs ~100 ms at 10,000 rows, so the file is kept
in a canonical layout, one row per line::

    [
    {row},
    {row}
    ]

and a write replaces the final ``\\n]\\n`` with ``,\\n{row}\\n]\\n`` in ONE ``pwrite`` (then
fsync). The whole file is validated once per run and process; later writes validate only the
bytes other processes appended since, and fall back to a full pass when the file was replaced,
shrank, changed before our last known end, or is not in that layout (then it is rewritten in
it, every row kept). A file cut short mid-append (power loss, or SIGKILL during a multi-page
write, which Linux can end early) is readable up to its last whole row and repaired on the next
write; a corrupt or non-array file is set aside, never deleted.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..i18n import define, t
from ..util.fsutil import FILE_MODE, atomic_write_text, open_private, private_dir, set_aside
from ..util.lazylog import lazy_logger

if TYPE_CHECKING:  # a reader of the manifest (status, show) needs neither
    from filelock import FileLock

    from .result import StepResult
    from .seam import ManifestRows

log = lazy_logger("flower")  # logging loads when something is logged

define(
    {
        "manifest.torn": (
            "manifest {path} 写到一半被截断;已留作 {aside},重写了其中完整的 {rows} 行",
            "manifest {path} was cut short mid-write; kept it as {aside} and rewrote its {rows} "
            "whole {rows|row|rows}",
        ),
        "manifest.corrupt": (
            "manifest {path} 不是由行组成的 JSON 数组;已留作 {aside},另起了一个新的",
            "manifest {path} is not a JSON array of rows; kept it as {aside} and started a "
            "fresh one",
        ),
        "manifest.corrupt_read": (
            "manifest {path} 不是由行组成的 JSON 数组;当作空的来读",
            "manifest {path} is not a JSON array of rows; reading it as empty",
        ),
    }
)

MANIFEST_NAME = "manifest.json"
LOCK_POLL_S = 0.002  # filelock's default 50 ms poll made 4-way contention wait up to 1.5 s
LOCK_TIMEOUT_S = 60.0

_HEAD = b"[\n"
_TAIL = b"\n]\n"
_EMPTY = _HEAD + b"]\n"
_SIG_LEN = 64  # bytes before our last known end, re-checked to notice in-place edits

# Signals whose Python handlers may write the manifest (rescue() on SIGTERM/SIGHUP) or lineage;
# a handler running in the middle of our own write would append at a stale offset.
_DEFERRED = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM")

Entry = tuple[bytes, dict[str, Any]]  # (the row's raw JSON line, its parsed value)


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold back signal handlers of this thread until the block ends (then they run)."""
    import signal  # a writer's import, not a reader's (status reads the manifest)

    if not hasattr(signal, "pthread_sigmask"):  # pragma: no cover - not Unix
        yield
        return
    deferred = {getattr(signal, name) for name in _DEFERRED if hasattr(signal, name)}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, deferred)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def manifest_row(result: StepResult, run_id: str) -> dict[str, Any]:
    """One manifest row: every StepResult field, ``duration_s`` and ``run``."""
    row = result.to_dict()
    row["duration_s"] = result.duration_s
    row["run"] = run_id
    return row


def _dumps(row: dict[str, Any]) -> bytes:
    """One row as one line (json escapes newlines inside strings)."""
    try:
        return json.dumps(row, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates in model text: \\u-escape them instead
        return json.dumps(row).encode("ascii")


def _row(line: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _parse_canonical(data: bytes) -> list[Entry] | None:
    """The rows of a file in the canonical one-row-per-line layout, or None if it is not."""
    if data == _EMPTY:
        return []
    if not (data.startswith(_HEAD) and data.endswith(_TAIL)):
        return None
    lines = data[len(_HEAD) : -len(_TAIL)].split(b"\n")
    out: list[Entry] = []
    for i, line in enumerate(lines):
        if i < len(lines) - 1:
            if not line.endswith(b","):
                return None
            line = line[:-1]
        row = _row(line)
        if row is None:
            return None
        out.append((line, row))
    return out


def _recover_torn(data: bytes) -> list[Entry] | None:
    """The whole rows of a canonical file whose last append was cut short, else None.

    A torn append leaves the header, whole row lines, then at most a partial last line;
    anything after the first unparsable line means corruption, not a torn tail.
    """
    if not data.startswith(_HEAD):
        return None
    lines = data[len(_HEAD) :].split(b"\n")
    out: list[Entry] = []
    for i, line in enumerate(lines):
        core = line.strip()
        if core.endswith(b"]"):  # "{row},]": only the comma of the next append landed
            core = core[:-1].rstrip()
        if core.endswith(b","):
            core = core[:-1]
        row = _row(core) if core else None
        if row is None:
            return None if any(rest.strip() for rest in lines[i + 1 :]) else out
        out.append((core, row))
    return out


def decode(data: bytes) -> tuple[list[Entry], str | None]:
    """Parse manifest bytes into entries and a verdict.

    Verdicts: None (canonical), ``"empty"``, ``"layout"`` (valid array, other layout),
    ``"torn"`` (last append cut short; whole rows returned), ``"corrupt"`` (no rows usable).
    """
    if not data.strip():
        return [], "empty"
    entries = _parse_canonical(data)
    if entries is not None:
        return entries, None
    try:
        doc = json.loads(data)
    except ValueError:
        torn = _recover_torn(data)
        return (torn, "torn") if torn is not None else ([], "corrupt")
    if not isinstance(doc, list) or not all(isinstance(r, dict) for r in doc):
        return [], "corrupt"
    return [(_dumps(r), r) for r in doc], "layout"


@dataclass(frozen=True)
class _View:
    """What this object knows of the file after its last write."""

    dev: int
    ino: int
    size: int
    rows: int
    sig: bytes  # the bytes just before body_end

    @property
    def body_end(self) -> int:
        """Where the next append starts: over the final ``\\n]\\n`` (or the ``]`` of ``[]``)."""
        return self.size - len(_TAIL) if self.rows else len(_HEAD)


@dataclass
class _RunState:
    """What one run (in this process) wrote to one manifest and knows of the file."""

    mine: list[bytes] = field(default_factory=list)  # every row recorded, in order
    pending: list[bytes] = field(default_factory=list)  # rows not yet known to be on disk
    view: _View | None = None


# Shared by every Manifest object of the same file and run in this process: a caller that
# builds a new Manifest per write (Runtime does) must not pay a full validation each time.
# Only touched under the file lock, which also serialises this process's threads.
_RUN_STATES: dict[tuple[str, str], _RunState] = {}
_RUN_STATES_LOCK = threading.Lock()


def _run_state(path: Path, run_id: str) -> _RunState:
    with _RUN_STATES_LOCK:
        return _RUN_STATES.setdefault((os.path.abspath(path), run_id), _RunState())


def _lock_for(run_dir: Path) -> FileLock:
    from filelock import FileLock  # ~15 ms: damage() and an absent manifest need no lock

    return FileLock(
        run_dir / f"{MANIFEST_NAME}.lock",
        timeout=LOCK_TIMEOUT_S,
        mode=FILE_MODE,
        poll_interval=LOCK_POLL_S,
    )


class Manifest:
    """This process's writer of one run's manifest rows (``run_id`` marks them), in
    ``<run_dir>/manifest.json`` (``Manifest(run_dir, run_id)``) or in a database's rows of one
    workspace (``Manifest(rows=…, workspace_id=…)``, the seam's :class:`~.seam.ManifestRows`).
    What a row holds is decided here, once; the rows only keep them.
    """

    def __init__(
        self,
        run_dir: str | Path | None = None,
        run_id: str = "",
        *,
        rows: ManifestRows | None = None,
        workspace_id: str = "",
        where: str = "",
    ) -> None:
        if rows is None:
            if run_dir is None:
                raise TypeError("Manifest needs a run_dir or rows")
            rows = FileManifestRows(Path(run_dir), run_id)
        self.store = rows
        self.run_id = run_id
        self.workspace_id = workspace_id
        self.path: Path | str = where or getattr(rows, "path", "")  # what a warning names

    def record(self, result: StepResult, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Append ``result``'s row and return it; ``extra`` adds fields of ours to it (a
        reused step's ``reused`` and ``saved_usd``).

        Raises OSError when the row cannot be kept (the caller's one warning); with files the
        row stays pending and lands with the next successful write.
        """
        row = manifest_row(result, self.run_id) | (extra or {})
        try:
            self.store.append(self.workspace_id, row)
        except OSError:
            raise
        except Exception as exc:
            raise OSError(str(exc)) from exc
        return row

    def check(self) -> None:
        """Validate what is kept now rather than at the first row: a damaged file is set
        aside (one warning) and a fresh one started before the run spends anything."""
        self.store.check()

    def rows(self) -> list[dict[str, Any]]:
        """Every row kept, in order (a file read under its lock, never half-written)."""
        return self.store.rows(self.workspace_id or None)


class FileManifestRows:
    """One run's manifest rows in ``<run_dir>/manifest.json`` (the seam's
    :class:`~.seam.ManifestRows`): appended under a file lock and fsynced, a damaged file set
    aside. Objects for the same file and run id share what they know, so making one per
    write costs no more than keeping one.
    """

    def __init__(self, run_dir: Path, run_id: str) -> None:
        self.run_dir = run_dir
        self.path = self.run_dir / MANIFEST_NAME
        self.run_id = run_id
        self._lock = _lock_for(self.run_dir)
        self._run = _run_state(self.path, run_id)

    def append(self, workspace_id: str, row: dict[str, Any]) -> None:
        """Raises OSError when the file cannot be written; the row stays pending and lands
        with the next successful write."""
        raw = _dumps(row)
        self._run.mine.append(raw)
        self._run.pending.append(raw)
        private_dir(self.run_dir)
        with self._lock, deferred_signals():
            self._write_locked()

    def check(self) -> None:
        if not self.path.exists():
            return
        with self._lock, deferred_signals():
            self._write_locked()

    def rows(self, workspace_id: str | None = None) -> list[dict[str, Any]]:
        """Every row in the file (a run_dir holds whichever workspaces ran in it)."""
        return read_manifest(self.run_dir)

    # -- writing ------------------------------------------------------------------------

    def _write_locked(self) -> None:
        fd = open_private(self.path, os.O_RDWR | os.O_CREAT)
        try:
            st = os.fstat(fd)
            rows = self._rows_if_only_appended(fd, st)
            if rows is not None:
                self._append(fd, st.st_size, rows, self._run.pending)
            else:
                self._full_pass(fd, st.st_size)
        finally:
            os.close(fd)
        self._run.pending.clear()

    def _rows_if_only_appended(self, fd: int, st: os.stat_result) -> int | None:
        """The row count if the file is ours plus whole rows others appended, else None."""
        v = self._run.view
        if v is None or (st.st_dev, st.st_ino) != (v.dev, v.ino) or st.st_size < v.size:
            return None
        end = v.body_end
        if os.pread(fd, len(v.sig), end - len(v.sig)) != v.sig:
            return None
        seg = _pread_all(fd, st.st_size - end, end)
        if v.rows:
            if seg == _TAIL:
                return v.rows
            if not seg.startswith(b",\n"):
                return None
            seg = seg[2:]
        added = _parse_canonical(_HEAD + seg)
        return None if added is None else v.rows + len(added)

    def _full_pass(self, fd: int, size: int) -> None:
        """Validate the whole file; append if it is canonical, else rewrite it canonically."""
        entries, verdict = decode(_pread_all(fd, size, 0))
        if verdict in ("torn", "corrupt"):
            self._set_aside(verdict, len(entries))
        missing = self._missing_own(entries)
        if verdict is None or (verdict == "empty" and size == 0):
            self._append(fd, size, len(entries), missing)
        else:
            self._rewrite([raw for raw, _ in entries] + missing)

    def _missing_own(self, entries: list[Entry]) -> list[bytes]:
        """Rows this object recorded that the file lacks (e.g. after a set-aside)."""
        on_disk = Counter(raw for raw, row in entries if row.get("run") == self.run_id)
        missing = []
        for raw in self._run.mine:
            if on_disk[raw]:
                on_disk[raw] -= 1
            else:
                missing.append(raw)
        return missing

    def _set_aside(self, verdict: str, whole_rows: int) -> None:
        aside = set_aside(self.path, verdict)
        if verdict == "torn":
            log.warning("%s", t("manifest.torn", path=self.path, aside=aside, rows=whole_rows))
        else:
            log.warning("%s", t("manifest.corrupt", path=self.path, aside=aside))

    def _append(self, fd: int, size: int, rows: int, raws: list[bytes]) -> None:
        """Write ``raws`` over the closing bracket in one pwrite; restore the tail on error."""
        if raws:
            body = b",\n".join(raws) + _TAIL
            if rows:
                at, payload = size - len(_TAIL), b",\n" + body
            elif size:
                at, payload = len(_HEAD), body
            else:
                at, payload = 0, _HEAD + body
            old_tail = os.pread(fd, size - at, at)
            try:
                _pwrite_all(fd, payload, at)
                os.fsync(fd)
            except OSError:
                _restore(fd, size, at, old_tail)
                raise
            size, rows = at + len(payload), rows + len(raws)
        st = os.fstat(fd)
        self._run.view = self._make_view(fd, st.st_dev, st.st_ino, size, rows)

    def _rewrite(self, raws: list[bytes]) -> None:
        data = _HEAD + b",\n".join(raws) + _TAIL if raws else _EMPTY
        atomic_write_text(self.path, data.decode("utf-8"))
        fd = os.open(self.path, os.O_RDONLY)
        try:
            st = os.fstat(fd)
            self._run.view = self._make_view(fd, st.st_dev, st.st_ino, len(data), len(raws))
        finally:
            os.close(fd)

    @staticmethod
    def _make_view(fd: int, dev: int, ino: int, size: int, rows: int) -> _View:
        end = size - len(_TAIL) if rows else len(_HEAD)
        start = max(0, end - _SIG_LEN)
        return _View(dev, ino, size, rows, os.pread(fd, end - start, start))


def damage(run_dir: str | Path) -> str | None:
    """What is wrong with ``<run_dir>/manifest.json`` (None when missing or well-formed)."""
    path = Path(run_dir) / MANIFEST_NAME
    try:
        data = _read_bytes(path)
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    entries, verdict = decode(data)
    if verdict == "torn":
        return f"was cut short mid-write (its {len(entries)} whole rows are readable)"
    if verdict == "corrupt":
        return "is not a JSON array of rows"
    return None


def read_manifest(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every row of ``<run_dir>/manifest.json`` ([] if there is none).

    Read under the writers' lock; a run_dir where the lock cannot be taken (read-only) is
    read without it. A torn last append yields the whole rows before it.
    """
    path = Path(run_dir) / MANIFEST_NAME
    if not path.exists():
        return []
    data = _read_shared(Path(run_dir), path)
    entries, verdict = decode(data)
    if verdict == "corrupt":
        log.warning("%s", t("manifest.corrupt_read", path=path))
    return [row for _, row in entries]


def _read_shared(run_dir: Path, path: Path) -> bytes:
    """``path``'s bytes under a shared ``flock`` of the writers' lock file: the lock
    filelock's writers take exclusively on POSIX, without importing filelock (~15 ms that
    ``flower-super status`` would pay). Unlockable (read-only run_dir, no flock): read as is."""
    try:
        import fcntl
    except ImportError:  # not POSIX: the writers' own lock
        try:
            with _lock_for(run_dir):
                return _read_bytes(path)
        except OSError:
            return _read_bytes(path)
    try:
        fd = os.open(run_dir / f"{MANIFEST_NAME}.lock", os.O_RDWR | os.O_CREAT, FILE_MODE)
    except OSError:
        return _read_bytes(path)
    try:
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return _read_bytes(path)  # a writer stuck: a torn tail is decoded anyway
                time.sleep(LOCK_POLL_S)
            except OSError:
                return _read_bytes(path)
        return _read_bytes(path)
    finally:
        os.close(fd)  # closing releases the lock


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def _pread_all(fd: int, n: int, offset: int) -> bytes:
    chunks = []
    while n > 0:
        chunk = os.pread(fd, n, offset)
        if not chunk:
            break
        chunks.append(chunk)
        n -= len(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _restore(fd: int, size: int, at: int, old_tail: bytes) -> None:
    """Put back the bytes a failed append overwrote (best effort: the error is re-raised)."""
    with contextlib.suppress(OSError):
        os.ftruncate(fd, size)
        _pwrite_all(fd, old_tail, at)
        os.fsync(fd)
