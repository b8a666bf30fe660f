"""``flower "…"`` offline, scripted with ``flower.testing.starter_script``: the real ``flower``
command, supervisor and CLI, every role of the starter flow played by the model server with
no marker, section or verdict format written by the test.

Judged by the workspace, the files flower keeps, the exit status and stop line, and what the
server received (``r.conversation`` names the role).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from flower import Verdict
from flower.people.human import TIMEOUT
from flower.testing import ModelServer, starter_script
from tests.e2e import Flower
from tests.test_e2e_flower import flower

# Each test runs the whole starter flow (5-8 CLI sessions of a turn or two) once or twice.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def bash(command: str) -> dict[str, Any]:
    return {"tool_use": {"name": "Bash", "input": {"command": command}}}


def asked(server: ModelServer) -> list[tuple[str | None, int | None]]:
    return [(r.conversation, r.turn) for r in server.requests if r.path == "/v1/messages"]


def sessions(server: ModelServer, name: str) -> set[str | None]:
    return {r.session_id for r in server.requests if r.conversation == name}


def test_a_starter_script_plays_every_role_through_two_rounds_and_a_wake(model_server, flower_env):
    script = starter_script(
        questions=[("Which file?", ["hi.txt", "out.txt"])],
        work=[[bash("echo hi > hi.txt")], [bash("echo there >> hi.txt"), "Added a line."], "Fine."],
        verdicts=["not_yet", "achieved", "achieved"],
    )
    server = model_server(script)
    f: Flower = flower_env(server)

    code, out, err = flower(f, "make hi.txt", "--timeout", "0")
    assert code == 0, out + err
    assert (f.ws / "hi.txt").read_text() == "hi\nthere\n"
    assert asked(server) == [
        ("probe", 0),
        ("clarifier", 0),  # the question
        ("clarifier", 1),  # the brief
        ("goal", 0),
        ("work", 0),  # round 1: dispatch the coder
        ("coder-1", 0),
        ("coder-1", 1),
        ("work", 1),
        ("judge-1", 0),  # not yet: back into the same working session
        ("work", 2),
        ("coder-2", 0),
        ("coder-2", 1),
        ("work", 3),
        ("judge-2", 0),  # achieved
    ]
    # The question reached the person's log and "nobody answered" reached the clarifier.
    notes = f.ws / ".flower" / "notes"
    assert "Which file?" in (notes / "问答记录.md").read_text(encoding="utf-8")
    (answered,) = [r for r in server.requests if (r.conversation, r.turn) == ("clarifier", 1)]
    assert json.dumps(TIMEOUT, ensure_ascii=False)[1:-1] in json.dumps(
        answered.messages[-1], ensure_ascii=False
    )
    # Round 2 was told what the judge found missing, in the same session as round 1.
    (round2,) = [r for r in server.requests if (r.conversation, r.turn) == ("work", 2)]
    told = json.dumps(round2.messages[-1], ensure_ascii=False)
    assert "Not every check passes yet." in told and "It is done as asked." in told, told
    work = sessions(server, "work")
    assert len(work) == 1
    judges = sessions(server, "judge-1") | sessions(server, "judge-2")
    assert len(judges) == 2 and not judges & work
    steps = [r["step"] for r in f.manifest()]
    assert steps == ["确认需求", "设定目标", "干活", "干活·判定#1", "干活#round2", "干活·判定#2"]

    # Run again with nothing said: the working session carries on with the next round and a
    # new judge rules on it.
    code, out, err = flower(f, "--timeout", "0")
    assert code == 0, out + err
    assert asked(server)[-3:] == [("probe", 0), ("work", 4), ("judge-3", 0)]
    assert sessions(server, "work") == work and f.lineage()["woke"] == 2
    assert not [r for r in server.requests if r.answer in ("unmatched", "exhausted", "rejected")]
    f.assert_no_survivors()


STOPS = {
    "brief": (
        {"brief": "OK, I'll just do it."},
        (),
        "stopped at step '确认需求': the brief still lacks: goal (目标), acceptance criteria "
        "(验收标准), bounds (边界), unknowns and assumptions (未知与假设). The clarifier's last "
        "reply has no such section (it began: “OK, I'll just do it.”); it must end with the "
        "four sections ## 目标 / ## 验收标准 / ## 边界 / ## 未知与假设",
    ),
    "goal": (
        {"goal": "Sure, done."},
        (),
        "stopped at step '设定目标': the goal still lacks: goal (目标), checklist (判定清单). "
        "The goal setter's reply has no such section (it began: “Sure, done.”); it must "
        "answer with the two sections ## 目标 / ## 判定清单",
    ),
    "rounds": (
        {
            "work": ["First try.", "Second try."],
            "verdicts": ["not_yet", Verdict("not_yet", "hi.txt is still empty", ["says hi"])],
        },
        ("--rounds", "2"),
        "stopped at step '干活': after 2 round(s) the goal is not met yet. The judge "
        "(干活·判定#2) concluded: not achieved. Reason: hi.txt is still empty (failed: says hi)",
    ),
}


@pytest.mark.parametrize("case", sorted(STOPS))
def test_a_stop_says_what_was_missing_or_what_the_judge_concluded(model_server, flower_env, case):
    kw, flags, line = STOPS[case]
    server = model_server(starter_script(**{"work": ["Done."], **kw}))
    f: Flower = flower_env(server)
    code, out, err = flower(f, "make hi.txt", "--timeout", "0", *flags, lang="en")
    assert code == 1, out + err
    assert line in err.splitlines(), err
    assert "Traceback" not in err
    f.assert_no_survivors()
