"""``flower-super start``: one supervisor process running one flow, one child per step.

Signals, as DESIGN.md's table says:
- Ctrl-C once: the in-flight child is interrupted at a message boundary, the person may type
  a sentence, the same session resumes with it; no attempt is used.
- Ctrl-C twice: exit (130). Only the stores are closed; the in-flight step gets no manifest
  row; lineage was already on disk.
- SIGTERM / SIGHUP: the in-flight step gets exactly one ``killed-by-signal`` row, the
  children and their trees are stopped, then the default action is restored and the signal
  re-raised, so the supervisor dies of it (a shell sees 143 / 129).
- SIGKILL: nothing runs here; the children notice (parent-death signal, pipe EOF) and take
  their trees down; the next start resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flower import Runtime, Workbench
from flower.i18n import define, t
from flower.people.answers import AnswerWatch
from flower.state.backends import RunState
from flower.state.registry import INTERRUPTED, KILLED
from flower.state.reuse import report_lines
from flower.step.proctree import PROCS
from flower.workflow import Workflow
from flower.workflow.goal import why_rejected
from flower.workflow.starter import archive
from supervisor.run.flows import refuse_new_while_live
from supervisor.run.placement import Forked, preload
from supervisor.terminal.oracle import Oracle
from supervisor.terminal.terminal import Terminal, show_warnings, unreachable

define(
    {
        "start.archived": (
            "-- 重开一件事:上次的血缘和冻结件已归档到 {into}",
            "-- starting something else: last time's lineage and frozen documents are "
            "archived in {into}",
        ),
        "start.stopped": ("在步骤 '{step}' 中止:{why}", "stopped at step '{step}': {why}"),
        "start.again": (
            "-- 在同一个目录再跑一次会从这里接着做。",
            "-- run it again in the same directory and it carries on from here.",
        ),
        "start.state_waiting": (
            "~ 状态库 {where} 还连不上:等它收下暂存在本机的记录再结束"
            "(Ctrl-C 就先留在本机,下次 flower 连上时补交)",
            "~ the state database {where} is still unreachable: waiting for it to take what "
            "was kept on this machine (Ctrl-C leaves it here; the next flower to connect "
            "delivers it)",
        ),
        "start.state_left": (
            "! 状态库 {where} 一直没恢复:记录留在本机,下次 flower 连上时补交",
            "! the state database {where} did not come back: what was kept stays on this "
            "machine, and the next flower to connect delivers it",
        ),
        "start.done": (
            "-- 完成 · 第 {woke} 次唤醒 · run {run}",
            "-- done · wake {woke} · run {run}",
        ),
        "start.why.gate": ("没通过它的检查", "it did not pass its check"),
        "start.why.gate.named": (
            "没通过它的检查:gate {gate} 判定不通过",
            "it did not pass its check: its gate {gate} said no",
        ),
        "start.interrupted": ("! 已打断这一轮。", "! This round is interrupted."),
        "start.interrupted.subagents": (
            "! 已打断这一轮。正在跑的 subagent 会丢掉半成品。",
            "! This round is interrupted. A subagent that was running loses its unfinished work.",
        ),
        "start.interrupted.waiting": (
            "  (有 {n} 个提问还等着,打断不影响它们)",
            "  ({n} {n|question|questions} still waiting; the interrupt does not affect them)",
        ),
        "start.interrupted.prompt": (
            "  要说什么?(直接回车 = 什么都不说,接着跑;再按一次 Ctrl+C = 退出)",
            "  Anything to say? (Enter = nothing, carry on; Ctrl+C again = exit)",
        ),
        "start.exited": (
            "-- 已退出。血缘在盘上:在同一个目录再跑一次就接着上次。",
            "-- exited. The lineage is on disk: run it again in the same directory to carry on.",
        ),
    }
)


HEARTBEAT_S = 5.0  # one small atomic write; status's "elapsed" of a dead flower is this close


@dataclass
class StartArgs:
    ask: str
    workspace: Path
    run_dir: Path
    new: bool
    trim: bool
    command: list[str]
    archive: bool = True  # --new archives here (the starter flow archives on its own)
    handoff: Any = True  # Runtime(handoff=...): True, False, or a HandoffPolicy
    # Runtime(workbench=...) when the flow has none of its own; None = <workspace>/.flower
    workbench: Any = None
    # Runtime(state=...): the run state the command chose and opened (supervisor.inspect.runstate);
    # None = FLOWER_STATE as the Runtime finds it, else the run_dir's files
    state: RunState | None = None
    # Where attempts run, chosen and built before anything starts: None = forked here (one
    # child per attempt); a cluster's placement (the CLIs build it with
    # supervisor.cluster.remote.cluster_placement from --placement / FLOWER_PLACEMENT)
    placement: Any = None


def stacks_on_usr1() -> None:
    """``kill -USR1 PID`` prints every thread's stack of this process on stderr: what a
    person (or a test) sees of a run that will not end, without stopping it."""
    import faulthandler

    with contextlib.suppress(ValueError, OSError, RuntimeError):  # no stderr, not main thread
        faulthandler.register(signal.SIGUSR1, all_threads=True)


def run_start(wf: Workflow, args: StartArgs, term: Terminal) -> int:
    """Build the runtime and run the flow; returns the exit status (signals may not return)."""
    stacks_on_usr1()
    preload()  # the SDK and what an attempt imports: once here, never in a forked child
    PROCS.become_subreaper()
    show_warnings(term)
    rt = Runtime(
        workspace=args.workspace,
        run_dir=args.run_dir,
        trim=args.trim,
        # A flow's own Workflow.workbench, else <workspace>/.flower (where the starter flow
        # keeps its documents too).
        workbench=_workbench(wf, args),
        handoff=args.handoff,
        placement=args.placement or Forked(ask=term.ask),
        state=args.state,
    )
    term.channel = wf.channel
    if args.new and args.archive:
        refuse_new_while_live(rt.state)
        _archive(rt, wf, term)
    try:
        return asyncio.run(_main(wf, rt, args, term))
    finally:
        rt.close()


def _workbench(wf: Workflow, args: StartArgs) -> Any:
    if wf.workbench is not None:
        return wf.workbench
    return Workbench(args.workspace) if args.workbench is None else args.workbench


def _archive(rt: Runtime, wf: Workflow, term: Terminal) -> None:
    """``--new`` for a flow of the person's own: lineage.json and the frozen 需求.md/目标.md
    of the flow's workbench notes (or ``<workspace>/.flower/notes``) move to
    notes/archive/<ts>/, as the starter flow does it."""
    notes = wf.workbench.notes if isinstance(wf.workbench, Workbench) else None
    into = archive(rt.workspace, rt.run_dir, notes or Workbench(rt.workspace).notes, state=rt.state)
    if into.exists():
        term.say(t("start.archived", into=into))


async def _main(wf: Workflow, rt: Runtime, args: StartArgs, term: Terminal) -> int:
    desk = SignalDesk(rt, term)
    desk.install()
    # Said, not waited for: a step that needs the model waits in its loop (the reference's
    # "net" verdict just starts the run; a flow whose steps need no model is not held up).
    unreachable(rt.resilience, term.say)
    term.rt = rt
    rt.on_result = term.row_done
    term.oracle = Oracle(
        rt.run_dir,
        rt.workspace,
        rt.workbench if isinstance(rt.workbench, Workbench) else None,
        say=term.say,
        # an oracle's question runs here, forked (never dispatched to a cluster)
        placement=rt.placement if isinstance(rt.placement, Forked) else Forked(),
    )
    term.listen()
    beat = asyncio.get_running_loop().create_task(_heartbeat(rt))
    # the page (flower-super ui) may answer the channel's questions too; the first answer wins
    answers = AnswerWatch(rt.state.events, rt.run_id, wf.channel).start() if wf.channel else None
    try:
        ctx = await wf.run(
            rt,
            on_event=rt.state.event_log(rt.run_id).tee(term.on_event),
            on_step=lambda s, r: term.step_done(r),
            command=args.command,
            new=args.new,
            ask=args.ask,
        )
    finally:
        beat.cancel()
        if answers is not None:
            answers.stop()
        term.stop()
        # Before rt.drain(): an oracle's attempt is a child of the same placement.
        await term.oracle.drain()
        await rt.drain()
    await _settle_state(rt, term)
    failed = [name for name, r in ctx["_results"].items() if not r.ok]
    if rt.record is not None and rt.record.state != "finished":
        stopped = ctx.get("_failed_at") or (failed[-1] if failed else "?")
        term.stop_reason = _why_stopped(ctx, stopped, wf)
        term.err(t("start.stopped", step=stopped, why=term.stop_reason))
        term.say(t("start.again"))
        term.closing(rt)
        return 1
    term.say(t("start.done", woke=ctx["_woke"], run=rt.run_id))
    for line in report_lines(ctx.get("_reuse") or []):
        term.say(line)
    term.closing(rt)
    return 0


async def _settle_state(rt: Runtime, term: Terminal) -> None:
    """A state database that was down during the run kept this run's writes (and those of
    step children that ended meanwhile) on this machine: the run ends once the database
    holds them, waiting for it as a step waits for the API. Off the event loop, so Ctrl-C
    and SIGTERM still act at once (what was kept stays on the machine, durable)."""
    if await asyncio.to_thread(rt.settle_state, 0.0):
        return
    term.say(t("start.state_waiting", where=rt.state.where))
    if not await asyncio.to_thread(rt.settle_state, rt.resilience.max_offline_wait):
        term.say(t("start.state_left", where=rt.state.where))


async def _heartbeat(rt: Runtime) -> None:
    """Touch this flower's registry record every HEARTBEAT_S: a flower killed with no word
    (kill -9, power loss) was last seen within that of its end, so status tells how long it
    lived, not when its step began."""
    while True:
        await asyncio.sleep(HEARTBEAT_S)
        rt.note()


def _why_stopped(ctx: dict[str, Any], step: str, wf: Workflow) -> str:
    """The stopped step's own reason: its StepAbort, its error, or why its gate said no
    (the starter flow's gates say it themselves; another gate is named)."""
    if ctx.get("_aborted_step") == step and ctx.get("_aborted"):
        return str(ctx["_aborted"])
    result = ctx["_results"].get(step)
    if result is not None and not result.ok and result.error:
        return str(result.error)
    why = why_rejected(ctx, step)
    if why:
        return why
    gate = next((s.gate for s in wf.steps if s.name == step), None)
    name = getattr(gate, "__qualname__", None)
    if gate is None or not name:
        return t("start.why.gate")
    return t("start.why.gate.named", gate=f"{getattr(gate, '__module__', '?')}.{name}")


class SignalDesk:
    """The supervisor's signal handlers (installed on the running event loop)."""

    def __init__(self, rt: Runtime, term: Terminal) -> None:
        # Forked or TemporalPlacement: both stop everything they run with stop_now()
        self.rt, self.term = rt, term
        self.placement: Any = rt.placement
        self.interrupting = False

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGINT, self.on_sigint)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(sig, self.on_fatal, sig)

    def on_sigint(self) -> None:
        # Twice, with nothing in flight, or with nobody left to type a sentence: exit.
        if self.interrupting or self.rt.in_flight is None or self.term.closed:
            self.exit_now()  # does not return
            return
        self.interrupting = True
        asyncio.get_running_loop().create_task(self._interrupt())

    async def _interrupt(self) -> None:
        """Ctrl-C once: the step loop stops what is in flight (an attempt in its child, or a
        wait between attempts) and resumes the same session with what the person says."""
        flying = self.rt.in_flight
        await self.rt.request_interrupt(None)
        self.term.say("")
        delegates = flying is not None and may_delegate(flying.task.spec)
        self.term.say(t("start.interrupted.subagents" if delegates else "start.interrupted"))
        waiting = self.term.questions_waiting()
        if waiting:
            self.term.say(t("start.interrupted.waiting", n=waiting))
        said = await self.term.read_line(t("start.interrupted.prompt") + "\n> ")
        self.interrupting = False
        self.rt.reply(said or "")

    def exit_now(self) -> None:
        """Ctrl-C twice: stop the children, close the stores, leave. No manifest row."""
        self.placement.stop_now()
        record = self.rt.record
        if record is None or record.state == "running":  # a finished run stays finished
            self.rt.note(state=INTERRUPTED, ended_at=time.time(), exit_code=130)
        self.rt.close()
        self.term.say("\n" + t("start.exited"))
        _flush()
        os._exit(130)

    def on_fatal(self, sig: int) -> None:
        """SIGTERM / SIGHUP: rescue the in-flight row, stop children, die of the signal."""
        try:
            self.rt.rescue()
            self.placement.stop_now()
            self.rt.note(state=KILLED, ended_at=time.time(), exit_code=128 + sig)
            self.rt.close()
        finally:
            _flush()
            signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
            os.kill(os.getpid(), sig)
            time.sleep(5)  # the signal is delivered before this returns; belt and braces
            os._exit(128 + sig)


def may_delegate(spec: Any) -> bool:
    """Can a step of ``spec`` have subagents running: it declares its own ``agents`` or
    pre-approves the ``Agent`` tool, and does not disallow it."""
    if "Agent" in (spec.disallowed_tools or []):
        return False
    return bool(spec.agents) or "Agent" in (spec.allowed_tools or [])


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
