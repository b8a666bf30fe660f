"""The step child: forked by the supervisor, runs ONE attempt of a step, reports, exits.

It is forked (not exec'd) from a supervisor that has already imported the SDK and loaded
the flow, so it starts in milliseconds and holds the very AgentSpec object (hooks,
in-process MCP servers and all) the supervisor resolved. It starts the attempt's CLI at once
(:meth:`SdkAttempt.connect`), even before its ``start`` frame arrives, so a child forked ahead
of time (a *prepared* child) only has the prompt left to send. It talks only over its two
pipe descriptors: its stdout/stderr go to the step's log file, so a stray print cannot break
the protocol.

The attempt is flower's one attempt (:class:`flower.step.attempt.SdkAttempt`); retries,
backoff, interrupts and handoffs are the supervisor's step loop, not the child's.

Its whole tree (the CLI, the tool shells) dies with it: it is its own process group and a
subreaper, it gets SIGTERM when the supervisor dies (even by SIGKILL), and SIGTERM, SIGHUP
or EOF on the parent's pipe all end in killing every descendant.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flower.people.human import set_relay
from flower.state.ledger import when_superseded
from flower.state.result import Event, jsonable
from flower.step.attempt import Closer, SdkAttempt, crash_of
from flower.step.call import StepCall
from flower.step.interrupts import Interrupts
from flower.step.placement import Seat, Watch
from flower.step.proctree import PROCS
from flower.util.fsutil import open_private, private_dir
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

MAX_TEXT_BYTES = 4 * 1024 * 1024  # half the protocol's line bound, leaving room for the rest


@dataclass
class ChildSetup:
    """What the forked child gets from its parent's memory."""

    call: StepCall  # the attempt to run (its prompt may still be unknown: see ``start``)
    seat: Seat
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
    before = set(sys.modules)
    try:
        return loop.run_until_complete(_serve(setup))
    finally:
        PROCS.kill_descendants()
        _close_store(setup.seat.store)
        imported = sorted(set(sys.modules) - before)
        if imported:  # each costs every child again: the supervisor should preload it
            print(f"--- imported during the attempt: {' '.join(imported)}", flush=True)


def _close_store(store: Any) -> None:
    """Close this process's connection to sessions.db: the last one to close copies the WAL
    back into the database, so a finished run leaves no ``-wal`` file behind."""
    close = getattr(store, "close", None)
    if close is not None:
        try:
            close()
        except Exception as exc:  # noqa: BLE001 - exiting anyway; the next open recovers the WAL
            print(f"flower step child: closing sessions.db: {exc}", file=sys.stderr)


def _isolate(setup: ChildSetup) -> None:
    """Own process group, subreaper, parent-death signal, quiet stdio, clean signal state."""
    os.setpgid(0, 0)
    PROCS.become_subreaper()
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _die)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides what an interrupt is
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    PROCS.forked()  # our own handlers are in place: a pending SIGTERM now runs _die
    PROCS.die_with_parent(signal.SIGTERM, parent=setup.parent_pid)
    # A newer attempt took this session over (our worker was frozen and has woken up after
    # the takeover): the whole tree ends before the CLI runs a tool or asks the model again.
    when_superseded(lambda: _die(signal.SIGTERM, None))
    # The SDK materialises a resumed session (transcript, credentials) in a temporary
    # directory and removes it when the attempt ends; if this child is killed it cannot, so
    # the directory lives in the run_dir, where the supervisor removes it once we are reaped.
    tempfile.tempdir = str(private_dir(setup.seat.tmp / str(os.getpid())))
    for fd in setup.close_fds:
        with contextlib.suppress(OSError):
            os.close(fd)
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
    PROCS.kill_descendants()
    os._exit(128 + signum)


