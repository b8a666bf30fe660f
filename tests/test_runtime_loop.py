"""The step loop as pure logic: a Runtime whose placement returns scripted outcomes.

The real loop (``flower.step.loop``), the real interrupt/reply methods and the real context
tracking (``AttemptState.saw_context``, the loop's watermark) run; only the SDK session is
replaced by a list of outcomes, and the network probe by a list of answers. The end-to-end
drills against the real CLI are in ``test_e2e_resilience.py`` and ``test_e2e_handoff.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from claude_agent_sdk import AssistantMessage, ResultMessage, TextBlock

from flower.agents.agent import AgentSpec
from flower.docs.handoff import HANDOFF_PROMPT, Handoff, degraded
from flower.state.result import Event, StepResult
from flower.step.attempt import AttemptState
from flower.step.call import StepCall
from flower.step.interrupts import Interrupts
from flower.step.loop import StepHooks, StepLoop
from flower.step.placement import Seat, Watch
from flower.step.proctree import ATTEMPT_TAG, PROCS
from flower.step.resilience import RESUME_PROMPT, Resilience
from flower.step.runtime import Runtime
from flower.step.window import HandoffPolicy

WINDOW = 200_000  # at = 150K, warn_at = 130K
SPEC = AgentSpec(name="t", instructions="test", max_budget_usd=1.0)
HANDOFF_TEXT = "## 在做什么\n写到第三章\n\n## 已经定下的\n用 Markdown\n\n## 下一步\n写第四章\n"
OVERLOADED = "API Error: 529 Overloaded. This is a server-side issue, usually temporary"
UNAUTHORIZED = "API Error: 401 Invalid API key · Fix external API key"

Outcome = StepResult | Callable[["Scripted"], Awaitable[StepResult]]


def ok(sid: str | None, text: str = "done") -> StepResult:
    return StepResult(step="s", session_id=sid, ok=True, text=text, cost_usd=0.01, num_turns=1)


def fail(sid: str | None, error: str) -> StepResult:
    return StepResult(step="s", session_id=sid, ok=False, error=error, cost_usd=0.01, num_turns=1)


@dataclass
class Call:
    spec: AgentSpec
    prompt: str
    resume: str | None
    fork: bool
    resume_at: str | None
    watch_context: bool


@dataclass
class Net(Resilience):
    """Resilience whose probe answers from ``ups`` (then True); tiny delays."""

    base_delay: float = 0.01
    max_delay: float = 0.05
    probe_interval: float = 0.01
    ups: list[bool] = field(default_factory=list)
    probes: int = 0
    delays: list[float] = field(default_factory=list)

    def reachable(self) -> bool:
        self.probes += 1
        return self.ups.pop(0) if self.ups else True

    def delay_for(self, n: int) -> float:
        self.delays.append(super().delay_for(n))
        return self.delays[-1]


class ScriptedPlacement:
    """A placement whose attempts return scripted outcomes, keeping the placement contract:
    it reports the session, takes interrupts while "running", reports each turn's context
    through a real ``AttemptState`` (which decides when to stop for a handoff)."""

    def __init__(self, outcomes: list[Outcome]) -> None:
        self.outcomes = list(outcomes)
        self.calls: list[Call] = []
        self.call: StepCall | None = None
        self.state: AttemptState | None = None
        self.rt: Scripted | None = None

    async def attempt(self, call: StepCall, seat: Seat, watch: Watch) -> StepResult:
        self.call, self.state = call, AttemptState(call, watch)
        self.calls.append(
            Call(
                call.spec,
                call.prompt,
                call.resume,
                call.fork,
                call.resume_at,
                call.stop_at is not None,
            )
        )
        item = self.outcomes.pop(0)
        watch.on_handle(self)
        try:
            assert self.rt is not None
            out = await item(self.rt) if callable(item) else item
        finally:
            watch.on_handle(None)
        if out.session_id:
            watch.on_session(out.session_id)
        if self.state.stopped_for_handoff and not out.ok:
            out.error = Runtime.HANDOFF_DUE
        return out

    async def interrupt(self) -> None:
        return None

    def prepare(self, calls: Sequence[StepCall], seat: Seat) -> None:
        return None

    async def close(self) -> None:
        return None


class Scripted(Runtime):
    """A Runtime whose attempts return scripted outcomes."""

    def __init__(self, outcomes: list[Outcome], **kw: Any) -> None:
        self.script = ScriptedPlacement(outcomes)
        super().__init__(placement=self.script, **kw)
        self.script.rt = self

    @property
    def calls(self) -> list[Call]:
        return self.script.calls

    @property
    def label(self) -> str:
        assert self.script.call is not None
        return self.script.call.label

    def turn(self, used: int, *, final: bool = False) -> bool:
        """What the real attempt does with one turn's context: report it; True when the
        attempt now stops because a handoff is due."""
        assert self.script.state is not None
        self.script.state.saw_context(used, final=final)
        return self.script.state.stop_requested


@pytest.fixture
def make(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Scripted]:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-dummy-key")
    (tmp_path / "ws").mkdir()

    def build(outcomes: list[Outcome], **kw: Any) -> Scripted:
        kw.setdefault("resilience", Net())
        kw.setdefault("handoff", HandoffPolicy(window=WINDOW))
        rt = Scripted(outcomes, workspace=tmp_path / "ws", run_dir=tmp_path / "runs", **kw)
        return rt

    return build


def run(
    rt: Runtime, prompt: str = "do it", events: list[Event] | None = None, **kw: Any
) -> StepResult:
    async def go() -> StepResult:
        try:
            return await rt.run(
                SPEC,
                prompt,
                step_name="s",
                on_event=events.append if events is not None else None,
                **kw,
            )
        finally:
            rt.close()

    return asyncio.run(go())


def row(rt: Runtime) -> dict[str, Any]:
    (only,) = json.loads((rt.run_dir / "manifest.json").read_text(encoding="utf-8"))
    return only


# --- exit 1 and 4: success, retries ------------------------------------------------------


def test_success_first_time_is_one_attempt(make):
    rt = make([ok("s1")])
    res = run(rt)
    assert res.ok and res.attempts == 1 and res.errors == [] and not res.resumed
    assert [c.prompt for c in rt.calls] == ["do it"]
    assert row(rt)["attempts"] == 1 and row(rt)["session_id"] == "s1"


def test_transient_errors_resume_the_seen_session_with_growing_delays(make):
    net = Net()
    rt = make([fail("s1", OVERLOADED), fail("s1", OVERLOADED), ok("s1")], resilience=net)
    events: list[Event] = []
    res = run(rt, events=events)
    assert res.ok and res.attempts == 3 and res.resumed and res.errors == [OVERLOADED] * 2
    assert [(c.prompt, c.resume, c.fork) for c in rt.calls[1:]] == [
        (RESUME_PROMPT, "s1", False)
    ] * 2
    assert [e.payload["attempt"] for e in events if e.kind == "retry"] == [1, 2]
    assert len(net.delays) == 2 and net.delays[1] > net.delays[0]
    r = row(rt)
    assert (r["attempts"], r["errors"], r["resumed"], r["ok"]) == (3, [OVERLOADED] * 2, True, True)


def test_a_fatal_error_is_not_retried(make):
    rt = make([fail("s1", UNAUTHORIZED)])
    res = run(rt)
    assert not res.ok and res.attempts == 1 and res.error == UNAUTHORIZED and len(rt.calls) == 1


def test_retries_stop_at_max_attempts(make):
    rt = make([fail("s1", OVERLOADED)] * 3, resilience=Net(max_attempts=3))
    res = run(rt)
    assert not res.ok and res.attempts == 3 and len(res.errors) == 3 and len(rt.calls) == 3


def test_a_call_brings_its_own_attempt_cap_and_session_callback(make):
    """What holds for one call travels with it (issue 18): ``max_attempts`` caps that call
    only, ``on_session`` hears that call's sessions in place of ``Runtime.on_session``; the
    Runtime's own settings are left as they were for the next call."""
    policy = Net(max_attempts=3)
    rt = make([fail("s1", OVERLOADED), fail("s2", OVERLOADED)] * 2 + [ok("s2")], resilience=policy)
    mine: list[str] = []
    theirs: list[str] = []
    rt.on_session = theirs.append

    async def go() -> tuple[StepResult, StepResult]:
        try:
            one = await rt.run(SPEC, "x", step_name="one", max_attempts=1, on_session=mine.append)
            two = await rt.run(SPEC, "y", step_name="two", max_attempts=5)
            return one, two
        finally:
            rt.close()

    one, two = asyncio.run(go())
    assert not one.ok and one.attempts == 1 and mine == ["s1"]
    # the cap lowers, never raises, the Runtime's policy; the Runtime's own callback is back
    assert not two.ok and two.attempts == 3 and theirs == ["s2", "s1", "s2"]
    assert rt.resilience is policy and policy.max_attempts == 3


