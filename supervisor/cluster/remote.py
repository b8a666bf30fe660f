"""Attempts on a cluster: the supervisor's Temporal placement, and what it shares with workers.

Each attempt of a step (a map item, a judge round) is a Temporal *standalone activity*
(:data:`ACTIVITY`) on a task queue, started with a deterministic id (run, label, the
placement's count of that label's dispatches) and ``REJECT_DUPLICATE``: a supervisor never
dispatches the same attempt twice. The id is on record (the run's registry, ``placed``) before
the activity starts, so a restarted supervisor finds every attempt its killed predecessor
dispatched — running, still waiting in the queue, or ended meanwhile — and attaches to it
(:attr:`flower.step.call.StepCall.attach`; starting an id that exists attaches to it). An attempt
the supervisor stops (SIGTERM, SIGHUP) ends for good: its worker fails it as not retryable.
A ``flower-super worker`` on any machine
runs it in a forked step child exactly as the supervisor runs one locally
(:mod:`supervisor.cluster.worker`).

Payloads carry ids and references (:class:`Order`): the flow to load, the workspace and its
identity, the step call with its agent by name and plain fields. Never an API key (a worker
takes its credentials from its own machine), never a transcript (those are in PostgreSQL).

**The channel.** What the attempt reports while it runs — its session id the instant it is
known, text, tool lines, handoff events, a question for the person — and what the supervisor
sends it — an interrupt with what the person said, an answer, ``shutdown`` — travel as the very
``ipc`` frames a forked child writes on its pipe, kept in the state database's event rows
(one *mailbox* per attempt, up and down, :class:`Mailbox`) and woken by its LISTEN/NOTIFY.
Why there: heartbeat details carry only the newest value (throttled, so text and questions
would be lost); a standalone activity has no workflow to signal; the database is already
shared by every supervisor and worker, keeps the frames in order, durably, for a supervisor
that attaches later (it reads the mailbox from the start), and answers in about a millisecond.

Temporal's own job: place the attempt on a worker with a free slot, notice within
:data:`HEARTBEAT_TIMEOUT_S` that its worker is gone (killed or frozen), and start it again
elsewhere; the new worker continues the attempt's own session from PostgreSQL (its epoch
fences out the old one's writes), or, when the old one had sent the attempt's result before
it died, returns that result and runs nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import threading
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from flower import AttemptCrash, FlowerError
from flower.agents.wire import to_wire
from flower.i18n import define, t
from flower.services.temporal_client import (
    TemporalUnreachable,
    Where,
    check,
    connect,
    settings_for,
    unreachable,
)
from flower.state.backends import RunState
from flower.state.result import StepResult
from flower.step.call import StepCall
from flower.step.placement import Seat, Watch
from ipc import (
    Answer,
    Ask,
    EventMsg,
    Failure,
    Interrupt,
    Message,
    ProtocolError,
    Result,
    Session,
    Shutdown,
    decode,
    encode,
)
from supervisor.run.placement import answer_for, event_of

log = logging.getLogger("flower.supervisor")

define(
    {
        "remote.waiting": (
            "{error};这个队列的 worker {ago} 秒前还连着它,最多再等它 {seconds} 秒(Ctrl-C 停止)",
            "{error}; this queue's workers were on it {ago} s ago: waiting up to {seconds} s "
            "for it to come back (Ctrl-C to stop)",
        ),
        "remote.no_recipe": (
            "这个流程没法放到集群上跑:worker 不知道怎么重建它",
            "this flow cannot run on a cluster: a worker would not know how to build it",
        ),
        "remote.no_recipe.hint": (
            "用 --flow FILE.py:ATTR 或 package.module:ATTR 给出流程",
            "name the flow with --flow FILE.py:ATTR or package.module:ATTR",
        ),
        "remote.local_state": (
            "把步骤放到集群上跑,运行状态得在 PostgreSQL 里(现在是本地文件 {where})",
            "placing steps on a cluster needs the run state in PostgreSQL (it is in local "
            "files, {where})",
        ),
        "remote.local_state.hint": (
            "加 --state postgresql://… 或设 FLOWER_STATE",
            "add --state postgresql://… or set FLOWER_STATE",
        ),
        "remote.no_order": (
            "尝试 {id} 的指令不在运行状态数据库里(supervisor 还没写进去,或者写在了别的库)",
            "attempt {id}'s order is not in the state database (not written yet, or written "
            "to another database)",
        ),
        "remote.failed": (
            "在集群上的这次尝试没有结果:{why}",
            "the attempt on the cluster ended without a result: {why}",
        ),
        "remote.temporal_down": (
            "Temporal {where} 没有回应({why});正在跑的尝试照常进行,它回来后接着派发",
            "Temporal at {where} is not answering ({why}); the running attempts go on, and "
            "dispatch carries on when it is back",
        ),
    }
)

ACTIVITY = "flower.attempt"
T = TypeVar("T")
#: How long a worker may go without a heartbeat before its attempt goes elsewhere. With the
#: beat and the retry below, a killed or frozen worker's attempt starts on another worker
#: about 2.5 s after its death and sends its first request about 3 s after it
#: (scripts/bench_cluster.py, figure 3; issue 25 asks for at most 4 s).
HEARTBEAT_TIMEOUT_S = 2.5
#: A worker heartbeats this often (a fifth of the timeout: four lost beats are not a death).
HEARTBEAT_EVERY_S = 0.5
#: How soon Temporal gives an attempt whose worker is gone (or handed it back) to a worker.
RETRY_FIRST_S = 0.2
#: How long an attempt that resumes a session waits for the attempt before it (which sent
#: its result) to end, its CLI having flushed the session (a worker that died meanwhile:
#: its retry ends it at once, seeing the result).
CLOSING_WAIT_S = 30.0
#: An attempt that waited longer than this for a worker hints nobody (see ``prepare``):
#: steps queue for busy workers, and each lands on whichever frees first.
QUEUED_S = 3.0
#: After an activity ended, how long its last frames may take to arrive.
LAST_FRAMES_S = 3.0
#: How long an attempt may wait for a worker, and run, in all.
SCHEDULE_TO_CLOSE = timedelta(days=2)
ORDER_VERSION = 2  # 2: the call travels through the state database (order_key), not Temporal


# ---------------------------------------------------------------------------------------
# what an attempt carries
# ---------------------------------------------------------------------------------------


#: What an order says of where its attempt comes from (a hint says it too).
PLACED_FROM = ("run", "flow", "workspace", "workspace_id", "run_dir", "seat")


@dataclass
class Order:
    """One attempt as a worker gets it: ids and references, nothing secret."""

    id: str  # the activity id
    run: str  # the supervisor's run id
    flow: dict[str, Any]  # how to build the flow again (supervisor.cluster.worker.flow_of)
    workspace: str  # the workspace's path on the supervisor's machine
    workspace_id: str  # its identity: a worker checks it before running anything there
    run_dir: str  # where step logs go (its path on the supervisor's machine)
    seat: dict[str, Any]  # the Seat's plain settings
    # In Temporal: {"label": …} only. The call itself (StepCall.wire(), its prompt and the
    # agent as flower.agents.wire.to_wire) is in the state database under order_key(id):
    # a worker reads it there (take_order), so no prompt or model text is in Temporal.
    call: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"v": ORDER_VERSION, **self.__dict__}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Order:
        if data.get("v") != ORDER_VERSION:
            raise FlowerError(f"an attempt order of version {data.get('v')!r}")
        names = {"id", "run", "flow", "workspace", "workspace_id", "run_dir", "seat", "call"}
        missing = sorted(names - set(data))
        if missing:
            raise FlowerError(f"an attempt order without {', '.join(missing)}")
        return cls(**{k: data[k] for k in names})


def order_call(call: StepCall) -> dict[str, Any]:
    """``call`` as an order carries it: its wire, the agent by name and plain fields."""
    return {**call.wire(), "spec": to_wire(call.spec)}


def seat_settings(seat: Seat) -> dict[str, Any]:
    return {
        "portable": seat.portable,
        "spill_threshold": seat.spill_threshold,
        "no_auto_compact": seat.no_auto_compact,
        "workbench": str(seat.workbench.root) if seat.workbench is not None else None,
    }


# ---------------------------------------------------------------------------------------
# the mailbox
# ---------------------------------------------------------------------------------------


def up(activity_id: str) -> str:
    return f"attempt/{activity_id}/up"


def result_key(activity_id: str) -> str:
    """Where a worker keeps an attempt's result beside its ``Result`` frame: the one copy
    that outlives a lost frame (Temporal carries no step text to take it from)."""
    return f"attempt/{activity_id}/result"


def keep_result(rows: Any, activity_id: str, fields: dict[str, Any]) -> None:
    """The attempt's result, under :func:`result_key` (before its frame is sent)."""
    rows.append(result_key(activity_id), {"result": fields})


