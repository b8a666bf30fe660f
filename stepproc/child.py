"""The step child: forked by the supervisor, runs one step attempt, reports, exits.

It is forked (not exec'd) from a supervisor that has already imported the SDK and loaded
the flow, so it starts in milliseconds and holds the very AgentSpec object (hooks,
in-process MCP servers and all) that the supervisor resolved; the ``start`` message carries
the rest. It talks only over its two pipe descriptors: its stdout/stderr go to a per-step
log, so a stray print cannot break the protocol.

Its whole tree (the CLI, the tool shells) dies with it: it is its own process group and a
subreaper, it gets SIGTERM when the supervisor dies (even by SIGKILL), and SIGTERM, SIGHUP
or EOF on the parent's pipe all end in killing every descendant.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flower.core import loop as step_loop
from flower.core.fsutil import open_private
from flower.core.result import Event, jsonable
from flower.core.runtime import Runtime
from ipc import (
    Answer,
    EventMsg,
    Failure,
    Hello,
    Interrupt,
    LineReader,
    LineWriter,
    ProtocolError,
    Result,
    Session,
    Shutdown,
    Start,
)

from .proctree import become_subreaper, die_with_parent, kill_descendants

MAX_TEXT_BYTES = 4 * 1024 * 1024  # half the protocol's line bound, leaving room for the rest


@dataclass
class ChildSetup:
    """What the forked child gets from its parent's memory."""

    runtime: Any  # the supervisor's Runtime object (its policies, workspace, store)
    spec: Any  # the AgentSpec to run
    read_fd: int  # parent -> child
    write_fd: int  # child -> parent
    log_path: Path
    parent_pid: int
    close_fds: tuple[int, ...] = ()  # the parent's ends and other children's pipes


def child_main(setup: ChildSetup) -> int:
    """Entry point right after fork in the child. The caller ``os._exit``s with the result."""
    _isolate(setup)
    asyncio.events._set_running_loop(None)  # we were forked inside the parent's loop
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(_serve(setup))
    finally:
        kill_descendants()


def _isolate(setup: ChildSetup) -> None:
    """Own process group, subreaper, parent-death signal, quiet stdio, clean signal state."""
    os.setpgid(0, 0)
    become_subreaper()
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _die)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides what an interrupt is
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    die_with_parent(signal.SIGTERM, parent=setup.parent_pid)
    for fd in setup.close_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    _redirect_stdio(setup.log_path)


def _redirect_stdio(log_path: Path) -> None:
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    log_fd = open_private(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)


def _die(signum: int, _frame: Any) -> None:
    """SIGTERM/SIGHUP (or the parent's death): take the whole tree down, now."""
    kill_descendants()
    os._exit(128 + signum)


class _Child:
    """The child's side of the conversation with the supervisor."""

    def __init__(self, setup: ChildSetup) -> None:
        self.setup = setup
        self.rt = setup.runtime
        self.out = LineWriter(setup.write_fd)
        self.reader = LineReader()
        self.start: Start | None = None
        self.started = asyncio.get_running_loop().create_future()
        self.task: asyncio.Task[Any] | None = None

    def send(self, msg: Any) -> None:
        try:
            self.out.send(msg)
        except (BrokenPipeError, OSError):
            _die(signal.SIGTERM, None)  # nobody is listening: the supervisor is gone
        except ProtocolError as exc:  # a message we built badly: report it, keep going
            print(f"flower step child: could not send {type(msg).__name__}: {exc}", file=sys.stderr)

    def on_readable(self) -> None:
        try:
            data = os.read(self.setup.read_fd, 65536)
        except BlockingIOError:
            return
        items = self.reader.feed(data) if data else [*self.reader.eof(), EOFError()]
        for item in items:
            self.dispatch(item)

    def dispatch(self, item: Any) -> None:
        if isinstance(item, EOFError):
            _die(signal.SIGTERM, None)  # the supervisor died; PDEATHSIG may not exist here
        elif isinstance(item, ProtocolError):
            print(f"flower step child: bad line from supervisor: {item}", file=sys.stderr)
        elif isinstance(item, Start) and not self.started.done():
            self.started.set_result(item)
        elif isinstance(item, Interrupt):
            asyncio.get_running_loop().create_task(Runtime.interrupt(self.rt, item.text))
        elif isinstance(item, Answer) and item.id == "interrupt":
            Runtime.reply(self.rt, item.text if item.state == "answered" else None)
        elif isinstance(item, Shutdown) and self.task is not None:
            self.task.cancel()

    async def run(self) -> int:
        self.send(Hello(pid=os.getpid()))
        start: Start = await self.started
        rt = self.rt
        rt.record = None  # only the supervisor writes the registry, lineage and manifest
        rt.on_session = lambda sid: self.send(
            Session(label=start.label, step=start.step, session_id=sid)
        )
        rt.defer_closing()  # report the result first, then let the CLI shut down
        self.task = asyncio.get_running_loop().create_task(
            step_loop.execute(
                rt,
                self.setup.spec,
                start.prompt,
                label=start.label,
                resume=start.resume,
                fork=start.fork,
                resume_at=start.resume_at,
                on_event=self.on_event,
            )
        )
        result = await self.task
        fields = result.to_dict()
        if (
            len(fields["text"].encode("utf-8")) > MAX_TEXT_BYTES
        ):  # keep the line under the pipe's bound
            fields["text"] = (
                fields["text"].encode("utf-8")[:MAX_TEXT_BYTES].decode("utf-8", "ignore")
                + "\n[…截断]"
            )
        self.send(Result(fields=jsonable(fields)))
        await rt.close_deferred()  # the supervisor waits for our exit before resuming this session
        return 0

    def on_event(self, event: Event) -> None:
        self.send(EventMsg(kind=event.kind, step=event.step, payload=jsonable(event.payload)))


async def _serve(setup: ChildSetup) -> int:
    os.set_blocking(setup.read_fd, False)
    child = _Child(setup)
    asyncio.get_running_loop().add_reader(setup.read_fd, child.on_readable)
    try:
        return await child.run()
    except asyncio.CancelledError:
        child.send(
            Failure(
                kind="shutdown", message="stopped by the supervisor", retryable=False, cause=None
            )
        )
        return 1
    except Exception as exc:  # noqa: BLE001 - reported over the pipe as an explicit frame
        cause = "".join(traceback.format_exception(exc))[-4000:]
        traceback.print_exc()
        child.send(
            Failure(kind=type(exc).__name__, message=str(exc)[:2000], retryable=True, cause=cause)
        )
        return 1