def test_no_retry_when_resilience_is_off(make):
    rt = make([fail("s1", OVERLOADED)], resilience=False)
    res = run(rt)
    assert not res.ok and res.attempts == 1 and len(rt.calls) == 1


def test_a_failure_before_any_session_repeats_the_same_request(make):
    # A fork that died before its new session was known is forked again, not resumed in
    # the parent session it was meant to leave untouched.
    rt = make([fail(None, "ProcessError: Command failed with exit code -9"), ok("child")])
    res = run(rt, resume="parent", fork=True, resume_at="msg-7")
    _, second = rt.calls
    assert (second.prompt, second.resume, second.fork, second.resume_at) == (
        "do it",
        "parent",
        True,
        "msg-7",
    )
    assert res.ok and res.attempts == 2 and not res.resumed and res.session_id == "child"


GONE = (
    "the CLI failed before any request (resume_target_not_found): No conversation found with"
    " session ID: 3d985b2b-b2fc-4699-a3dc-9143db09c04a"
)
DEAD = "3d985b2b-b2fc-4699-a3dc-9143db09c04a"


def test_a_session_the_cli_refuses_starts_afresh_with_the_own_prompt_once(make):
    """Issue 23: the CLI has no conversation for the session to continue. The step starts
    a fresh session with its own prompt (no attempt used), says so once, and whoever named
    the dead id forgets it; the same refusal of the new session is an error, not a loop."""
    rt = make([fail(None, GONE), ok("s2")])
    events: list[Event] = []
    forgotten: list[str] = []
    res = run(
        rt,
        RESUME_PROMPT,
        events,
        resume=DEAD,
        fresh_prompt="do it from the start",
        on_session_gone=forgotten.append,
    )
    assert res.ok and res.attempts == 1 and res.errors == [] and not res.resumed
    assert [(c.prompt, c.resume) for c in rt.calls] == [
        (RESUME_PROMPT, DEAD),
        ("do it from the start", None),
    ]
    assert [e.payload["session"] for e in events if e.kind == "fresh"] == [DEAD]
    assert forgotten == [DEAD] and res.session_id == "s2"
    assert not [e for e in events if e.kind == "retry"]


