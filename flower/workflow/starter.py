"""The starter flow: confirm the requirement, set the goal, do the work under the goal guard.

This is what a bare ``flower-super start "do X"`` runs (seed 003's ``starter_flow``). Its
files live in one place, defined only here: the workbench of the workspace (``<ws>/.flower``,
or ``<ws>.parent/.flower-<ws.name>`` when the worker is isolated in git worktrees), whose
``notes/`` hold ``需求.md``, ``目标.md`` and ``问答记录.md``.

Running it again in the same place is waking up: the frozen requirement and goal are read,
not asked for again, and the working step carries on its own session. A sentence said when
waking lands in three places: appended to ``需求.md`` under ``## 唤醒时追加``, handed to the
goal setter (``目标.md`` is derived again) and sent to the working session. Waking with
nothing said appends nothing and derives nothing again.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from ..agents.roles import coordinator, worker
from ..agents.workbench import Workbench
from ..docs.brief import Brief
from ..docs.goal import Goal
from ..i18n import define, t
from ..people.human import HumanChannel
from ..state.backends import LocalState, RunState
from ..state.lineage import Lineage
from .base import Ctx, Step, Workflow
from .goal import CLARIFY_RESUME, GOAL_KEY, clarify_step, goal_step, with_goal

FLOW_NAME = "starter"
CLARIFY_STEP = "确认需求"
GOAL_STEP = "设定目标"
WORK_STEP = "干活"
WAKE_LABEL = "唤醒时追加"
ARCHIVE_DIR = "archive"

NO_ASK = "要给一句诉求,例如 flower '帮我做一个 X'"
NOT_GIT = "isolate=True 需要工作区是 git 仓库,{ws} 不是(先 git init,或者不开隔离)"

CODER = "coder"
CODER_DESCRIPTION = "写代码与测试。要动手实现的活派给它。"

WORK_PROMPT = "照这份需求做:\n\n{brief}"
WORK_GOAL = "\n\n做完会有判定者按下面的目标独立验收:\n\n{goal}"
WAKE_SAID = (
    "人在唤醒时追加了一句:{said}\n\n"
    "需求.md 已经追加了这句,目标.md 也据此重新推导过。按新的要求接着做,不要重头来过。{goal}"
)
CARRY_ON = "接着上次没做完的做。先看一眼工作区里已经有的东西,从断的地方接着来,不要重头来过。"


def _workbench_for(workspace: Path, isolate: bool) -> Workbench:
    """The one definition of where the starter flow keeps its files."""
    home = workspace.parent / f".flower-{workspace.name}" if isolate else None
    return Workbench(workspace, home=home)


def wake_state(
    workspace: str | Path = ".",
    *,
    run_dir: str | Path = "runs",
    isolate: bool = False,
    brief_name: str = "需求.md",
    goal_name: str = "目标.md",
    state: RunState | None = None,
) -> dict[str, Any]:
    """Will the starter flow carry on last time here? A read-only probe: writes no byte.
    ``state``: the run state the start uses (None: the run_dir's files).

    Returns ``waking`` (the brief exists with all four sections), ``brief`` and ``goal``
    (their paths), ``checks`` (how many checklist items the goal has, 0 without one),
    ``woke`` (how many times this workspace was woken), ``steps`` (step name -> session) and
    ``clarifying`` (a clarifier was cut off before the brief froze: something to carry on).
    """
    ws = Path(workspace).expanduser().resolve()
    notes = _workbench_for(ws, isolate).notes
    brief_path, goal_path = notes / brief_name, notes / goal_name
    brief, goal = Brief.load(brief_path), Goal.load(goal_path)
    lineage = _lineage(ws, run_dir, state)
    return {
        "waking": bool(brief is not None and brief.complete()),
        "brief": brief_path,
        "goal": goal_path,
        "checks": len(goal.checks) if goal is not None else 0,
        "woke": lineage.woke,
        "steps": dict(lineage.steps),
        "clarifying": _clarifying(ws, run_dir, state),
    }


def starter_flow(
    ask: str,
    *,
    workspace: str | Path = ".",
    run_dir: str | Path = "runs",
    new: bool = False,
    isolate: bool = False,
    clarify_only: bool = False,
    goal: bool = True,
    rounds: int = 3,
    judge_can_run: bool = False,
    max_asks: int | None = None,
    timeout_s: float | None = 1800.0,
    instructions: str = "",
    worker_prompt: str = "你负责实现。每改一处就跑一次验证,别攒到最后。",
    brief_name: str = "需求.md",
    goal_name: str = "目标.md",
    log_name: str = "问答记录.md",
    state: RunState | None = None,
) -> Workflow:
    """The three-step flow: 确认需求 → 设定目标 → 干活 (under the goal guard).

    ``ask`` is the person's sentence: the task the first time, one more thing said when
    waking. Raises ValueError before anything runs when ``isolate`` is asked for outside a
    git repository, or when there is nothing to wake (no frozen brief, no clarifier cut off
    mid-way) and ``ask`` is empty. ``new`` first
    archives lineage.json, the brief and the goal together into
    ``<notes>/archive/<YYYYmmdd-HHMMSS>/`` (sessions.db keeps every old session). ``state``
    is the run state the start uses (:func:`flower.state.backends.open_state`; None: the
    run_dir's files): its lineage is the one archived and looked at.
    """
    ws = Path(workspace).expanduser().resolve()
    if isolate and not in_git(ws):
        raise ValueError(NOT_GIT.format(ws=ws))
    wb = _workbench_for(ws, isolate)
    brief_path, goal_path = wb.notes / brief_name, wb.notes / goal_name
    said = ask.strip()
    if new:
        archive(ws, run_dir, wb.notes, brief_name=brief_name, goal_name=goal_name, state=state)
    frozen = Brief.load(brief_path)
    waking = frozen is not None and frozen.complete()
    if not waking and not said and not _clarifying(ws, run_dir, state):
        raise ValueError(NO_ASK)
    wb.ensure()
    channel = HumanChannel(
        log_path=wb.notes / log_name,
        amend_path=brief_path,
        max_asks=max_asks,
        timeout_s=timeout_s,
    )
    steps = [_clarify(channel, brief_path, said, waking, instructions, ws, run_dir)]
    if not clarify_only:
        judge_kw: dict[str, Any] = {"can_run": True} if judge_can_run else {}
        if goal:
            steps.append(
                goal_step(
                    channel,
                    goal_path=goal_path,
                    brief_key=CLARIFY_STEP,
                    always_set=waking and bool(said),
                    **judge_kw,
                )
            )
        steps.append(
            _work(
                channel,
                worker_prompt,
                isolate,
                said if waking else "",
                goal_path if goal else None,
                rounds,
                judge_can_run,
            )
        )
    flow = Workflow(steps, name=FLOW_NAME, channel=channel, workbench=wb)
    flow.banner_steps = [WORK_STEP]  # type: ignore[attr-defined]
    flow.wake_banner = lambda: _banner(brief_path, goal_path)  # type: ignore[attr-defined]
    return flow


def archive(
    workspace: str | Path,
    run_dir: str | Path,
    notes: Path,
    *,
    brief_name: str = "需求.md",
    goal_name: str = "目标.md",
    state: RunState | None = None,
) -> Path:
    """``--new``: lineage.json (with shared ``state``, the database's lineage of the
    workspace) and the frozen brief and goal (in ``notes``) move together into
    ``<notes>/archive/<YYYYmmdd-HHMMSS>/``; the directory exists only if something moved.
    Nothing is deleted; sessions.db keeps every old session."""
    lineage = _lineage(Path(workspace), run_dir, state)
    return lineage.archive(notes / ARCHIVE_DIR, extra=[notes / brief_name, notes / goal_name])


def _lineage(workspace: Path, run_dir: str | Path, state: RunState | None) -> Lineage:
    """The workspace's lineage, read (unchecked) from ``state``, or the run_dir's file."""
    if state is None:
        return Lineage.open(Path(run_dir).expanduser(), workspace)
    lineage = state.lineage()
    lineage.load()
    return lineage


def _clarify(
    channel: HumanChannel,
    brief_path: Path,
    said: str,
    waking: bool,
    extra: str,
    workspace: Path,
    run_dir: str | Path,
) -> Step:
    step = clarify_step(channel, brief_path=brief_path, prompt=said, instructions=extra)
    if said and not waking:
        # A clarifier cut off before the brief froze is continued with CLARIFY_RESUME; a new
        # sentence typed at that restart goes with it (the same ask typed again does not).
        def resume_prompt(ctx: Ctx) -> str:
            if _said_before(ctx, said):
                return CLARIFY_RESUME
            return f"{CLARIFY_RESUME}\n\n人这次又说:{said}"

        step.resume_prompt = resume_prompt
    if not (waking and said):
        return step
    frozen_when = step.when
    assert frozen_when is not None

    def when(ctx: Ctx) -> Any:
        # Appended at run time, so a start that is refused (busy run_dir) changes no file.
        channel.amend(said, label=WAKE_LABEL)  # not again when already there
        return frozen_when(ctx)

    step.when = when
    return step


def _work(
    channel: HumanChannel,
    worker_prompt: str,
    isolate: bool,
    said: str,
    goal_path: Path | None,
    rounds: int,
    judge_can_run: bool,
) -> Step:
    coder = worker(CODER_DESCRIPTION, worker_prompt, isolate=isolate)
    spec = coordinator("协调者", "", {CODER: coder}, channel=channel)

    def goal_block(ctx: Ctx) -> str:
        g = ctx.get(GOAL_KEY)
        return WORK_GOAL.format(goal=g.prompt_block()) if goal_path and g is not None else ""

    def prompt(ctx: Ctx) -> str:
        return WORK_PROMPT.format(brief=ctx.get(CLARIFY_STEP, "")) + goal_block(ctx)

    def resume_prompt(ctx: Ctx) -> str:
        return WAKE_SAID.format(said=said, goal=goal_block(ctx)) if said else CARRY_ON

    step = Step(WORK_STEP, spec, prompt, resume_prompt=resume_prompt)
    if goal_path is None:
        return step
    return with_goal(step, channel, goal_path=goal_path, rounds=rounds, can_run=judge_can_run)


define(
    {
        "starter.brief_confirmed": ("需求已确认", "brief confirmed"),
        "starter.checks": ("目标 {n} 条", "goal: {n} {n|check|checks}"),
    }
)


def _banner(brief_path: Path, goal_path: Path) -> list[str]:
    """seed 000's wake line: 需求已确认 always, 目标 N 条 only with a checklist."""
    parts = []
    brief = Brief.load(brief_path)
    if brief is not None and brief.complete():
        parts.append(t("starter.brief_confirmed"))
    goal = Goal.load(goal_path)
    if goal is not None and goal.checks:
        parts.append(t("starter.checks", n=len(goal.checks)))
    return parts


def _said_before(ctx: Ctx, said: str) -> bool:
    """Did the clarifier's session already get ``said`` from the person (read from
    sessions.db)? A store that cannot say counts as no: the sentence is sent."""
    rt, sid = ctx.get("_runtime"), (ctx.get("_sessions") or {}).get(CLARIFY_STEP)
    if rt is None or not sid:
        return False
    try:
        key = {"project_key": rt.project_key, "session_id": sid}
        entries = rt.store.load_sync(key) or []
    except Exception:  # noqa: BLE001 - then the sentence is sent once more
        return False
    quoted = json.dumps(said, ensure_ascii=False)[1:-1]
    return any(
        quoted in json.dumps(e.get("message"), ensure_ascii=False)
        for e in entries
        if isinstance(e, dict) and e.get("type") == "user"
    )


def _clarifying(workspace: Path, run_dir: str | Path, state: RunState | None = None) -> bool:
    """A clarifier cut off before the brief was frozen is something to wake too: its session
    carries on with CLARIFY_RESUME (a person re-running a killed flower types nothing). Only
    if the store still has that session: else there is nothing to continue."""
    runs = Path(run_dir).expanduser()
    sid = _lineage(workspace, runs, state).steps.get(CLARIFY_STEP)
    if not sid:
        return False
    return (state or LocalState(runs, workspace)).resumable(str(sid))


def in_git(path: Path) -> bool:
    """Is ``path`` inside a git work tree (what ``isolate=True`` needs)?"""
    try:
        done = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "--is-inside-work-tree"],
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0 and done.stdout.strip() == b"true"