def order_key(activity_id: str) -> str:
    """Where an attempt's call waits for its worker (an event row of the state database)."""
    return f"attempt/{activity_id}/order"


def down(activity_id: str) -> str:
    return f"attempt/{activity_id}/down"


def hints_key(worker: str) -> str:
    """Where supervisors tell a worker which attempts to get ready (``prepare``)."""
    return f"worker/{worker}/prepare"


class Mailbox:
    """One attempt's frames, both ways, in the state database's event rows.

    ``send`` is synchronous (one insert; a signal handler may call it). Reading is
    :meth:`frames`, an async iterator fed by this process's :class:`Pump`.
    """

    def __init__(self, rows: Any, activity_id: str, pump: Pump) -> None:
        self.rows, self.id, self.pump = rows, activity_id, pump

    def send(self, key: str, msg: Message) -> bool:
        try:
            self.rows.append(key, {"line": encode(msg).decode("utf-8")})
            return True
        except (ProtocolError, FlowerError, OSError) as exc:
            log.warning("%s", t("remote.failed", why=exc))
            return False

    def read(self, key: str) -> list[Message]:
        """Every frame under ``key`` so far, decoded (one that does not decode is left
        out); raises what reading the database raises."""
        out: list[Message] = []
        for _, event in self.rows.read(key, 0):
            with contextlib.suppress(ProtocolError, TypeError, AttributeError):
                out.append(decode(str(event.get("line", ""))))
        return out

    async def frames(
        self, key: str, after: int = 0
    ) -> AsyncGenerator[Message | ProtocolError, None]:
        queue = self.pump.subscribe(key, after)
        try:
            while True:
                for line in await queue.get():
                    try:
                        yield decode(line)
                    except ProtocolError as exc:
                        yield exc
        finally:
            self.pump.unsubscribe(key, queue)