def test_a_refusal_repeated_for_the_same_session_is_a_local_failure_not_retried(make):
    rt = make([fail(None, GONE), fail(None, GONE)])
    events: list[Event] = []
    res = run(rt, "do it", events, resume=DEAD)
    assert not res.ok and res.attempts == 1 and res.error == GONE
    assert [(c.prompt, c.resume) for c in rt.calls] == [("do it", DEAD), ("do it", None)]
    assert not [e for e in events if e.kind in ("retry", "offline")]


def test_a_local_failure_of_the_cli_is_not_retried_as_the_network(make):
    local = "the CLI failed before any request (error_during_execution): No message found"
    net = Net()
    rt = make([fail(None, local)], resilience=net)
    events: list[Event] = []
    res = run(rt, events=events)
    assert not res.ok and res.attempts == 1 and len(rt.calls) == 1 and net.probes == 0
    assert not [e for e in events if e.kind in ("retry", "offline", "fresh")]


def test_a_retry_event_says_whether_the_next_attempt_starts_afresh(make):
    died = "step child died (SIGKILL)"
    rt = make([fail(None, died), fail("s1", died), ok("s1")])
    events: list[Event] = []
    run(rt, events=events)
    assert [e.payload["fresh"] for e in events if e.kind == "retry"] == [True, False]


def test_the_versions_an_attempt_reports_land_on_the_step_s_row(make):
    async def attempt(rt: Scripted) -> StepResult:
        assert rt.script.state is not None
        rt.script.state.watch.on_event(
            Event("versions", payload={"step": "s", "sdk": "0.2.190", "cli": "2.1.337"})
        )
        return ok("s1")

    rt = make([attempt])
    events: list[Event] = []
    run(rt, events=events)
    assert (row(rt)["sdk"], row(rt)["cli"]) == ("0.2.190", "2.1.337")
    assert not [e for e in events if e.kind == "versions"], "the versions reached the screen"


def test_a_long_outage_gives_up_after_max_offline_wait(make):
    net = Net(ups=[False] * 10_000, probe_interval=0.01, max_offline_wait=0.1)
    rt = make([fail("s1", "API Error: Connection refused (ECONNREFUSED)")], resilience=net)
    res = run(rt)
    assert not res.ok and res.attempts == 1 and len(rt.calls) == 1
    assert "网络仍不通" in (res.error or "") and net.probes >= 2


def test_the_network_is_waited_for_before_the_retry(make):
    net = Net(ups=[False, False, False])
    rt = make(
        [fail("s1", "API Error: Connection refused (ECONNREFUSED)"), ok("s1")], resilience=net
    )
    res = run(rt)
    assert res.ok and res.attempts == 2 and net.probes == 4


# --- exit 2: interrupts ------------------------------------------------------------------


