"""Requirement and goal: the clarify step, the goal-setting step and the goal guard (seed 003).

Three pieces a flow strings together:

* :func:`clarify_step` asks until the requirement is clear and freezes it as a
  :class:`~flower.docs.brief.Brief` (``需求.md``);
* :func:`goal_step` has a judge turn the brief into a :class:`~flower.docs.goal.Goal`
  (statement plus checklist, ``目标.md``);
* :func:`with_goal` wraps a working step so that after every round a judge in a brand-new
  session rules on the goal; a round that falls short goes back into the same working session
  with the judge's feedback.

A frozen brief or goal is not asked for again: its step is skipped, but what it froze is still
put into ctx, so the steps after it read the same thing as the first time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..agents.agent import AgentSpec
from ..agents.roles import clarify, judge
from ..docs import brief as brief_doc
from ..docs import goal as goal_doc
from ..docs.brief import Brief, named, write_document
from ..docs.goal import Goal
from ..docs.verdict import VAGUE_REASON, Verdict, state_name
from ..i18n import define, t
from ..people.human import amendments
from ..state.result import Event, StepResult
from .base import Ctx, Step, StepAbort

BRIEF_KEY = "_brief"
MISSING_KEY = "_brief_missing"
GOAL_KEY = "_goal"
VERDICT_KEY = "_verdict"
ROUND_KEY = "_goal_rounds"
AMENDED_KEY = "_goal_amended"  # set when the person amended the goal in this round
#: step name -> why its gate (one of this module's) said no last time: one line for a person
WHY_KEY = "_gate_why"

NO_BRIEF = "(没有确认书)"

#: What a clarifier whose session was cut off is told when it is continued: carry on with the
#: questions still open, do not take the original ask as a new task and ask it all again.
CLARIFY_RESUME = (
    "接着上次没做完的需求确认往下做,不要从头再来。"
    "已经问过、已经得到回答的不要再问;还缺哪一段就只补问哪一段。"
    "四段都清楚了,就按 目标 / 验收标准 / 边界 / 未知与假设 四段给出需求确认书。"
)

#: The goal setter's prompt; ``{brief}`` is the frozen requirement.
GOAL_PROMPT = (
    "下面是已经确认的需求。先看清楚你所在的环境(有什么文件、能跑什么),"
    "再把它写成一个目标和一份判定清单。\n\n"
    "按两段回答:\n"
    "## 目标\n一段话说清楚要达成什么。\n\n"
    "## 判定清单\n"
    "- 每行一条,每条都是判定时能亲自检查的一件事(看文件、跑命令、看输出)。\n"
    "- 在这个环境里验证不了的条目照样写上,并在条目里标明 [此环境无法验证:原因]。\n\n"
    "需求:\n\n{brief}"
)

#: The judge's prompt; ``{goal}`` is the goal with its checklist. The judge gets the goal and
#: the workspace, never the worker's account of itself or how many rounds it took.
VERIFY_PROMPT = (
    "独立判定下面这个目标现在是否已经达成。"
    "不要相信任何人的汇报:亲自去看工作区里实际的文件和结果,逐条对照判定清单。\n\n"
    "按三段回答:\n"
    "## 结论\n第一行只写一个词:达成 / 未达成 / 无法验证,三选一;要补充的写在下一行。"
    "清单里有在这个环境里验证不了的条目,结论就是 无法验证。\n\n"
    "## 理由\n简短说明依据。\n\n"
    "## 未通过\n- 每行一条没有通过的清单条目;都通过就写 无。\n\n"
    "目标:\n\n{goal}"
)

GOAL_AMENDED = "目标刚被人修改过,下一轮按修改后的目标做,判定者也按它判:"

# What the person is told and asked (in their language; these constants are the Chinese).
define(
    {
        "goal.no_runtime": ("拿不到 Runtime,无法判定目标", "no Runtime: the goal cannot be judged"),
        "goal.accept": ("接受这个结果,就这样往下走", "accept this result and go on"),
        "goal.amend": ("修改目标", "amend the goal"),
        "goal.wrong": ("你判断错了", "the judge is wrong"),
        "goal.unreachable": (
            "判定者认为这个目标在当前环境里无法验证或无法达成:\n{reason}\n\n怎么处理?",
            "The judge thinks this goal cannot be verified or reached here:\n{reason}\n\nWhat now?",
        ),
        "goal.new_goal": (
            "新的目标是什么?(会追加在原目标后面)",
            "What is the new goal? (it is appended to the old one)",
        ),
        "goal.no_reason": ("(判定者没有说明理由)", "(the judge gave no reason)"),
        "goal.judge_failed": (
            "判定者第 {n} 轮没有跑完:{error}",
            "the judge of round {n} did not finish: {error}",
        ),
        "goal.no_result": ("没有结果", "no result"),
        "goal.nobody": (
            "判定为无法达成,没有人可问:{reason}",
            "judged unreachable and there is nobody to ask: {reason}",
        ),
        "goal.no_answer": (
            "判定为无法达成,没有人回应({state}):{reason}",
            "judged unreachable and nobody answered ({state}): {reason}",
        ),
        "goal.no_new_goal": (
            "要修改目标,但没有收到新目标({state}):{reason}",
            "the goal was to be amended but no new goal came ({state}): {reason}",
        ),
        "goal.doomed": (
            "目标里有 {n} 条在此环境无法验证,判定时注定不过:{path}",
            "{n} {n|check|checks} of the goal cannot be verified here and will fail every "
            "verdict: {path}",
        ),
    }
)
# Why a gate said no: what was missing or what the judge concluded, and why.
define(
    {
        "goal.why.brief": (
            "需求确认书还缺:{missing}。确认者的最后一条回复里没有这几段(回复开头:{said});"
            "它要以 {headings} 四段收尾",
            "the brief still lacks: {missing}. The clarifier's last reply has no such "
            "section (it began: {said}); it must end with the four sections {headings}",
        ),
        "goal.why.goal": (
            "目标还缺:{missing}。设定目标的回复里没有这几段(回复开头:{said});"
            "它要分 {headings} 两段回答",
            "the goal still lacks: {missing}. The goal setter's reply has no such section "
            "(it began: {said}); it must answer with the two sections {headings}",
        ),
        "goal.why.rounds": (
            "做了 {n} 轮,目标还没达成。判定者({label})的结论:{verdict}",
            "after {n} round(s) the goal is not met yet. The judge ({label}) concluded: {verdict}",
        ),
        "goal.why.verdict": ("{state}。理由:{reason}{failed}", "{state}. Reason: {reason}{failed}"),
        "goal.why.failed": ("(没通过:{items})", " (failed: {items})"),
        "goal.why.vague": (
            "没有明确结论,按未达成处理(回复开头:{said})",
            "no clear conclusion, counted as not achieved (its reply began: {said})",
        ),
        "goal.why.empty": ("空的", "empty"),
    }
)
NO_RUNTIME = "拿不到 Runtime,无法判定目标"
ACCEPT, AMEND, WRONG = "接受这个结果,就这样往下走", "修改目标", "你判断错了"
UNREACHABLE_QUESTION = "判定者认为这个目标在当前环境里无法验证或无法达成:\n{reason}\n\n怎么处理?"
NEW_GOAL_QUESTION = "新的目标是什么?(会追加在原目标后面)"


# -- the clarify step -------------------------------------------------------------------------


def clarify_step(
    channel: Any,
    *,
    brief_path: str | Path,
    prompt: str | Callable[[Ctx], str],
    name: str = "确认需求",
    spec: AgentSpec | None = None,
    instructions: str = "",
    always_ask: bool = False,
    on_fail: str = "stop",
    retries: int = 0,
    **spec_kw: Any,
) -> Step:
    """A step that asks until the requirement is clear and freezes it as a Brief.

    Skipped when ``brief_path`` already holds a complete brief (unless ``always_ask``); the
    brief is put into ctx either way: ``ctx[BRIEF_KEY]`` the Brief, ``ctx[name]`` its
    ``prompt_block()``. An incomplete answer fails the gate with ``ctx[MISSING_KEY]`` naming
    the missing sections (and :func:`why_rejected` saying it for a person). A continued
    session is told :data:`CLARIFY_RESUME`.
    """
    path = Path(brief_path)
    spec = spec or clarify(name, channel, instructions=instructions, **spec_kw)

    def pour(ctx: Ctx, brief: Brief) -> None:
        ctx[BRIEF_KEY] = brief
        ctx[name] = brief.prompt_block()
        ctx.pop(MISSING_KEY, None)

    def gate(result: StepResult, ctx: Ctx) -> bool:
        brief = Brief.parse(result.text)
        if not brief.complete():
            ctx[MISSING_KEY] = brief.missing()
            return _lacks(
                ctx, name, "goal.why.brief", brief.missing(), result.text, brief_doc.HEADINGS
            )
        _passed(ctx, name)
        kept = amendments(path)  # what the person said meanwhile (channel.send) stays
        if kept:
            write_document(path, brief.to_markdown() + kept)
            brief = Brief.load(path) or brief
        else:
            brief.write(path)
        pour(ctx, brief)
        return True

    return Step(
        name,
        spec,
        prompt,
        retries=retries,
        gate=gate,
        on_fail=on_fail,
        when=_unless_frozen(Brief.load, path, pour, always_ask),
        resume_prompt=CLARIFY_RESUME,
        reduce=lambda result, ctx: ctx[name],  # what pour() put there, not the raw reply
    )


# -- the goal-setting step --------------------------------------------------------------------


def goal_step(
    channel: Any,
    *,
    goal_path: str | Path,
    brief_key: str = "确认需求",
    name: str = "设定目标",
    spec: AgentSpec | None = None,
    instructions: str = "",
    always_set: bool = False,
    on_fail: str = "stop",
    retries: int = 0,
    **spec_kw: Any,
) -> Step:
    """A step where a judge turns the brief (``ctx[brief_key]``) into a Goal and freezes it.

    Skipped when ``goal_path`` already holds a complete goal (unless ``always_set``), which
    is still put into ctx: ``ctx[GOAL_KEY]`` the Goal, ``ctx[name]`` its markdown; an
    incomplete answer fails the gate, :func:`why_rejected` saying what it lacked. Checks the
    goal marks as unverifiable here are reported at once as ``Event("task")``: they will fail
    every verdict, better known before a round of work is paid for. No ``resume_prompt``:
    setting the goal again should read the whole brief again.
    """
    path = Path(goal_path)
    spec = spec or judge(name, channel, instructions=instructions, **spec_kw)

    def pour(ctx: Ctx, goal: Goal) -> None:
        ctx[GOAL_KEY] = goal
        ctx[name] = goal.to_markdown()

    def prompt(ctx: Ctx) -> str:
        brief = ctx.get(brief_key)
        return GOAL_PROMPT.format(brief=brief if isinstance(brief, str) and brief else NO_BRIEF)

    def gate(result: StepResult, ctx: Ctx) -> bool:
        goal = Goal.parse(result.text)
        if not goal.complete():
            return _lacks(
                ctx, name, "goal.why.goal", goal.missing(), result.text, goal_doc.HEADINGS
            )
        _passed(ctx, name)
        goal.write(path)
        pour(ctx, goal)
        doomed = goal.unverifiable
        sink = ctx.get("_on_event")
        if doomed and callable(sink):
            sink(
                Event(
                    "task",
                    t("goal.doomed", n=len(doomed), path=path),
                    payload={
                        "unverifiable": list(doomed),
                        "total": len(goal.checks),
                        "path": str(path),
                        "step": name,
                    },
                )
            )
        return True

    return Step(
        name,
        spec,
        prompt,
        retries=retries,
        gate=gate,
        on_fail=on_fail,
        when=_unless_frozen(Goal.load, path, pour, always_set),
        reduce=lambda result, ctx: ctx[name],
    )


def _unless_frozen(
    load: Callable[[Path], Any], path: Path, pour: Callable[[Ctx, Any], None], always: bool
) -> Callable[[Ctx], bool]:
    """A step's ``when``: skip it when ``path`` already holds a complete document, which is
    then put into ctx all the same (the steps after it read what it froze)."""

    def when(ctx: Ctx) -> bool:
        if always:
            return True
        frozen = load(path)
        if frozen is not None and frozen.complete():
            pour(ctx, frozen)
            return False
        return True

    return when


# -- the goal guard ---------------------------------------------------------------------------


def with_goal(
    step: Step,
    channel: Any,
    *,
    goal_path: str | Path,
    spec: AgentSpec | None = None,
    rounds: int = 3,
    instructions: str = "",
    can_run: bool = False,
    name: str | None = None,
    **spec_kw: Any,
) -> Step:
    """``step`` under a goal guard: after each round a judge rules, in a session of its own.

    ``rounds`` counts every round (``rounds=3``: at most three). The result is
    ``dataclasses.replace(step, retries=…, gate=…, on_reject=…)``, so every other field of
    ``step`` (``resume_prompt`` above all) is kept. The judge runs as
    ``f"{name or step.name + '·判定'}#N"`` with no session to continue, so it is a brand-new
    session every round and never enters lineage. A round that falls short goes back into the
    same working session with the verdict's feedback; a verdict with no readable conclusion
    is not achieved, its reason :data:`~flower.docs.verdict.VAGUE_REASON`. An unreachable
    verdict asks the person (accept, amend the goal, or "you judged wrong"); nobody answering
    raises StepAbort. After a round that falls short, :func:`why_rejected` gives the judge's
    label, conclusion, reason and failed checks.
    """
    path = Path(goal_path)
    label = name or f"{step.name}·判定"
    judger = spec or judge(label, channel, instructions=instructions, can_run=can_run, **spec_kw)

    async def gate(result: StepResult, ctx: Ctx) -> bool:
        rt = ctx.get("_runtime")
        if rt is None:
            raise StepAbort(t("goal.no_runtime"))
        ctx[ROUND_KEY] = n = int(ctx.get(ROUND_KEY, 0)) + 1
        goal = _goal_of(ctx, path)
        verdict_run = await rt.run(
            judger,
            VERIFY_PROMPT.format(goal=goal.prompt_block()),
            step_name=f"{label}#{n}",
            on_event=ctx.get("_on_event"),
        )
        if not verdict_run.ok:  # not a verdict at all: do not charge the worker a round for it
            raise StepAbort(
                t("goal.judge_failed", n=n, error=verdict_run.error or t("goal.no_result"))
            )
        verdict = Verdict.parse(verdict_run.text)
        ctx[VERDICT_KEY] = verdict
        if verdict.achieved:
            _passed(ctx, step.name)
            return True
        if not verdict.ok:  # an unclear verdict is not achieved, and says so (api.md, step 7)
            verdict.reason = VAGUE_REASON
        passed = verdict.unreachable and await _ask_about_unreachable(
            channel, verdict, goal, path, ctx
        )
        if passed:
            _passed(ctx, step.name)
            return True
        shown = _verdict_line(verdict, verdict_run.text)
        return _rejected(
            ctx, step.name, t("goal.why.rounds", n=n, label=f"{label}#{n}", verdict=shown)
        )

    def on_reject(result: StepResult, ctx: Ctx) -> str:
        verdict = ctx.get(VERDICT_KEY)
        feedback = verdict.feedback() if isinstance(verdict, Verdict) else ""
        if ctx.pop(AMENDED_KEY, False):
            feedback = f"{feedback}\n\n{GOAL_AMENDED}\n\n{_goal_of(ctx, path).prompt_block()}"
        return feedback.strip()

    return dataclasses.replace(step, retries=max(0, rounds - 1), gate=gate, on_reject=on_reject)


def why_rejected(ctx: Ctx, step: str) -> str:
    """Why ``step``'s gate said no the last time, one line in the reader's language: what
    the brief or the goal lacked and what the reply began with, or the judge's conclusion,
    reason and failed checks. "" when no gate of this module turned it down."""
    return str((ctx.get(WHY_KEY) or {}).get(step, ""))


def _lacks(
    ctx: Ctx, step: str, key: str, missing: list[str], reply: str, headings: dict[str, str]
) -> bool:
    """A document gate's no: the sections ``reply`` lacked (by name), how it began, and the
    headings the document asks for."""
    wanted = " / ".join(f"## {h}" for h in headings.values())
    return _rejected(ctx, step, t(key, missing=named(missing), said=_began(reply), headings=wanted))


def _rejected(ctx: Ctx, step: str, why: str) -> bool:
    ctx.setdefault(WHY_KEY, {})[step] = why
    return False


def _passed(ctx: Ctx, step: str) -> None:
    (ctx.get(WHY_KEY) or {}).pop(step, None)


def _one_line(text: str, limit: int) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _began(reply: str) -> str:
    """The first line of a model's reply, short, quoted: what a person needs to see that it
    answered something else than the sections asked for."""
    first = next((line for line in str(reply).splitlines() if line.strip()), "")
    return f"“{_one_line(first, 60)}”" if first else t("goal.why.empty")


def _verdict_line(verdict: Verdict, said: str) -> str:
    if not verdict.ok:
        return t("goal.why.vague", said=_began(said))
    failed = [f.strip() for f in verdict.failed if f.strip()]
    items = t("goal.why.failed", items=_one_line(t("section.and").join(failed), 300))
    reason = _one_line(verdict.reason, 300) if verdict.reason.strip() else t("goal.no_reason")
    shown = items if failed else ""
    return t("goal.why.verdict", state=state_name(verdict.state), reason=reason, failed=shown)


def _goal_of(ctx: Ctx, path: Path) -> Goal:
    goal = ctx.get(GOAL_KEY)
    if isinstance(goal, Goal) and goal.complete():
        return goal
    return Goal.load(path) or Goal()


async def _ask_about_unreachable(
    channel: Any, verdict: Verdict, goal: Goal, path: Path, ctx: Ctx
) -> bool:
    """The judge says the goal cannot be reached or checked here: only a person can decide."""
    reason = verdict.reason or t("goal.no_reason")
    if channel is None:
        raise StepAbort(t("goal.nobody", reason=reason))
    accept, amend = t("goal.accept"), t("goal.amend")
    options = [accept, amend, t("goal.wrong")]
    asked = await channel.ask(t("goal.unreachable", reason=reason), options)
    if asked.state != "answered":
        raise StepAbort(t("goal.no_answer", state=asked.state, reason=reason))
    said = asked.answer.strip()
    if said == accept:
        return True
    if said == amend:
        again = await channel.ask(t("goal.new_goal"))
        if again.state != "answered" or not again.answer.strip():
            raise StepAbort(t("goal.no_new_goal", state=again.state, reason=reason))
        goal.amend(again.answer.strip()).write(path)
        ctx[GOAL_KEY] = goal
        ctx[AMENDED_KEY] = True  # the next round is told the new goal, not only the verdict
        return False
    verdict.reason = f"{verdict.reason}\n人的意见:{said}".strip()
    return False
