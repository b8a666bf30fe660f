"""A person at the supervisor's terminal, with the attempts on a cluster (issue 19, point 7):
a question asked by an attempt running on a worker is shown on the terminal of the person
who started the run, the answer typed there goes back to the attempt, and a line typed
while a step runs on a worker reaches that attempt's inbox.

Real things only: a ``flower`` on a pseudo-terminal, a ``flower-super worker`` process, the
suite's Temporal dev server and PostgreSQL, the real CLI against the scripted model server.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest

from flower.services.model_server import ModelServer
from flower.testing import starter_script
from flower.testing.pytest_postgres import pg_dsn, pg_server  # noqa: F401 - fixtures
from flower.testing.pytest_temporal import temporal_queue, temporal_target  # noqa: F401
from tests.e2e import TAG, Flower, Pty, wait_until

# A worker imports the SDK (~3 s on a busy machine); the starter flow's four CLI sessions run
# one after another through Temporal, a question waits for the person in the middle.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

WRITE_HI = {"tool_use": {"name": "Bash", "input": {"command": "echo hi > hi.txt"}}}


@pytest.fixture
def cluster(
    flower_env: Callable[..., Flower],
    pg_dsn: str,  # noqa: F811
    temporal_target: str,  # noqa: F811
    temporal_queue: str,  # noqa: F811
) -> Iterator[Callable[[ModelServer], tuple[Flower, list[str]]]]:
    """``make(server)``: a workspace whose runs keep their state in a database of their own
    and place their attempts on a queue of their own, one worker serving it; returns the
    Flower and the flags a person adds to ``flower``."""
    workers: list[subprocess.Popen[str]] = []
    stack = contextlib.ExitStack()

    def make(server: ModelServer) -> tuple[Flower, list[str]]:
        f = flower_env(server)
        log = stack.enter_context((f.root / "worker.log").open("w"))
        argv = [sys.executable, "-m", "supervisor", "worker", "--temporal", temporal_target]
        argv += ["--queue", temporal_queue, "--state", pg_dsn]
        # this machine's credentials, as the worker's own; not the supervisor's tag: the
        # worker's tree is looked at on its own (no_attempt_left)
        env = {k: v for k, v in f.env.items() if k != TAG}
        proc = subprocess.Popen(
            argv,
            cwd=f.root,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        workers.append(proc)
        wait_until(
            lambda: (
                (f.root / "worker.log").read_text().startswith("-- ") or proc.poll() is not None
            ),
            90,
            "the worker's ready line",
        )
        assert proc.poll() is None, (f.root / "worker.log").read_text()
        placement = f"temporal://{temporal_target}/{temporal_queue}"
        return f, ["--state", pg_dsn, "--placement", placement]

    make.workers = workers  # type: ignore[attr-defined]
    yield make
    for proc in workers:
        proc.send_signal(signal.SIGINT)
        proc.send_signal(signal.SIGINT)  # again: what still runs goes back, at once
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    stack.close()


def flower_argv(f: Flower, flags: list[str], *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "supervisor.commands.flower_cli",
        "-w",
        str(f.ws),
        "-r",
        str(f.runs),
        *flags,
        *args,
    ]


def no_attempt_left(workers: list[subprocess.Popen[str]]) -> None:
    """No worker has a process below it (a step child, a CLI, a tool shell) any more."""

    def below() -> list[psutil.Process]:
        out: list[psutil.Process] = []
        for w in workers:
            with contextlib.suppress(psutil.Error):
                out += psutil.Process(w.pid).children(recursive=True)
        return out

    wait_until(lambda: not below(), 15, "the workers' attempt processes to end")


def results_of(request: Any) -> str:
    """Every tool result a request carries, as one text."""
    out = []
    for message in request.messages:
        content = message.get("content")
        if isinstance(content, list):
            out += [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
    return json.dumps(out, ensure_ascii=False)


def test_a_question_from_an_attempt_on_a_worker_is_answered_at_the_person_s_terminal(
    model_server, cluster
):
    server = model_server(
        starter_script(work=[[WRITE_HI]], questions=[("Which file?", ["hi.txt", "bye.txt"])])
    )
    f, flags = cluster(server)
    term = Pty(f, flower_argv(f, flags, "make a file"))
    try:
        try:
            term.expect("Which file?", timeout=120)
            term.expect("1) hi.txt")
        except AssertionError as exc:
            worker = (f.root / "worker.log").read_text()
            raise AssertionError(
                f"{exc}\n--- screen:\n{term.pump()}\n--- worker:\n{worker}"
            ) from None
        term.type("1\r")
        assert term.wait(timeout=180) == 0, term.pump()
        screen = term.pump()
    finally:
        term.close()
    assert "@ " in screen and "worker pid" in screen, screen  # the attempts ran on the worker
    asked = [r for r in server.requests if r.conversation == "clarifier"]
    answered = [r for r in asked if "hi.txt" in results_of(r)]
    assert answered, [results_of(r) for r in asked]
    log = (f.ws / ".flower" / "notes" / "问答记录.md").read_text(encoding="utf-8")
    assert "[answered]" in log and "hi.txt" in log, log
    assert (f.ws / "hi.txt").read_text() == "hi\n"
    took = (f.root / "worker.log").read_text()
    assert "确认需求" in took and "干活" in took, took  # the worker ran them, not a fork here
    f.assert_no_survivors()
    no_attempt_left(cluster.workers)


def test_a_line_typed_while_a_step_runs_on_a_worker_reaches_its_inbox(model_server, cluster):
    from tests.test_e2e_starter import ASK, BRIEF, WORK_MARK, asked, conv, notes, tool

    said = "write the tests first"
    inbox = tool("mcp__human__inbox")
    inbox["delay"] = 8  # the coordinator looks at its inbox a little after the step began
    server = model_server(
        {
            "conversations": [
                conv("clarify", [BRIEF], marker="[[ask]]"),
                conv("coordinate", [inbox, "done."], marker=WORK_MARK),
            ],
            "default": ["ok"],
        }
    )
    f, flags = cluster(server)
    term = Pty(f, flower_argv(f, flags, ASK, "--no-goal", "--timeout", "120"))
    try:
        term.expect("== 干活", timeout=120)
        term.expect("worker pid")
        wait_until(lambda: asked(server, "coordinate"), 60, "the coordinator's first request")
        term.type(said + "\r")
        term.expect("+ 收到")
        assert term.wait(timeout=120) == 0, term.pump()
    finally:
        term.close()
    assert said in (notes(f) / "需求.md").read_text(encoding="utf-8")
    work = asked(server, "coordinate")
    assert any(said in results_of(r) for r in work[1:]), [results_of(r) for r in work]
    f.assert_no_survivors()
    no_attempt_left(cluster.workers)


def test_a_question_answered_before_the_supervisor_was_killed_is_not_asked_again(
    model_server, cluster
):
    """The person answers the clarifier's question (on a worker), the supervisor is killed
    -9 while the clarifier goes on, and the same command again attaches to the clarifier's
    attempt: it shows what ran, but never the answered question again (it used to ask it
    again, and the new answer went nowhere)."""
    from tests.e2e import kill

    script = starter_script(work=[[WRITE_HI]], questions=[("Which file?", ["hi.txt", "bye.txt"])])
    (clarifier,) = [c for c in script["conversations"] if c["name"] == "clarifier"]
    brief = clarifier["turns"][-1]
    held = brief if isinstance(brief, dict) else {"text": brief}
    clarifier["turns"][-1] = {**held, "delay": 10, "times": 1}  # time to kill and start again
    server = model_server(script)
    f, flags = cluster(server)
    argv = flower_argv(f, flags, "make a file")
    term = Pty(f, argv)
    try:
        term.expect("Which file?", timeout=120)
        term.type("1\r")
        wait_until(
            lambda: [
                r
                for r in server.requests
                if r.conversation == "clarifier" and "hi.txt" in results_of(r)
            ],
            60,
            "the answer to reach the clarifier",
        )
        assert kill(term.proc) == -signal.SIGKILL
    finally:
        term.close()
    again = Pty(f, argv)  # the same command
    try:
        assert again.wait(timeout=180) == 0, again.pump()
        screen = again.pump()
    finally:
        again.close()
    assert "Which file?" not in screen, screen
    assert "worker pid" in screen, screen  # it attached to the clarifier on the worker
    log = (f.ws / ".flower" / "notes" / "问答记录.md").read_text(encoding="utf-8")
    assert log.count("Which file?") == 1, log
    assert (f.ws / "hi.txt").read_text() == "hi\n"
    f.assert_no_survivors()
    no_attempt_left(cluster.workers)