def test_an_interrupt_resumes_with_the_sentence_and_uses_no_attempt(make):
    async def interrupted(rt: Scripted) -> StepResult:
        await rt.request_interrupt("先写测试")
        return fail("s1", "[ede_diagnostic] result_type=user")

    rt = make([interrupted, ok("s1")])
    res = run(rt)
    assert res.ok and res.attempts == 1 and res.errors == []
    assert (rt.calls[1].prompt, rt.calls[1].resume) == (
        f"先写测试\n\n{Runtime.INTERRUPT_NOTE}",
        "s1",
    )


def test_an_interrupt_waits_for_the_reply(make):
    async def interrupted(rt: Scripted) -> StepResult:
        await rt.request_interrupt(None)
        asyncio.get_running_loop().call_later(0.05, rt.reply, "晚到的一句")
        return fail("s1", "aborted")

    rt = make([interrupted, ok("s1")])
    assert run(rt).ok
    assert rt.calls[1].prompt == f"晚到的一句\n\n{Runtime.INTERRUPT_NOTE}"


def test_an_interrupted_attempt_is_off_record_while_the_person_is_asked(make):
    # A cluster's attempt stays on record once it returned (a supervisor killed before the
    # step's row finds it and takes its result again). An interrupted one is taken: stopped
    # now (Ctrl-C twice), the next start resumes the session in an attempt of its own
    # instead of taking the interruption again and counting a second attempt.
    placed: list[tuple[str, Any]] = []
    at_reply: list[list[tuple[str, Any]]] = []

    async def interrupted(rt: Scripted) -> StepResult:
        await rt.request_interrupt(None)

        def reply() -> None:
            at_reply.append(list(placed))
            rt.reply("接着来")

        asyncio.get_running_loop().call_later(0.05, reply)
        return fail("s1", "aborted")

    async def on_record(rt: Scripted) -> StepResult:
        return ok("s1")

    rt = make([interrupted, on_record])
    original = rt.script.attempt

    async def attempt(call: StepCall, seat: Seat, watch: Watch) -> StepResult:
        watch.on_placed({"id": f"a{len(rt.calls) + 1}"})
        return await original(call, seat, watch)

    rt.script.attempt = attempt  # type: ignore[method-assign]
    rt._placed = lambda label, where: placed.append((label, where))  # type: ignore[method-assign]
    res = run(rt)
    assert res.ok and res.attempts == 1
    assert at_reply == [[("s", {"id": "a1"}), ("s", None)]]


@pytest.mark.timeout(10)  # a lost reply would leave the loop waiting for it for 600 s
def test_a_reply_that_arrives_before_its_interrupt_is_kept(make):
    # The step child reads "interrupt" and "answer" off its pipe in one go: the answer is
    # handled at once, the interrupt only scheduled.
    async def interrupted(rt: Scripted) -> StepResult:
        rt.reply("抢先到的一句")
        await rt.request_interrupt(None)
        return fail("s1", "aborted")

    rt = make([interrupted, ok("s1")])
    assert run(rt).ok
    assert rt.calls[1].prompt == f"抢先到的一句\n\n{Runtime.INTERRUPT_NOTE}"


def test_an_interrupt_with_nothing_said_sends_only_the_note(make):
    async def interrupted(rt: Scripted) -> StepResult:
        await rt.request_interrupt("")
        return fail("s1", "aborted")

    rt = make([interrupted, ok("s1")])
    assert run(rt).ok and rt.calls[1].prompt == Runtime.INTERRUPT_NOTE


def test_an_interrupt_before_any_session_stops_the_step(make):
    async def interrupted(rt: Scripted) -> StepResult:
        await rt.request_interrupt("停")
        return fail(None, "aborted")

    rt = make([interrupted])
    res = run(rt)
    assert not res.ok and res.error == Runtime.INTERRUPTED and len(rt.calls) == 1


@pytest.mark.timeout(20)  # the unanswered probes alone would hold the wait for 60 s
def test_an_interrupt_during_the_network_wait_ends_it_and_brings_the_sentence(make):
    net = Net(ups=[False] * 10_000, probe_interval=0.02, max_offline_wait=60.0)
    rt = make(
        [fail("s1", "API Error: Connection refused (ECONNREFUSED)"), ok("s1")], resilience=net
    )

    async def go() -> StepResult:
        step = asyncio.ensure_future(rt.run(SPEC, "do it", step_name="s"))
        while net.probes < 3:  # noqa: ASYNC110 - a counter the code under test bumps
            await asyncio.sleep(0.01)
        await rt.request_interrupt("网络好了再说,先改 README")
        return await step

    res = asyncio.run(go())
    rt.close()
    assert res.ok and res.attempts == 2 and res.resumed
    second = rt.calls[1]
    assert second.resume == "s1"
    assert (
        second.prompt == f"{RESUME_PROMPT}\n\n网络好了再说,先改 README\n\n{Runtime.INTERRUPT_NOTE}"
    )


