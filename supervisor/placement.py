"""The supervisor's placement: every attempt of a step runs in a forked step child.

The parent's whole view of its children lives here: forking (through the process tree
object, :data:`flower.core.proctree.PROCS`), the pipes, reading frames, reaping, stopping
trees, and *prepared* children — forked ahead of time for the steps likely to run next,
their CLI already started, so that only the prompt is left to send (``prepare``). A prepared
child that turns out not to be needed is told ``shutdown`` and exits without sending a
request; the flow never hears of it.

What an attempt is and what the loop above expects of it is written down in
:mod:`flower.core.placement`. A child that dies is one more failed attempt of that one loop:
its result says ``step child <pid> died without a result (<how>)``; a child that reports a
crash (``failure`` with ``retryable: false``) raises :class:`flower.AttemptCrash`.
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
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from flower import AttemptCrash
from flower.core.call import StepCall
from flower.core.placement import Seat, Watch
from flower.core.proctree import PROCS, ProcessTree, describe_status
from flower.core.result import StepResult
from ipc import (
    Answer,
    Ask,
    EventMsg,
    Failure,
    Hello,
    Interrupt,
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

#: How a dead child's attempt is described (the terminal recognises it).
DIED = "died without a result"


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

    @property
    def parent_fds(self) -> tuple[int, int]:
        return (self.read_fd, self.write_fd)

    def send(self, msg: Message) -> bool:
        """Send a message; False when the child is gone (its pipe is closed)."""
        try:
            self.writer.send(msg)
            return True
        except (OSError, ProtocolError):
            return False

    async def interrupt(self) -> None:
        """What an interrupt of this attempt does: tell the child (it interrupts its CLI)."""
        self.send(Interrupt())

    async def messages(self) -> AsyncIterator[Message | ProtocolError]:
        """Every message the child sends, until EOF on its pipe."""
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
            except ChildProcessError:
                pid, status = self.pid, 0
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

    def stop(self, *, grace: float = 2.0) -> None:
        """SIGTERM (the child kills its own tree), then SIGKILL whatever is left. Blocking."""
        if self.poll() is not None:
            return
        self.procs.kill(self.pid, signal.SIGTERM)
        if not self._reaped_within(grace):
            self.procs.kill_tree(self.pid, pgid=self.pid)
            self._reaped_within(5.0)

    def _reaped_within(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.poll() is not None:
                return True
            time.sleep(0.01)
        return False

    def close(self) -> None:
        for fd in self.parent_fds:
            with contextlib.suppress(OSError):
                os.close(fd)


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
    ) -> None:
        self.procs = procs
        self.ask = ask  # puts a child's question to the person (only the supervisor has a terminal)
        self.children: dict[int, ChildHandle] = {}
        self.prepared: list[ChildHandle] = []
        self._reapers: set[asyncio.Task[int]] = set()
        self._closing: dict[str, asyncio.Task[int]] = {}  # session id -> its child's reaper
        self._asking: set[asyncio.Task[None]] = set()
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
        watch.on_handle(child)
        try:
            out, sid, problem = await self._converse(child, call, watch)
        except BaseException:
            self._retire(child)
            raise
        finally:
            watch.on_handle(None)
        if out is not None:
            self._reap_later(child, out.session_id)
            return out
        status = await self._reap(child)
        if isinstance(problem, Failure) and not problem.retryable:
            raise AttemptCrash(
                problem.kind, problem.message, detail=problem.cause or "", log=str(child.log_path)
            )
        if isinstance(problem, Failure):
            problem = f"step child failed: {problem.kind}: {problem.message}"
        text = problem or f"step child {child.pid} {DIED} ({describe_status(status)})"
        return _failed(call, started, sid, text)

    async def _converse(
        self, child: ChildHandle, call: StepCall, watch: Watch
    ) -> tuple[StepResult | None, str | None, str | Failure]:
        """Hand the child its ``start`` and read it to its result.

        Returns (its result, or None), the session id it reported, and why it gave no result.
        """
        sid: str | None = None
        child.started = True
        if not child.send(Start(**call.wire())):
            child.stop()
            status = await self._reap(child)
            how = describe_status(status)
            return (
                None,
                None,
                f"could not hand the step to child {child.pid} ({how} before reading it)",
            )
        async for item in child.messages():
            if isinstance(item, ProtocolError):
                child.stop()
                return None, sid, f"protocol error from step child: {item}"
            if isinstance(item, Session):
                if item.label != call.label:
                    child.stop()
                    return None, sid, f"protocol error from step child: session for {item.label!r}"
                sid = item.session_id
                watch.on_session(sid)
            elif isinstance(item, EventMsg):
                from flower.core.result import Event

                watch.on_event(Event(item.kind, item.step, dict(item.payload)))
            elif isinstance(item, Result):
                return StepResult.from_dict(item.fields), sid, ""
            elif isinstance(item, Ask):
                self._answer(child, item)
            elif isinstance(item, Failure):
                return None, sid, item
            elif not isinstance(item, Hello):
                return None, sid, f"unexpected message from step child: {type(item).__name__}"
        return None, sid, ""

    def _answer(self, child: ChildHandle, question: Ask) -> None:
        """Put the question to the person while the child's frames keep being read."""

        async def answer() -> None:
            text = await self.ask(question) if self.ask else None
            state = "answered" if text is not None else "closed"
            child.send(Answer(id=question.id, state=state, text=text))

        task = asyncio.get_running_loop().create_task(answer())
        self._asking.add(task)
        task.add_done_callback(self._asking.discard)

    # -- prepared children ----------------------------------------------------------------

    def prepare(self, calls: Sequence[StepCall], seat: Seat) -> None:
        """Keep a child ready for each of ``calls``; drop prepared ones no longer expected."""
        for child in list(self.prepared):
            if not any(_fits(child, c) for c in calls):
                self._drop(child)
        for call in calls:
            if any(_fits(child, call) for child in self.prepared):
                continue
            if call.resume and call.resume in self._closing:
                # Its CLI would load that session while the last one is still flushing it:
                # the attempt waits for that, then forks.
                continue
            try:
                self.prepared.append(self._spawn(call, seat))
            except OSError as exc:  # preparing is an optimisation: the attempt forks later
                log.debug("could not prepare a child for %s: %s", call.label, exc)

    def _take_prepared(self, call: StepCall) -> ChildHandle | None:
        for child in list(self.prepared):
            if not _fits(child, call):
                continue
            self.prepared.remove(child)
            if child.poll() is None:
                return child
            self._retire(child)  # it died waiting; a fresh child does the attempt
        return None

    def _drop(self, child: ChildHandle) -> None:
        """Shut a prepared child down: it exits without a request, its empty log goes too."""
        self.prepared.remove(child)
        if not child.send(Shutdown(reason="not needed")):
            child.stop(grace=0.0)
        self._reap_later(child, None, then=lambda: _remove_if_empty(child.log_path))

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
        reading the process table) is spared."""
        self.children.pop(child.pid, None)
        child.close()
        self.procs.killpg(child.pid)
        if not clean:
            self.procs.reap_orphans(keep=set(self.children))
        shutil.rmtree(child.tmp, ignore_errors=True)

    async def close(self) -> None:
        """Drop every prepared child and wait for children that already reported to exit."""
        for child in list(self.prepared):
            self._drop(child)
        while self._reapers:
            await asyncio.gather(*list(self._reapers), return_exceptions=True)

    def stop_now(self) -> None:
        """Stop every child and its whole tree (blocking, bounded): SIGTERM/SIGHUP, Ctrl-C twice."""
        self.prepared.clear()
        for child in list(self.children.values()):
            child.stop()
            self.children.pop(child.pid, None)
            child.close()


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


def _remove_if_empty(path: Path) -> None:
    with contextlib.suppress(OSError):
        if path.stat().st_size == 0:
            path.unlink()


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
