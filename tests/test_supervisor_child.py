"""The supervisor's side of a step child that misbehaves: garbage on the pipe, an early
exit, a death by signal. Real forks, real pipes; the children are stand-ins that break
the protocol on purpose (the real child is exercised by the end-to-end drills).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from flower import AgentSpec, Resilience, Runtime, read_manifest
from supervisor.placement import Forked

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
        return behaviour(setup)

    monkeypatch.setattr("supervisor.placement.child_main", fake_child_main)


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
