"""Children prepared ahead of their step (issue 7): while a step runs, the next step's child
is forked and its CLI started, so only the prompt is left to send. A prepared child whose
step does not run sends no request, writes no row, and leaves no process behind.
"""

from __future__ import annotations

import re
from typing import Any

import psutil
import pytest

from flower.services.model_server import ModelServer
from tests.e2e import Flower, cli_under, kill, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]  # one flower run of two or three turns

FLOWS = "tests.flows.prepared"


def conversation(name: str, turns: list[Any]) -> dict[str, Any]:
    return {"name": name, "match": {"marker": f"[[{name}]]"}, "turns": turns}


HOLD = 8  # seconds step a is held: room for the prepared child's CLI to start, even on a busy CI


def held_a(**more: Any) -> dict[str, Any]:
    """Step a is held by the server long enough to look at the supervisor's children."""
    return {
        "conversations": [
            conversation("a", [{"text": "a done.", "delay": HOLD, "times": 1, **more}])
        ]
    }


def children_with_a_cli(sup_pid: int) -> list[psutil.Process]:
    try:
        kids = psutil.Process(sup_pid).children()
    except psutil.Error:
        return []
    return [k for k in kids if cli_under(k.pid)]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def prepared_while_a_runs(f: Flower, server: ModelServer, proc: Any) -> int:
    """The pid of the second step child, the one with a started CLI and no request yet."""
    server.wait_for(lambda reqs: [r for r in reqs if r.conversation == "a"], timeout=60)
    kids = wait_until(
        lambda: len(children_with_a_cli(proc.pid)) == 2 and children_with_a_cli(proc.pid),
        30,
        "a prepared child with its CLI",
    )
    (log,) = f.runs.glob("logs/*/a.log")  # a's child wrote "--- a: attempt 1 (pid N)" on start
    running = int(re.search(r"\(pid (\d+)\)", log.read_text())[1])  # type: ignore[index]
    (prepared,) = [k.pid for k in kids if k.pid != running]
    return prepared


def test_a_prepared_child_whose_step_does_not_run_sends_nothing(model_server, flower_env):
    server = model_server(
        {
            "conversations": [
                *held_a()["conversations"],
                conversation("b", ["b done."]),
                conversation("c", ["c done."]),
            ]
        }
    )
    f: Flower = flower_env(server)
    proc = f.start(flow=f"{FLOWS}:skipped")
    prepared = prepared_while_a_runs(f, server, proc)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out.decode()
    assert not [r for r in server.requests if r.conversation == "b"], "b's child sent a request"
    assert [r["step"] for r in f.manifest()] == ["a", "c"]
    assert "b" not in f.lineage()["steps"]
    assert gone(prepared)
    logs = {p.name for p in f.runs.glob("logs/*/*.log")}
    assert "b.log" not in logs, "the unneeded child left an (empty) log behind"
    f.assert_no_survivors()


def test_the_next_step_runs_in_the_child_prepared_for_it(model_server, flower_env):
    server = model_server(
        {"conversations": [*held_a()["conversations"], conversation("b", ["b done."])]}
    )
    f: Flower = flower_env(server)
    proc = f.start(flow=f"{FLOWS}:used")
    prepared = prepared_while_a_runs(f, server, proc)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out.decode()
    (log,) = f.runs.glob("logs/*/b.log")
    assert re.search(rf"--- b: attempt 1 \(pid {prepared}\)", log.read_text()), log.read_text()
    # The supervisor preloads what an attempt imports: no child pays for an import again.
    assert "imported during the attempt" not in log.read_text(), log.read_text()
    assert [r["step"] for r in f.manifest()] == ["a", "b"] and all(r["ok"] for r in f.manifest())
    f.assert_no_survivors()


def test_a_flow_that_stops_drops_the_child_prepared_for_the_next_step(model_server, flower_env):
    server = model_server(
        {
            "conversations": [
                conversation("a", [{"error": 401, "delay": HOLD}]),
                conversation("b", ["b done."]),
            ]
        }
    )
    f: Flower = flower_env(server)
    proc = f.start(flow=f"{FLOWS}:stops")
    prepared_while_a_runs(f, server, proc)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, out.decode()
    assert not [r for r in server.requests if r.conversation == "b"]
    assert [r["step"] for r in f.manifest()] == ["a"]
    f.assert_no_survivors()


def test_a_prepared_cli_that_died_meanwhile_is_started_again_without_using_an_attempt(
    model_server, flower_env
):
    server = model_server(
        {"conversations": [*held_a()["conversations"], conversation("b", ["b done."])]}
    )
    f: Flower = flower_env(server)
    proc = f.start(flow=f"{FLOWS}:used")
    prepared = prepared_while_a_runs(f, server, proc)
    for cli in cli_under(prepared):  # its CLI goes away while it waits for its step
        cli.kill()
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out.decode()
    (row,) = f.rows("b")
    assert row["ok"] and row["attempts"] == 1 and row["errors"] == [], row
    (log,) = f.runs.glob("logs/*/b.log")
    assert f"(pid {prepared})" in log.read_text() and "starting it again" in log.read_text()
    f.assert_no_survivors()


def test_kill9_of_the_supervisor_takes_a_prepared_child_down_too(model_server, flower_env):
    server = model_server(
        {"conversations": [*held_a()["conversations"], conversation("b", ["b done."])]}
    )
    f: Flower = flower_env(server)
    proc = f.start(flow=f"{FLOWS}:used")
    prepared = prepared_while_a_runs(f, server, proc)
    kill(proc)  # SIGKILL while a waits on the model and b's child waits, its CLI started
    f.assert_no_survivors(within=5.0)
    assert gone(prepared)
    assert not [r for r in server.requests if r.conversation == "b"]

    code, out = f.run(flow=f"{FLOWS}:used")  # the next start carries on
    assert code == 0, out
    assert [r["step"] for r in f.manifest() if r["ok"]] == ["a", "b"]
    f.assert_no_survivors()
