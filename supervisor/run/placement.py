"""The supervisor's placement: every attempt of a step runs in a forked step child.

The parent's whole view of its children lives here: forking (through the process tree
object, :data:`flower.step.proctree.PROCS`), the pipes, reading frames, reaping, stopping
trees, and *prepared* children — forked ahead of time for the steps likely to run next,
their CLI already started, so that only the prompt is left to send (``prepare``). A prepared
child that turns out not to be needed is told ``shutdown`` and exits without sending a
request; the flow never hears of it.

What an attempt is and what the loop above expects of it is written down in
:mod:`flower.step.placement`. A child that dies is one more failed attempt of that one loop:
its result says ``step child <pid> died without a result (<how>)``; a child that reports a
crash (``failure`` with ``retryable: false``) raises :class:`flower.AttemptCrash`.

A prepared CLI has loaded its session when it started, so preparing never races a writer:
no child is prepared for a session that a running child writes or a finished one is still
flushing, and one prepared for a session that a child starts writing later is dropped. A
spec with Python callbacks (hooks, in-process MCP servers) is never prepared: they run in the
child, and a child forked early would run them on a copy of the supervisor's memory taken
before the previous step ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import shutil
import signal
import sys
import time
import traceback
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from flower import AttemptCrash
from flower.agents.agent import AgentSpec
from flower.i18n import define, t
from flower.state.result import Event, StepResult
from flower.step.call import StepCall
from flower.step.placement import DIED, Seat, Watch
from flower.step.proctree import PROCS, ProcessTree, describe_status
from ipc import (
    Answer,
    Ask,
    EventMsg,
    Failure,
    Hello,
    Interrupt,
    Kept,
    LineReader,
    LineWriter,
    Message,
    ProtocolError,
    Result,
    Session,
    Shutdown,
    Start,
)
from stepproc import ChildSetup, child_main

log = logging.getLogger("flower.supervisor")

define(
    {
        "placement.ask_failed": (
            "步骤的问题没能转给人:{error}",
            "could not put a step's question to the person: {error}",
        ),
    }
)

#: How a dead child's attempt is described (the terminal recognises it).


# What an attempt imports the first time it runs, beyond ``claude_agent_sdk`` itself: the SDK
# reaches anyio's asyncio backend, subprocess and stream modules only at its first async call.
# A process that forks attempt runners imports them once (:func:`preload`); measured, a forked
# step child otherwise spent ~20 ms of CPU per attempt importing them again.
ATTEMPT_MODULES = (
    "concurrent.futures.thread",
    "anyio._backends._asyncio",
    "anyio._core._resources",
    "anyio._core._sockets",
    "anyio._core._streams",
    "anyio._core._subprocesses",
    "anyio.abc._eventloop",
    "anyio.abc._sockets",
    "anyio.abc._testing",
    "anyio.streams.stapled",
    "anyio.streams.tls",
)


def preload() -> list[str]:
    """Import :data:`ATTEMPT_MODULES` and the SDK; returns those that could not be imported
    (a newer anyio may have moved one: then a child imports what it needs, a bit slower)."""
    import importlib

    import claude_agent_sdk  # noqa: F401 - about a second: paid once, not per child

    import flower

    for public in flower.__all__:  # flower's own names load lazily: all of them, once
        getattr(flower, public)
    missing = []
    for name in ATTEMPT_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


@dataclass
class ChildHandle:
    """The supervisor's view of one running step child."""

    pid: int
    call: StepCall  # the attempt it was forked for
    read_fd: int  # child -> parent
    write_fd: int  # parent -> child
    log_path: Path
    tmp: Path  # its temporary directory (see Seat.tmp)
    procs: ProcessTree = field(repr=False)
    writer: LineWriter = field(repr=False)
    status: int | None = None  # waitpid status once reaped
    started: bool = False  # it was sent its ``start``
    closed: bool = False  # its pipes are closed (the fd numbers may belong to others now)
    session_id: str | None = None  # the session it reported
    asking: set[asyncio.Task[None]] = field(default_factory=set, repr=False)

    @property
    def parent_fds(self) -> tuple[int, int]:
        return (self.read_fd, self.write_fd)

    def send(self, msg: Message) -> bool:
        """Send a message; False when the child is gone (its pipe is closed)."""
        if self.closed:
            return False
        try:
            self.writer.send(msg)
            return True
        except (OSError, ProtocolError):
            return False

    async def interrupt(self) -> None:
        """What an interrupt of this attempt does: tell the child (it interrupts its CLI)."""
        self.send(Interrupt())

    async def messages(self) -> AsyncGenerator[Message | ProtocolError, None]:
        """Every message the child sends, until EOF on its pipe. Use it under
        ``contextlib.aclosing``: its reader must be gone before the fd is closed and reused."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Message | ProtocolError | None] = asyncio.Queue()
        reader = LineReader()

        def on_readable() -> None:
            try:
                data = os.read(self.read_fd, 1 << 16)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            items: list[Message | ProtocolError | None] = [
                *(reader.feed(data) if data else reader.eof())
            ]
            if not data:
                loop.remove_reader(self.read_fd)
                items.append(None)
            for item in items:
                queue.put_nowait(item)

        os.set_blocking(self.read_fd, False)
        loop.add_reader(self.read_fd, on_readable)
        try:
            while (item := await queue.get()) is not None:
                yield item
        finally:
            loop.remove_reader(self.read_fd)

    def poll(self) -> int | None:
        """The child's waitpid status if it has exited (reaping it), else None."""
        if self.status is None:
            try:
                pid, status = self.procs.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by someone else: how it ended is unknown
                pid, status = self.pid, LOST
            if pid == self.pid:
                self.status = status
        return self.status

    async def wait(self) -> int:
        """Reap the child (without blocking the loop); return its waitpid status."""
        while (status := self.poll()) is None:
            await self._exit()
        return status

    async def _exit(self) -> None:
        """Until the child may have exited: its pidfd turns readable then (Linux 5.3 and
        later); where there is none, a 10 ms poll."""
        try:
            fd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            await asyncio.sleep(0.01)
            return
        loop = asyncio.get_running_loop()
        exited = loop.create_future()
        loop.add_reader(fd, _settle, exited)
        try:
            await exited
        finally:
            loop.remove_reader(fd)
            os.close(fd)

    async def terminate(self, *, grace: float = 2.0) -> int:
        """SIGTERM (the child kills its own tree), then SIGKILL whatever is left; reaped."""
        if self.poll() is None:
            self.procs.kill(self.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(self.wait(), grace)
            except TimeoutError:
                self.procs.kill_tree(self.pid, pgid=self.pid)
        return await self.wait()

    def stop(self, *, grace: float = 2.0) -> None:
        """:meth:`terminate`, blocking: for signal handlers, where nothing may be awaited."""
        if self.poll() is not None:
            return
        self.procs.kill(self.pid, signal.SIGTERM)
        if not self._reaped_within(grace):
            self.procs.kill_tree(self.pid, pgid=self.pid)
            self._reaped_within(5.0)

    def _reaped_within(self, seconds: float) -> bool:
        status = self.procs.reap(self.pid, within=seconds)
        if status is not None:
            self.status = status
        return self.poll() is not None

    def close(self) -> None:
        """Close the pipes (once) and stop whatever was still talking to the child."""
        if self.closed:
            return
        self.closed = True
        for task in self.asking:
            task.cancel()
        for fd in self.parent_fds:
            with contextlib.suppress(OSError):
                os.close(fd)


# The waitpid status of a child someone else reaped: "exited with status 255", never clean.
LOST = 255 << 8


def spawn(
    call: StepCall,
    seat: Seat,
    *,
    close_fds: tuple[int, ...] = (),
    procs: ProcessTree = PROCS,
) -> ChildHandle:
    """Fork a step child for ``call``; its CLI starts at once, its prompt comes with ``start``."""
    log_path = seat.log_for(call.label)
    p2c_r, p2c_w = os.pipe()
    c2p_r, c2p_w = os.pipe()
    parent = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    # The child inherits every object as frozen: its garbage collector never walks (and so
    # never writes to, copying page after page) the supervisor's heap. Measured: a third less
    # CPU per step child. The parent takes its objects back at once.
    gc.freeze()
    try:
        pid = procs.fork()
    except OSError:
        gc.unfreeze()
        for fd in (p2c_r, p2c_w, c2p_r, c2p_w):
            os.close(fd)
        raise
    if pid == 0:  # the child: never return into the supervisor's stack
        code = 70
        try:
            setup = ChildSetup(
                call, seat, p2c_r, c2p_w, log_path, parent, close_fds=(p2c_w, c2p_r, *close_fds)
            )
            code = child_main(setup)
        except BaseException:  # noqa: BLE001 - report to the per-step log, then exit
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    gc.unfreeze()
    os.close(p2c_r)
    os.close(c2p_w)
    with contextlib.suppress(PermissionError, ProcessLookupError):
        os.setpgid(pid, pid)  # also done by the child; whichever runs first wins the race
    return ChildHandle(
        pid=pid,
        call=call,
        read_fd=c2p_r,
        write_fd=p2c_w,
        log_path=log_path,
        tmp=seat.tmp / str(pid),
        procs=procs,
        writer=LineWriter(p2c_w),
    )


class Forked:
    """One forked child per attempt, prepared ahead where the next steps are known."""

    def __init__(
        self,
        *,
        procs: ProcessTree = PROCS,
        ask: Callable[[Ask], Awaitable[str | None]] | None = None,
        relay: Callable[[Ask], Awaitable[str | None]] | None = None,
        siblings: Callable[[], set[int]] | None = None,
        stored: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.procs = procs
        # A worker's: what a new session's frame waits for before the child's tool calls may
        # run (``Kept``): the frame in the shared state, not in this machine's spool during
        # an outage, since the attempt's next try may run on another machine and must find
        # the session to continue it (here, lineage written before ``Kept`` is enough: the
        # next run on this machine delivers the spool before it reads).
        self.stored = stored
        # The live step children of the other placements in this process (a worker runs
        # one per slot): orphans are swept around them, never through them.
        self.siblings = siblings
        self.ask = ask  # puts a child's question to the person (only the supervisor has a terminal)
        # A worker's children ask through it: every question, a channel's too, goes on to the
        # supervisor that placed the attempt (its terminal, its copy of the channel).
        self.relay = relay
        self.children: dict[int, ChildHandle] = {}
        self.prepared: list[ChildHandle] = []
        self._reapers: set[asyncio.Task[int]] = set()
        self._closing: dict[str, asyncio.Task[int]] = {}  # session id -> its child's reaper
        self._writing: dict[str, int] = {}  # session id -> running children writing it
        self._swept = False  # the temporary files of children of an earlier, killed flower

    # -- one attempt ----------------------------------------------------------------------

    async def attempt(self, call: StepCall, seat: Seat, watch: Watch) -> StepResult:
        started = time.time()
        if call.resume and call.resume in self._closing:
            # That session's CLI (of a child that already reported) is still shutting down,
            # flushing its last entries: resume only once they are all in sessions.db.
            await asyncio.shield(self._closing[call.resume])
        try:
            child = self._take_prepared(call) or self._spawn(call, seat)
        except OSError as exc:
            return _failed(call, started, None, f"could not fork a step child: {exc}")
        writes = set() if call.fork or not call.resume else {call.resume}
        watch.on_handle(child)
        try:
            out, problem = await self._converse(child, call, watch, writes)
        except BaseException:
            self._retire(child)
            raise
        finally:
            watch.on_handle(None)
            for sid in writes:
                self._written(sid)
        if out is not None:
            self._reap_later(child, out.session_id)
            return out
        status = await child.terminate()
        self._retire(child, clean=status == 0)
        if isinstance(problem, Failure) and not problem.retryable:
            raise AttemptCrash(
                problem.kind, problem.message, detail=problem.cause or "", log=str(child.log_path)
            )
        if isinstance(problem, Failure):
            problem = f"step child failed: {problem.kind}: {problem.message}"
        text = problem or f"step child {child.pid} {DIED} ({describe_status(status)})"
        return _failed(call, started, child.session_id, text)

    async def _converse(
        self, child: ChildHandle, call: StepCall, watch: Watch, writes: set[str]
    ) -> tuple[StepResult | None, str | Failure]:
        """Hand the child its ``start`` and read it to its result: (its result, "") or
        (None, why it gave none). Sessions it writes are added to ``writes`` as it reports
        them (and counted as being written meanwhile)."""
        for sid in writes:
            self._writing_now(sid)
        child.started = True
        if not child.send(Start(**call.wire())):
            return None, f"could not hand the step to child {child.pid} before it ended"
        async with contextlib.aclosing(child.messages()) as frames:
            async for item in frames:
                if isinstance(item, Result):
                    return StepResult.from_dict(item.fields), ""
                if isinstance(item, Failure):
                    return None, item
                problem = self._take_frame(child, call, watch, item, writes)
                if problem:
                    return None, problem
        return None, ""

    def _take_frame(
        self,
        child: ChildHandle,
        call: StepCall,
        watch: Watch,
        item: Message | ProtocolError,
        writes: set[str],
    ) -> str:
        """Act on one frame before the result; a protocol problem ends the attempt."""
        if isinstance(item, ProtocolError):
            return f"protocol error from step child: {item}"
        if isinstance(item, Hello):
            return "" if item.pid == child.pid else f"protocol error: hello from pid {item.pid}"
        if isinstance(item, Session):
            if item.label != call.label:
                return f"protocol error from step child: session for {item.label!r}"
            child.session_id = item.session_id
            if item.session_id not in writes:
                writes.add(item.session_id)
                self._writing_now(item.session_id)
            watch.on_session(item.session_id)  # lineage is written before this returns
            if self.stored is None:
                child.send(Kept(session_id=item.session_id))  # its first tool call may run now
            else:
                self._kept_once_stored(child, item.session_id, self.stored)
        elif isinstance(item, EventMsg):
            watch.on_event(event_of(item))
        elif isinstance(item, Ask):
            self._answer(child, item)
        else:
            return f"unexpected message from step child: {type(item).__name__}"
        return ""

    def _kept_once_stored(
        self, child: ChildHandle, sid: str, stored: Callable[[], Awaitable[None]]
    ) -> None:
        """``Kept`` once ``stored`` says the session's frame is where any machine finds it
        (the child's frames keep being read meanwhile)."""

        async def kept() -> None:
            await stored()
            child.send(Kept(session_id=sid))

        task = asyncio.get_running_loop().create_task(kept())
        child.asking.add(task)
        task.add_done_callback(child.asking.discard)

    def _answer(self, child: ChildHandle, question: Ask) -> None:
        """Put the question to the person while the child's frames keep being read."""

        async def answer() -> None:
            child.send(await answer_for(question, self.ask, self.relay))

        task = asyncio.get_running_loop().create_task(answer())
        child.asking.add(task)
        task.add_done_callback(child.asking.discard)

    # -- who writes which session ---------------------------------------------------------

    def _writing_now(self, sid: str) -> None:
        """A running child writes ``sid`` from now on: a CLI prepared with it is stale."""
        self._writing[sid] = self._writing.get(sid, 0) + 1
        self.stale(sid)

    def stale(self, sid: str) -> None:
        """``sid`` is being written (here or by another placement of this process): drop
        the children prepared with it (their CLI loaded a copy that is out of date)."""
        for child in [c for c in self.prepared if c.call.resume == sid]:
            self._drop(child)

    def busy_with(self, sid: str) -> bool:
        """Does a child of this placement write ``sid``, or still flush it?"""
        return sid in self._writing or sid in self._closing

    def _written(self, sid: str) -> None:
        n = self._writing.get(sid, 0) - 1
        if n > 0:
            self._writing[sid] = n
        else:
            self._writing.pop(sid, None)

    # -- prepared children ----------------------------------------------------------------

    def prepare(self, calls: Sequence[StepCall], seat: Seat) -> None:
        """Keep a child ready for each of ``calls``; drop prepared ones no longer expected."""
        for child in list(self.prepared):
            if not any(_fits(child, c) for c in calls):
                self._drop(child)
        for call in calls:
            if any(_fits(child, call) for child in self.prepared) or not self._preparable(call):
                continue
            try:
                self.prepared.append(self._spawn(call, seat))
            except OSError as exc:  # preparing is an optimisation: the attempt forks later
                log.debug("could not prepare a child for %s: %s", call.label, exc)

    def give(self, call: StepCall) -> ChildHandle | None:
        """The child prepared for ``call``, if it is alive, handed out of this placement for
        another to :meth:`adopt` (a worker prepares apart from the attempt that runs it)."""
        child = self._take_prepared(call)
        if child is not None:
            self.children.pop(child.pid, None)
        return child

    def adopt(self, child: ChildHandle) -> None:
        """A prepared child another placement of this process :meth:`give`-s: the next
        attempt that fits it runs there."""
        self.children[child.pid] = child
        self.prepared.append(child)

    def _preparable(self, call: StepCall) -> bool:
        """May a CLI for ``call`` be started now? Not while its session is being written or
        flushed (it would load a stale copy), nor for a spec with Python callbacks."""
        if call.resume and (call.resume in self._writing or call.resume in self._closing):
            return False
        return not _runs_python(call.spec)

    def _take_prepared(self, call: StepCall) -> ChildHandle | None:
        """The child prepared for ``call``, if it is alive; others for its label are dropped
        (they were prepared for another session)."""
        taken = None
        for child in list(self.prepared):
            if child.call.label != call.label:
                continue
            if taken is None and _fits(child, call) and child.poll() is None:
                self.prepared.remove(child)
                taken = child
            else:
                self._drop(child)
        return taken

    def _drop(self, child: ChildHandle) -> None:
        """Shut a prepared child down: it exits without a request, its empty log goes too."""
        self.prepared.remove(child)
        if not child.send(Shutdown(reason="not needed")):
            child.stop(grace=0.0)
        self._reap_later(child, None, then=lambda: self._remove_log_if_empty(child))

    def _remove_log_if_empty(self, child: ChildHandle) -> None:
        if any(c.log_path == child.log_path for c in self.children.values()):
            return  # another child of that label writes to it
        with contextlib.suppress(OSError):
            if child.log_path.stat().st_size == 0:
                child.log_path.unlink()

    # -- children's lives -----------------------------------------------------------------

    def _spawn(self, call: StepCall, seat: Seat) -> ChildHandle:
        if not self._swept:
            self._swept = True
            _sweep_tmp(seat.tmp)
        others = tuple(fd for c in self.children.values() for fd in c.parent_fds)
        child = spawn(call, seat, close_fds=others, procs=self.procs)
        self.children[child.pid] = child
        return child

    def _reap_later(
        self,
        child: ChildHandle,
        session_id: str | None,
        *,
        then: Callable[[], None] | None = None,
    ) -> asyncio.Task[int]:
        """The flow goes on at once while the child shuts its CLI down and exits; until it
        has, its session counts as closing (see the wait at the top of ``attempt``). ``then``
        runs once it is reaped, inside the task :meth:`close` waits for."""

        async def reap() -> int:
            status = await self._reap(child)
            if then is not None:
                then()
            return status

        task = asyncio.get_running_loop().create_task(reap())
        self._reapers.add(task)
        task.add_done_callback(self._reapers.discard)
        if session_id:
            self._closing[session_id] = task

            def forget(t: asyncio.Task[int]) -> None:
                if self._closing.get(session_id) is t:
                    del self._closing[session_id]

            task.add_done_callback(forget)
        return task

    async def _reap(self, child: ChildHandle) -> int:
        status: int | None = None
        try:
            status = await child.wait()
            return status
        finally:
            self._retire(child, clean=status == 0)

    def _retire(self, child: ChildHandle, *, clean: bool = False) -> None:
        """Whatever the child left behind dies too: its process group (the CLI, tool
        shells) and any orphan re-parented to us, the subreaper, gets killed and reaped; its
        temporary files (a resumed transcript the SDK copied) are removed. A child that exited
        cleanly killed its own descendants first, so the scan for orphans (a few ms of
        reading the process table) is spared. Retiring twice does nothing more."""
        if self.children.pop(child.pid, None) is None and child.closed:
            return
        child.close()
        self.procs.killpg(child.pid)
        if not clean:
            keep = set(self.children) | (self.siblings() if self.siblings else set())
            self.procs.reap_orphans(keep=keep)
        shutil.rmtree(child.tmp, ignore_errors=True)

    async def close(self) -> None:
        """Drop every prepared child and wait for children that already reported to exit."""
        for child in list(self.prepared):
            self._drop(child)
        while self._reapers:
            await asyncio.gather(*list(self._reapers), return_exceptions=True)

    def stop_now(self) -> None:
        """Stop every child and its whole tree (blocking, bounded): SIGTERM/SIGHUP, Ctrl-C
        twice. Their temporary files (copied transcripts) go too."""
        self.prepared.clear()
        for child in list(self.children.values()):
            child.stop()
            self.children.pop(child.pid, None)
            child.close()
            shutil.rmtree(child.tmp, ignore_errors=True)


def event_of(frame: EventMsg) -> Event:
    """The Event an ``event`` frame carries (from a child's pipe or a worker's mailbox)."""
    payload = {**frame.payload, "step": frame.step} if frame.step else dict(frame.payload)
    return Event(frame.kind, frame.text, frame.tool, payload)


async def answer_for(
    question: Ask,
    ask: Callable[[Ask], Awaitable[str | None]] | None,
    relay: Callable[[Ask], Awaitable[str | None]] | None = None,
) -> Answer:
    """The answer to an attempt's question, always one: from ``relay`` when the question
    must go on (a worker's), else the supervisor's copy of the asking channel, else the
    person (``ask``); ``closed`` when nobody could be asked."""
    try:
        if relay is not None:
            text: str | None = await relay(question)
        elif question.channel:
            text = await _serve_channel(question)
        else:
            text = await ask(question) if ask else None
    except Exception as exc:  # noqa: BLE001 - the attempt waits for an answer: always one
        log.warning("%s", t("placement.ask_failed", error=exc))
        text = None
    state = "answered" if text is not None else "closed"
    return Answer(id=question.id, state=state, text=text)


async def _serve_channel(question: Ask) -> str:
    """A child's HumanChannel tool call, handled by the supervisor's copy of that channel."""
    from flower.people.human import find_channel

    channel = find_channel(question.channel)
    if channel is None:
        return f"(flower: no HumanChannel {question.channel!r} in the supervisor; go on without)"
    args: dict[str, Any] = {"question": question.question, "options": list(question.options)}
    return await channel.serve(question.kind, args)


def _runs_python(spec: AgentSpec) -> bool:
    """Does the spec hand the SDK Python callbacks (hooks, in-process MCP servers)?"""
    if spec.hooks:
        return True
    return any(isinstance(s, dict) and s.get("type") == "sdk" for s in spec.mcp_servers.values())


def _sweep_tmp(tmp: Path) -> None:
    """Remove what children of a supervisor killed with -9 left in ``tmp`` (a directory per
    child pid; one whose pid still runs may be another flower's and stays)."""
    try:
        names = os.listdir(tmp)
    except OSError:
        return
    for name in names:
        if not (name.isdigit() and psutil.pid_exists(int(name))):
            shutil.rmtree(tmp / name, ignore_errors=True)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _fits(child: ChildHandle, call: StepCall) -> bool:
    """Can ``child`` (prepared, never started) run ``call``?"""
    return not child.started and child.call.label == call.label and child.call.same_session_as(call)


def _failed(call: StepCall, started: float, sid: str | None, error: str) -> StepResult:
    return StepResult(
        step=call.label,
        session_id=sid,
        ok=False,
        error=error,
        started_at=started,
        ended_at=time.time(),
        attempts=call.attempt,
    )
