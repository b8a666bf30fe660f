"""The starter flow end to end: ``flower-super start`` with no --flow, the real CLI, the
scripted model server answering as clarifier, goal setter, coordinator (and its coder) and
judge.

Conversations are told apart by what each role is sent: the clarifier gets the person's
ask (a marker in it), the goal setter and the judge get flower's own prompts, the coordinator
gets "照这份需求做". The judge reads out.txt and answers by what it holds (the server's
``result`` match): not met while the coder has not written DONE, met once it has.

Judged by the files in the run_dir and the workbench, and by what the server received.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from flower.people.human import TIMEOUT
from flower.services.model_server import ModelServer, RecordedRequest
from flower.workflow.goal import CLARIFY_RESUME
from tests.e2e import Flower, wait_until

# Each test runs flower-super two or three times; a run is 3-6 CLI sessions of a few turns.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ASK = "写个 md 转 html 的脚本 [[ask]]"
SAID = "顺便支持代码块高亮"
BRIEF = (
    "## 目标\n写一个把 markdown 转成 html 的脚本。\n\n"
    "## 验收标准\n跑脚本能把 README.md 转成 out.html。\n\n"
    "## 边界\n只用 Python 标准库。\n\n"
    "## 未知与假设\n假设输入是 UTF-8。"
)
GOAL_1 = "## 目标\n有一个能用的 md 转 html 脚本。\n\n## 判定清单\n- out.txt 里写着 DONE"
GOAL_2 = (
    "## 目标\n有一个能用的 md 转 html 脚本,支持代码块高亮。\n\n## 判定清单\n- out.txt 里写着 DONE"
)
NOT_MET = "## 结论\n未达成\n\n## 理由\n还没有写完。\n\n## 未通过\n- out.txt 里写着 DONE"
MET = "## 结论\n达成\n\n## 理由\nout.txt 里有 DONE。\n\n## 未通过\n无"
UNREACHABLE = "## 结论\n无法验证\n\n## 理由\n这台机器上没有浏览器,看不了渲染效果。\n\n## 未通过\n无"

GOAL_MARK = "写成一个目标和一份判定清单"
JUDGE_MARK = "独立判定下面这个目标"
WORK_MARK = "照这份需求做"


def tool(name: str, **args: Any) -> dict[str, Any]:
    return {"tool_use": {"name": name, "input": args}}


def bash(command: str) -> dict[str, Any]:
    return tool("Bash", command=command, description="test")


def agent(marker: str) -> dict[str, Any]:
    return tool("Agent", subagent_type="coder", description="动手", prompt=f"[[{marker}]] 动手")


def conv(name: str, turns: list[Any], **match: str) -> dict[str, Any]:
    return {"name": name, "match": match or {"marker": f"[[{name}]]"}, "turns": turns}


def script(ws: Path, *, clarify: list[Any], coordinate: list[Any], verdict: str) -> dict[str, Any]:
    out = str(ws / "out.txt")
    return {
        "conversations": [
            conv("clarify", clarify, marker="[[ask]]"),
            conv("goal", [GOAL_1, GOAL_2], marker=GOAL_MARK),
            # Listed before "judge": a judge whose Read of out.txt shows DONE says met.
            conv("judge-met", [tool("Read", file_path=out), MET], marker=JUDGE_MARK, result="DONE"),
            conv("judge", [tool("Read", file_path=out), verdict], marker=JUDGE_MARK),
            conv("coordinate", coordinate, marker=WORK_MARK),
            conv("coder1", [bash("echo started > out.txt"), "CODER1: 写了初版"]),
            conv("coder2", [bash("echo DONE >> out.txt"), "CODER2: 写完了"]),
        ]
    }


ASKS_FIRST = [tool("mcp__human__ask", question="输出放哪个文件?", options=["out.html"]), BRIEF]
WORK = [
    agent("coder1"),
    "第一轮做完了。",
    agent("coder2"),
    "第二轮做完了。",
    "唤醒后补上了代码块高亮。",
    "接着看了一遍,没有要补的。",
]


def results_in(req: RecordedRequest) -> list[dict[str, Any]]:
    """The tool_result blocks of the request's last message."""
    last = req.messages[-1]
    blocks = last["content"] if isinstance(last["content"], list) else []
    return [b for b in blocks if b.get("type") == "tool_result"]


