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

from flower import FlowerError, Runtime, Workbench
from flower.core.attempt import preload
from flower.core.proctree import PROCS
from flower.core.registry import INTERRUPTED, KILLED
from flower.workflow import Workflow
from flower.workflow.goal import MISSING_KEY, VERDICT_KEY
from flower.workflow.starter import CLARIFY_STEP, WORK_STEP, archive

from .flows import refuse_new_while_live
from .placement import Forked
from .terminal import Terminal, show_warnings


@dataclass
class StartArgs:
    ask: str
    workspace: Path
    run_dir: Path
    new: bool
    trim: bool
    command: list[str]
    archive: bool = True  # --new archives here (the starter flow archives on its own)


def run_start(wf: Workflow, args: StartArgs, term: Terminal) -> int:
    """Build the runtime and run the flow; returns the exit status (signals may not return)."""
    preload()  # the SDK and what an attempt imports: once here, never in a forked child
    PROCS.become_subreaper()
    show_warnings(term)
    rt = Runtime(
        workspace=args.workspace,
        run_dir=args.run_dir,
        trim=args.trim,
        # A flow's own Workflow.workbench, else <workspace>/.flower (where the starter flow
        # keeps its documents too).
        workbench=wf.workbench if wf.workbench is not None else Workbench(args.workspace),
        placement=Forked(ask=term.ask),
    )
    term.channel = wf.channel
    if args.new and args.archive:
        refuse_new_while_live(rt.run_dir)
        _archive(rt, wf, term)
    try:
        return asyncio.run(_main(wf, rt, args, term))
    finally:
        rt.close()


def _archive(rt: Runtime, wf: Workflow, term: Terminal) -> None:
    """``--new`` for a flow of the person's own: lineage.json and the frozen 需求.md/目标.md
    of the flow's workbench notes (or ``<workspace>/.flower/notes``) move to
    notes/archive/<ts>/, as the starter flow does it."""
    notes = wf.workbench.notes if isinstance(wf.workbench, Workbench) else None
    into = archive(rt.workspace, rt.run_dir, notes or Workbench(rt.workspace).notes)
    if into.exists():
        term.say(f"-- 重开一件事:上次的血缘和冻结件已归档到 {into}")


async def _main(wf: Workflow, rt: Runtime, args: StartArgs, term: Terminal) -> int:
    desk = SignalDesk(rt, term)
    desk.install()
    await _wait_for_endpoint(rt, term)
    try:
        ctx = await wf.run(
            rt,
            on_event=term.on_event,
            on_step=lambda s, r: term.step_done(r),
            command=args.command,
            new=args.new,
            ask=args.ask,
        )
    finally:
        await rt.drain()
    failed = [name for name, r in ctx["_results"].items() if not r.ok]
    if rt.record is not None and rt.record.state != "finished":
        stopped = ctx.get("_failed_at") or (failed[-1] if failed else "?")
        term.say(f"在步骤 '{stopped}' 中止:{_why_stopped(ctx, stopped)}")
        term.say("-- 在同一个目录再跑一次会从这里接着做。")
        return 1
    term.say(f"-- 完成 · 第 {ctx['_woke']} 次唤醒 · run {rt.run_id}")
    return 0


def _why_stopped(ctx: dict[str, Any], step: str) -> str:
    """The stopped step's own reason: its StepAbort, what its gate found, or its error."""
    if ctx.get("_aborted_step") == step and ctx.get("_aborted"):
        return str(ctx["_aborted"])
    result = ctx["_results"].get(step)
    if result is not None and not result.ok and result.error:
        return str(result.error)
    verdict = ctx.get(VERDICT_KEY)
    if step == WORK_STEP and verdict is not None:
        return f"轮数用完,目标还没达成:{verdict.reason or '判定者没给理由'}"
    if ctx.get(MISSING_KEY) and step == CLARIFY_STEP:
        return f"需求确认书还缺:{'、'.join(ctx[MISSING_KEY])}"
    return "没通过它的检查"


async def _wait_for_endpoint(rt: Runtime, term: Terminal) -> None:
    """An unreachable endpoint is one clear line, then the wait resilience promises."""
    res = rt.resilience
    if not res.enabled or res.reachable():  # sync: no helper thread alive when we fork
        return
    host, port = res.endpoint()
    base = os.environ.get("ANTHROPIC_BASE_URL") or "https://api.anthropic.com"
    term.say(
        f"flower-super: cannot reach {host}:{port} ({base}); waiting for it, probing every "
        f"{res.probe_interval:g} s for up to {res.max_offline_wait / 60:g} min (Ctrl-C to stop)"
    )
    if not await res.wait_online():
        raise FlowerError(
            f"{host}:{port} did not answer for {res.max_offline_wait / 60:g} min",
            hint="check the network, or ANTHROPIC_BASE_URL if you use a gateway",
        )


class SignalDesk:
    """The supervisor's signal handlers (installed on the running event loop)."""

    def __init__(self, rt: Runtime, term: Terminal) -> None:
        assert isinstance(rt.placement, Forked)
        self.rt, self.term, self.placement = rt, term, rt.placement
        self.interrupting = False

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGINT, self.on_sigint)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(sig, self.on_fatal, sig)

    def on_sigint(self) -> None:
        if self.interrupting or self.rt.in_flight is None:
            self.exit_now()  # does not return
            return
        self.interrupting = True
        asyncio.get_running_loop().create_task(self._interrupt())

    async def _interrupt(self) -> None:
        """Ctrl-C once: the step loop stops what is in flight (an attempt in its child, or a
        wait between attempts) and resumes the same session with what the person says."""
        await self.rt.request_interrupt(None)
        self.term.say("")
        said = await self.term.read_line(
            "打断了。想说点什么就打一句,回车 = 直接接着做(再按一次 Ctrl-C 退出)\n> "
        )
        self.interrupting = False
        self.rt.reply(said or "")

    def exit_now(self) -> None:
        """Ctrl-C twice: stop the children, close the stores, leave. No manifest row."""
        self.placement.stop_now()
        self.rt.note(state=INTERRUPTED, ended_at=time.time(), exit_code=130)
        self.rt.close()
        self.term.say("\n-- 已退出。血缘在盘上:在同一个目录再跑一次就接着上次。")
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


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
