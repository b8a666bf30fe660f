"""``flower-super worker``: runs the attempts a supervisor placed on a Temporal task queue.

A worker is the supervisor's fork placement (:class:`supervisor.run.placement.Forked`) behind a
Temporal activity: each attempt runs in a forked step child exactly as on the supervisor's
machine — the same isolation, hooks, tool ledger and process-tree cleanup — with what the
child says relayed to the supervisor through the attempt's mailbox
(:mod:`supervisor.cluster.remote`), and what the supervisor says (an interrupt, an answer,
``shutdown``) relayed back.

Before it runs anything it loads the flow the attempt names and checks the workspace: it must
be reachable here (the same path, or ``--map FROM=TO``) and carry the identity the attempt
was placed with. An attempt it cannot run goes back to the queue with one line on its
terminal, never runs in the wrong directory.

A second try of the same attempt (its first worker died or froze) continues the attempt's
own session from PostgreSQL: the session its first try reported in the mailbox, resumed
with the neutral resume prompt; the ledger gives finished tool calls their results, and the
new attempt's epoch fences the old one out. When the old worker wakes, Temporal cancels its
activity and the worker ends its child's whole tree; if the child writes first, the
database refuses it and the child ends its own tree (``flower.state.ledger.when_superseded``).

Credentials come from this machine (the same lookup order as ``flower``); the state from
``--state`` or ``FLOWER_STATE`` and must be PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from flower import FlowerError
from flower.agents.wire import from_wire
from flower.i18n import define, t
from flower.services.temporal_client import connect, settings
from flower.state.backends import RunState
from flower.state.result import Event, StepResult, jsonable
from flower.step.attempt import handoff_at
from flower.step.call import StepCall
from flower.step.loop import model_key
from flower.step.placement import Seat, Watch
from ipc import Answer, Ask, EventMsg, Interrupt, Result, Session, Shutdown
from supervisor.cluster.remote import (
    ACTIVITY,
    HEARTBEAT_EVERY_S,
    PLACED_FROM,
    Mailbox,
    Order,
    Pump,
    down,
    hints_key,
    keep_result,
    take_order,
    up,
)
from supervisor.cluster.report import REPORT_EVERY_S, WorkerReport, metrics_failed
from supervisor.run.placement import Forked

log = logging.getLogger("flower.supervisor")

#: How often a worker reaps the dead processes it adopted (see :meth:`Attempts.reap`).
REAP_EVERY_S = 1.0
#: Runs a worker keeps prepared children for, per slot (the most recently hinted).
SPARE_RUNS = 2
#: Runs that hinted within this many seconds count as wanting this worker (see hinted()).
CONTENDED_S = 30.0
#: What was prepared for a run that has hinted nothing for this long is dropped (its
#: supervisor may be gone: a prepared CLI is an idle process, not a free one).
SPARE_TTL_S = 600.0
#: Every this many reaper rounds, what was prepared for runs whose supervisor is gone goes.
SPARE_CHECK_EVERY = 3
# How long a worker waits for an attempt's order to reach the state database (written
# there during an outage, it is delivered when the database is back) before handing the
# attempt back to the queue.
ORDER_WAIT_S = 20.0

define(
    {
        "worker.ready": (
            "-- worker {name} 在 {target} 的队列 {queue} 上等活(一次最多 {slots} 个)· 状态 {state}",
            "-- worker {name} takes attempts from queue {queue} at {target} ({slots} at once) "
            "· state {state}",
        ),
        "worker.took": (
            "> {label}  (run {run},第 {attempt} 次派发)",
            "> {label}  (run {run}, dispatch try {attempt})",
        ),
        "worker.done": ("+ {label}  {outcome}", "+ {label}  {outcome}"),
        "worker.interrupted": (
            "被打断了(supervisor 那边按了 Ctrl-C),同一个会话会接着做",
            "interrupted (Ctrl-C at its supervisor); the same session goes on",
        ),
        "worker.stopped": (
            "x {label}  停了:supervisor 叫停,或者租约没了(别的 worker 接手了);进程树已结束",
            "x {label}  stopped: its supervisor said so, or its lease is gone (another worker "
            "took it over); its process tree is ended",
        ),
        "worker.had_result": (
            "= {label}  上一次派发已经跑完(结果在它的信箱里),不再跑",
            "= {label}  an earlier try of it ended with a result (in its mailbox): not run again",
        ),
        "worker.fresh": (
            "~ {label}  上一次派发的会话 {session} 还没存下对话,接不上:用这一步自己的提示开新会话",
            "~ {label}  the earlier try's session {session} has no conversation stored and "
            "cannot be resumed: a fresh session starts with the step's own prompt",
        ),
        "worker.refused": (
            "! {label} 还回队列:{why}",
            "! {label} goes back to the queue: {why}",
        ),
        "worker.no_workspace": (
            "这台机器上没有工作区 {path}(用 --map FROM=TO 把它映射过来)",
            "the workspace {path} is not on this machine (map it with --map FROM=TO)",
        ),
        "worker.wrong_workspace": (
            "{path} 不是派活的那个工作区(身份 {found},要的是 {want})",
            "{path} is not the workspace the attempt came from (identity {found}, expected {want})",
        ),
        "worker.no_flow": (
            "加载不了流程 {ref}:{why}",
            "cannot load the flow {ref}: {why}",
        ),
        "worker.local_state": (
            "worker 需要 PostgreSQL 里的运行状态(--state 或 FLOWER_STATE),不能用本地文件",
            "a worker needs the run state in PostgreSQL (--state or FLOWER_STATE), not local files",
        ),
        "worker.local_state.hint": (
            "和 supervisor 用同一个 postgresql://… 地址",
            "use the same postgresql://… URL as the supervisor",
        ),
        "worker.stopping": (
            "-- 收到 {sig}:跑完手上的 {n} 个再退出(再来一次就交还给队列)",
            "-- {sig}: finishing the {n} running, then exiting (again: hand them back)",
        ),
        "worker.no_address": (
            "worker 不知道 Temporal 在哪:没给 --temporal,Temporal 的客户端配置里也没有地址",
            "the worker does not know where Temporal is: no --temporal, and no address in "
            "Temporal's client configuration",
        ),
        "worker.no_address.hint": (
            "给 --temporal HOST:PORT,或设 TEMPORAL_ADDRESS(或在 temporal.toml 的 profile 里写 "
            "address)",
            "give --temporal HOST:PORT, or set TEMPORAL_ADDRESS (or address in a temporal.toml "
            "profile)",
        ),
        "worker.map": (
            "--map 要写成 FROM=TO(两个绝对路径),不是 {text}",
            "--map must be FROM=TO (two absolute paths), not {text}",
        ),
    }
)


@dataclass
class WorkerConfig:
    target: str  # --temporal HOST:PORT; "": TEMPORAL_ADDRESS or the profile's
    queue: str
    slots: int
    state: str | None  # --state; None: $FLOWER_STATE
    maps: list[tuple[str, str]] = field(default_factory=list)
    name: str = ""
    namespace: str = ""  # --namespace; "": TEMPORAL_NAMESPACE, the profile's, or default
    metrics: str = ""  # --metrics HOST:PORT: serve Prometheus metrics there


def parse_map(text: str) -> tuple[str, str]:
    src, sep, dst = text.partition("=")
    if not sep or not os.path.isabs(src) or not os.path.isabs(dst):
        raise FlowerError(t("worker.map", text=text))
    return os.path.normpath(src), os.path.normpath(dst)


class Attempts:
    """What one worker process keeps between attempts: the flows it loaded, the run states
    of the workspaces it served, and the mailbox reader."""

    def __init__(self, cfg: WorkerConfig, report: WorkerReport) -> None:
        self.cfg = cfg
        self._states: dict[tuple[str, str], RunState] = {}
        self._stores: dict[tuple[str, str, bool, int], Any] = {}
        self._flows: dict[str, Any] = {}
        self._told: set[tuple[str, str]] = set()  # refusals said in a mailbox already
        self._pump: Pump | None = None
        self.running = 0
        self.forks: set[Forked] = set()  # every slot's placement, while its attempt runs
        # run -> the children prepared for it (a supervisor's hints), their seat, and when
        # it last hinted; placements whose prepared children are being dropped
        self.spares: dict[str, tuple[Forked, Seat, float]] = {}
        self.hinting: dict[str, float] = {}  # run -> when it last hinted (and still wants)
        self.retiring: set[Forked] = set()
        self.report = report  # what this worker says of itself (its row, its metrics)
        # The CLI's real context window per model, as attempts here (or an earlier try of
        # an attempt taken over) learned it: what a Runtime keeps, so that no later attempt
        # spends 1-2 s asking the CLI again (flower.step.attempt.SdkAttempt._ask_window).
        self.windows: dict[str, dict[str, Any]] = {}

    def reap(self) -> list[int]:
        """Reap the dead processes this worker adopted as subreaper (a stopped attempt's
        ``claude``, its tool shells), never a slot's own step child: its placement reaps
        that for its status. Returns the pids reaped."""
        from flower.step.proctree import PROCS

        return PROCS.reap_zombies(self.step_children())

    def step_children(self) -> set[int]:
        """Every slot's step children (each placement reaps its own)."""
        placements = [*self.forks, *(s[0] for s in self.spares.values()), *self.retiring]
        return {pid for forked in placements for pid in forked.children}

    # -- where -------------------------------------------------------------------------

    def here(self, path: str) -> Path:
        """``path`` on this machine, through ``--map``."""
        norm = os.path.normpath(path)
        for src, dst in self.cfg.maps:
            if norm == src or norm.startswith(src + os.sep):
                return Path(dst + norm[len(src) :])
        return Path(norm)

    def check_workspace(self, order: Order) -> tuple[Path, str]:
        """The workspace here, or why not ("" when fine)."""
        from flower.state.identity import read_identity, workspace_id

        ws = self.here(order.workspace)
        if not ws.is_dir():
            return ws, t("worker.no_workspace", path=ws)
        found = read_identity(ws) or workspace_id(ws, create=False)
        if found != order.workspace_id:
            return ws, t("worker.wrong_workspace", path=ws, found=found, want=order.workspace_id)
        return ws, ""

    def state_for(self, ws: Path, run_dir: Path) -> RunState:
        from flower.state.backends import open_state

        key = (str(ws), str(run_dir))
        if key not in self._states:
            self._states[key] = open_state(
                self.cfg.state, run_dir=run_dir, workspace=ws, create=False
            )
        return self._states[key]

    def seat_for(
        self, state: RunState, ws: Path, run_dir: Path, run: str, seat: dict[str, Any]
    ) -> Seat:
        """Where an attempt of ``run`` sits here (an order's or a hint's seat settings)."""
        return Seat(
            workspace=ws,
            store=self.store_for(state, ws, seat),
            portable=bool(seat.get("portable", True)),
            logs=run_dir / "logs" / run,
            tmp=run_dir / "tmp",
            workbench=_workbench(self.here, seat.get("workbench"), ws),
            spill_threshold=seat.get("spill_threshold"),
            no_auto_compact=bool(seat.get("no_auto_compact")),
        )

    def store_for(self, state: RunState, ws: Path, seat: dict[str, Any]) -> Any:
        from flower.state.stores import layered

        trim, keep = bool(seat.get("trim")), int(seat.get("keep_denials") or 1)
        key = (str(ws), state.where, trim, keep)
        if key not in self._stores:
            self._stores[key] = layered(
                state.sessions, state.ledger, workspace=ws, trim=trim, keep_denials=keep
            )
        return self._stores[key]

    def flow_for(self, recipe: dict[str, Any], ws: Path, run_dir: Path) -> Any:
        """Build the flow the attempt came from (its specs are what the order names)."""
        from supervisor.run.flows import load_flow

        key = repr(sorted(recipe.items())) + str(ws)
        if key in self._flows:
            return self._flows[key]
        try:
            if recipe.get("kind") == "starter":
                from flower.workflow.starter import starter_flow

                options = dict(recipe.get("options") or {})
                wf = starter_flow(
                    str(recipe.get("ask") or ""),
                    workspace=ws,
                    run_dir=run_dir,
                    new=False,
                    **options,
                )
            else:
                ref = str(recipe.get("ref"))
                target, _, attr = ref.rpartition(":")
                if target.endswith(".py") or "/" in target:  # a file: where it is here
                    ref = f"{self.here(target)}:{attr}"
                wf = load_flow(ref, str(recipe.get("ask") or ""))
        except (FlowerError, ValueError) as exc:
            why = t("worker.no_flow", ref=recipe.get("ref") or "starter", why=exc)
            raise FlowerError(why) from None
        self._flows[key] = wf
        return wf

    def tell_refused(self, order: Order, label: str, why: str) -> None:
        """Say in the attempt's mailbox that this worker cannot run it, and why: the
        supervisor's terminal shows it (an attempt no worker can run would otherwise wait
        on the queue in silence). Best effort: the state may be what is wrong here."""
        try:
            # the mailbox is the run's event rows, whatever the workspace (which may be
            # what this worker cannot see)
            state = self.state_for(Path.cwd(), Path.cwd() / "runs")
            self.mailbox(state, order.id).send(
                up(order.id),
                EventMsg(
                    kind="refused",
                    step=label,
                    payload={"host": socket.gethostname(), "pid": os.getpid(), "why": why},
                    text=why,
                    tool="",
                ),
            )
        except Exception:  # the refusal itself must still happen
            log.debug("could not tell the supervisor about a refusal", exc_info=True)

    def pump(self, state: RunState) -> Pump:
        """This worker's one mailbox reader (every attempt's, and its hints)."""
        if self._pump is None:
            self._pump = Pump(state.mailboxes)
        return self._pump

    def mailbox(self, state: RunState, activity_id: str) -> Mailbox:
        return Mailbox(state.mailboxes, activity_id, self.pump(state))

    async def follow_hints(self, state: RunState) -> None:
        """Take the hints supervisors send this worker (:func:`hints_key`) until cancelled."""
        queue = self.pump(state).subscribe(hints_key(self.cfg.name), 0)
        while True:
            for line in await queue.get():
                try:
                    hint = json.loads(line)
                except ValueError:
                    continue
                if isinstance(hint, dict):
                    self.hinted(hint)

    # -- the context window --------------------------------------------------------------

    def learn(self, spec: Any, kind: str, payload: dict[str, Any]) -> None:
        """A ``window`` event of an attempt of ``spec``: keep the window it names (what the
        CLI itself said beats a result's, which does not say where it compacts)."""
        if kind != "window" or int(payload.get("window") or 0) <= 0:
            return
        key = model_key(spec)
        if payload.get("source") != "cli" and key in self.windows:
            return
        self.windows[key] = {
            "window": int(payload["window"]),
            "compact_at": payload.get("compact_at"),
        }

    def known(self, call: StepCall) -> tuple[StepCall, dict[str, Any] | None]:
        """``call`` handing off by the window learned here when its own is a guess, and
        the ``window`` event's payload that says so (None: nothing changed)."""
        known = self.windows.get(model_key(call.spec))
        if known is None or call.headroom is None or call.stop_at is None:
            return call, None
        compact_at = int(known["compact_at"]) if known.get("compact_at") else None
        at = min(call.stop_at, handoff_at(known["window"], call.headroom, compact_at))
        payload = {"step": call.label, **known, "at": at, "source": "cli"}
        return call.attempting(stop_at=at, headroom=None), payload

    def with_known_window(self, call: StepCall, mailbox: Mailbox, activity_id: str) -> StepCall:
        """:meth:`known`; the supervisor hears it as the attempt's ``window`` event, as if
        the CLI had said it."""
        call, payload = self.known(call)
        if payload is not None:
            mailbox.send(
                up(activity_id),
                EventMsg(kind="window", step=call.label, payload=payload, text="", tool=""),
            )
        return call

    # -- attempts got ready ahead (a supervisor's hints) -----------------------------------

    def hinted(self, hint: dict[str, Any]) -> None:
        """A supervisor's ``prepare``: fork the children of the attempts its run is likely
        to place next and start their CLIs (as the local fork does), so one that lands
        here only sends its prompt; no calls: drop what was prepared for that run. A hint
        this worker cannot follow is ignored (the attempt starts cold)."""
        run = str(hint.get("run") or "")
        calls = list(hint.get("calls") or [])
        now = time.monotonic()
        if calls:
            self.hinting[run] = now
        else:
            self.hinting.pop(run, None)
        for r in [r for r, at in self.hinting.items() if now - at > CONTENDED_S]:
            del self.hinting[r]
        if calls and len(self.hinting) > SPARE_RUNS * self.cfg.slots:
            # More runs want this worker than it has slots for: their next attempts queue
            # and land on whichever worker frees first, so what is got ready here would
            # mostly start a CLI for nothing. Nothing is prepared until fewer runs hint.
            for other in list(self.spares):
                self.drop_spare(other)
            return
        if not calls:
            self.drop_spare(run)
            return
        spare = self.spares.pop(run, None)
        try:
            ws, problem = self.check_workspace(
                Order(id="", call={}, **{k: hint[k] for k in PLACED_FROM})
            )
            if problem:
                return
            run_dir = self.here(str(hint["run_dir"]))
            state = self.state_for(ws, run_dir)
            self.flow_for(dict(hint["flow"]), ws, run_dir)
            seat = self.seat_for(state, ws, run_dir, run, dict(hint["seat"]))
            wanted = [self.known(_call_of_dict(c, from_wire(dict(c["spec"]))))[0] for c in calls]
        except (FlowerError, KeyError, TypeError, ValueError) as exc:
            log.debug("cannot follow a hint for run %s: %s", run, exc)
            return
        # a session an attempt here writes (or still flushes) is not loaded ahead
        wanted = [c for c in wanted if not (c.resume and self.busy_with(c.resume))]
        forked = spare[0] if spare is not None else Forked(siblings=self.step_children)
        forked.prepare(wanted, seat)
        self.spares[run] = (forked, seat, time.monotonic())
        while len(self.spares) > SPARE_RUNS * self.cfg.slots:  # the least recently hinted
            oldest = min(self.spares, key=lambda r: self.spares[r][2])
            self.drop_spare(oldest)

    def drop_spare(self, run: str) -> None:
        """Drop what was prepared for ``run`` (its children exit without a request)."""
        spare = self.spares.pop(run, None)
        if spare is not None:
            spare[0].prepare([], spare[1])
            self.retiring.add(spare[0])

    def busy_with(self, sid: str) -> bool:
        return any(f.busy_with(sid) for f in list(self.forks))

    def prepared_for(self, run: str, call: StepCall) -> Any:
        """The child prepared here for ``call`` of ``run`` (None: start one)."""
        spare = self.spares.get(run)
        return spare[0].give(call) if spare is not None else None

    def sweep_spares(self) -> None:
        """Drop what was prepared for runs that hinted nothing for :data:`SPARE_TTL_S`,
        and forget placements whose dropped children are reaped."""
        now = time.monotonic()
        for run in [r for r, (_, _, at) in self.spares.items() if now - at > SPARE_TTL_S]:
            self.drop_spare(run)
        self.retiring = {f for f in self.retiring if f.children}

    async def drop_orphaned_spares(self) -> None:
        """Drop what was prepared for runs whose supervisor is gone (killed: it could not
        say so), as its run record tells (its process here, its lease elsewhere)."""
        runs = {run: seat for run, (_, seat, _) in self.spares.items()}
        if not runs:
            return

        def gone() -> list[str]:
            out = []
            for run, seat in runs.items():
                state = self.state_for(seat.workspace, seat.tmp.parent)
                record = state.registry.get(run)
                if record is None or not record.alive:
                    out.append(run)
            return out

        try:
            dead = await asyncio.to_thread(gone)
        except Exception:  # the database is away: look again later
            log.debug("could not look at the runs prepared for", exc_info=True)
            return
        for run in dead:
            self.hinting.pop(run, None)
            self.drop_spare(run)

    # -- the activity ------------------------------------------------------------------

    async def run(self, order_data: dict[str, Any]) -> dict[str, Any]:
        from temporalio import activity
        from temporalio.exceptions import ApplicationError

        info = activity.info()
        order = Order.from_dict(order_data)
        label = str(order.call.get("label"))
        ws, problem = self.check_workspace(order)
        run_dir = self.here(order.run_dir)
        if not problem:
            try:
                # The call (its prompt) is in the state database, never in Temporal.
                rows = self.state_for(ws, run_dir).mailboxes
                order.call = await take_order(rows, order.id, ORDER_WAIT_S)
                self.flow_for(order.flow, ws, run_dir)
                spec = from_wire(dict(order.call["spec"]))
            except FlowerError as exc:
                problem = exc.message
        if problem:
            say(t("worker.refused", label=label, why=problem))
            self.report.refused()
            if (order.id, problem) not in self._told:  # Temporal retries it every few s
                self._told.add((order.id, problem))
                self.tell_refused(order, label, problem)
            await asyncio.sleep(1.0)  # give another worker the next try
            raise ApplicationError(problem, type="NotHere")
        state = self.state_for(ws, run_dir)
        mailbox = self.mailbox(state, order.id)
        call = _call_of(order, spec)
        ran, sid = False, None
        say(t("worker.took", label=label, run=order.run, attempt=info.attempt))
        if info.attempt > 1:  # a takeover: continue what the first try started
            ran, sid, ended = _earlier_try(
                mailbox, lambda kind, payload: self.learn(spec, kind, payload)
            )
            if ended is not None:
                # That try sent its result and died before Temporal heard it had ended:
                # the supervisor has the result (and may be steps further). Nothing to run.
                say(t("worker.had_result", label=label))
                return {"step": label, "in": "mailbox"}  # Temporal keeps ids only
            if sid and not _resumable(state, sid):
                # Named before its prompt was stored (it cannot be, since 2.1.337's first
                # entry came first): resuming it would only hear "No conversation found".
                say(t("worker.fresh", label=label, session=sid[:8]))
                mailbox.send(up(order.id), _fresh(label, sid))
                sid = None
            if sid:
                from flower.step.resilience import Resilience

                call = call.attempting(
                    resume=sid, fork=False, resume_at=None, prompt=Resilience().resume_prompt
                )
        call = self.with_known_window(call, mailbox, order.id)
        seat = self.seat_for(state, ws, run_dir, order.run, order.seat)
        prepared = self.prepared_for(order.run, call)
        if call.resume and not call.fork:  # written here from now on: a copy loaded is stale
            for spare, _, _ in self.spares.values():
                spare.stale(call.resume)
        mailbox.send(
            up(order.id),
            EventMsg(
                kind="placed",
                step=label,
                payload={
                    "host": socket.gethostname(),
                    "pid": os.getpid(),
                    "worker": self.cfg.name,
                    "try": info.attempt,
                    # the session an earlier try began, continued here ("": none, e.g. the
                    # earlier tries were handed back by workers that could not run it)
                    "resumes": sid or "",
                    # an earlier try ran on a worker that is gone (with nothing stored to
                    # continue when "resumes" is empty: this try starts the step afresh)
                    "took_over": ran,
                    # its child was forked and its CLI started while the step before ran
                    # (a supervisor's hint): only the prompt was left to send
                    "warm": prepared is not None,
                },
                text="",
                tool="",
            ),
        )
        self.running += 1
        self.report.began(order.id, order.run, label, info.attempt, took_over=ran)
        interrupted: list[bool] = []
        ok = False
        try:
            result, retire = await self._attempt(
                call, seat, mailbox, order.id, interrupted, prepared, state
            )
            ok = result.ok
            try:
                fields = dict(jsonable(result.to_dict()))
                try:  # the frame below is the result; this, its copy for a frame that is lost
                    keep_result(mailbox.rows, order.id, fields)
                except (FlowerError, OSError) as exc:
                    log.warning("%s", t("remote.failed", why=exc))
                mailbox.send(up(order.id), Result(fields=fields))  # the supervisor goes on
            finally:
                await retire()
        finally:
            self.running -= 1
            self.report.ended(order.id, ok)
        if result.ok:
            outcome = "ok"
        elif interrupted:  # the CLI's own words for a cut turn are no news to a person
            outcome = t("worker.interrupted")
        else:
            outcome = result.error or ""
        say(t("worker.done", label=label, outcome=outcome))
        return {"step": label, "in": "mailbox"}  # the result is its Result frame: ids only here

    async def _attempt(
        self,
        call: StepCall,
        seat: Seat,
        mailbox: Mailbox,
        activity_id: str,
        interrupted: list[bool],
        prepared: Any = None,
        state: RunState | None = None,
    ) -> tuple[StepResult, Callable[[], Awaitable[None]]]:
        """Run ``call`` in a forked child, relaying both ways; ``interrupted`` gets an entry
        when the supervisor's interrupt reached the child. Returns its result as soon as the
        child reports it, with what to await once the result is sent: the child's CLI may
        still be exiting (flushing its session's last entries), and the attempt ends only
        once it has, as a local fork's session counts as closing until then."""
        from temporalio import activity

        answers: dict[str, asyncio.Future[str | None]] = {}
        handles: list[Any] = [None]
        told_to_stop: list[str] = []  # the supervisor's Shutdown: its reason

        async def relay(question: Ask) -> str | None:
            waiting = asyncio.get_running_loop().create_future()
            answers[question.id] = waiting
            mailbox.send(up(activity_id), question)
            try:
                text: str | None = await waiting
                return text
            finally:
                answers.pop(question.id, None)

        async def stored() -> None:
            # A frame kept in this worker's spool (the database is away) is on no other
            # machine: a takeover elsewhere would not find the session it names.
            if state is not None:
                while not await asyncio.to_thread(state.settle, 2.0):
                    pass

        forked = Forked(relay=relay, siblings=self.step_children, stored=stored)
        if prepared is not None:  # its CLI started while the step before it ran
            forked.adopt(prepared)
        self.forks.add(forked)

        def on_session(sid: str) -> None:
            mailbox.send(up(activity_id), Session(label=call.label, step=call.step, session_id=sid))

        def on_event(ev: Event) -> None:
            self.learn(call.spec, ev.kind, ev.payload)
            mailbox.send(up(activity_id), _frame(ev))

        watch = Watch(
            on_session=on_session,
            on_event=on_event,
            on_handle=lambda h: handles.__setitem__(0, h),
        )
        work = asyncio.ensure_future(forked.attempt(call, seat, watch))

        async def listen() -> None:
            async for item in mailbox.frames(down(activity_id)):
                if isinstance(item, Interrupt) and handles[0] is not None:
                    interrupted.append(True)
                    await handles[0].interrupt()
                elif isinstance(item, Answer):
                    waiting = answers.get(item.id)
                    if waiting is not None and not waiting.done():
                        waiting.set_result(item.text if item.state == "answered" else None)
                elif isinstance(item, Shutdown):
                    told_to_stop.append(item.reason)
                    work.cancel()

        async def beat() -> None:
            while True:
                activity.heartbeat()
                await asyncio.sleep(HEARTBEAT_EVERY_S)

        helpers = [asyncio.ensure_future(listen()), asyncio.ensure_future(beat())]

        async def retire() -> None:
            # (heartbeats go on meanwhile: a CLI slow to exit is not a dead worker)
            try:
                await forked.close()
            finally:
                for task in helpers:
                    task.cancel()
                self.forks.discard(forked)
                self.reap()

        try:
            try:
                result = await work
            except asyncio.CancelledError:
                # Cancelled by the supervisor, told to shut down, or our lease is gone (we were
                # frozen and Temporal gave the attempt to another worker): the child's whole
                # tree ends now, nothing more is written or sent.
                forked.stop_now()
                say(t("worker.stopped", label=call.label))
                if told_to_stop and not _cancelled_by_temporal():
                    # The supervisor stopped it (SIGTERM, SIGHUP, Ctrl-C twice): the attempt is
                    # over for good. A cancellation Temporal did not ask for would count as a
                    # failure and be retried, and each retry would read the same Shutdown again.
                    from temporalio.exceptions import ApplicationError

                    raise ApplicationError(
                        told_to_stop[0] or "stopped", type="Stopped", non_retryable=True
                    ) from None
                raise
        except BaseException:
            await retire()
            raise

        return result, retire


