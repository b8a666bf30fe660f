"""Kill drills: the real flower-super, the real CLI, the scripted model server.

Each drill kills something for real and then judges by what persists (lineage, manifest,
workspace files), what the model server received, exit codes, and the process table.

Every drill runs twice (``state``): with local state (the run_dir's files) and with
``FLOWER_STATE`` naming a fresh PostgreSQL database of its own, where lineage, manifest and
transcripts are read by SQL (tests/e2e_pg.py) and no ``sessions.db``, ``lineage.json`` or
``manifest.json`` may appear under the run_dir.
"""

from __future__ import annotations

import signal

import pytest

from tests.e2e import Flower, kill, wait_until
from tests.e2e_pg import STATES

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]  # two flower runs of real CLI turns each

FLOW = "tests.flows.basic:two"
HOLD = 90  # seconds the scripted model "thinks" (once) so a drill can kill mid-step


def script(second_turns: list) -> dict:
    return {
        "conversations": [
            {"name": "first", "match": {"marker": "[[first]]"}, "turns": [{"text": "first done."}]},
            {"name": "second", "match": {"marker": "[[second]]"}, "turns": second_turns},
        ]
    }


def bash(command: str) -> dict:
    return {"tool_use": {"name": "Bash", "input": {"command": command, "description": "test step"}}}


def waiting_on(server, conversation: str, turn: int) -> None:
    server.wait_for(
        lambda reqs: any(r.conversation == conversation and r.turn == turn for r in reqs),
        timeout=60,
    )


@pytest.fixture(params=STATES)
def state(request: pytest.FixtureRequest) -> str | None:
    """Where the drill's flower keeps its run state: None (local files), or the URL of a
    PostgreSQL database made for this test."""
    return request.getfixturevalue("pg_dsn") if request.param == "postgres" else None


def no_api_error_sent(server) -> None:
    for req in server.requests:
        assert not any("API Error" in t for t in req.texts()), (
            f"request {req.seq} fed an API error back"
        )


def test_kill9_supervisor_waiting_on_model(model_server, flower_env, state):
    server = model_server(
        script(
            [bash("echo ran >> counter.txt"), {"text": "second done.", "delay": HOLD, "times": 1}]
        )
    )
    f: Flower = flower_env(server, state=state)
    proc = f.start(flow=FLOW)
    waiting_on(server, "second", 1)
    before = f.lineage()["steps"]
    wait_until(lambda: f.has_tool_result(before["second"]), 10, "the tool result in sessions.db")
    killed_at = max(r.seq for r in server.requests)
    assert kill(proc) == -signal.SIGKILL
    f.assert_no_survivors(within=5.0)

    code, out = f.run(flow=FLOW)
    assert code == 0, out
    after = [r for r in server.requests if r.seq > killed_at]
    assert not [r for r in after if r.conversation == "first"], (
        "a finished step was sent to the model again"
    )
    resumed = [r for r in after if r.conversation == "second"]
    assert resumed and {r.session_id for r in resumed} == {before["second"]}
    kinds = [
        b.get("type")
        for m in resumed[0].messages
        for b in m["content"]
        if isinstance(m["content"], list)
    ]
    assert "tool_use" in kinds and "tool_result" in kinds, (
        "the earlier turns were not sent on resume"
    )
    assert (f.ws / "counter.txt").read_text().splitlines() == ["ran"], (
        "a completed tool call ran again"
    )
    assert f.lineage()["steps"]["second"] == before["second"]
    assert [r["ok"] for r in f.rows("second")] == [True]
    no_api_error_sent(server)
    f.assert_no_survivors()
    f.assert_state_home()


def test_kill9_supervisor_during_tool_call(model_server, flower_env, state):
    slow = (
        "python3 -c \"import pathlib,time; pathlib.Path('tool.started').touch(); time.sleep(300)\""
    )
    server = model_server(script([bash(slow), {"text": "second done."}]))
    f: Flower = flower_env(server, state=state)
    proc = f.start(flow=FLOW)
    wait_until(lambda: (f.ws / "tool.started").exists(), 60, "the slow tool to start")
    sid = f.lineage()["steps"]["second"]
    killed_at = max(r.seq for r in server.requests)
    kill(proc)
    f.assert_no_survivors(within=5.0)  # the tool's own python process included

    code, out = f.run(flow=FLOW)
    assert code == 0, out
    after = [r for r in server.requests if r.seq > killed_at and r.conversation == "second"]
    assert after and {r.session_id for r in after} == {sid}
    assert not [r for r in server.requests if r.answer == "rejected"], (
        "a tool_use without tool_result was sent"
    )
    results = [
        b
        for m in after[0].messages
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result"
    ]
    assert results, "the interrupted tool call has no tool_result on resume"
    assert not [r for r in server.requests if r.seq > killed_at and r.conversation == "first"], (
        "a finished step was sent to the model again"
    )
    assert f.lineage()["steps"]["second"] == sid
    no_api_error_sent(server)
    f.assert_no_survivors()
    f.assert_state_home()