def asked(server: ModelServer, name: str) -> list[RecordedRequest]:
    return [r for r in server.requests if r.path == "/v1/messages" and r.conversation == name]


def sessions_of(server: ModelServer, name: str) -> list[str]:
    seen: list[str] = []
    for r in asked(server, name):
        if r.session_id and r.session_id not in seen:
            seen.append(r.session_id)
    return seen


def notes(f: Flower) -> Path:
    return f.ws / ".flower" / "notes"


def no_api_errors(server: ModelServer) -> None:
    for r in server.requests:
        assert not any("API Error" in t for t in r.texts()), r.conversation
    assert not [r for r in server.requests if r.answer == "rejected"]


def first_ws(tmp_path: Path) -> Path:
    """Where flower_env puts its first workspace (the judge reads a file there)."""
    return tmp_path / "f0" / "ws"


def test_first_start_freezes_brief_and_goal_and_the_judge_sends_the_work_back(
    model_server, flower_env, tmp_path
):
    ws = first_ws(tmp_path)
    server = model_server(script(ws, clarify=ASKS_FIRST, coordinate=WORK, verdict=NOT_MET))
    f: Flower = flower_env(server)
    assert f.ws == ws

    code, out = f.run(ASK, "--timeout", "0", timeout=240)
    assert code == 0, out

    # 需求.md and 目标.md are frozen in the workbench notes, owner-only.
    brief, goal = notes(f) / "需求.md", notes(f) / "目标.md"
    assert "只用 Python 标准库" in brief.read_text(encoding="utf-8")
    assert "out.txt 里写着 DONE" in goal.read_text(encoding="utf-8")
    assert oct(brief.stat().st_mode & 0o777) == "0o600"
    # The clarifier's question went child -> pipe -> supervisor and back: logged, answered
    # at once as "nobody answered" (unattended), and the clarifier got that text.
    log = (notes(f) / "问答记录.md").read_text(encoding="utf-8")
    assert "输出放哪个文件?" in log
    clar = asked(server, "clarify")
    assert len(clar) == 2, clar
    answered = json.dumps(results_in(clar[1]), ensure_ascii=False)
    assert json.dumps(TIMEOUT, ensure_ascii=False)[1:-1] in answered, answered

    rows = {r["step"]: r for r in f.manifest()}
    assert {"确认需求", "设定目标", "干活", "干活#round2", "干活·判定#1", "干活·判定#2"} <= set(
        rows
    )
    assert rows["干活·判定#1"]["ok"] and rows["干活·判定#2"]["ok"]
    # Round 2 continued round 1's session and carried the verdict's feedback.
    work = rows["干活"]["session_id"]
    assert rows["干活#round2"]["session_id"] == work
    feedback = [r for r in asked(server, "coordinate") if r.turn == 2]
    assert feedback and feedback[0].session_id == work
    last = feedback[0].messages[-1]
    told = json.dumps(last["content"], ensure_ascii=False)
    assert last["role"] == "user" and "还没有写完" in told, told
    # Every judge request is a session never seen before, and none is in lineage.json.
    judges = set(sessions_of(server, "judge")) | set(sessions_of(server, "judge-met"))
    assert len(judges) == 2
    others = {
        sid for name in ("clarify", "goal", "coordinate") for sid in sessions_of(server, name)
    }
    assert not judges & others
    lineage = f.lineage()["steps"]
    assert not judges & set(lineage.values())
    assert set(lineage) == {"确认需求", "设定目标", "干活"} and lineage["干活"] == work
    assert (f.ws / "out.txt").read_text().split() == ["started", "DONE"]
    no_api_errors(server)
    f.assert_no_survivors()

    # A second start with a sentence: appended to 需求.md, carried to the goal setter, and
    # sent to the same working session.
    code, out = f.run(SAID, "--timeout", "0", timeout=240)
    assert code == 0, out
    text = brief.read_text(encoding="utf-8")
    assert "## 唤醒时追加" in text and SAID in text
    goal_reqs = asked(server, "goal")
    assert len(goal_reqs) == 2 and any(SAID in t for t in goal_reqs[1].texts())
    assert "支持代码块高亮" in goal.read_text(encoding="utf-8")
    woke = [r for r in asked(server, "coordinate") if r.turn == 4]
    assert woke and woke[0].session_id == work
    assert any(SAID in t for t in woke[0].texts())
    assert "<- 在" in out and "需求已确认" in out and "目标 1 条" in out and "第 2 次唤醒" in out

    # A third start with nothing said: no goal-setter request, the work carries on.
    code, out = f.run("--timeout", "0", timeout=240)
    assert code == 0, out
    assert len(asked(server, "goal")) == 2
    assert text == brief.read_text(encoding="utf-8"), "an empty wake appended something"
    carried = [r for r in asked(server, "coordinate") if r.turn == 5]
    assert carried and carried[0].session_id == work
    assert "第 3 次唤醒" in out and "干活上下文" in out
    assert f.lineage()["woke"] == 3
    no_api_errors(server)
    f.assert_no_survivors()


