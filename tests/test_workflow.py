"""Workflow control flow (pure logic): a Runtime whose model is a table of canned results.

Lineage, manifest and the registry are the real ones on disk; only the SDK attempt is
replaced, so these tests pin down when / gate / on_reject / reduce / retries / on_fail,
session continuity across runs, and seed 004's skip of unchanged completed steps.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from flower import AgentSpec, ConfigError, Runtime, Step, StepAbort, StepResult, Workflow
from flower.state.registry import Registry
from flower.step.call import StepCall
from flower.step.placement import Seat, Watch

SPEC = AgentSpec(name="t", instructions="x")


class FakePlacement:
    """Every attempt answers from ``script[label]`` (a list consumed in order) or 'ok'."""

    def __init__(self, rt: FakeRuntime, script: dict[str, list[Any]]) -> None:
        self.rt, self.script = rt, script
        self.prepared: list[list[str]] = []

    async def attempt(self, call: StepCall, seat: Seat, watch: Watch) -> StepResult:
        label, prompt, resume, fork = call.label, call.prompt, call.resume, call.fork
        self.rt.calls.append(
            {"label": label, "prompt": prompt, "resume": resume, "fork": fork, "spec": call.spec}
        )
        planned = self.script.get(label, [])
        outcome = planned.pop(0) if planned else "ok"
        sid = resume if (resume and not fork) else f"s-{label}-{next(_ids)}"
        self.rt.known.add(sid)
        watch.on_session(sid)
        ok = outcome == "ok" or (isinstance(outcome, str) and outcome.startswith("text:"))
        text = (
            outcome[5:]
            if isinstance(outcome, str) and outcome.startswith("text:")
            else f"{label} said {prompt[:20]}"
        )
        return StepResult(
            step=label,
            session_id=sid,
            ok=ok,
            text=text if ok else "",
            error=None if ok else str(outcome),
            started_at=1.0,
            ended_at=2.0,
        )

    def prepare(self, calls: Sequence[StepCall], seat: Seat) -> None:
        self.prepared.append([c.label for c in calls])

    async def close(self) -> None:
        return None


class FakeRuntime(Runtime):
    """A real Runtime (lineage, manifest, registry on disk) whose attempts are canned.

    Resilience is off: a canned failure is the step's one attempt (retries have their own
    tests in test_runtime_loop.py)."""

    def __init__(self, tmp: Path, script: dict[str, list[Any]] | None = None, **kw: Any) -> None:
        kw.setdefault("resilience", False)
        self.fake = FakePlacement(self, {k: list(v) for k, v in (script or {}).items()})
        super().__init__(workspace=tmp / "ws", run_dir=tmp / "runs", placement=self.fake, **kw)
        self.calls: list[dict[str, Any]] = []
        self.known: set[str] = set(_known_sessions(tmp))

    def has_session(self, session_id: str) -> bool:
        return session_id in self.known


_ids = itertools.count(1)


def _known_sessions(tmp: Path) -> list[str]:
    path = tmp / "runs" / "lineage.json"
    if not path.exists():
        return []
    return list(json.loads(path.read_text())["steps"].values())


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")


def run(wf: Workflow, rt: Runtime, **kw: Any) -> dict[str, Any]:
    try:
        return asyncio.run(wf.run(rt, **kw))
    finally:
        rt.close()


def labels(rt: FakeRuntime) -> list[str]:
    return [c["label"] for c in rt.calls]


def test_woke_and_sessions_continue_across_runs(tmp_path):
    wf = Workflow([Step("取词", SPEC, "读 seed.txt")])
    ctx1 = dict(run(wf, FakeRuntime(tmp_path)))  # as it was then
    assert ctx1["_woke"] == 1
    rt2 = FakeRuntime(tmp_path)
    ctx2 = run(wf, rt2)
    assert ctx2["_woke"] == 2
    assert ctx2["_sessions"]["取词"] == ctx1["_sessions"]["取词"]
    assert rt2.calls[0]["resume"] == ctx1["_sessions"]["取词"]


def test_continuous_false_starts_fresh_each_process(tmp_path):
    wf = Workflow([Step("a", SPEC, "p")], continuous=False)
    ctx1 = dict(run(wf, FakeRuntime(tmp_path)))  # as it was then
    rt2 = FakeRuntime(tmp_path)
    ctx2 = run(wf, rt2)
    assert rt2.calls[0]["resume"] is None and ctx2["_sessions"]["a"] != ctx1["_sessions"]["a"]


def test_resume_prompt_is_sent_when_a_session_continues(tmp_path):
    wf = Workflow([Step("a", SPEC, "the whole brief", resume_prompt="接着做")])
    run(wf, FakeRuntime(tmp_path))
    rt2 = FakeRuntime(tmp_path)
    run(wf, rt2)
    assert rt2.calls[0]["prompt"] == "接着做"


def test_resume_from_and_fork_within_one_run(tmp_path):
    wf = Workflow(
        [
            Step("plan", SPEC, "plan it"),
            Step("build", SPEC, "build it", resume_from="plan"),
            Step("try", SPEC, "try it", resume_from="plan", fork=True),
        ],
        continuous=False,
    )
    rt = FakeRuntime(tmp_path)
    ctx = run(wf, rt)
    plan_sid = ctx["_sessions"]["plan"]
    assert rt.calls[1]["resume"] == plan_sid and not rt.calls[1]["fork"]
    assert rt.calls[2]["resume"] == plan_sid and rt.calls[2]["fork"]


def test_when_skips_reduce_feeds_ctx(tmp_path):
    wf = Workflow(
        [
            Step("a", SPEC, "a", reduce=lambda r, ctx: "reduced-a"),
            Step("b", SPEC, "b", when=lambda ctx: False),
            Step("c", SPEC, lambda ctx: f"c after {ctx['a']}"),
        ]
    )
    rt = FakeRuntime(tmp_path)
    ctx = run(wf, rt)
    assert labels(rt) == ["a", "c"]
    assert ctx["a"] == "reduced-a" and "b" not in ctx
    assert rt.calls[1]["prompt"] == "c after reduced-a"


def test_retries_are_labelled_and_only_the_bare_name_enters_lineage(tmp_path):
    wf = Workflow([Step("a", SPEC, "a", retries=2)])
    rt = FakeRuntime(tmp_path, {"a": ["boom"], "a#retry1": ["boom"]})
    ctx = run(wf, rt)
    assert labels(rt) == ["a", "a#retry1", "a#retry2"]
    steps = json.loads((tmp_path / "runs" / "lineage.json").read_text())["steps"]
    assert list(steps) == ["a"] and steps["a"] == ctx["_sessions"]["a"]
    rows = json.loads((tmp_path / "runs" / "manifest.json").read_text())
    assert [r["step"] for r in rows] == ["a", "a#retry1", "a#retry2"]


def test_gate_and_on_reject_make_rounds_that_resume_the_rejected_session(tmp_path):
    verdicts = iter([False, True])
    wf = Workflow(
        [
            Step(
                "work",
                SPEC,
                "do",
                retries=2,
                gate=lambda r, ctx: next(verdicts),
                on_reject=lambda r, ctx: "not yet, fix X",
            )
        ]
    )
    rt = FakeRuntime(tmp_path)
    run(wf, rt)
    assert labels(rt) == ["work", "work#round2"]
    assert rt.calls[1]["prompt"] == "not yet, fix X" and rt.calls[1]["resume"] is not None


def test_async_gate_and_step_abort(tmp_path):
    async def gate(r, ctx):
        raise StepAbort("再来也没用")

    wf = Workflow([Step("a", SPEC, "a", retries=3, gate=gate), Step("b", SPEC, "b")])
    rt = FakeRuntime(tmp_path)
    ctx = run(wf, rt)
    assert labels(rt) == ["a"] and ctx["_aborted"] == "再来也没用"
    assert rt.record is not None and rt.record.state == "failed"


def test_on_fail_continue_goes_on(tmp_path):
    wf = Workflow([Step("a", SPEC, "a", on_fail="continue"), Step("b", SPEC, "b")])
    rt = FakeRuntime(tmp_path, {"a": ["boom"]})
    run(wf, rt)
    assert labels(rt) == ["a", "b"]


def test_bad_declarations_are_one_line_errors():
    with pytest.raises(ConfigError, match="on_fail"):
        Step("a", SPEC, "a", on_fail="explode")
    with pytest.raises(ConfigError, match="two steps named"):
        Workflow([Step("a", SPEC, "a"), Step("a", SPEC, "b")])
    with pytest.raises(ConfigError, match="#"):
        Step("a#retry1", SPEC, "a")


def test_unfinished_run_is_resumed_without_redoing_finished_steps(tmp_path):
    wf = Workflow(
        [Step("a", SPEC, "a"), Step("b", SPEC, "b"), Step("c", SPEC, lambda ctx: f"c {ctx['b']}")]
    )
    rt1 = FakeRuntime(tmp_path, {"b": ["boom"]})
    ctx1 = dict(run(wf, rt1))  # as it was then
    assert labels(rt1) == ["a", "b"] and rt1.record.state == "failed"

    rt2 = FakeRuntime(tmp_path)
    ctx2 = run(wf, rt2)
    assert labels(rt2) == ["b", "c"], "the completed step was sent again"
    assert ctx2["a"] == ctx1["a"] and ctx2["_sessions"]["a"] == ctx1["_sessions"]["a"]
    # b was the step the dead run was in: it continues its session with the neutral text.
    assert rt2.calls[0]["resume"] == ctx1["_sessions"]["b"]
    assert rt2.calls[0]["prompt"] == rt2.resilience.resume_prompt

    rt3 = FakeRuntime(tmp_path)
    run(wf, rt3)
    assert labels(rt3) == ["a", "b", "c"], "after a finished run every step continues (new intent)"


def test_a_changed_prompt_is_not_reused(tmp_path):
    prompt = {"a": "version 1"}
    wf = Workflow([Step("a", SPEC, lambda ctx: prompt["a"]), Step("b", SPEC, "b")])
    run(wf, FakeRuntime(tmp_path, {"b": ["boom"]}))
    prompt["a"] = "version 2"
    rt2 = FakeRuntime(tmp_path)
    run(wf, rt2)
    assert labels(rt2) == ["a", "b"]


def test_reused_steps_stay_reused_across_repeated_crashes(tmp_path):
    wf = Workflow([Step("a", SPEC, "a"), Step("b", SPEC, "b")])
    run(wf, FakeRuntime(tmp_path, {"b": ["boom"]}))
    run(wf, FakeRuntime(tmp_path, {"b": ["boom"]}))
    rt3 = FakeRuntime(tmp_path)
    run(wf, rt3)
    assert labels(rt3) == ["b"]


def test_the_reuse_report_says_never_ran_only_of_a_step_that_never_ran(tmp_path):
    """A step that ran in an earlier run without completing says it ran before, not
    finished; after a finished run every step ran before; only c, never reached until
    the third run, "never ran"."""
    prompt = {"a": "version 1"}
    wf = Workflow(
        [Step("a", SPEC, lambda ctx: prompt["a"]), Step("b", SPEC, "b"), Step("c", SPEC, "c")]
    )

    def whys(ctx: dict[str, Any]) -> dict[str, str]:
        return {e["step"]: e["why"]["key"] for e in ctx["_reuse"]}

    ctx = run(wf, FakeRuntime(tmp_path, {"b": ["boom"]}))
    assert whys(ctx) == {"a": "memo.why.never", "b": "memo.why.never"}
    prompt["a"] = "version 2"  # a changes and fails: the run stops before b
    ctx = run(wf, FakeRuntime(tmp_path, {"a": ["boom"]}))
    assert whys(ctx) == {"a": "memo.why.changed"}
    rt = FakeRuntime(tmp_path)
    ctx = run(wf, rt)
    assert labels(rt) == ["a", "b", "c"]
    assert whys(ctx) == {
        "a": "memo.why.unfinished",  # the step the last run stopped in
        "b": "memo.why.ran_unfinished",  # ran two runs ago, never completed
        "c": "memo.why.never",
    }
    ctx = run(wf, FakeRuntime(tmp_path))  # after a finished run: a new run
    assert set(whys(ctx).values()) == {"memo.why.ran_again"}


def test_registry_record_tells_the_story(tmp_path):
    wf = Workflow([Step("a", SPEC, "a")], name="story")
    rt = FakeRuntime(tmp_path)
    run(wf, rt)
    (rec,) = Registry(tmp_path / "runs").records()
    assert (
        rec.flow == "story" and rec.state == "finished" and rec.woke == 1 and "a" in rec.completed
    )


def test_new_ignores_the_unfinished_run(tmp_path):
    wf = Workflow([Step("a", SPEC, "a"), Step("b", SPEC, "b")])
    run(wf, FakeRuntime(tmp_path, {"b": ["boom"]}))
    rt2 = FakeRuntime(tmp_path)
    run(wf, rt2, new=True)
    assert labels(rt2) == ["a", "b"]


def test_a_start_refused_for_another_workspace_leaves_no_record(tmp_path):
    import os
    import time

    from flower import RunDirBusy
    from flower.state.registry import FlowerRecord

    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "lineage.json").write_text(
        json.dumps({"workspace": "/somewhere/else", "woke": 3, "steps": {}})
    )
    holder = FlowerRecord(
        run="20260101-000000-abcdef",
        flow="other",
        pid=os.getpid(),
        pid_started=None,
        workspace="/somewhere/else",
        started_at=time.time(),
    )
    Registry(runs).write(holder)
    rt = FakeRuntime(tmp_path)
    with pytest.raises(RunDirBusy, match=str(os.getpid())):
        run(Workflow([Step("a", SPEC, "a")]), rt)
    assert [r.run for r in Registry(runs).records()] == [holder.run]
    assert rt.calls == []


def test_an_irreversible_step_gets_one_attempt_and_is_run_again_with_a_warning(tmp_path, caplog):
    wf = Workflow([Step("a", SPEC, "a"), Step("deploy", SPEC, "ship", retries=2, idempotent=False)])
    rt = FakeRuntime(tmp_path, {"deploy": ["boom"]})
    run(wf, rt)
    assert labels(rt) == ["a", "deploy"]  # no deploy#retry1: never retried automatically
    rt = FakeRuntime(tmp_path)
    with caplog.at_level("WARNING", logger="flower"):
        run(wf, rt)
    assert labels(rt) == ["deploy"]  # a is reused; deploy runs again, and says so once
    said = [r.getMessage() for r in caplog.records if "deploy" in r.getMessage()]
    assert len(said) == 1 and "idempotent=False" in said[0], said


def test_running_the_same_workflow_again_reuses_its_context_dict(tmp_path):
    """api.md: ``Workflow.context`` is the ctx itself; a second run works in the same dict
    (what the first run put there is still there), and it still reuses what an unfinished
    first run completed: the steps' values in the dict do not change their input hashes."""
    given: dict[str, Any] = {"topic": "tea"}
    wf = Workflow(
        [Step("a", SPEC, lambda ctx: f"a about {ctx['topic']}"), Step("b", SPEC, "b")],
        context=given,
    )
    ctx1 = run(wf, FakeRuntime(tmp_path, {"b": ["boom"]}))
    assert ctx1 is given and wf.context is given
    assert ctx1["_failed_at"] == "b" and ctx1["a"].startswith("a said")
    rt2 = FakeRuntime(tmp_path)
    ctx2 = run(wf, rt2)
    assert ctx2 is given
    assert labels(rt2) == ["b"], "the dict's own values changed the completed step's hash"
    assert "_failed_at" not in ctx2, "the first run's failure was left in the second run's ctx"
    assert ctx2["topic"] == "tea" and ctx2["b"].startswith("b said") and ctx2["_woke"] == 2