def test_kill9_while_the_first_request_waits_continues_that_session(
    model_server, flower_env, state
):
    # Issue 9: a step killed while its very first request waits (a clarifier thinking) is
    # continued, not started again: lineage names the session once sessions.db holds it.
    server = model_server(script([{"text": "second done.", "delay": HOLD, "times": 1}]))
    f: Flower = flower_env(server, state=state)
    proc = f.start(flow=FLOW)
    waiting_on(server, "second", 0)
    doomed = next(r.session_id for r in server.requests if r.conversation == "second")
    wait_until(lambda: f.lineage()["steps"].get("second") == doomed, 10, "lineage to name it")
    assert f.transcript(doomed), "lineage named a session sessions.db does not have"
    killed_at = max(r.seq for r in server.requests)
    kill(proc)
    f.assert_no_survivors(within=5.0)

    code, out = f.run(flow=FLOW)
    assert code == 0, out
    assert f.lineage()["steps"]["second"] == doomed
    after = [r for r in server.requests if r.seq > killed_at]
    resumed = [r for r in after if r.conversation == "second"]
    assert resumed and {r.session_id for r in resumed} == {doomed}
    assert not [r for r in after if r.conversation == "first"]
    # first ran once; the restart reused it: a row of $0 marked reused (seed 004)
    rows = f.rows("first")
    assert [(r["ok"], r.get("reused")) for r in rows] == [(True, None), (True, "run-only")]
    assert rows[1]["cost_usd"] == 0
    assert rows[1]["saved_usd"] == pytest.approx(rows[0]["cost_usd"], abs=1e-6)
    no_api_error_sent(server)
    f.assert_no_survivors()
    f.assert_state_home()


def test_kill9_step_child_is_resumed_in_a_new_child(model_server, flower_env, state):
    server = model_server(
        script(
            [bash("echo ran >> counter.txt"), {"text": "second done.", "delay": HOLD, "times": 1}]
        )
    )
    f: Flower = flower_env(server, state=state)
    proc = f.start(flow=FLOW)
    waiting_on(server, "second", 1)
    child = wait_until(lambda: f.step_child(proc.pid), 10, "the step child")
    sid = f.lineage()["steps"]["second"]
    wait_until(lambda: f.has_tool_result(sid), 10, "the tool result in sessions.db")
    child.kill()
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 0, out.decode()
    (row,) = f.rows("second")
    assert row["ok"] and row["attempts"] == 2 and row["resumed"], row
    assert "SIGKILL" in row["errors"][0], row["errors"]
    assert row["session_id"] == sid and f.lineage()["steps"]["second"] == sid
    assert (f.ws / "counter.txt").read_text().splitlines() == ["ran"]
    f.assert_no_survivors()
    f.assert_state_home()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_term_and_hup_write_one_killed_row_and_die_of_it(model_server, flower_env, state, sig):
    server = model_server(
        script(
            [bash("echo ran >> counter.txt"), {"text": "second done.", "delay": HOLD, "times": 1}]
        )
    )
    f: Flower = flower_env(server, state=state)
    proc = f.start(flow=FLOW)
    waiting_on(server, "second", 1)
    assert kill(proc, sig) == -sig  # died of the signal: a shell sees 128+n
    rows = f.rows("second")
    assert len(rows) == 1 and rows[0]["error"] == "killed-by-signal" and not rows[0]["ok"], rows
    assert rows[0]["session_id"] == f.lineage()["steps"]["second"]
    f.assert_no_survivors(within=5.0)
    code, js = f.status_json()
    assert code == 3 and js["flowers"][0]["state"] == "killed"

    code, out = f.run(flow=FLOW)
    assert code == 0, out
    assert [r["error"] for r in f.rows("second")] == ["killed-by-signal", None]
    f.assert_no_survivors()
    f.assert_state_home()