class Pump:
    """This process's one reader of every mailbox it follows: a thread that sleeps on the
    database's notifications of those mailboxes and reads only the ones they name (one
    listening connection for any number of attempts; another attempt's frames neither wake
    it nor cost a read, however many share the database). Every mailbox is read again every
    :data:`SWEEP_S` seconds, and whenever the database cannot say what changed (it was
    away, or a run_dir's files have no notifications). Between two sweeps it sleeps until a
    notification or a nudge (a new subscription, :meth:`close`): an idle pump costs its
    process nothing, which counts when fifty supervisors wait in a queue for four workers;
    rows that cannot say what changed are looked at every :data:`BLIND_S` seconds."""

    SWEEP_S = 5.0
    BLIND_S = 0.5

    def __init__(self, rows: Any) -> None:
        self.rows = rows
        self._subs: dict[str, list[tuple[asyncio.Queue[list[str]], list[int]]]] = {}
        self._new: set[str] = set()  # subscribed since the last look: read them at once
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = False

    def subscribe(self, key: str, after: int) -> asyncio.Queue[list[str]]:
        self._loop = asyncio.get_running_loop()
        queue: asyncio.Queue[list[str]] = asyncio.Queue()
        with self._lock:
            self._subs.setdefault(key, []).append((queue, [after]))
            self._new.add(key)
            self.rows.nudge()  # a wait for the others' events ends: this one is listened to
            if self._thread is None:
                self._stop = False
                self._thread = threading.Thread(
                    target=self._run, name="flower-mailbox", daemon=True
                )
                self._thread.start()
        return queue

    def unsubscribe(self, key: str, queue: asyncio.Queue[list[str]]) -> None:
        with self._lock:
            subs = [s for s in self._subs.get(key, []) if s[0] is not queue]
            if subs:
                self._subs[key] = subs
            else:
                self._subs.pop(key, None)

    def close(self) -> None:
        with self._lock:
            self._stop = True
            self._subs.clear()
        self.rows.nudge()  # its thread ends now, not at the end of its sleep

    def _run(self) -> None:
        changed: set[str] | None = None  # None: every mailbox
        blind = True  # the rows' last answer could not say what changed
        swept = 0.0
        while True:
            now = time.monotonic()
            if now - swept >= self.SWEEP_S:
                changed = None
            if changed is None:
                swept = now
            with self._lock:
                if self._stop or not self._subs:
                    self._thread = None
                    return
                look = changed if changed is None else changed | self._new
                self._new.clear()
                keys = set(self._subs)
                subs = [
                    (k, q, pos)
                    for k, lst in self._subs.items()
                    if look is None or k in look
                    for q, pos in lst
                ]
            away = False
            for key, queue, pos in subs:
                try:
                    rows = self.rows.read(key, pos[0])
                except Exception:  # noqa: BLE001 - the database is away: look again later
                    away = True
                    break
                if rows:
                    pos[0] = rows[-1][0]
                    lines = [str(e.get("line", "")) for _, e in rows if isinstance(e, dict)]
                    if self._loop is not None:
                        self._loop.call_soon_threadsafe(queue.put_nowait, lines)
            if away:
                time.sleep(self.BLIND_S)
                changed = None
                continue
            sweep_in = self.SWEEP_S - (time.monotonic() - swept)
            try:
                changed = self.rows.changed(self.BLIND_S if blind else max(0.05, sweep_in), keys)
            except Exception:  # noqa: BLE001 - the database is away: look at all, later
                time.sleep(self.BLIND_S)
                changed = None
            blind = changed is None


