"""The goal guard, the clarify and goal-setting steps, the starter flow's assembly and
Workflow's control flow (pure logic): the Runtime's attempts are canned (tests/test_workflow.py's
FakeRuntime); lineage, manifest, the documents and the HumanChannel are the real ones.

The end-to-end drills with the real CLI are in tests/test_e2e_starter.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from flower import (
    BRIEF_KEY,
    GOAL_KEY,
    MISSING_KEY,
    ROUND_KEY,
    VERDICT_KEY,
    AgentSpec,
    Brief,
    ConfigError,
    Event,
    Goal,
    HumanChannel,
    Step,
    StepAbort,
    Verdict,
    Workflow,
    clarify_step,
    goal_step,
    starter_flow,
    wake_state,
    with_goal,
)
from flower.docs.verdict import VAGUE_REASON
from flower.workflow.goal import ACCEPT, AMEND, CLARIFY_RESUME, NO_RUNTIME, WRONG, why_rejected
from tests.test_workflow import FakeRuntime, labels, run

pytestmark = pytest.mark.timeout(60)

SPEC = AgentSpec(name="t", instructions="x")
BRIEF = "## 目标\n写脚本\n## 验收标准\n能跑\n## 边界\n标准库\n## 未知与假设\n无"
GOAL = "## 目标\n脚本能用\n## 判定清单\n- 跑得通\n- [此环境无法验证:要 macOS] 在 mac 上跑"
NOT_MET = "text:## 结论\n未达成\n## 理由\n还差测试\n## 未通过\n- 跑得通"
MET = "text:## 结论\n达成\n## 理由\n都过了\n## 未通过\n无"
UNREACHABLE = "text:## 结论\n无法验证\n## 理由\n没有 macOS\n## 未通过\n无"


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")


def unattended() -> HumanChannel:
    return HumanChannel(timeout_s=0)


def guarded(tmp_path: Path, ch: HumanChannel, rounds: int = 3) -> tuple[Workflow, Path]:
    goal_path = tmp_path / "notes" / "目标.md"
    Goal.parse(GOAL).write(goal_path)
    work = Step("干活", SPEC, "做", resume_prompt="接着做")
    return Workflow(
        [with_goal(work, ch, goal_path=goal_path, rounds=rounds)], channel=ch
    ), goal_path


# -- with_goal -------------------------------------------------------------------------------


def test_with_goal_replaces_only_gate_on_reject_and_retries():
    step = Step("干活", SPEC, "做", resume_prompt="接着做", on_fail="continue", when=lambda c: True)
    g = with_goal(step, unattended(), goal_path="目标.md", rounds=3)
    assert g.retries == 2 and g.gate is not None and g.on_reject is not None
    kept = [
        f.name for f in dataclasses.fields(Step) if f.name not in ("gate", "on_reject", "retries")
    ]
    assert all(getattr(g, n) == getattr(step, n) for n in kept)
    assert with_goal(step, unattended(), goal_path="g", rounds=0).retries == 0
    assert with_goal(step, unattended(), goal_path="g", rounds=1).retries == 0


def test_not_met_goes_back_into_the_same_session_with_the_feedback_then_met(tmp_path):
    wf, _ = guarded(tmp_path, unattended())
    rt = FakeRuntime(tmp_path, {"干活·判定#1": [NOT_MET], "干活·判定#2": [MET]})
    ctx = run(wf, rt)
    assert labels(rt) == ["干活", "干活·判定#1", "干活#round2", "干活·判定#2"]
    work, judge1, round2, judge2 = rt.calls
    assert work["prompt"] == "做"
    assert judge1["resume"] is None and judge2["resume"] is None  # always a fresh session
    assert round2["resume"] == ctx["_sessions"]["干活"] and not round2["fork"]
    assert "还差测试" in round2["prompt"] and "跑得通" in round2["prompt"]
    assert "脚本能用" in judge1["prompt"] and judge1["prompt"] != "做"
    assert ctx[ROUND_KEY] == 2 and ctx[VERDICT_KEY].achieved and ctx["干活"]
    lineage = ctx["_lineage"]
    assert set(lineage.steps) == {"干活"}, "a judge's session entered lineage"


def test_a_vague_verdict_is_not_met_and_says_so(tmp_path):
    wf, _ = guarded(tmp_path, unattended(), rounds=1)
    rt = FakeRuntime(tmp_path, {"干活·判定#1": ["text:看起来还行吧"]})
    ctx = run(wf, rt)
    v = ctx[VERDICT_KEY]
    assert not v.ok and not v.achieved and v.reason
    assert ctx["_failed_at"] == "干活" and "干活" not in {k for k in ctx if not k.startswith("_")}


def test_an_unclear_verdict_gets_the_default_reason_not_the_judges_words(tmp_path):
    # api.md, with_goal step 7: an ambiguous verdict is not achieved, with a default reason
    # saying the verdict was unclear; the worker's next round is told that.
    wf, _ = guarded(tmp_path, unattended(), rounds=2)
    rt = FakeRuntime(tmp_path, {"干活·判定#1": ["text:看起来还行吧"], "干活·判定#2": [MET]})
    run(wf, rt)
    assert labels(rt) == ["干活", "干活·判定#1", "干活#round2", "干活·判定#2"]
    told = rt.calls[2]["prompt"]
    assert VAGUE_REASON in told and "看起来还行吧" not in told, told


@pytest.mark.parametrize(
    ("lang", "expected"),
    [
        (
            "en",
            "after 2 round(s) the goal is not met yet. The judge (干活·判定#2) concluded: "
            "not achieved. Reason: 还差测试 (failed: 跑得通)",
        ),
        (
            "zh",
            "做了 2 轮,目标还没达成。判定者(干活·判定#2)的结论:"
            "未达成。理由:还差测试(没通过:跑得通)",
        ),
    ],
)
def test_out_of_rounds_says_which_judge_and_what_it_concluded(
    tmp_path, monkeypatch, lang, expected
):
    monkeypatch.setenv("FLOWER_LANG", lang)
    wf, _ = guarded(tmp_path, unattended(), rounds=2)
    first = NOT_MET.replace("还差测试", "只有个框架")
    ctx = run(wf, FakeRuntime(tmp_path, {"干活·判定#1": [first], "干活·判定#2": [NOT_MET]}))
    assert ctx["_failed_at"] == "干活"
    assert why_rejected(ctx, "干活") == expected


def test_an_unclear_last_verdict_says_so_and_quotes_the_judge(tmp_path, monkeypatch):
    monkeypatch.setenv("FLOWER_LANG", "en")
    wf, _ = guarded(tmp_path, unattended(), rounds=1)
    ctx = run(wf, FakeRuntime(tmp_path, {"干活·判定#1": ["text:Looks fine to me\nmostly"]}))
    why = why_rejected(ctx, "干活")
    assert "no clear conclusion, counted as not achieved" in why, why
    assert "(its reply began: “Looks fine to me”)" in why, why


def test_a_passing_round_clears_what_an_earlier_one_said(tmp_path):
    wf, _ = guarded(tmp_path, unattended())
    ctx = run(wf, FakeRuntime(tmp_path, {"干活·判定#1": [NOT_MET], "干活·判定#2": [MET]}))
    assert "_failed_at" not in ctx and why_rejected(ctx, "干活") == ""


def test_unreachable_with_nobody_answering_aborts_without_using_the_rounds(tmp_path):
    wf, _ = guarded(tmp_path, unattended())
    rt = FakeRuntime(tmp_path, {"干活·判定#1": [UNREACHABLE]})
    ctx = run(wf, rt)
    assert labels(rt) == ["干活", "干活·判定#1"]
    assert "没有 macOS" in ctx["_aborted"] and ctx["_failed_at"] == "干活"
    assert ctx[VERDICT_KEY].unreachable


async def _answering(ch: HumanChannel, answers: list[str]) -> None:
    for text in answers:
        ask = await ch.next_ask()
        assert ask is not None
        ch.answer(ask.id, text)


@pytest.mark.parametrize(
    ("answers", "calls", "passed"),
    [
        ([ACCEPT], ["干活", "干活·判定#1"], True),
        (
            [AMEND, "也要能在 linux 上跑"],
            ["干活", "干活·判定#1", "干活#round2", "干活·判定#2"],
            True,
        ),
        ([WRONG], ["干活", "干活·判定#1", "干活#round2", "干活·判定#2"], True),
        (["macOS 的事不用管"], ["干活", "干活·判定#1", "干活#round2", "干活·判定#2"], True),
    ],
)
def test_unreachable_asks_the_person(tmp_path, answers, calls, passed):
    ch = HumanChannel(timeout_s=30)
    wf, goal_path = guarded(tmp_path, ch)
    rt = FakeRuntime(tmp_path, {"干活·判定#1": [UNREACHABLE], "干活·判定#2": [MET]})

    async def main() -> dict[str, Any]:
        helper = asyncio.ensure_future(_answering(ch, answers))
        try:
            return await wf.run(rt)
        finally:
            helper.cancel()
            rt.close()

    ctx = asyncio.run(main())
    assert labels(rt) == calls
    assert ("_failed_at" not in ctx) is passed
    if answers[0] == AMEND:
        assert "也要能在 linux 上跑" in Goal.load(goal_path).statement
        assert "也要能在 linux 上跑" in rt.calls[3]["prompt"]  # the next judge reads it
        assert "也要能在 linux 上跑" in rt.calls[2]["prompt"]  # and the worker is told
    if len(answers) == 1 and answers[0] != ACCEPT:
        assert answers[0] in rt.calls[2]["prompt"], "the person's words did not reach the work"


def test_a_judge_run_that_fails_aborts(tmp_path):
    wf, _ = guarded(tmp_path, unattended())
    rt = FakeRuntime(tmp_path, {"干活·判定#1": ["overloaded"]})
    ctx = run(wf, rt)
    assert "判定者" in ctx["_aborted"] and labels(rt) == ["干活", "干活·判定#1"]


def test_no_runtime_in_ctx_is_an_abort_not_a_pass():
    g = with_goal(Step("干活", SPEC, "做"), unattended(), goal_path="目标.md")
    assert g.gate is not None
    with pytest.raises(StepAbort, match=NO_RUNTIME):
        asyncio.run(g.gate(None, {}))  # type: ignore[arg-type]


# -- clarify_step / goal_step ------------------------------------------------------------------


def test_clarify_freezes_a_complete_brief_and_is_skipped_next_time(tmp_path):
    brief = tmp_path / "notes" / "需求.md"
    step = clarify_step(unattended(), brief_path=brief, prompt="做个 X")
    assert step.resume_prompt == CLARIFY_RESUME
    rt = FakeRuntime(tmp_path, {"确认需求": ["text:" + BRIEF]})
    ctx = run(Workflow([step]), rt)
    assert Brief.load(brief).complete() and isinstance(ctx[BRIEF_KEY], Brief)
    assert ctx["确认需求"] == ctx[BRIEF_KEY].prompt_block()
    rt2 = FakeRuntime(tmp_path)
    ctx2 = run(Workflow([step]), rt2)
    assert rt2.calls == [] and ctx2["确认需求"] == ctx["确认需求"], "a frozen brief not loaded"


def test_an_incomplete_brief_fails_naming_what_is_missing(tmp_path):
    brief = tmp_path / "需求.md"
    step = clarify_step(unattended(), brief_path=brief, prompt="做个 X")
    ctx = run(Workflow([step]), FakeRuntime(tmp_path, {"确认需求": ["text:## 目标\n写脚本"]}))
    assert set(ctx[MISSING_KEY]) == {"验收标准", "边界", "未知与假设"}
    assert not brief.exists() and ctx["_failed_at"] == "确认需求"


@pytest.mark.parametrize(
    ("lang", "expected"),
    [
        (
            "en",
            "the brief still lacks: acceptance criteria (验收标准), bounds (边界), unknowns and "
            "assumptions (未知与假设). The clarifier's last reply has no such section (it began: "
            "“好的,我这就去做。”); it must end with the four sections ## 目标 / ## 验收标准 / "
            "## 边界 / ## 未知与假设",
        ),
        (
            "zh",
            "需求确认书还缺:验收标准、边界、未知与假设。确认者的最后一条回复里没有这几段"
            "(回复开头:“好的,我这就去做。”);它要以 ## 目标 / ## 验收标准 / ## 边界 / "
            "## 未知与假设 四段收尾",
        ),
    ],
)
def test_an_incomplete_brief_says_what_is_missing_and_why(tmp_path, monkeypatch, lang, expected):
    monkeypatch.setenv("FLOWER_LANG", lang)
    step = clarify_step(unattended(), brief_path=tmp_path / "需求.md", prompt="做个 X")
    reply = "text:好的,我这就去做。\n\n## 目标\n写脚本"
    ctx = run(Workflow([step]), FakeRuntime(tmp_path, {"确认需求": [reply]}))
    assert why_rejected(ctx, "确认需求") == expected


@pytest.mark.parametrize(
    ("lang", "expected"),
    [
        (
            "en",
            "the goal still lacks: checklist (判定清单). The goal setter's reply has no such "
            "section (it began: “## 目标”); it must answer with the two sections ## 目标 / "
            "## 判定清单",
        ),
        (
            "zh",
            "目标还缺:判定清单。设定目标的回复里没有这几段(回复开头:“## 目标”);"
            "它要分 ## 目标 / ## 判定清单 两段回答",
        ),
    ],
)
def test_an_incomplete_goal_says_what_is_missing_and_why(tmp_path, monkeypatch, lang, expected):
    monkeypatch.setenv("FLOWER_LANG", lang)
    step = goal_step(unattended(), goal_path=tmp_path / "目标.md")
    rt = FakeRuntime(tmp_path, {"设定目标": ["text:## 目标\n脚本能用\n\n都检查一下"]})
    ctx = run(Workflow([step], context={"确认需求": BRIEF}), rt)
    assert ctx["_failed_at"] == "设定目标" and why_rejected(ctx, "设定目标") == expected
    assert not (tmp_path / "目标.md").exists()


def test_goal_step_warns_about_unverifiable_checks_at_once(tmp_path):
    goal_path = tmp_path / "目标.md"
    events: list[Event] = []
    step = goal_step(unattended(), goal_path=goal_path)
    wf = Workflow([step], context={"确认需求": "## 目标\n写脚本"})
    rt = FakeRuntime(tmp_path, {"设定目标": ["text:" + GOAL]})
    ctx = run(wf, rt, on_event=events.append)
    assert "写脚本" in rt.calls[0]["prompt"]
    (task,) = [e for e in events if e.kind == "task"]
    assert task.payload["total"] == 2 and len(task.payload["unverifiable"]) == 1
    assert isinstance(ctx[GOAL_KEY], Goal) and Goal.load(goal_path).complete()


def test_goal_step_without_a_brief_says_so(tmp_path):
    rt = FakeRuntime(tmp_path, {"设定目标": ["text:" + GOAL]})
    run(Workflow([goal_step(unattended(), goal_path=tmp_path / "g.md")]), rt)
    assert "(没有确认书)" in rt.calls[0]["prompt"]


# -- Workflow control flow -------------------------------------------------------------------


def test_on_fail_skip_continue_and_stop(tmp_path):
    wf = Workflow(
        [
            Step("a", SPEC, "p", on_fail="skip"),
            Step("b", SPEC, "p", on_fail="continue"),
            Step("c", SPEC, "p"),
            Step("d", SPEC, "p"),
        ]
    )
    rt = FakeRuntime(tmp_path, {"a": ["boom"], "b": ["boom"], "c": ["boom"]})
    ctx = run(wf, rt)
    assert "a" not in ctx and ctx["b"] == "" and ctx["_failed_at"] == "c"
    assert labels(rt) == ["a", "b", "c"]
    assert set(ctx["_results"]) == {"a", "b", "c"}


def test_async_on_reject_and_render(tmp_path):
    async def reject(result: Any, ctx: dict[str, Any]) -> str:
        return "再来"

    calls = iter([False, True])
    step = Step(
        "a", SPEC, lambda ctx: "第一次", gate=lambda r, c: next(calls), on_reject=reject, retries=1
    )
    rt = FakeRuntime(tmp_path)
    run(Workflow([step]), rt)
    assert [c["prompt"] for c in rt.calls] == ["第一次", "再来"]
    assert step.render({}) == "第一次" and step.render({}, resuming=True) == "第一次"
    assert Step("b", SPEC, "p", resume_prompt=lambda c: "接").render({}, resuming=True) == "接"


def test_resume_from_a_step_without_a_session_is_a_value_error(tmp_path):
    wf = Workflow([Step("b", SPEC, "p", resume_from="a")], continuous=False)
    with pytest.raises(ValueError, match="resume_from='a'"):
        run(wf, FakeRuntime(tmp_path))


def test_an_async_reduce_is_refused_at_once():
    async def reduce(result: Any, ctx: Any) -> str:
        return ""

    with pytest.raises(ConfigError, match="reduce"):
        Step("a", SPEC, "p", reduce=reduce)


def test_a_channel_without_its_own_outlet_sends_questions_to_the_run(tmp_path):
    ch = unattended()
    events: list[Event] = []

    async def asking(result: Any, ctx: Any) -> bool:
        await ch.ask("要哪个?", ["甲", "乙"])
        return True

    wf = Workflow([Step("a", SPEC, "p", gate=asking)], channel=ch)
    run(wf, FakeRuntime(tmp_path), on_event=events.append)
    assert [e.text for e in events if e.kind == "ask"] == ["要哪个?"]
    assert ch.on_event is None, "the run's outlet stayed wired after the run"


# -- starter_flow / wake_state ---------------------------------------------------------------


def test_starter_flow_assembly(tmp_path):
    wf = starter_flow("做个 X", workspace=tmp_path, run_dir=tmp_path / "runs", timeout_s=0)
    assert [s.name for s in wf.steps] == ["确认需求", "设定目标", "干活"]
    assert wf.name == "starter" and wf.channel is not None and wf.workbench is not None
    assert wf.workbench.root == tmp_path / ".flower"
    assert wf.channel.log_path == tmp_path / ".flower" / "notes" / "问答记录.md"
    assert wf.channel.amend_path == tmp_path / ".flower" / "notes" / "需求.md"
    assert wf.steps[2].retries == 2 and wf.steps[2].spec.delegate_only
    only = starter_flow("做个 X", workspace=tmp_path, run_dir=tmp_path / "runs", clarify_only=True)
    assert [s.name for s in only.steps] == ["确认需求"]
    bare = starter_flow("做个 X", workspace=tmp_path, run_dir=tmp_path / "runs", goal=False)
    assert [s.name for s in bare.steps] == ["确认需求", "干活"] and bare.steps[1].gate is None


def test_starter_flow_refuses_before_any_model_call(tmp_path):
    with pytest.raises(ValueError, match="要给一句诉求"):
        starter_flow("  ", workspace=tmp_path, run_dir=tmp_path / "runs")
    with pytest.raises(ValueError, match="git"):
        starter_flow("做个 X", workspace=tmp_path, run_dir=tmp_path / "runs", isolate=True)
    assert list(tmp_path.iterdir()) == []


def test_isolate_in_a_git_repo_moves_the_workbench_out(tmp_path):
    ws = tmp_path / "repo"
    ws.mkdir()
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    wf = starter_flow("做个 X", workspace=ws, run_dir=tmp_path / "runs", isolate=True)
    assert wf.workbench.root == tmp_path / ".flower-repo"
    assert wake_state(ws, run_dir=tmp_path / "runs", isolate=True)["brief"].parent == (
        tmp_path / ".flower-repo" / "notes"
    )


def test_wake_state_reads_and_writes_nothing(tmp_path):
    notes = tmp_path / ".flower" / "notes"
    Brief.parse(BRIEF).write(notes / "需求.md")
    Goal.parse(GOAL).write(notes / "目标.md")
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    state = wake_state(tmp_path, run_dir=tmp_path / "runs")
    assert state["waking"] and state["checks"] == 2 and state["woke"] == 0 and state["steps"] == {}
    assert state["brief"] == notes / "需求.md" and state["goal"] == notes / "目标.md"
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before


def test_waking_with_a_sentence_amends_once_and_rederives_the_goal(tmp_path):
    notes = tmp_path / ".flower" / "notes"
    Brief.parse(BRIEF).write(notes / "需求.md")
    Goal.parse(GOAL).write(notes / "目标.md")
    wf = starter_flow("顺便支持高亮", workspace=tmp_path, run_dir=tmp_path / "runs", timeout_s=0)
    assert (notes / "需求.md").read_text(encoding="utf-8").count("顺便支持高亮") == 0
    rt = FakeRuntime(tmp_path, {"设定目标": ["text:" + GOAL], "干活·判定#1": [MET]})
    ctx = run(wf, rt)
    text = (notes / "需求.md").read_text(encoding="utf-8")
    assert text.count("顺便支持高亮") == 1 and "唤醒时追加" in text
    assert labels(rt) == ["设定目标", "干活", "干活·判定#1"]
    assert "顺便支持高亮" in rt.calls[0]["prompt"] and "顺便支持高亮" in rt.calls[1]["prompt"]
    assert isinstance(ctx[VERDICT_KEY], Verdict)
    # The same sentence again is not appended twice.
    wf2 = starter_flow("顺便支持高亮", workspace=tmp_path, run_dir=tmp_path / "runs", timeout_s=0)
    run(wf2, FakeRuntime(tmp_path, {"设定目标": ["text:" + GOAL], "干活·判定#1": [MET]}))
    assert (notes / "需求.md").read_text(encoding="utf-8").count("顺便支持高亮") == 1


def test_new_archives_lineage_brief_and_goal_together(tmp_path):
    notes = tmp_path / ".flower" / "notes"
    Brief.parse(BRIEF).write(notes / "需求.md")
    Goal.parse(GOAL).write(notes / "目标.md")
    run(
        starter_flow("", workspace=tmp_path, run_dir=tmp_path / "runs", timeout_s=0, goal=False),
        FakeRuntime(tmp_path),
    )
    starter_flow("另一件事", workspace=tmp_path, run_dir=tmp_path / "runs", new=True)
    (stamp,) = (notes / "archive").iterdir()
    assert {p.name for p in stamp.iterdir()} == {"lineage.json", "需求.md", "目标.md"}
    assert (
        not (notes / "需求.md").exists()
        and wake_state(tmp_path, run_dir=tmp_path / "runs")["woke"] == 0
    )


def test_judge_can_run_reaches_the_goal_setter_and_every_round_judge(tmp_path):
    wf = starter_flow(
        "做个 X", workspace=tmp_path, run_dir=tmp_path / "runs", timeout_s=0, judge_can_run=True
    )
    rt = FakeRuntime(
        tmp_path,
        {"确认需求": ["text:" + BRIEF], "设定目标": ["text:" + GOAL], "干活·判定#1": [MET]},
    )
    run(wf, rt)
    tools = {c["label"]: c["spec"].allowed_tools for c in rt.calls}
    assert "Bash" in tools["设定目标"] and "Bash" in tools["干活·判定#1"]
    plain = starter_flow("做个 Y", workspace=tmp_path / "b", run_dir=tmp_path / "rb", timeout_s=0)
    rt2 = FakeRuntime(
        tmp_path / "b",
        {"确认需求": ["text:" + BRIEF], "设定目标": ["text:" + GOAL], "干活·判定#1": [MET]},
    )
    run(plain, rt2)
    assert not any("Bash" in c["spec"].allowed_tools for c in rt2.calls if "判定" in c["label"])


def test_a_restart_of_a_cut_off_clarifier_continues_it_with_the_new_sentence(tmp_path):
    runs = tmp_path / "runs"
    wf = starter_flow("做个 X", workspace=tmp_path, run_dir=runs, timeout_s=0)
    rt = FakeRuntime(tmp_path, {"确认需求": ["killed"]})  # the clarifier never froze a brief
    run(wf, rt)
    wf2 = starter_flow("其实要做 Y", workspace=tmp_path, run_dir=runs, timeout_s=0, goal=False)
    rt2 = FakeRuntime(tmp_path, {"确认需求": ["text:" + BRIEF]})
    run(wf2, rt2)
    cut_off = json.loads((runs / "lineage.json").read_text())["steps"]["确认需求"]
    first = rt2.calls[0]
    assert first["resume"] == cut_off
    assert CLARIFY_RESUME in first["prompt"] and "其实要做 Y" in first["prompt"]


def test_a_lineage_naming_a_clarifier_gone_from_sessions_db_is_nothing_to_wake(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "lineage.json").write_text(
        json.dumps({"workspace": str(tmp_path), "woke": 1, "steps": {"确认需求": "gone"}})
    )
    # no sessions.db: nothing holds that session
    with pytest.raises(ValueError, match="要给一句诉求"):
        starter_flow("", workspace=tmp_path, run_dir=runs)


def test_what_the_person_said_during_clarifying_survives_the_freeze(tmp_path):
    brief = tmp_path / "notes" / "需求.md"
    ch = HumanChannel(timeout_s=0, amend_path=brief)
    assert ch.amend("记得支持 Windows")  # said while the clarifier was asking
    step = clarify_step(ch, brief_path=brief, prompt="做个 X")
    ctx = run(Workflow([step]), FakeRuntime(tmp_path, {"确认需求": ["text:" + BRIEF]}))
    text = brief.read_text(encoding="utf-8")
    assert "记得支持 Windows" in text and Brief.load(brief).complete()
    assert "记得支持 Windows" in ctx["确认需求"]
    assert oct(brief.stat().st_mode & 0o777) == "0o600"