def test_kill_9_while_the_clarifier_waits_continues_its_session_with_clarify_resume(
    model_server, flower_env
):
    server = model_server(
        {
            "conversations": [
                conv("clarify", [{"text": BRIEF, "delay": 120, "times": 1}], marker="[[ask]]"),
                conv("goal", [GOAL_1], marker=GOAL_MARK),
                conv("coordinate", ["做完了。"], marker=WORK_MARK),
            ]
        }
    )
    f: Flower = flower_env(server)
    proc = f.start(ASK, "--timeout", "0", "--no-goal")
    held = server.wait_for(
        lambda reqs: [r for r in reqs if r.conversation == "clarify"], timeout=60
    )
    sid = held[0].session_id
    # The CLI's first entries reach sessions.db ~100 ms after its first request.
    wait_until(lambda: f.lineage()["steps"].get("确认需求") == sid, 10, "the clarifier in lineage")
    wait_until(lambda: f.transcript(sid), 10, "the clarifier's session in sessions.db")
    os.killpg(proc.pid, signal.SIGKILL)  # the whole job, as a closed terminal would lose it
    proc.wait(timeout=30)
    f.assert_no_survivors()
    assert f.lineage()["steps"].get("确认需求") == sid

    code, out = f.run(ASK, "--timeout", "0", "--no-goal", timeout=240)
    assert code == 0, out
    again = [r for r in asked(server, "clarify") if r is not held[0]]
    assert again and again[0].session_id == sid, "the clarifier did not continue its session"
    last = again[0].texts()[-1]
    assert CLARIFY_RESUME in last and "写个 md 转 html" not in last, last
    assert (notes(f) / "需求.md").exists()
    no_api_errors(server)
    f.assert_no_survivors()


def test_an_unreachable_verdict_with_nobody_answering_stops_the_run(
    model_server, flower_env, tmp_path
):
    ws = first_ws(tmp_path)
    server = model_server(script(ws, clarify=[BRIEF], coordinate=WORK, verdict=UNREACHABLE))
    f: Flower = flower_env(server)
    assert f.ws == ws
    code, out = f.run(ASK, "--timeout", "0", timeout=240)
    assert code == 1, out
    assert "在步骤 '干活' 中止" in out and "没有浏览器" in out, out
    rows = {r["step"]: r for r in f.manifest()}
    assert "干活·判定#1" in rows and "干活#round2" not in rows, sorted(rows)
    assert "没有浏览器" in (notes(f) / "问答记录.md").read_text(encoding="utf-8")
    f.assert_no_survivors()