#: The Temporal runtimes this process made. They are never let go: a runtime collected while
#: one of its core threads waits for the GIL (to hand a late RPC's answer to a cancelled
#: task) hangs the process for good, the collecting thread joining that core thread while
#: holding the GIL (seen at the end of finished runs: "Garbage-collecting", one thread with
#: no Python frame). So the process ends through :func:`leave`.
_RUNTIMES: list[Any] = []


def leave(code: int) -> int:
    """The exit status ``code`` of a command that may have placed attempts on Temporal:
    when this process made a Temporal runtime, it ends here and now, its output flushed
    (every write that matters is durable by then: the state's writes are synchronous or
    fsynced to the spool), without the interpreter's finalization, which would drop the
    runtime. Otherwise ``code`` is returned for a normal exit."""
    if not _RUNTIMES:
        return code
    import os
    import sys

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


# ---------------------------------------------------------------------------------------
# choosing it (before anything runs)
# ---------------------------------------------------------------------------------------

PLACEMENT_ENV = "FLOWER_PLACEMENT"


def choose_placement(
    given: str | None,
    workspace: Path,
    state: RunState,
    *,
    wait_s: float = 0.0,
    waiting: Callable[[str], None] | None = None,
) -> str | None:
    """Where this start places its attempts: ``--placement`` as given, else
    ``FLOWER_PLACEMENT`` as a start in ``workspace`` finds it (the environment, then the
    ``.env`` files of the credentials lookup order); None: forked children here.

    Checked before anything runs (nothing sent to the model, nothing on record): an address
    that is not ``temporal://HOST:PORT/QUEUE``, a cluster with the run state in local files,
    a Temporal service that cannot be reached (TLS or credentials refused included) and a
    namespace it does not have are each one line with a hint
    (:mod:`flower.services.temporal_client`), except a service this queue's workers were
    on a moment ago: a restart, waited for up to ``wait_s`` (one line to ``waiting``)."""
    from flower.people.credentials import lookup

    url = (given if given is not None else lookup(PLACEMENT_ENV, workspace) or "").strip()
    if not url:
        return None
    where = Where.parse(url)
    _shared_state(state)
    found = settings_for(where)
    try:
        check(found)
    except TemporalUnreachable as exc:
        ago = _workers_were_on(state, where.queue, found.describe())
        if ago is None or wait_s <= 0:
            raise  # nobody was ever seen there: a wrong address, said at once
        _back_soon(found, exc, ago, wait_s, waiting)
    return str(where)


#: How long ago a worker of the queue last reported being on the service for a start to
#: take the service's silence for a restart and wait for it.
KNOWN_S = 600.0


def _workers_were_on(state: RunState, queue: str, target: str) -> float | None:
    """How many seconds ago a worker of ``queue`` on ``target`` (the service as
    ``Settings.describe`` names it: address, namespace, TLS) last reported (its row in the
    state: ``flower-super workers``), when within :data:`KNOWN_S`; None otherwise."""
    try:
        rows = state.workers.rows(queue)
    except Exception:  # noqa: BLE001 - cannot say: the address is as good as unknown
        return None
    ago = [
        float(r["now"]) - float(r["heartbeat_at"])
        for r in rows
        if r.get("target") == target and r.get("heartbeat_at") is not None
    ]
    return min(ago) if ago and min(ago) <= KNOWN_S else None


def _back_soon(
    found: Any,
    first: TemporalUnreachable,
    ago: float,
    wait_s: float,
    waiting: Callable[[str], None] | None,
) -> None:
    """The service this queue's workers were on does not answer: a restart, as a
    database's is (a start waits for one as long), one line saying so; then the check
    again until it passes, or its last error after ``wait_s``."""
    if waiting is not None:
        waiting(t("remote.waiting", error=first.message, ago=round(ago), seconds=round(wait_s)))
    deadline, pause = time.monotonic() + wait_s, 0.5
    while True:
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        try:
            check(found)
            return
        except TemporalUnreachable:
            if time.monotonic() >= deadline:
                raise
        pause = min(pause * 2, 2.0)


def cluster_placement(
    url: str | None,
    state: RunState,
    wf: Any,
    ask: Callable[[Ask], Awaitable[str | None]] | None,
    *,
    trim: bool,
    keep_denials: int = 1,
) -> TemporalPlacement | None:
    """The placement a start on a cluster runs its attempts with (None for ``url`` None:
    forked here), built before the Runtime: a flow no worker could build again is refused
    here, before anything runs. Questions from its attempts are served on ``wf``'s channel."""
    if not url:
        return None
    from supervisor.run.flows import recipe_of

    recipe = recipe_of(wf)
    if recipe is None:
        raise FlowerError(t("remote.no_recipe"), hint=t("remote.no_recipe.hint"))
    return TemporalPlacement(
        Where.parse(url),
        state,
        recipe,
        ask=ask,
        store={"trim": bool(trim), "keep_denials": keep_denials},
        channel=wf.channel,
    )