class _Child:
    """The child's side of the conversation with the supervisor."""

    def __init__(self, setup: ChildSetup) -> None:
        self.setup = setup
        self.out = LineWriter(setup.write_fd)
        self.reader = LineReader()
        self.started: asyncio.Future[Start] = asyncio.get_running_loop().create_future()
        self.interrupts = Interrupts()
        self.watch = Watch(
            on_session=self.on_session, on_event=self.on_event, on_handle=self.interrupts.attach
        )
        self.attempt = SdkAttempt(setup.call, setup.seat, self.watch)
        self.work: asyncio.Task[int] | None = None
        self.pending: set[asyncio.Task[None]] = set()
        self.questions: dict[str, asyncio.Future[str]] = {}
        # Sessions the supervisor has recorded (Kept): the tool ledger holds a new session's
        # first call until then. A session resumed (not forked) is on record already.
        self.kept: dict[str, asyncio.Event] = {}
        if setup.call.resume and not setup.call.fork:
            self._kept(setup.call.resume).set()
        ledger = getattr(setup.seat.store, "ledger", None)
        if ledger is not None:
            ledger.kept = self.session_kept
        # A HumanChannel's tools in this child put their calls to the supervisor's copy of
        # the channel: only the supervisor talks to the person and keeps the log and quota.
        set_relay(self.relay)

    async def relay(self, channel: Any, op: str, args: dict[str, Any]) -> str:
        qid = f"{os.getpid()}-{len(self.questions)}-{id(args):x}"
        answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.questions[qid] = answer
        options = args.get("options") or []
        sent = self.send(
            Ask(
                id=qid,
                question=str(args.get("question") or ""),
                options=[str(o) for o in options] if isinstance(options, list) else [],
                kind=op,
                channel=str(channel.key),
            )
        )
        nobody = str(getattr(channel, "timeout_text", "") or "无人应答。按你自己的判断继续。")
        if not sent:  # the question could not be put (e.g. text the protocol refuses)
            self.questions.pop(qid, None)
            return nobody
        try:
            return await answer or nobody  # "closed": the supervisor could not ask
        finally:
            self.questions.pop(qid, None)

    def _kept(self, sid: str) -> asyncio.Event:
        return self.kept.setdefault(sid, asyncio.Event())

    async def session_kept(self, sid: str) -> None:
        """Until the supervisor has recorded session ``sid`` (a kill then resumes it)."""
        await self._kept(sid).wait()

    def send(self, msg: Message) -> bool:
        try:
            self.out.send(msg)
        except OSError:
            _die(signal.SIGTERM, None)  # nobody is listening: the supervisor is gone
        except ProtocolError as exc:  # a message we built badly: report it, keep going
            print(f"flower step child: could not send {type(msg).__name__}: {exc}", file=sys.stderr)
            return False
        return True

    def on_readable(self) -> None:
        try:
            data = os.read(self.setup.read_fd, 65536)
        except BlockingIOError:
            return
        items = self.reader.feed(data) if data else [*self.reader.eof(), EOFError()]
        for item in items:
            self.dispatch(item)

    def dispatch(self, item: Message | ProtocolError | EOFError) -> None:
        if isinstance(item, EOFError):
            _die(signal.SIGTERM, None)  # the supervisor died; PDEATHSIG may not exist here
        elif isinstance(item, ProtocolError):
            print(f"flower step child: bad line from supervisor: {item}", file=sys.stderr)
        elif isinstance(item, Start) and not self.started.done():
            self.started.set_result(item)
        elif isinstance(item, Interrupt):
            task = asyncio.get_running_loop().create_task(self.interrupts.request(""))
            self.pending.add(task)  # the loop keeps only a weak reference to a task
            task.add_done_callback(self.pending.discard)
        elif isinstance(item, Shutdown) and self.work is not None:
            self.work.cancel()
        elif isinstance(item, Kept):
            self._kept(item.session_id).set()
        elif isinstance(item, Answer):
            waiting = self.questions.get(item.id)
            if waiting is not None and not waiting.done():
                waiting.set_result(item.text or "")

    async def serve(self) -> int:
        self.send(Hello(pid=os.getpid()))
        connecting = asyncio.ensure_future(self.attempt.connect())  # before the prompt is known
        deferred: list[Closer] = []
        try:
            start = await self.started
            prepared = connecting.done()  # its CLI was started before its step came
            problem = _mismatch(start, self.setup.call)
            if problem:
                self.send(
                    Failure(kind="ProtocolError", message=problem, retryable=True, cause=None)
                )
                return 1
            print(f"--- {start.label}: attempt {start.attempt} (pid {os.getpid()})", flush=True)
            await connecting
            # Started ahead of time (or while the start was on its way): the workbench may
            # have changed since, or the CLI died meanwhile.
            if self.attempt.stale() or (prepared and self.attempt.lost()):
                print(
                    "--- the CLI started ahead of time is gone or stale; starting it again",
                    flush=True,
                )
                await self.attempt.close()
                self.attempt = self.attempt.again()
                await self.attempt.connect()
            call = self.setup.call.attempting(
                prompt=start.prompt,
                attempt=start.attempt,
                stop_at=start.stop_at,
                headroom=start.headroom,
            )
            result = await self.attempt.run(call)
            self.send(Result(fields=_fields(result.to_dict())))
        finally:
            connecting.cancel()
            await self.attempt.close(defer=deferred)
        for close in deferred:  # the supervisor waits for our exit before resuming this session
            await close()
        return 0

    def on_session(self, sid: str) -> None:
        call = self.setup.call
        self.send(Session(label=call.label, step=call.step, session_id=sid))

    def on_event(self, event: Event) -> None:
        self.send(
            EventMsg(
                kind=event.kind,
                step=event.step,
                payload=jsonable(event.payload),
                text=event.text,
                tool=event.tool,
            )
        )


def _mismatch(start: Start, call: StepCall) -> str:
    """Why ``start`` is not the attempt this child's CLI was started for ('' when it is)."""
    want = call.wire()
    got = {k: getattr(start, k) for k in ("label", "step", "spec", "resume", "fork", "resume_at")}
    wrong = [k for k, v in got.items() if want[k] != v]
    return f"start does not match the prepared attempt in {', '.join(wrong)}" if wrong else ""


def _fields(fields: dict[str, Any]) -> dict[str, Any]:
    text = fields["text"]
    if len(text.encode("utf-8")) > MAX_TEXT_BYTES:  # keep the line under the pipe's bound
        cut = text.encode("utf-8")[:MAX_TEXT_BYTES].decode("utf-8", "ignore")
        fields["text"] = cut + "\n[…截断]"
    return dict(jsonable(fields))


async def _serve(setup: ChildSetup) -> int:
    os.set_blocking(setup.read_fd, False)
    child = _Child(setup)
    asyncio.get_running_loop().add_reader(setup.read_fd, child.on_readable)
    child.work = asyncio.ensure_future(child.serve())
    try:
        return await child.work
    except asyncio.CancelledError:  # shutdown: a prepared child not needed, or the step dropped
        return 0
    except Exception as exc:  # noqa: BLE001 - reported over the pipe as an explicit frame
        crash = crash_of(exc)
        traceback.print_exception(exc)
        sys.stderr.flush()
        child.send(
            Failure(
                kind=crash.kind, message=crash.text, retryable=False, cause=crash.detail[-4000:]
            )
        )
        return 1
