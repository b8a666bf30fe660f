"""Forking a step child and talking to it from the supervisor's event loop."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import traceback
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ipc import LineReader, LineWriter, Message, ProtocolError

from .child import ChildSetup, child_main
from .proctree import kill_tree


@dataclass
class ChildHandle:
    """The supervisor's view of one running step child."""

    pid: int
    read_fd: int  # child -> parent
    write_fd: int  # parent -> child
    log_path: Path
    writer: LineWriter = field(repr=False)
    status: int | None = None  # waitpid status once reaped

    @property
    def parent_fds(self) -> tuple[int, int]:
        return (self.read_fd, self.write_fd)

    def send(self, msg: Message) -> bool:
        """Send a message; False when the child is gone (its pipe is closed)."""
        try:
            self.writer.send(msg)
            return True
        except (BrokenPipeError, OSError, ProtocolError):
            return False

    async def messages(self) -> AsyncIterator[Message | ProtocolError]:
        """Every message the child sends, until EOF on its pipe."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        reader = LineReader()
        done = object()

        def on_readable() -> None:
            try:
                data = os.read(self.read_fd, 1 << 16)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            items = reader.feed(data) if data else [*reader.eof(), done]
            if not data:
                loop.remove_reader(self.read_fd)
            for item in items:
                queue.put_nowait(item)

        os.set_blocking(self.read_fd, False)
        loop.add_reader(self.read_fd, on_readable)
        try:
            while (item := await queue.get()) is not done:
                yield item
        finally:
            loop.remove_reader(self.read_fd)

    async def wait(self) -> int:
        """Reap the child (without blocking the loop); return its waitpid status."""
        while self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                self.status = status
                break
            await asyncio.sleep(0.01)
        return self.status

    def stop(self, *, grace: float = 2.0) -> None:
        """SIGTERM (the child kills its own tree), then SIGKILL whatever is left. Blocking."""
        if self.status is not None:
            return
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        if not self._reaped_within(grace):
            kill_tree(self.pid, pgid=self.pid)
            self._reaped_within(5.0)

    def _reaped_within(self, seconds: float) -> bool:
        import time

        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                self.status = status
                return True
            time.sleep(0.01)
        return False

    def close(self) -> None:
        for fd in self.parent_fds:
            try:
                os.close(fd)
            except OSError:
                pass


def spawn(
    runtime: Any, spec: Any, log_path: Path, *, close_fds: tuple[int, ...] = ()
) -> ChildHandle:
    """Fork a step child running ``spec`` with ``runtime``'s policies; it waits for ``start``."""
    p2c_r, p2c_w = os.pipe()
    c2p_r, c2p_w = os.pipe()
    parent = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never return into the supervisor's stack
        code = 70
        try:
            setup = ChildSetup(
                runtime, spec, p2c_r, c2p_w, log_path, parent, close_fds=(p2c_w, c2p_r, *close_fds)
            )
            code = child_main(setup)
        except BaseException:  # noqa: BLE001 - report to the per-step log, then exit
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(p2c_r)
    os.close(c2p_w)
    try:
        os.setpgid(pid, pid)  # also done by the child; whichever runs first wins the race
    except (PermissionError, ProcessLookupError):
        pass
    return ChildHandle(
        pid=pid, read_fd=c2p_r, write_fd=p2c_w, log_path=log_path, writer=LineWriter(p2c_w)
    )


def describe_status(status: int) -> str:
    """'killed by SIGKILL' / 'exited with status 3' from a waitpid status."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"killed by {name}"
    return f"exited with status {os.WEXITSTATUS(status)}"