def _shared_state(state: RunState) -> None:
    if not state.shared:
        raise FlowerError(
            t("remote.local_state", where=state.where),
            hint=t("remote.local_state.hint"),
        )


# ---------------------------------------------------------------------------------------
# the supervisor's placement
# ---------------------------------------------------------------------------------------


@dataclass
class _Remote:
    """Whatever an interrupt of a remote attempt reaches: its mailbox."""

    mailbox: Mailbox

    async def interrupt(self) -> None:
        self.mailbox.send(down(self.mailbox.id), Interrupt())


@dataclass
class TemporalPlacement:
    """Each attempt a Temporal activity on ``where``'s queue; see the module docstring."""

    where: Where
    state: RunState  # the run state (PostgreSQL): the mailboxes are its event rows
    flow: dict[str, Any]
    ask: Callable[[Ask], Awaitable[str | None]] | None = None
    store: dict[str, Any] = field(default_factory=dict)  # the Runtime's trim, keep_denials
    # The flow's HumanChannel here. A worker builds the flow again, so a question from one
    # of its attempts names the worker's copy of the channel (another process's key, which
    # means nothing here): every such question is served by this one, the channel whose
    # person is at this terminal (one from an attempt an earlier supervisor placed too).
    # A flow with several channels has its remote questions all served by this one.
    channel: Any = None
    _sent: dict[str, int] = field(default_factory=dict)
    _client: Any = None
    _runtime: Any = None
    _pump: Pump | None = None
    # id -> what stops it: its mailbox, and its watch (which takes it off the record)
    _running: dict[str, tuple[Mailbox, Watch]] = field(default_factory=dict)
    _outage: _Outage | None = None
    # the workers that took this run's last two attempts (names): where prepare() hints
    # go, and the one hinted last (told to drop what it prepared when the hints go elsewhere)
    _landed: list[str] = field(default_factory=list)
    _hinted: str | None = None
    _seat: Seat | None = None
    _expected: list[StepCall] = field(default_factory=list)  # the last prepare()'s calls
    # session id -> the end of the attempt whose CLI may still be flushing it
    _closing: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _shared_state(self.state)

    async def connect(self) -> None:
        """Reach Temporal now (the start checked it already: this is the run's own client);
        a service that went away since is waited for (:class:`_Outage`)."""
        from temporalio.runtime import Runtime, TelemetryConfig

        if self._client is not None:
            return
        if self._runtime is None:
            # No core logging: its WARN lines (coloured, on stderr) are not the person's, and
            # forwarding them to a Python logger deadlocked an exit here (the runtime, being
            # collected, joined a core thread that waited for the GIL to log).
            self._runtime = Runtime(telemetry=TelemetryConfig(logging=None))
            _RUNTIMES.append(self._runtime)  # never collected: see leave()
        outage = self.outage
        while True:
            try:
                self._client = await connect(settings_for(self.where), self._runtime, check=False)
            except FlowerError as exc:
                if not outage.transient(exc):
                    raise
                await outage.wait(exc)
                continue
            outage.over()
            return

    @property
    def outage(self) -> _Outage:
        if self._outage is None:
            self._outage = _Outage(self.where.target)
        return self._outage

    def _mailbox(self, activity_id: str) -> Mailbox:
        if self._pump is None:
            self._pump = Pump(self.state.mailboxes)
        return Mailbox(self.state.mailboxes, activity_id, self._pump)

    def _next_id(self, call: StepCall, run: str) -> str:
        n = self._sent.get(call.label, 0) + 1
        self._sent[call.label] = n
        return f"flower/{run}/{call.label}/{n}"

    async def attempt(self, call: StepCall, seat: Seat, watch: Watch) -> StepResult:
        from temporalio.common import ActivityIDConflictPolicy, ActivityIDReusePolicy, RetryPolicy
        from temporalio.exceptions import ActivityAlreadyStartedError

        await self.connect()
        closing = self._closing.get(call.resume or "")
        if closing is not None:
            # That session's CLI (an attempt that reported its result) is still exiting on
            # its worker, flushing its last entries: resume only once they are stored.
            # (A cancellation of this attempt meanwhile goes through.)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(closing), CLOSING_WAIT_S)
        started = time.time()
        self._seat = seat
        activity_id = call.attach or self._next_id(call, seat.run)
        mailbox = self._mailbox(activity_id)
        # On record before it starts: a supervisor killed from then on finds the id and
        # attaches to it, even while it waits in the queue for a worker (where it runs comes
        # with the worker's ``placed`` frame, once one takes it).
        watch.on_placed({"id": activity_id})
        # Started with its deterministic id, or attached to when that id exists already: an
        # attempt a killed supervisor left (running, queued or ended) is never started twice,
        # and one it had put on record but not yet started is started now.
        try:
            # The call (its prompt) goes to the state database; Temporal gets its label.
            # Attaching to an attempt a killed supervisor left, its order is there already.
            rows = self.state.mailboxes
            if not (call.attach and rows.read(order_key(activity_id), 0)):
                rows.append(order_key(activity_id), {"call": order_call(call)})
            order = Order(id=activity_id, **self._placed_from(seat), call={"label": call.label})
            while True:  # a Temporal that went away is waited for (the id makes it once)
                try:
                    handle = await self.outage.watch(
                        self._client.start_activity(
                            ACTIVITY,
                            order.to_dict(),
                            id=activity_id,
                            task_queue=self.where.queue,
                            schedule_to_close_timeout=SCHEDULE_TO_CLOSE,
                            heartbeat_timeout=timedelta(seconds=HEARTBEAT_TIMEOUT_S),
                            id_reuse_policy=ActivityIDReusePolicy.REJECT_DUPLICATE,
                            id_conflict_policy=ActivityIDConflictPolicy.FAIL,
                            retry_policy=RetryPolicy(
                                initial_interval=timedelta(seconds=RETRY_FIRST_S),
                                backoff_coefficient=1.0,
                                maximum_interval=timedelta(seconds=2),
                            ),
                            summary=f"{call.label} (run {seat.run})",
                        )
                    )
                except Exception as exc:
                    if not self.outage.transient(exc):
                        raise
                    await self.outage.wait(exc)
                    continue
                self.outage.over()
                break
        except ActivityAlreadyStartedError:
            handle = self._client.get_activity_handle(activity_id)
        self._running[activity_id] = (mailbox, watch)
        watch.on_handle(_Remote(mailbox))
        returned = False
        # Attached to an attempt an earlier supervisor followed: its frames are read again
        # from the first, and a question that supervisor had answered is not asked again.
        answered = _answered(mailbox) if call.attach else set()
        try:
            out = await self._follow(call, mailbox, handle, watch, started, answered)
            returned = True
            if out.session_id:
                self._closing_until_ended(out.session_id, handle)
            return out
        finally:
            watch.on_handle(None)
            self._running.pop(activity_id, None)
            # An attempt that returned stays on record until the Runtime has written its
            # step's row: a supervisor killed in between must find it and take its result
            # again, not continue the step's session as if it had never ended.
            if not returned:
                watch.on_placed(None)

    async def _follow(
        self,
        call: StepCall,
        mailbox: Mailbox,
        handle: Any,
        watch: Watch,
        started: float,
        answered: set[str],
    ) -> StepResult:
        """Read the attempt's frames to its result; the activity's end settles what the
        frames could not (it failed for good, or was cancelled)."""
        done = asyncio.ensure_future(_outcome(handle, self.outage))
        frames = mailbox.frames(up(mailbox.id))
        asking: set[asyncio.Task[None]] = set()
        try:
            while True:
                nxt = asyncio.ensure_future(anext(frames))
                first, _ = await asyncio.wait({nxt, done}, return_when=asyncio.FIRST_COMPLETED)
                if nxt not in first:
                    # The activity ended: the frames it wrote before it did are on their way.
                    try:
                        item = await asyncio.wait_for(nxt, LAST_FRAMES_S)
                    except TimeoutError:
                        ended = done.result()
                        kept = _result_in(mailbox) if ended is None else None
                        if kept is not None:  # its result, though the frame came late
                            return kept
                        why = ended or "it returned without a result frame"
                        return _failed(call, started, t("remote.failed", why=why))
                else:
                    item = nxt.result()
                if isinstance(item, Ask) and item.id in answered:
                    continue
                out = self._take(call, mailbox, item, watch, asking, started)
                if out is not None:
                    return out
        finally:
            done.cancel()
            for task in asking:
                task.cancel()
            await frames.aclose()

    def _take(
        self,
        call: StepCall,
        mailbox: Mailbox,
        item: Message | ProtocolError,
        watch: Watch,
        asking: set[asyncio.Task[None]],
        started: float,
    ) -> StepResult | None:
        if isinstance(item, Result):
            return StepResult.from_dict(item.fields)
        if isinstance(item, Failure):
            if not item.retryable:
                raise AttemptCrash(item.kind, item.message, detail=item.cause or "")
            return _failed(call, time.time(), f"step child failed: {item.kind}: {item.message}")
        if isinstance(item, Session):
            watch.on_session(item.session_id)
        elif isinstance(item, EventMsg):
            ev = event_of(item)
            if ev.kind == "placed":
                watch.on_placed({"id": mailbox.id, **ev.payload})
                if ev.payload.get("worker"):
                    waited = time.time() - started
                    self._worker_known(str(ev.payload["worker"]), call.label, waited)
            watch.on_event(ev)
        elif isinstance(item, Ask):
            if item.channel and self.channel is not None:
                item = dataclasses.replace(item, channel=self.channel.key)

            async def answer(q: Ask = item) -> None:
                mailbox.send(down(mailbox.id), await answer_for(q, self.ask))

            task = asyncio.get_running_loop().create_task(answer())
            asking.add(task)
            task.add_done_callback(asking.discard)
        return None

    def _closing_until_ended(self, sid: str, handle: Any) -> None:
        """A worker sends an attempt's result before its CLI has exited (the flow goes on at
        once); the activity ends once it has: until then ``sid`` counts as closing."""

        async def ended() -> None:
            with contextlib.suppress(Exception):
                await _outcome(handle, self.outage)

        task = asyncio.get_running_loop().create_task(ended())
        self._closing[sid] = task

        def forget(done: asyncio.Task[None]) -> None:
            if self._closing.get(sid) is done:
                del self._closing[sid]

        task.add_done_callback(forget)

    def _placed_from(self, seat: Seat) -> dict[str, Any]:
        """Where an attempt of this run comes from, as an :class:`Order` carries it."""
        return {
            "run": seat.run,
            "flow": self.flow,
            "workspace": str(seat.workspace),
            "workspace_id": self.state.workspace_id,
            "run_dir": str(seat.tmp.parent),
            "seat": {**seat_settings(seat), **self.store},
        }

    def prepare(self, calls: Sequence[StepCall], seat: Seat) -> None:
        """Get ``calls`` ready where this run's attempts keep landing: a hint in the state
        database (:func:`hints_key`) to the worker that took its last two attempts, which
        forks their children and starts their CLIs as the local fork does, so an attempt
        that lands there only sends its prompt. Temporal gives an attempt to any worker of
        the queue: a run whose attempts move from worker to worker (several idle ones take
        turns) hints nobody, since what is got ready would mostly start a CLI for nothing.
        A worker hinted before is told to drop what it prepared."""
        # a session still being flushed is not loaded ahead (the CLI would load a stale copy)
        self._expected = [c for c in calls if (c.resume or "") not in self._closing]
        self._seat = seat
        self._hint_where_warm(self._expected)

    def _worker_known(self, worker: str, running: str, waited: float) -> None:
        """An attempt (of label ``running``) was taken by ``worker`` after ``waited``
        seconds. Once two in a row landed there, it hears what is expected next at once
        (but the step it runs now), so that step's child gets ready while this one runs.
        An attempt that waited in the queue for a worker starts the count again: with more
        steps than slots, the next lands on whichever worker frees first (measured with
        50 flows on 4 workers: a tenth of the CLIs were started for nothing)."""
        queued = waited > QUEUED_S
        self._landed = [] if queued else [*self._landed[-1:], worker]
        if (queued or self._hinted != worker) and self._seat is not None:
            self._hint_where_warm([c for c in self._expected if c.label != running])

    def _hint_where_warm(self, calls: Sequence[StepCall]) -> None:
        stable = len(self._landed) == 2 and self._landed[0] == self._landed[1]
        target = self._landed[-1] if stable else None
        if self._hinted and self._hinted != target and self._seat is not None:
            self._hint(self._hinted, self._seat, [])
        self._hinted = target
        if target is not None and self._seat is not None:
            self._hint(target, self._seat, calls)

    def _hint(self, worker: str, seat: Seat, calls: Sequence[StepCall]) -> None:
        hint = {**self._placed_from(seat), "calls": [order_call(c) for c in calls]}
        try:  # a hint lost is an attempt started cold, nothing worse
            self.state.mailboxes.append(hints_key(worker), {"line": json.dumps(hint)})
        except (FlowerError, OSError) as exc:
            log.debug("could not hint %s: %s", worker, exc)

    async def close(self) -> None:
        if self._hinted and self._seat is not None:
            self._hint(self._hinted, self._seat, [])  # what it prepared for us is not needed
        self._hinted = None
        for task in list(self._closing.values()):
            task.cancel()
        if self._pump is not None:
            self._pump.close()
        self._client = None

    def stop_now(self) -> None:
        """SIGTERM/SIGHUP, Ctrl-C twice: every running attempt is told to stop (its worker
        ends its process tree); synchronous, so a signal handler can."""
        if self._hinted and self._seat is not None:  # nothing more is placed: drop it
            self._hint(self._hinted, self._seat, [])
            self._hinted = None
        for mailbox, watch in list(self._running.values()):
            mailbox.send(down(mailbox.id), Shutdown(reason="the supervisor stopped"))
            # Its session may have been told to the worker's child (whose tool calls then
            # ran) while the frame naming it was on its way here: lineage names it before
            # the attempt goes off record, or the next start would begin the step afresh.
            try:
                frames = mailbox.read(up(mailbox.id))
            except Exception:  # noqa: BLE001 - the database is away
                # It stays on record: the next start attaches to it, reads its frames (its
                # session among them), sees it stopped and continues that session.
                continue
            sids = [m.session_id for m in frames if isinstance(m, Session)]
            if sids:
                watch.on_session(sids[-1])
            # Off the record: the next start of this flow must not attach to an attempt
            # that was told to stop (it would show it failing, then dispatch again).
            watch.on_placed(None)
        self._running.clear()