# --- exit 3: handoffs --------------------------------------------------------------------


def crossing(sid: str, used: int = 160_000) -> Callable[[Scripted], Awaitable[StepResult]]:
    """An attempt whose turn reports ``used`` tokens before it ends (not a final turn)."""

    async def attempt(rt: Scripted) -> StepResult:
        if rt.turn(used):
            return fail(sid, "[ede_diagnostic] aborted_tools")
        return ok(sid)

    return attempt


def test_crossing_the_threshold_hands_off_to_a_fresh_session(make):
    rt = make([crossing("old"), ok("old", HANDOFF_TEXT), ok("new", "all done")], workbench=True)
    events: list[Event] = []
    res = run(rt, events=events)
    ask, fresh = rt.calls[1], rt.calls[2]
    assert ask.prompt == HANDOFF_PROMPT.format(used=160_000, window=WINDOW)
    assert (ask.resume, ask.fork, ask.watch_context, ask.spec.max_budget_usd) == (
        "old",
        False,
        False,
        None,
    )
    expected = Handoff.parse(HANDOFF_TEXT)
    expected.step = "s"
    assert (fresh.prompt, fresh.resume, fresh.fork) == (expected.prompt_block(), None, False)
    assert res.ok and res.retired == ["old"] and res.session_id == "new" and res.attempts == 1
    assert res.errors == [] and res.text == "all done"
    assert rt.notes_dir == rt.run_dir / "workbench" / "notes"  # Runtime(workbench=True)
    path = rt.notes_dir / "交接-s.md"
    assert Handoff.load(path) == expected
    handoffs = [e.payload for e in events if e.kind == "handoff"]
    assert [p["phase"] for p in handoffs] == ["near", "writing", "done"]
    assert handoffs[-1]["degraded"] is False and handoffs[-1]["path"] == str(path)


def test_without_a_workbench_the_handoff_still_reaches_the_successor(make):
    rt = make([crossing("old"), ok("old", HANDOFF_TEXT), ok("new")])
    events: list[Event] = []
    assert run(rt, events=events).ok
    assert rt.calls[2].prompt.endswith("## 下一步\n写第四章")
    assert [e.payload.get("path") for e in events if e.payload.get("phase") == "done"] == [None]


def test_an_incomplete_handoff_falls_back_to_the_degraded_one(make):
    rt = make([crossing("old"), ok("old", "我觉得差不多了"), ok("new")])
    res = run(rt, prompt="写一本书")
    successor = rt.calls[2].prompt
    assert res.ok and res.retired == ["old"]
    assert degraded("s", "写一本书").doing in successor and "缺了必填段" in successor


def test_prompt_too_long_hands_off_at_once_with_the_degraded_handoff(make):
    too_long = "Prompt is too long · the request is ~210000 tokens (limit 200000)"
    rt = make([fail("old", too_long), ok("new")])
    res = run(rt, prompt="写一本书")
    assert len(rt.calls) == 2, "the full session was asked to write a handoff it cannot write"
    h = degraded("s", "写一本书", why=too_long)
    assert rt.calls[1].prompt == h.prompt_block() and rt.calls[1].resume is None
    assert res.ok and res.retired == ["old"] and res.attempts == 1 and res.errors == []


def test_near_is_announced_once_per_generation(make):
    # g0 warns at 135K and fails (a retry), crosses at 160K (handoff); g1 warns at 140K.
    rt = make(
        [
            _fail_after_context("g0", 135_000),
            crossing("g0", 160_000),
            ok("g0", HANDOFF_TEXT),
            crossing("g1", 140_000),
        ]
    )
    events: list[Event] = []
    res = run(rt, events=events)
    assert res.ok and res.retired == ["g0"]
    nears = [
        e.payload["used"] for e in events if e.kind == "handoff" and e.payload["phase"] == "near"
    ]
    assert nears == [135_000, 140_000]


def _fail_after_context(sid: str, used: int) -> Callable[[Scripted], Awaitable[StepResult]]:
    async def attempt(rt: Scripted) -> StepResult:
        rt.turn(used)
        return fail(sid, OVERLOADED)

    return attempt