def _cancelled_by_temporal() -> bool:
    """Has Temporal asked this activity to stop (its lease is gone, or it was cancelled)?"""
    from temporalio import activity

    try:
        return activity.is_cancelled()
    except RuntimeError:  # not in an activity
        return False


def _call_of(order: Order, spec: Any) -> StepCall:
    return _call_of_dict(order.call, spec)


def _call_of_dict(c: dict[str, Any], spec: Any) -> StepCall:
    return StepCall(
        spec=spec,
        prompt=str(c["prompt"]),
        label=str(c["label"]),
        resume=c.get("resume"),
        fork=bool(c.get("fork")),
        resume_at=c.get("resume_at"),
        attempt=int(c.get("attempt") or 1),
        stop_at=c.get("stop_at"),
        headroom=c.get("headroom"),
    )


def _earlier_try(
    mailbox: Mailbox, learn: Callable[[str, dict[str, Any]], None]
) -> tuple[bool, str | None, dict[str, Any] | None]:
    """What the attempt's earlier tries reported: whether a worker ran one (a ``placed``
    frame: not only handed it back), the session (its last ``session`` frame) and the
    result, when one of them got as far as sending it. Their events go to ``learn``."""
    ran, sid, ended = False, None, None
    for item in mailbox.read(up(mailbox.id)):
        if isinstance(item, Session):
            sid = item.session_id
        elif isinstance(item, Result):
            ended = dict(item.fields)
        elif isinstance(item, EventMsg) and item.kind == "placed":
            ran = True
        elif isinstance(item, EventMsg):
            learn(item.kind, dict(item.payload))
    return ran, sid, ended