def _answered(mailbox: Mailbox) -> set[str]:
    """The ids of the questions an attempt was sent answers to (its down mailbox)."""
    try:
        frames = mailbox.read(down(mailbox.id))
    except Exception:  # noqa: BLE001 - the database is away: a question may be asked twice
        return set()
    return {item.id for item in frames if isinstance(item, Answer)}


async def _outcome(handle: Any, outage: _Outage) -> str | None:
    """How the activity ended (it waits for the end): None when it returned (its result is
    the attempt's ``Result`` frame in the mailbox: Temporal carries no step text), else
    why it gave none. A Temporal that went away meanwhile is waited for: the attempt runs
    on its worker all the same, its frames come through the state database."""
    while True:
        try:
            await outage.watch(handle.result())
        except Exception as exc:  # noqa: BLE001 - said as the attempt's error
            if outage.transient(exc):
                await outage.wait(exc)
                continue
            cause = getattr(exc, "cause", None)
            return str(cause or exc)
        outage.over()
        return None


class _Outage:
    """Temporal not answering, mid-run: one ``!`` line per outage, then waits that grow
    (0.25 s to 4 s) until a call goes through again. The start's checks found it, so an
    unreachable service now is an outage (a restart, a network cut), not a mistake."""

    PROBE_S = 2.0  # while a call waits, this often a look whether the service is there

    def __init__(self, where: str) -> None:
        self.where = where
        self.tries = 0

    async def watch(self, call: Awaitable[T]) -> T:
        """``await call``, looking every :data:`PROBE_S` whether Temporal still takes
        connections: the SDK retries a call through a short outage by itself, silently,
        and a person should still hear of it (one line)."""
        task = asyncio.ensure_future(call)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=self.PROBE_S)
                if done:
                    out = task.result()
                    self.over()
                    return out
                why = await asyncio.to_thread(unreachable, self.where)
                if why is not None and self.tries == 0:
                    log.warning("%s", t("remote.temporal_down", where=self.where, why=why))
                    self.tries = 1
        finally:
            if not task.done():
                task.cancel()

    @staticmethod
    def transient(exc: BaseException) -> bool:
        from temporalio.service import RPCError, RPCStatusCode

        if isinstance(exc, RPCError):
            return exc.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED)
        return isinstance(exc, TemporalUnreachable)  # connect's own verdict

    async def wait(self, exc: BaseException) -> None:
        if self.tries == 0:
            log.warning("%s", t("remote.temporal_down", where=self.where, why=_short(exc)))
        self.tries += 1
        await asyncio.sleep(min(4.0, 0.25 * 2 ** min(self.tries, 5)))

    def over(self) -> None:
        self.tries = 0


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 160 else text[:159] + "…"