def test_max_generations_stops_the_step_with_a_diagnostic(make):
    rt = make(
        [
            crossing("g0"),
            ok("g0", HANDOFF_TEXT),
            crossing("g1"),
            ok("g1", HANDOFF_TEXT),
            crossing("g2"),
        ],
        handoff=HandoffPolicy(window=WINDOW, max_generations=2),
        workbench=True,
    )
    res = run(rt)
    assert (
        not res.ok and res.retired == ["g0", "g1"] and res.session_id == "g2" and res.attempts == 1
    )
    assert "max_generations=2" in (res.error or "") and "交接-s.md" in (res.error or "")
    assert len(rt.calls) == 5
    r = row(rt)
    assert r["error"] == res.error and r["retired"] == ["g0", "g1"]


def test_max_generations_without_a_workbench_says_nothing_was_saved(make):
    rt = make(
        [crossing("g0"), ok("g0", HANDOFF_TEXT), crossing("g1")],
        handoff=HandoffPolicy(window=WINDOW, max_generations=1),
    )
    res = run(rt)
    assert "max_generations=1" in (res.error or "") and "没有落盘" in (res.error or "")


def test_an_interrupt_while_the_handoff_is_written_goes_to_the_successor(make):
    async def interrupted_handoff(rt: Scripted) -> StepResult:
        await rt.request_interrupt("换个思路")
        return ok("old", HANDOFF_TEXT)

    rt = make([crossing("old"), interrupted_handoff, ok("new")])
    res = run(rt, prompt="写一本书")
    successor = rt.calls[2].prompt
    assert res.ok and res.attempts == 1 and res.retired == ["old"]
    assert successor.endswith(f"换个思路\n\n{Runtime.INTERRUPT_NOTE}")
    assert rt.calls[2].resume is None


def test_handoff_disabled_means_no_handoff_on_overflow(make):
    too_long = "Prompt is too long"
    rt = make([fail("s1", too_long)], handoff=False)
    res = run(rt)
    assert not res.ok and res.error == too_long and len(rt.calls) == 1 and res.retired == []


# --- the context watermark: the attempt reports, the loop tracks and warns ----------------


def watermark(
    tmp_path: Path, handoff: HandoffPolicy | bool, events: list[Event]
) -> tuple[StepLoop, Callable[..., bool]]:
    """A step loop and a real attempt state wired as in a run: ``turn(used, final)`` is one
    main-thread turn of the attempt in flight; it returns whether the attempt stops."""
    rt = Scripted([], workspace=tmp_path / "ws", run_dir=tmp_path / "runs", handoff=handoff)
    rt.close()
    loop = StepLoop(
        StepCall(SPEC, "do it", "s"),
        placement=rt.script,
        seat=rt.seat,
        resilience=rt.resilience,
        handoff=rt.handoff,
        interrupts=Interrupts(),
        notes_dir=None,
        hooks=StepHooks(on_session=lambda sid: None, on_attempt=lambda n: None),
        on_event=events.append,
    )
    state = AttemptState(loop.next, loop._watch())

    def turn(used: int, final: bool = False) -> bool:
        state.saw_context(used, final=final)
        stops, state.stop_requested = state.stop_requested, False
        return stops

    return loop, turn


def test_context_seen_tracks_warns_and_asks_for_a_handoff(make, tmp_path):
    events: list[Event] = []
    loop, turn = watermark(tmp_path, HandoffPolicy(window=WINDOW), events)
    assert turn(100_000) is False
    assert turn(131_000) is False  # near
    assert turn(149_000) is False
    assert turn(151_000, final=True) is False  # a final turn: no handoff
    assert turn(151_000) is True
    assert [e.kind for e in events].count("context") == 5
    assert [e.payload["used"] for e in events if e.kind == "handoff"] == [131_000]
    assert loop.ctx == 151_000


def test_context_seen_with_handoff_off_only_reports(make, tmp_path):
    events: list[Event] = []
    _, turn = watermark(tmp_path, False, events)
    assert turn(10_000_000) is False
    assert [e.kind for e in events] == ["context"]


# --- attempt.py: folding SDK messages ----------------------------------------------------


def _state() -> tuple[AttemptState, list[str], list[Event], list[int]]:
    sessions: list[str] = []
    events: list[Event] = []
    contexts: list[int] = []

    def on_event(event: Event) -> None:
        if event.kind == "context":
            contexts.append(event.payload["used"])
        else:
            events.append(event)

    state = AttemptState(
        StepCall(SPEC, "do it", "s"),
        Watch(on_session=sessions.append, on_event=on_event, on_handle=lambda h: None),
    )
    return state, sessions, events, contexts


def _result(**kw: Any) -> ResultMessage:
    base: dict[str, Any] = {
        "subtype": "success",
        "duration_ms": 1,
        "duration_api_ms": 1,
        "is_error": False,
        "num_turns": 1,
        "session_id": "s1",
    }
    return ResultMessage(**{**base, **kw})


