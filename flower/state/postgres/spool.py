"""The spool: fenced writes kept on this machine while PostgreSQL cannot be reached.

The SDK mirrors transcript entries as the CLI writes them; an outage of the database must
not lose one, and a kill -9 during the outage must not either. So a write that cannot reach
the database (and every later write of the same process, to keep their order) is appended
to this process's spool file and fsynced before the write returns; a thread delivers the
file, in order, once the database answers (:mod:`.db`).

Where: ``${XDG_STATE_HOME:-~/.local/state}/flower/spool/<database key>/``, 0700, one file
per process (0600) named ``<time ns>-<pid>-<random>.spool``. The writing process holds an
``flock`` on its file for as long as it lives; a file nobody holds is an orphan (its process
died) and the next process that connects to the same database delivers it first. The lock
is taken before the file gets its final name, so no other process ever sees a live file
unlocked.

Format: JSON lines. The first is a header (``{"spool": id}``); each further line is a
record ``{"n": 1, "op": ..., "epoch": ..., "args": {...}}``, ``n`` counting from 1. A last
line without its newline is a write the machine's crash cut short: it never returned, and
is ignored. Delivery is exactly once: the database keeps, per spool id, the last record
delivered (``spools``), updated in the same transaction as the record's write.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...util.fsutil import fsync_dir, open_private, private_dir

__all__ = ["Record", "SpoolFile", "orphans", "spool_dir"]

SUFFIX = ".spool"


def spool_dir(database_key: str) -> Path:
    """This machine's spool directory for one database (see the module docstring)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "flower" / "spool" / database_key


@dataclass(frozen=True)
class Record:
    n: int
    op: str
    epoch: int
    args: dict[str, Any]


class SpoolFile:
    """One spool file, opened and locked by this process (its writer, or its deliverer)."""

    def __init__(self, path: Path, fd: int, spool_id: str, header: int) -> None:
        self.path = path
        self.fd = fd
        self.id = spool_id
        self.written = 0  # records appended by this process (a writer's own file)
        self.offset = header  # bytes of the file delivered (the header counts as read)

    @classmethod
    def create(cls, directory: Path) -> SpoolFile:
        """A new spool file of this process, locked, its header durable."""
        private_dir(directory)
        spool_id = f"{time.time_ns()}-{os.getpid()}-{secrets.token_hex(3)}"
        final = directory / f"{spool_id}{SUFFIX}"
        tmp = directory / f".{spool_id}.tmp"
        fd = open_private(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            header = _line({"spool": spool_id, "pid": os.getpid()})
            _write_all(fd, header)
            os.fsync(fd)
            os.rename(tmp, final)
            fsync_dir(directory)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return cls(final, fd, spool_id, len(header))

    @classmethod
    def claim(cls, path: Path) -> SpoolFile | None:
        """Another process's file, locked for delivery; None while its writer lives, or
        when another process delivered it already. A file without a readable header is
        returned all the same (its id empty): reading its records fails, and the caller
        sets it aside."""
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.fstat(fd).st_nlink == 0:  # delivered and removed while we waited
                raise BlockingIOError
            first = os.pread(fd, 4096, 0).split(b"\n", 1)[0]
        except OSError:
            os.close(fd)
            return None
        try:
            spool_id, header = str(json.loads(first)["spool"]), len(first) + 1
        except (ValueError, KeyError, TypeError):
            spool_id, header = "", 0  # damaged: its first "record" will not parse
        return cls(path, fd, spool_id, header)

    def add(self, op: str, epoch: int, args: dict[str, Any]) -> None:
        """Append one record and fsync it: once this returns, a kill -9 cannot lose it."""
        n = self.written + 1
        _write_all(self.fd, _line({"n": n, "op": op, "epoch": epoch, "args": args}))
        os.fsync(self.fd)
        self.written = n

    def unread(self) -> list[tuple[Record, int]]:
        """The complete records after the read mark, in order, each with the offset just
        past it (hand that to :meth:`mark` once the record is delivered)."""
        size = os.fstat(self.fd).st_size
        chunk = os.pread(self.fd, max(0, size - self.offset), self.offset)
        out, at = [], self.offset
        for raw in chunk[: chunk.rfind(b"\n") + 1].split(b"\n")[:-1]:
            at += len(raw) + 1
            data = json.loads(raw)
            out.append((Record(int(data["n"]), data["op"], int(data["epoch"]), data["args"]), at))
        return out

    def mark(self, offset: int) -> None:
        self.offset = offset

    def remove(self) -> None:
        """Delivered: unlink it (still locked, so no other process takes it), then close."""
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        self.close()

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


def orphans(directory: Path) -> Iterator[SpoolFile]:
    """Spool files of dead processes in ``directory``, oldest first, each claimed."""
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(SUFFIX))
    except OSError:
        return
    for name in names:
        claimed = SpoolFile.claim(directory / name)
        if claimed is not None:
            yield claimed


def _line(obj: dict[str, Any]) -> bytes:
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    try:
        return (text + "\n").encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from the CLI's JSON: kept, escaped
        return (json.dumps(obj, ensure_ascii=True, separators=(",", ":")) + "\n").encode()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