def _result_in(mailbox: Mailbox) -> StepResult | None:
    """The attempt's result as its worker sent it to the mailbox (its frame, else the copy
    it kept under :func:`result_key`), if it did."""
    with contextlib.suppress(Exception):
        for item in reversed(mailbox.read(up(mailbox.id))):
            if isinstance(item, Result):
                return StepResult.from_dict(item.fields)
        for _, kept in reversed(mailbox.rows.read(result_key(mailbox.id), 0)):
            if isinstance(kept.get("result"), dict):
                return StepResult.from_dict(kept["result"])
    return None


async def take_order(rows: Any, activity_id: str, wait_s: float) -> dict[str, Any]:
    """The call of attempt ``activity_id`` from the state database (waiting up to
    ``wait_s`` for it: a supervisor that wrote it during an outage delivers it later).
    Raises FlowerError when it is not there."""
    key = order_key(activity_id)
    deadline = time.monotonic() + wait_s
    while True:
        found = await asyncio.to_thread(rows.read, key, 0)
        if found:
            call = found[-1][1].get("call")
            if isinstance(call, dict):
                return call
        left = deadline - time.monotonic()
        if left <= 0:
            raise FlowerError(t("remote.no_order", id=activity_id))
        await asyncio.to_thread(rows.wait, key, 0, min(left, 5.0))


def _failed(call: StepCall, started: float, error: str) -> StepResult:
    return StepResult(
        step=call.label,
        ok=False,
        error=error,
        started_at=started,
        ended_at=time.time(),
        attempts=call.attempt,
    )
