"""Ctrl-C through a real pseudo-terminal: the terminal's SIGINT reaches only the supervisor.

The supervisor runs as the session leader of a pty, like under a shell; its step children
are in their own process groups, so the ``^C`` typed into the pty signals the supervisor
alone, which then decides what the child gets.
"""

from __future__ import annotations

import pytest

from tests import e2e
from tests.e2e import Flower, attempt_child, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]  # real CLI turns plus a resumed run

FLOW = "tests.flows.basic:one"
SENTENCE = "也顺便把 README 更新一下"


def Pty(f: Flower, flow: str = FLOW) -> e2e.Pty:
    """flower-super start on a pseudo-terminal."""
    return e2e.Pty(f, f.argv("start", "--flow", flow, "-w", str(f.ws), "-r", str(f.runs)))


def script(turns: list) -> dict:
    return {"conversations": [{"name": "only", "match": {"marker": "[[only]]"}, "turns": turns}]}


def test_ctrl_c_once_then_a_sentence_reaches_the_same_session(model_server, flower_env):
    server = model_server(script([{"text": "only done.", "delay": 90, "times": 1}]))
    f: Flower = flower_env(server)
    term = Pty(f)
    try:
        server.wait_for(lambda reqs: any(r.conversation == "only" for r in reqs), timeout=60)
        term.type(b"\x03")
        term.expect("已打断这一轮")
        term.type(SENTENCE.encode() + b"\n")
        assert term.wait() == 0, term.pump()
    finally:
        term.close()
    # A step that cannot delegate has no subagent to lose: the warning is not given.
    shown = term.raw.decode("utf-8", "replace")
    assert "! 已打断这一轮。\r\n" in shown and "subagent" not in shown, shown
    asked = [
        r
        for r in server.requests
        if r.conversation == "only" and any(SENTENCE in t for t in r.texts())
    ]
    assert asked, "the sentence typed after Ctrl-C never reached the model"
    first = next(r for r in server.requests if r.conversation == "only")
    assert {r.session_id for r in asked} == {first.session_id}, (
        "the interrupt did not resume the same session"
    )
    (row,) = f.rows("only")
    assert row["ok"] and row["attempts"] == 1 and row["session_id"] == first.session_id, row
    f.assert_no_survivors()


def test_ctrl_c_in_a_step_with_subagents_warns_that_they_lose_their_work(model_server, flower_env):
    turns = [{"text": "协调完了。", "delay": 90, "times": 1}]
    spec = {"name": "coordinate", "match": {"marker": "[[coordinate]]"}, "turns": turns}
    server = model_server({"conversations": [spec]})
    f: Flower = flower_env(server)
    term = Pty(f, flow="tests.flows.roles:coordinated")  # a coordinator with a worker
    try:
        server.wait_for(lambda reqs: any(r.conversation == "coordinate" for r in reqs), 60)
        term.type(b"\x03")
        term.expect("! 已打断这一轮。正在跑的 subagent 会丢掉半成品。")
        term.type(b"\n")
        assert term.wait() == 0, term.pump()
    finally:
        term.close()
    (row,) = f.rows("协调")
    assert row["ok"] and row["attempts"] == 1, row
    f.assert_no_survivors()


def test_ctrl_c_twice_exits_and_the_next_start_resumes(model_server, flower_env):
    echo = {"tool_use": {"name": "Bash", "input": {"command": "echo hi", "description": "warm up"}}}
    server = model_server(script([echo, {"text": "only done.", "delay": 90, "times": 1}]))
    f: Flower = flower_env(server)
    term = Pty(f)
    try:
        # Wait for the second turn: by then the session id is known and in lineage.json, and
        # (a moment later: the CLI writes a turn only after sending the next request) its
        # first turn is in sessions.db, which the next start checks before resuming it.
        held = server.wait_for(
            lambda reqs: [r for r in reqs if r.conversation == "only" and r.turn == 1], timeout=60
        )
        wait_until(lambda: f.has_tool_result(held[0].session_id), 10, "the turn in sessions.db")
        term.type(b"\x03")
        term.expect("已打断这一轮")
        term.type(b"\x03")
        assert term.wait() == 130, term.pump()
    finally:
        term.close()
    f.assert_no_survivors(within=5.0)
    assert f.rows("only") == [], "Ctrl-C twice must not write the in-flight step"
    first = next(r for r in server.requests if r.conversation == "only")

    code, out = f.run(flow=FLOW)
    assert code == 0, out
    assert f.lineage()["steps"]["only"] == first.session_id
    assert {r.session_id for r in server.requests if r.conversation == "only"} == {first.session_id}


@pytest.mark.timeout(120)  # one flower run: a death, a backoff cut short, the resumed turn
def test_ctrl_c_during_the_backoff_after_a_death_reaches_the_same_session(model_server, flower_env):
    echo = {"tool_use": {"name": "Bash", "input": {"command": "echo hi", "description": "warm up"}}}
    server = model_server(
        {
            "conversations": [
                {
                    "name": "backoff",
                    "match": {"marker": "[[backoff]]"},
                    "turns": [echo, {"text": "backoff done.", "delay": 90, "times": 1}],
                }
            ]
        }
    )
    f: Flower = flower_env(server)
    term = Pty(f, flow="tests.flows.inside:backoff")
    try:
        held = server.wait_for(
            lambda reqs: [r for r in reqs if r.conversation == "backoff" and r.turn == 1],
            timeout=60,
        )
        sid = held[0].session_id
        wait_until(lambda: f.has_tool_result(sid), 10, "the tool result in sessions.db")
        child = wait_until(lambda: attempt_child(term.proc.pid), 10, "the step child")
        killed_at = max(r.seq for r in server.requests)
        child.kill()
        term.expect("步骤子进程意外退出")  # the death is a failed attempt: the backoff begins
        term.type(b"\x03")
        term.expect("已打断这一轮")
        term.type(SENTENCE.encode() + b"\n")
        assert term.wait() == 0, term.pump()
    finally:
        term.close()
    told = [r for r in server.requests if any(SENTENCE in t for t in r.texts())]
    assert told and {r.session_id for r in told} == {sid}, "the sentence did not reach the session"
    # The Ctrl-C ended the backoff itself: the first request after the death already carries
    # the sentence (a Ctrl-C that came after the wait would have interrupted a new attempt).
    after = [r for r in server.requests if r.seq > killed_at and r.conversation == "backoff"]
    assert after and any(SENTENCE in t for t in after[0].texts()), [r.texts()[-1:] for r in after]
    (row,) = f.rows("backoff")
    assert row["ok"] and row["session_id"] == sid and row["resumed"], row
    # The death used an attempt; the interrupt during the backoff did not.
    assert row["attempts"] == 2 and len(row["errors"]) == 1, row
    assert "died without a result (killed by SIGKILL)" in row["errors"][0], row["errors"]
    f.assert_no_survivors()
