"""The event log: every Event the supervisor renders, one JSON line each, for ``logs``.

``<run_dir>/logs/<run id>/events.jsonl`` holds one object per line::

    {"t": 1796147437.94, "kind": "tool_call", "step": "second", "text": "ls -la",
     "tool": "Bash", "payload": {...}}

``t`` is epoch seconds, ``payload`` the event's payload made JSON-safe (``raw``, the SDK
object, is never written), every string in it cut at :data:`MAX_CHARS` (a ``Write`` call's
payload holds the whole file; the transcript in sessions.db keeps it all). The file is
created 0600 and only ever appended to, one ``write(2)`` per line and no buffer of ours, so
``flower-super logs -f`` in another process sees each line as soon as it is written, and a
supervisor killed at any instant loses nothing it had written (closing is a courtesy).

The log is a by-product, never a reason to stop: an OSError (disk full, the directory gone)
is one warning on the ``flower`` logger (the terminal prints it as a ``! …`` line), then the
log stops and the run goes on.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import threading
import time
import weakref
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..i18n import define, t
from ..util.fsutil import open_private, private_dir
from ..util.lazylog import lazy_logger

if TYPE_CHECKING:  # `logs` and `status` only ask where the file is
    from .result import Event
    from .seam import EventRows

log = lazy_logger("flower")  # logging loads when something is logged

EVENTS_NAME = "events.jsonl"
MAX_CHARS = 16_000  # per string; well above what a person reads on one line of `logs`

define(
    {
        "logs.write_failed": (
            "事件日志 {path} 写不进去({why}),之后的事件不再记录;运行照常继续",
            "cannot write the event log {path} ({why}); it stops here, the run goes on",
        ),
    }
)


def events_path(run_dir: str | Path, run_id: str) -> Path:
    """Where the supervisor of ``run_id`` writes its events."""
    return Path(run_dir) / "logs" / run_id / EVENTS_NAME


# Open logs of this process: a forked step child closes its inherited descriptors at once
# (it never writes them; the supervisor alone renders events).
_OPEN: weakref.WeakSet[EventLog] = weakref.WeakSet()


def _close_all_in_child() -> None:
    for each in list(_OPEN):
        each.close()


os.register_at_fork(after_in_child=_close_all_in_child)


class _FileLines:
    """Where a local run's events go: ``events.jsonl``, appended one ``write(2)`` a line."""

    def __init__(self, fd: int) -> None:
        self.fd: int | None = fd

    def append(self, data: bytes) -> None:
        if self.fd is None:
            raise OSError(errno.EBADF, "closed")
        try:
            _write_all(self.fd, data)
        except OSError as exc:
            if exc.errno == errno.EBADF:  # the number is not ours any more: never close it
                self.fd = None
            raise

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


class _Rows:
    """Where a shared run's events go: one row each (:class:`~.seam.EventRows`)."""

    def __init__(self, rows: EventRows, run_id: str) -> None:
        self.rows, self.run_id = rows, run_id

    def append(self, data: bytes) -> None:
        self.rows.append(self.run_id, json.loads(data))

    def close(self) -> None:
        return None


class EventLog:
    """One run's append-only event log, kept in a file (:meth:`open`) or in a database's
    rows (:meth:`over_rows`), written, warned about and stopped the same way. Every method
    is safe to call after a failure."""

    def __init__(self, sink: _FileLines | _Rows | None, where: Path | str) -> None:
        self.path = where  # what a warning names
        self._sink = sink
        if isinstance(sink, _FileLines):
            _OPEN.add(self)

    @classmethod
    def open(cls, run_dir: str | Path, run_id: str) -> EventLog:
        """The event log of ``run_id`` in ``run_dir`` (created 0600 if missing). Never raises:
        a log that cannot be opened is one warning and writes nothing."""
        path = events_path(run_dir, run_id)
        try:
            private_dir(path.parent)
            fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC)
        except OSError as exc:
            _warn(path, exc)
            return cls(None, path)
        return cls(_FileLines(fd), path)

    @classmethod
    def over_rows(cls, rows: EventRows, run_id: str, where: str) -> EventLog:
        """The event log of ``run_id`` as rows of a database (``where`` names it)."""
        return cls(_Rows(rows, run_id), where)

    @property
    def writing(self) -> bool:
        return self._sink is not None

    def write(self, ev: Event) -> None:
        """Append ``ev`` as one line (one row). Never raises: a store that cannot take it is
        one warning, and the log stops (as a full disk stops the file)."""
        if self._sink is None:
            return
        try:
            data = line(ev)
        except (TypeError, ValueError) as exc:  # a payload json cannot take: skip this one
            log.debug("event not logged: %s", exc)
            return
        try:
            self._sink.append(data)
        except Exception as exc:  # noqa: BLE001 - the log is a by-product: warn, stop
            _warn(self.path, exc)
            self.close()

    def tee(self, fn: Callable[[Event], Any]) -> Callable[[Event], None]:
        """An ``on_event`` callback that writes each event here, then hands it to ``fn``."""

        def on_event(ev: Event) -> None:
            self.write(ev)
            fn(ev)

        return on_event

    def close(self) -> None:
        sink, self._sink = self._sink, None
        _OPEN.discard(self)
        if sink is not None:
            sink.close()