class OnlyRun:
    """A runtime as api.md lets one test a flow's control flow offline: nothing but an async
    ``run(spec, prompt, *, step_name, resume, fork, on_event)`` that returns StepResults."""

    def __init__(self, fails: Sequence[str] = ()) -> None:
        self.fails = list(fails)  # labels whose (first) attempt fails
        self.calls: list[tuple[str | None, str, str | None, bool]] = []

    async def run(
        self,
        spec: AgentSpec,
        prompt: str,
        *,
        step_name: str | None = None,
        resume: str | None = None,
        fork: bool = False,
        on_event: Any = None,
    ) -> StepResult:
        self.calls.append((step_name, prompt, resume, fork))
        label = step_name or spec.name
        if label in self.fails:
            self.fails.remove(label)
            return StepResult(step=label, ok=False, error="boom")
        sid = f"sid-{len(self.calls)}"
        return StepResult(step=label, ok=True, text=f"{label}: {prompt}", session_id=sid)


def test_a_runtime_with_only_run_drives_the_control_flow(tmp_path, monkeypatch):
    from flower import MapStep

    monkeypatch.chdir(tmp_path)
    gated: list[str] = []
    wf = Workflow(
        [
            Step("a", SPEC, "a", retries=1, gate=lambda r, ctx: gated.append(r.text) or True),
            Step("skipped", SPEC, "s", when=lambda ctx: False),
            Step("b", SPEC, "b", resume_from="a", reduce=lambda r, ctx: r.text.upper()),
            Step("flaky", SPEC, "f", retries=2),
            Step("ship", SPEC, "ship", idempotent=False, on_fail="continue"),
            MapStep("each", SPEC, prompt=lambda ctx, item: f"item {item}", over="items"),
            Step("last", SPEC, lambda ctx: f"after {ctx['b']} and {ctx['each']}"),
        ],
        context={"items": [1, 2]},
    )
    rt = OnlyRun(fails=["flaky", "ship"])
    ctx = asyncio.run(wf.run(rt, on_step=lambda s, r: None))  # type: ignore[arg-type]
    assert [c[0] for c in rt.calls] == [
        "a",
        "b",
        "flaky",
        "flaky#retry1",
        "ship",
        "each[0]",
        "each[1]",
        "last",
    ]
    assert rt.calls[1][2] == "sid-1", "resume_from did not continue a's session"
    assert gated == ["a: a"] and ctx["b"] == "B: B"
    assert (
        "skipped" not in ctx
        and ctx["ship"] == ""
        and ctx["each"] == ["each[0]: item 1", "each[1]: item 2"]
    )
    assert rt.calls[-1][1] == "after B: B and ['each[0]: item 1', 'each[1]: item 2']"
    assert ctx["_woke"] == 1 and "_lineage" not in ctx and "_failed_at" not in ctx
    assert ctx["_runtime"] is rt and set(ctx["_results"]) >= {"a", "b", "flaky", "ship", "each"}
    assert not (tmp_path / "runs").exists(), "a runtime without a run_dir got one"
