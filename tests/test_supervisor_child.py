"""The supervisor's side of its step children: garbage on the pipe, an early exit, a death
by signal, a crash reported, a question asked, children prepared ahead of their step. Real
forks, real pipes; the children are stand-ins (the real child is exercised by the
end-to-end drills).
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flower import AgentSpec, Resilience, Runtime, StepResult, read_manifest
from flower.step.call import StepCall
from flower.step.proctree import PROCS, ProcessTree
from ipc import Answer, Ask, Failure, LineWriter, Message, Result, Shutdown, Start, read_messages
from supervisor.run.placement import Forked

SPEC = AgentSpec(name="t", instructions="x")


@pytest.fixture(autouse=True)
def _key(monkeypatch, listening_url):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    # Before a retry the loop probes the endpoint (a dead child is a failed attempt like any
    # other): here a loopback socket that accepts.
    monkeypatch.setenv("ANTHROPIC_BASE_URL", listening_url)


def runtime(tmp_path: Path) -> Runtime:
    return Runtime(
        workspace=tmp_path,
        run_dir=tmp_path / "runs",
        resilience=Resilience(max_attempts=2, base_delay=0.01, max_delay=0.02),
        placement=Forked(),
    )


def with_child(monkeypatch, behaviour) -> None:
    """Replace what the forked child runs (it still gets its real pipes and log)."""

    def fake_child_main(setup) -> int:
        os.dup2(os.open(str(setup.log_path), os.O_WRONLY | os.O_CREAT, 0o600), 2)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as the real child: SIGTERM ends it
        PROCS.forked()  # the signals held back across the fork
        return behaviour(setup)

    monkeypatch.setattr("supervisor.run.placement.child_main", fake_child_main)


def run(rt: Runtime):
    try:
        return asyncio.run(rt.run(SPEC, "do it", step_name="s"))
    finally:
        rt.close()


def test_a_garbage_line_is_a_failed_attempt_not_a_crash(tmp_path, monkeypatch):
    def garbage(setup) -> int:
        os.write(setup.write_fd, b'{"v": 1, "type": "hello", "pid": "not a number"}\n')
        time.sleep(30)  # the supervisor must stop us
        return 0

    with_child(monkeypatch, garbage)
    result = run(runtime(tmp_path))
    assert not result.ok and result.attempts == 2
    assert all("protocol error from step child" in e for e in result.errors), result.errors
    (row,) = read_manifest(tmp_path / "runs")
    assert row["error"].startswith("protocol error") and row["attempts"] == 2


def test_an_oversized_line_is_a_failed_attempt(tmp_path, monkeypatch):
    def flood(setup) -> int:
        os.write(setup.write_fd, b"x" * (9 * 1024 * 1024))  # over the 8 MiB line bound, no newline
        time.sleep(30)
        return 0

    with_child(monkeypatch, flood)
    result = run(runtime(tmp_path))
    assert not result.ok and "protocol error" in (result.error or "")


def test_a_child_that_exits_without_a_result(tmp_path, monkeypatch):
    def quit_after_start(setup) -> int:
        os.read(setup.read_fd, 1 << 16)  # take the step, then leave without a word
        return 3

    with_child(monkeypatch, quit_after_start)
    result = run(runtime(tmp_path))
    assert not result.ok and result.attempts == 2
    assert all("died without a result (exited with status 3)" in e for e in result.errors), (
        result.errors
    )


def test_a_child_that_dies_before_taking_the_step(tmp_path, monkeypatch):
    with_child(monkeypatch, lambda setup: 3)
    result = run(runtime(tmp_path))
    assert not result.ok and result.attempts == 2
    # Either the start message could not be written, or it was and nobody answered.
    for e in result.errors:
        assert "exited with status 3" in e, result.errors


def test_a_child_killed_by_a_signal(tmp_path, monkeypatch):
    def die(setup) -> int:
        os.read(setup.read_fd, 1 << 16)
        os.kill(os.getpid(), signal.SIGKILL)
        return 0

    with_child(monkeypatch, die)
    result = run(runtime(tmp_path))
    assert not result.ok and "killed by SIGKILL" in (result.error or "")


# --- what a child reports, and children prepared ahead --------------------------------------


def _frames(setup) -> Iterator[Message]:
    """The frames the supervisor sends this stand-in child, until EOF."""
    yield from read_messages(setup.read_fd)


def _send(setup, msg: Message) -> None:
    LineWriter(setup.write_fd).send(msg)


def test_a_child_reporting_a_crash_is_not_retried_and_the_row_says_why(tmp_path, monkeypatch):
    def crash(setup) -> int:
        next(_frames(setup))  # the start
        _send(setup, Failure("ImportError", "no module named 'x'", False, "Traceback: ..."))
        return 1

    with_child(monkeypatch, crash)
    result = run(runtime(tmp_path))
    assert not result.ok and result.attempts == 1 and result.errors == [result.error]
    assert "not retried" in result.error and "ImportError: no module named 'x'" in result.error
    (row,) = read_manifest(tmp_path / "runs")
    assert row["error"] == result.error and row["attempts"] == 1


def test_a_retryable_failure_from_a_child_is_retried(tmp_path, monkeypatch):
    def overloaded(setup) -> int:
        next(_frames(setup))
        _send(setup, Failure("APIError", "overloaded", True))
        return 1

    with_child(monkeypatch, overloaded)
    result = run(runtime(tmp_path))
    assert not result.ok and result.attempts == 2
    assert result.errors == ["step child failed: APIError: overloaded"] * 2


def test_a_question_from_a_child_is_put_to_the_person_and_answered(tmp_path, monkeypatch):
    def asks(setup) -> int:
        frames = _frames(setup)
        next(frames)
        _send(setup, Ask("q1", "Which one?", ["red", "blue"], "choice"))
        answer = next(frames)
        assert isinstance(answer, Answer)
        _send(
            setup,
            Result(StepResult(step="s", ok=True, text=f"{answer.state}:{answer.text}").to_dict()),
        )
        return 0

    asked: list[Ask] = []

    async def person(question: Ask) -> str:
        asked.append(question)
        return "blue"

    with_child(monkeypatch, asks)
    rt = runtime(tmp_path)
    rt.placement = Forked(ask=person)
    result = run(rt)
    assert result.ok and result.text == "answered:blue"
    assert [q.question for q in asked] == ["Which one?"]


def test_a_prepared_child_runs_its_step_and_an_unneeded_one_exits_unstarted(tmp_path, monkeypatch):
    marks = tmp_path / "marks"
    marks.mkdir()

    def stand_in(setup) -> int:
        # What the real child does with its frames, minus the CLI: note each one by label.
        for msg in _frames(setup):
            (marks / f"{setup.call.label}.{os.getpid()}.{msg.TYPE}").touch()
            if isinstance(msg, Start):
                _send(setup, Result(StepResult(step=msg.label, ok=True, text=msg.prompt).to_dict()))
                return 0
            if isinstance(msg, Shutdown):
                return 0
        return 3

    with_child(monkeypatch, stand_in)
    rt = runtime(tmp_path)
    placement = rt.placement
    assert isinstance(placement, Forked)

    async def go() -> tuple[StepResult, int, int]:
        rt.prepare([StepCall(SPEC, "", "a"), StepCall(SPEC, "", "b")])
        (a_child, b_child) = placement.prepared
        result = await rt.run(SPEC, "the prompt of a", step_name="a")
        rt.prepare([])  # the flow moved on without b
        await rt.drain()
        return result, a_child.pid, b_child.pid

    try:
        result, a_pid, b_pid = asyncio.run(go())
    finally:
        rt.close()
    assert result.ok and result.text == "the prompt of a"
    assert sorted(p.name for p in marks.iterdir()) == sorted(
        [f"a.{a_pid}.start", f"b.{b_pid}.shutdown"]
    ), "a did not run in its prepared child, or b was started"
    assert [r["step"] for r in read_manifest(tmp_path / "runs")] == ["a"]
    assert not (tmp_path / "runs" / "logs" / rt.run_id / "b.log").exists()  # empty: removed


def test_a_prepared_child_that_died_is_replaced_without_using_an_attempt(tmp_path, monkeypatch):
    def stand_in(setup) -> int:
        if setup.call.prompt == "":  # the prepared one dies before its step comes
            return 9
        for msg in _frames(setup):
            if isinstance(msg, Start):
                _send(setup, Result(StepResult(step=msg.label, ok=True, text="fresh").to_dict()))
                return 0
        return 3

    with_child(monkeypatch, stand_in)
    rt = runtime(tmp_path)
    placement = rt.placement
    assert isinstance(placement, Forked)

    async def go() -> StepResult:
        rt.prepare([StepCall(SPEC, "", "a")])
        (prepared,) = placement.prepared
        while prepared.poll() is None:  # noqa: ASYNC110 - its death, not a fixed time
            await asyncio.sleep(0.01)
        return await rt.run(SPEC, "go", step_name="a")

    try:
        result = asyncio.run(go())
    finally:
        rt.close()
    assert result.ok and result.text == "fresh" and result.attempts == 1 and result.errors == []


def test_no_child_is_prepared_for_a_session_still_being_flushed(tmp_path, monkeypatch):
    gate = tmp_path / "may-exit"

    def slow_exit(setup) -> int:
        for msg in _frames(setup):
            if isinstance(msg, Shutdown):
                return 0
            if isinstance(msg, Start):
                _send(setup, Result(StepResult(step=msg.label, session_id="S", ok=True).to_dict()))
                break
        deadline = time.monotonic() + 30  # bounded: a failing test must not leave it spinning
        while not gate.exists() and time.monotonic() < deadline:  # "its CLI still writes"
            time.sleep(0.01)
        return 0

    with_child(monkeypatch, slow_exit)
    rt = runtime(tmp_path)
    placement = rt.placement
    assert isinstance(placement, Forked)

    async def go() -> tuple[int, int]:
        await rt.run(SPEC, "go", step_name="a")
        rt.prepare([StepCall(SPEC, "", "b", resume="S")])  # b continues a's session
        while_closing = len(placement.prepared)
        gate.touch()
        await rt.drain()
        rt.prepare([StepCall(SPEC, "", "b", resume="S")])
        after = len(placement.prepared)
        rt.prepare([])
        await rt.drain()
        return while_closing, after

    try:
        assert asyncio.run(go()) == (0, 1)
    finally:
        rt.close()


class NoForks(ProcessTree):
    """The process tree of a machine out of processes: every fork fails with EAGAIN."""

    forks = 0

    def fork(self) -> int:
        NoForks.forks += 1
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")


def test_a_fork_that_fails_is_a_failed_attempt_and_preparing_just_skips(tmp_path):
    NoForks.forks = 0
    rt = runtime(tmp_path)
    rt.placement = Forked(procs=NoForks())

    async def go() -> StepResult:
        rt.prepare([StepCall(SPEC, "", "s")])  # an optimisation: failing it changes nothing
        return await rt.run(SPEC, "do it", step_name="s")

    try:
        result = asyncio.run(go())
    finally:
        rt.close()
    assert not result.ok and result.attempts == 2 and NoForks.forks == 3
    assert all("could not fork a step child" in e and "temporarily" in e for e in result.errors)
    assert [r["attempts"] for r in read_manifest(tmp_path / "runs")] == [2]