def test_new_archives_the_three_files_and_starts_woke_1(model_server, flower_env):
    server = model_server(
        {
            "conversations": [
                conv("clarify", [BRIEF], marker="[[ask]]"),
                conv("other", [BRIEF], marker="[[other]]"),
                conv("coordinate", ["做完了。", "另一件也做完了。"], marker=WORK_MARK),
            ]
        }
    )
    f: Flower = flower_env(server)
    code, out = f.run(ASK, "--timeout", "0", "--no-goal", timeout=240)
    assert code == 0, out
    old = dict(f.lineage()["steps"])
    code, out = f.run("另一件事 [[other]]", "--new", "--timeout", "0", "--no-goal", timeout=240)
    assert code == 0, out
    (stamp,) = (notes(f) / "archive").iterdir()
    # --no-goal: there is no 目标.md to move; lineage.json and 需求.md moved together.
    assert {p.name for p in stamp.iterdir()} == {"lineage.json", "需求.md"}
    assert json.loads((stamp / "lineage.json").read_text())["steps"] == old
    assert f.lineage()["woke"] == 1
    for sid in old.values():
        assert f.transcript(sid), f"sessions.db lost the old session {sid}"
    assert f.lineage()["steps"]["确认需求"] not in old.values()
    f.assert_no_survivors()


def test_an_empty_ask_with_nothing_to_wake_is_one_line_and_no_request(model_server, flower_env):
    server = model_server({"default": ["不该有请求"]})
    f: Flower = flower_env(server)
    code, out = f.run("--timeout", "0", timeout=60)
    assert code == 2, out
    assert "要给一句诉求" in out and "Traceback" not in out, out
    assert not [r for r in server.requests if r.path == "/v1/messages"]
    assert not (f.ws / ".flower").exists() and not (f.runs / "lineage.json").exists()


def test_new_without_a_sentence_is_one_line_and_moves_nothing(model_server, flower_env):
    server = model_server({"default": ["不该有请求"]})
    f: Flower = flower_env(server)
    notes(f).mkdir(parents=True)
    (notes(f) / "需求.md").write_text(BRIEF, encoding="utf-8")
    code, out = f.run("--new", "--timeout", "0", timeout=60)
    assert code == 2 and "--new" in out and "Traceback" not in out, out
    assert (notes(f) / "需求.md").read_text(encoding="utf-8") == BRIEF
    assert not (notes(f) / "archive").exists()
    assert not [r for r in server.requests if r.path == "/v1/messages"]


def test_a_question_asked_in_the_child_is_answered_at_the_supervisors_terminal(
    model_server, flower_env
):
    server = model_server(
        {
            "conversations": [
                conv("clarify", ASKS_FIRST, marker="[[ask]]"),
                conv("coordinate", ["做完了。"], marker=WORK_MARK),
            ]
        }
    )
    f: Flower = flower_env(server)
    proc = f.start(ASK, "--timeout", "60", "--no-goal", stdin=subprocess.PIPE)
    assert proc.stdin is not None
    server.wait_for(lambda reqs: [r for r in reqs if r.conversation == "clarify"], timeout=60)
    proc.stdin.write(b"1\n")  # the first option, typed at the supervisor's prompt
    proc.stdin.flush()
    out, _ = proc.communicate(timeout=120)
    text = out.decode("utf-8", "replace")
    assert proc.returncode == 0, text
    assert "? 输出放哪个文件?" in text and "     1) out.html" in text, text
    (after,) = [r for r in asked(server, "clarify") if r.turn == 1]
    results = results_in(after)
    assert results and "out.html" in json.dumps(results, ensure_ascii=False), results
    log = (notes(f) / "问答记录.md").read_text(encoding="utf-8")
    assert "[answered]" in log and "out.html" in log, log
    f.assert_no_survivors()