def test_a_synthetic_api_error_is_an_error_not_the_answer():
    state, sessions, events, _ = _state()
    state.see(
        AssistantMessage(
            content=[TextBlock("Working on it.")],
            model="m",
            session_id="s1",
            usage={"input_tokens": 900},
        )
    )
    synthetic = "API Error: 529 Overloaded. This is a server-side issue"
    state.see(
        AssistantMessage(
            content=[TextBlock(synthetic)],
            model="<synthetic>",
            error="server_error",
            session_id="s1",
        )
    )
    state.see(_result(is_error=True, result=synthetic, api_error_status=529))
    r = state.result
    assert not r.ok and r.error == synthetic and r.text == "" and r.session_id == "s1"
    assert sessions == ["s1"], "the session id must be reported exactly once"
    assert [e.text for e in events if e.kind == "text"] == ["Working on it."]
    assert r.context == 900


def test_the_status_is_added_when_the_cli_text_lacks_it():
    state, *_ = _state()
    state.see(
        _result(
            is_error=True, result="Invalid API key · Fix external API key", api_error_status=401
        )
    )
    assert state.result.error == UNAUTHORIZED


def test_a_subagent_turn_does_not_count_as_the_main_context():
    state, _, _, contexts = _state()
    state.see(
        AssistantMessage(
            content=[TextBlock("sub")],
            model="m",
            parent_tool_use_id="toolu_1",
            usage={"input_tokens": 99_999},
        )
    )
    state.see(
        AssistantMessage(
            content=[TextBlock("main")], model="m", usage={"input_tokens": 10, "output_tokens": 2}
        )
    )
    assert contexts == [12] and state.result.context == 12


# What Claude Code printed when it failed before any request (recorded, issue 23).
RESUME_REFUSED_2_1_337 = {
    "type": "result",
    "subtype": "error_during_execution",
    "duration_ms": 0,
    "duration_api_ms": 0,
    "is_error": True,
    "num_turns": 0,
    "stop_reason": None,
    "session_id": DEAD,
    "total_cost_usd": 0,
    "errors": [f"No conversation found with session ID: {DEAD}"],
    "startup_failure_reason": "resume_target_not_found",
}
RESUME_REFUSED_2_1_332 = {
    k: v for k, v in RESUME_REFUSED_2_1_337.items() if k != "startup_failure_reason"
}
CONNECTION_REFUSED = {  # a turn that failed on the network: never local
    "subtype": "success",
    "duration_api_ms": 0,
    "is_error": True,
    "num_turns": 1,
    "result": "API Error: Connection refused (ECONNREFUSED)",
    "terminal_reason": "api_error",
}


@pytest.mark.parametrize(
    "payload", [RESUME_REFUSED_2_1_337, RESUME_REFUSED_2_1_332], ids=["2.1.337", "2.1.332"]
)
def test_a_cli_that_failed_before_any_request_is_a_local_failure(payload):
    from flower.step.attempt import local_failure
    from flower.step.resilience import CLI_FAILED, classify, gone_session_id, session_gone

    text = local_failure(payload)
    assert text is not None and text.startswith(CLI_FAILED), text
    assert classify(text) == "local" and session_gone(text) and gone_session_id(text) == DEAD
    assert not Resilience().should_retry(text)


def test_a_network_failure_is_never_a_local_one():
    from flower.step.attempt import local_failure
    from flower.step.resilience import classify

    assert local_failure(CONNECTION_REFUSED) is None
    assert classify(CONNECTION_REFUSED["result"]) == "transient"


def test_a_result_message_of_a_start_up_failure_reads_as_local():
    state, *_ = _state()
    state.see(
        _result(
            subtype="error_during_execution",
            is_error=True,
            num_turns=0,
            duration_api_ms=0,
            errors=[f"No conversation found with session ID: {DEAD}"],
        )
    )
    from flower.step.resilience import classify

    assert classify(state.result.error) == "local", state.result.error


def test_a_successful_result_keeps_the_answer():
    state, *_ = _state()
    state.see(AssistantMessage(content=[TextBlock("the answer")], model="m", session_id="s1"))
    state.see(_result(result="the answer", total_cost_usd=0.5, num_turns=3))
    r = state.result
    assert (
        r.ok
        and r.error is None
        and r.text == "the answer"
        and r.cost_usd == 0.5
        and r.num_turns == 3
    )


# --- attempt.py: nothing of an attempt outlives it ---------------------------------------