class FileEventRows:
    """The event logs of one run_dir read as the seam's :class:`~.seam.EventRows` (what
    ``logs`` follows): a position is the byte offset just past an event's line, so a line
    still being written is read once its newline is there. A line that is no JSON object is
    given as ``{"unreadable": <its text>}``, never skipped in silence. Waits poll the file
    every :data:`POLL_S` seconds (a person watching does not notice 0.2 s)."""

    POLL_S = 0.2

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self._nudged = threading.Event()

    def where(self, run: str) -> str:
        return str(events_path(self.run_dir, run))

    def append(self, run: str, event: dict[str, Any]) -> None:
        path = events_path(self.run_dir, run)
        private_dir(path.parent)
        data = (json.dumps(event, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)

    def read(self, run: str, after: int = 0) -> list[tuple[int, dict[str, Any]]]:
        try:
            with open(events_path(self.run_dir, run), "rb") as f:
                f.seek(after)
                data = f.read()
        except FileNotFoundError:
            return []
        out: list[tuple[int, dict[str, Any]]] = []
        pos = after
        for raw in data.split(b"\n")[:-1]:  # the part after the last newline: being written
            raw += b"\n"
            pos += len(raw)
            if not raw.strip():
                continue
            try:
                ev = json.loads(raw)
            except ValueError:
                ev = None
            if not isinstance(ev, dict):
                ev = {"unreadable": raw.decode("utf-8", "replace").strip()}
            out.append((pos, ev))
        return out

    def wait(self, run: str, after: int, timeout: float) -> bool:
        """Until a whole line follows ``after`` (a line still being written is not one)."""
        path = events_path(self.run_dir, run)
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError):
                if path.stat().st_size > after and self._whole_line_after(path, after):
                    return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(self.POLL_S, left))

    @staticmethod
    def _whole_line_after(path: Path, after: int) -> bool:
        with open(path, "rb") as f:
            f.seek(after)
            while chunk := f.read(65536):
                if b"\n" in chunk:
                    return True
        return False

    def changed(self, timeout: float, runs: AbstractSet[str]) -> set[str] | None:
        """A run_dir has no listeners to wake: look at every run again after ``timeout``
        (or once :meth:`nudge` is called)."""
        self._nudged.wait(max(0.0, timeout))
        self._nudged.clear()
        return None

    def nudge(self) -> None:
        self._nudged.set()


def line(ev: Event, now: float | None = None) -> bytes:
    """``ev`` as the bytes of one line of ``events.jsonl``."""
    from .result import jsonable

    record = {
        "t": round(time.time() if now is None else now, 3),
        "kind": ev.kind,
        "step": ev.step,
        "text": _cut(ev.text),
        "tool": ev.tool,
        "payload": _cut(jsonable(ev.payload)),
    }
    text = json.dumps(record, ensure_ascii=False, separators=(",", ":"))
    try:
        return (text + "\n").encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from the CLI's JSON: keep it, escaped
        return (json.dumps(record, ensure_ascii=True, separators=(",", ":")) + "\n").encode()


def _cut(value: Any) -> Any:
    if isinstance(value, str):
        return value if len(value) <= MAX_CHARS else value[:MAX_CHARS] + "…"
    if isinstance(value, dict):
        return {k: _cut(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cut(v) for v in value]
    return value


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _warn(path: Path | str, exc: Exception) -> None:
    why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
    log.warning("%s", t("logs.write_failed", path=path, why=why))