def _resumable(state: RunState, sid: str) -> bool:
    """Can the CLI resume ``sid`` from the run state (a database that cannot say: yes; the
    CLI's refusal starts the step afresh)?"""
    return state.resumable(sid)


def _fresh(label: str, sid: str) -> EventMsg:
    """The step's "fresh" event: ``sid`` cannot be resumed, a new session starts."""
    payload = {"session": sid, "error": "no conversation stored"}
    return EventMsg(kind="fresh", step=label, payload=payload, text="", tool="")


def _frame(ev: Event) -> EventMsg:
    return EventMsg(
        kind=ev.kind, step=ev.step, payload=jsonable(ev.payload), text=ev.text, tool=ev.tool
    )


def _workbench(here: Any, home: str | None, ws: Path) -> Any:
    if not home:
        return None
    from flower.agents.workbench import Workbench

    wb = Workbench(ws, home=here(home))
    wb.ensure()
    return wb


def say(line: str) -> None:
    print(line, flush=True)


# ---------------------------------------------------------------------------------------
# the process
# ---------------------------------------------------------------------------------------


def run_worker(cfg: WorkerConfig) -> int:
    """Serve attempts until SIGTERM/SIGINT (the first finishes what runs, the second hands
    it back). Returns the exit status."""
    from flower.people.credentials import load_dotenv
    from flower.services.temporal_client import MetricsUnavailable, run_on_own_runtime
    from flower.state.backends import open_state
    from flower.step.proctree import PROCS
    from supervisor.run.placement import preload

    load_dotenv()
    # the address and namespace given, over TEMPORAL_* and the TOML profile; checked before
    # the state is opened or anything imported
    found = settings(cfg.target, cfg.namespace)
    if not found.target:
        raise FlowerError(t("worker.no_address"), hint=t("worker.no_address.hint"))
    # Temporal logs a cancelled or refused attempt with its traceback; the worker says one
    # line of its own for each instead.
    logging.getLogger("temporalio").setLevel(logging.ERROR)
    probe = open_state(cfg.state, run_dir=Path.cwd() / "runs", workspace=Path.cwd(), create=False)
    if not probe.shared:
        raise FlowerError(t("worker.local_state"), hint=t("worker.local_state.hint"))
    where = probe.where
    probe.close()
    preload()  # the SDK and what an attempt imports, once: every child is forked from here
    PROCS.become_subreaper()
    cfg.name = cfg.name or f"{socket.gethostname()}:{os.getpid()}"

    async def main(runtime: Any) -> int:
        from temporalio.worker import Worker

        client = await connect(found, runtime)
        meter = runtime.metric_meter if cfg.metrics else None
        attempts = Attempts(cfg, WorkerReport(cfg.queue, cfg.slots, found.describe(), meter))

        from temporalio import activity

        @activity.defn(name=ACTIVITY)
        async def attempt(order: dict[str, Any]) -> dict[str, Any]:
            return await attempts.run(order)

        worker = Worker(
            client,
            task_queue=cfg.queue,
            activities=[attempt],
            max_concurrent_activities=cfg.slots,
            # a cancel (the supervisor's, or our lost lease) reaches a running attempt fast
            max_heartbeat_throttle_interval=timedelta(seconds=0.3),
            default_heartbeat_throttle_interval=timedelta(seconds=0.3),
            graceful_shutdown_timeout=timedelta(hours=1),
        )
        loop = asyncio.get_running_loop()
        stopping: list[int] = []
        stopping_task: list[asyncio.Task[None]] = []

        def on_signal(sig: int) -> None:
            stopping.append(sig)
            if len(stopping) == 1:
                say(t("worker.stopping", sig=signal.Signals(sig).name, n=attempts.running))
                stopping_task.append(loop.create_task(worker.shutdown()))
            else:  # again: hand what runs back to the queue now
                os._exit(128 + sig)

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)

        async def reaper() -> None:
            # what a stopped attempt's tree leaves dies a moment after it is killed (and a
            # CLI may be reparented here whenever its step child ends): swept every second
            beats = 0
            while True:
                await asyncio.sleep(REAP_EVERY_S)
                attempts.reap()
                attempts.sweep_spares()
                beats += 1
                if beats % SPARE_CHECK_EVERY == 0:
                    await attempts.drop_orphaned_spares()

        # this worker's row in the state (``flower-super workers``), from a state of its own
        # (the report is written from a thread: the loop never waits on the database)
        told = open_state(
            cfg.state, run_dir=Path.cwd() / "runs", workspace=Path.cwd(), create=False
        )
        rows = told.workers

        def write_report() -> None:
            attempts.report.spooled(*rows.kept())
            rows.report(cfg.name, cfg.queue, attempts.report.started_at, attempts.report.record())

        async def reporter() -> None:
            while True:
                try:
                    await asyncio.to_thread(write_report)
                except Exception:  # the database is away: the next report
                    log.debug("could not write this worker's row", exc_info=True)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(attempts.report.news.wait(), REPORT_EVERY_S)
                attempts.report.news.clear()

        sweeping = loop.create_task(reaper())
        reporting = loop.create_task(reporter())
        hints = loop.create_task(attempts.follow_hints(told))
        if cfg.metrics:
            say(t("worker.metrics", where=cfg.metrics))
        say(
            t(
                "worker.ready",
                name=cfg.name,
                target=found.describe(),
                queue=cfg.queue,
                slots=cfg.slots,
                state=where,
            )
        )
        try:
            await worker.run()
        finally:
            sweeping.cancel()
            reporting.cancel()
            hints.cancel()
            for run in list(attempts.spares):  # nothing prepared outlives the worker
                attempts.hinted({"run": run})
            try:
                await asyncio.to_thread(rows.stopped, cfg.name)
            except Exception:
                log.debug("could not mark this worker stopped", exc_info=True)
            told.close()
        return 0

    try:
        return run_on_own_runtime(main, metrics=cfg.metrics or None)
    except MetricsUnavailable as exc:
        raise metrics_failed(cfg.metrics, exc) from None
    finally:
        sys.stdout.flush()