def test_end_leftovers_kills_what_carries_the_attempt_tag_and_nothing_else():
    tag = uuid.uuid4().hex
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    mine = subprocess.Popen(sleeper, env={**os.environ, ATTEMPT_TAG: tag}, start_new_session=True)
    other = subprocess.Popen(
        sleeper, env={**os.environ, ATTEMPT_TAG: "another-attempt"}, start_new_session=True
    )
    try:
        assert [p.pid for p in PROCS.leftovers(tag)] == [mine.pid]
        assert PROCS.end_leftovers(tag) == 1
        mine.wait(timeout=5)
        assert PROCS.leftovers(tag) == [] and other.poll() is None
    finally:
        for proc in (mine, other):
            proc.kill()
            proc.wait(timeout=5)


def test_an_exception_out_of_the_placement_stops_the_step_as_a_crash(make):
    # A bug below the loop (a placement's own code, a callback it runs) is not retried and
    # probes nothing: one attempt, one line, the traceback in the step's log file.
    async def broken(rt: Scripted) -> StepResult:
        raise KeyError("fields")

    net = Net()
    rt = make([broken, ok("never")], resilience=net)
    res = run(rt)
    assert not res.ok and res.attempts == 1 and res.errors == [res.error] and len(rt.calls) == 1
    assert "not retried" in (res.error or "") and "KeyError" in (res.error or "")
    log = rt.run_dir / "logs" / rt.run_id / "s.log"
    assert str(log) in (res.error or "") and "Traceback" in log.read_text()
    assert net.probes == 0 and net.delays == []
    assert row(rt)["error"] == res.error


# --- a guessed window, corrected by what the CLI says --------------------------------------


def learning(sid: str, window: int, used: int, seen: list[tuple[Any, Any]]):
    """An attempt whose CLI says its window is ``window``, then reports ``used`` tokens."""

    async def attempt(rt: Scripted) -> StepResult:
        call, state = rt.script.call, rt.script.state
        assert call is not None and state is not None
        seen.append((call.stop_at, call.headroom))
        state.learn(window, source="cli")
        if rt.turn(used):
            return fail(sid, "stopped")
        return ok(sid, "finished")

    return attempt


def test_a_guessed_window_is_lowered_to_the_clis_and_kept_for_the_next_steps(make, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_MODEL", raising=False)
    seen: list[tuple[Any, Any]] = []
    rt = make(
        [learning("old", 200_000, 155_000, seen), ok("old", HANDOFF_TEXT), ok("new", "done")],
        handoff=HandoffPolicy(),  # default_window(): a 1M guess
    )
    assert rt.handoff.at == 950_000
    res = run(rt)
    assert res.ok and res.retired == ["old"], "the CLI's 200K window did not hand off at 150K"
    assert seen[0] == (950_000, 50_000), "the first attempt did not know it may lower the guess"
    last = rt.script.call
    assert last is not None and (last.stop_at, last.headroom) == (150_000, None)
    assert next(iter(rt.windows.values())).window == 200_000
    # The next step of the same model starts from what was learned: no question to the CLI.
    rt.script.outcomes = [learning("s2", 200_000, 10_000, seen)]
    asyncio.run(rt.run(SPEC, "again", step_name="s2"))
    assert seen[-1] == (150_000, None)
    other = AgentSpec(name="o", instructions="x", model="claude-haiku-4-5")
    rt.script.outcomes = [learning("s3", 200_000, 10_000, seen)]
    asyncio.run(rt.run(other, "other model", step_name="s3"))
    assert seen[-1] == (950_000, 50_000), "a window learned for one model was used for another"


def test_a_window_a_person_wrote_is_never_lowered_and_never_asked(make):
    seen: list[tuple[Any, Any]] = []
    rt = make([learning("s", 200_000, 155_000, seen)], handoff=HandoffPolicy(window=400_000))
    res = run(rt)
    assert res.ok and res.retired == [], res
    assert seen == [(350_000, None)]
    assert rt.windows == {}


def test_without_handoff_nothing_is_asked_or_stopped(make):
    seen: list[tuple[Any, Any]] = []
    rt = make([learning("s", 200_000, 900_000, seen)], handoff=False)
    assert run(rt).ok
    assert seen == [(None, None)]


def test_handoff_stays_clear_of_an_auto_compaction_threshold_the_cli_reports() -> None:
    from flower.step.attempt import handoff_at

    assert handoff_at(200_000, 50_000) == 150_000
    assert handoff_at(200_000, 50_000, compact_at=167_000) == 150_000  # 17K below it
    assert handoff_at(300_000, 50_000, compact_at=200_000) == 183_000
    assert handoff_at(200_000, 20_000, compact_at=167_000) == 162_000  # never closer than 5K
    assert handoff_at(30_000, 50_000) == 10_000
