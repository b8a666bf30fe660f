"""Roles and the hook layer, end to end: the real flower-super, the real CLI, the scripted
model server, flows written with the public API only (tests/flows/roles.py).

Judged by what persists (files the tools would have made, the workbench, the spill file)
and by what the model was sent (the tool results in the next request).
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import Any

import pytest

from flower.services.model_server import ModelServer, RecordedRequest
from tests.e2e import Flower

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]  # one flower run of a few CLI turns

FLOWS = "tests.flows.roles"


def bash(command: str) -> dict[str, Any]:
    return {"tool_use": {"name": "Bash", "input": {"command": command, "description": "test"}}}


def tool(name: str, **args: Any) -> dict[str, Any]:
    return {"tool_use": {"name": name, "input": args}}


def conv(name: str, turns: list[Any]) -> dict[str, Any]:
    return {"name": name, "match": {"marker": f"[[{name}]]"}, "turns": turns}


def asked(server: ModelServer, name: str) -> list[RecordedRequest]:
    return [r for r in server.requests if r.path == "/v1/messages" and r.conversation == name]


def results_in(req: RecordedRequest) -> list[dict[str, Any]]:
    """The tool_result blocks of the request's last message."""
    last = req.messages[-1]
    blocks = last["content"] if isinstance(last["content"], list) else []
    return [b for b in blocks if b.get("type") == "tool_result"]


def text_of(block: dict[str, Any]) -> str:
    c = block.get("content")
    if isinstance(c, list):
        return "\n".join(str(x.get("text", "")) for x in c if isinstance(x, dict))
    return str(c or "")


def no_rejections(server: ModelServer) -> None:
    bad = [r for r in server.requests if r.answer == "rejected"]
    assert not bad, f"rejected: {bad[0].detail}"


def test_a_coordinator_delegates_and_waits_for_its_worker(model_server, flower_env):
    server = model_server(
        {
            "conversations": [
                conv(
                    "coordinate",
                    [
                        bash("touch main-ran.txt"),
                        tool(
                            "Agent",
                            subagent_type="coder",
                            description="动手",
                            prompt="[[sub]] 建一个文件",
                        ),
                        {"text": "coordinated."},
                    ],
                ),
                conv("sub", [bash("sleep 1; touch sub-ran.txt"), {"text": "SUBREPORT: 建好了"}]),
            ]
        }
    )
    f: Flower = flower_env(server)
    code, out = f.run(flow=f"{FLOWS}:coordinated", timeout=100)
    assert code == 0, out
    assert not (f.ws / "main-ran.txt").exists(), "the coordinator's own Bash ran"
    assert (f.ws / "sub-ran.txt").exists(), "the worker's Bash did not run"
    main = asked(server, "coordinate")
    (denied,) = results_in(main[1])
    assert denied.get("is_error") and "Agent" in text_of(denied), text_of(denied)
    assert "派" in text_of(denied), "the denial does not say to dispatch a subagent"
    (report,) = results_in(main[2])
    assert "SUBREPORT" in text_of(report), (
        "the Agent call returned before its worker finished (it ran in the background)"
    )
    (row,) = f.rows("协调")
    assert row["ok"] and row["text"] == "coordinated.", row
    no_rejections(server)
    f.assert_no_survivors()


def test_a_judge_cannot_write_and_one_that_may_run_keeps_bash(model_server, flower_env):
    server = model_server(
        {
            "conversations": [
                conv(
                    "judge",
                    [
                        tool("Write", file_path="verdict.txt", content="pass"),
                        bash("touch judge-ran.txt"),
                        {"text": "## 结论\n未达成"},
                    ],
                ),
                conv(
                    "judge-run",
                    [
                        bash("touch judge-ran.txt"),
                        tool("Write", file_path="verdict.txt", content="pass"),
                        {"text": "## 结论\n达成"},
                    ],
                ),
            ]
        }
    )
    f: Flower = flower_env(server)
    code, out = f.run(flow=f"{FLOWS}:judging", timeout=100)
    assert code == 0, out
    first = asked(server, "judge")
    for req in first[1:3]:
        (res,) = results_in(req)
        assert res.get("is_error") and "这是有意的" in text_of(res), text_of(res)
    assert not (f.ws / "verdict.txt").exists() and not (f.ws / "judge-ran.txt").exists()

    f = flower_env(server)  # a workspace of its own: the step names are the same
    code, out = f.run(flow=f"{FLOWS}:judging_runs", timeout=100)
    assert code == 0, out
    assert (f.ws / "judge-ran.txt").exists(), "judge(can_run=True) lost Bash"
    second = asked(server, "judge-run")
    (wrote,) = results_in(second[2])
    assert wrote.get("is_error") and "这是有意的" in text_of(wrote), text_of(wrote)
    assert not (f.ws / "verdict.txt").exists()
    no_rejections(server)


BIG_LINES = 1000


def big_output() -> str:
    return "\n".join(f"line {i:04d} " + "x" * 40 for i in range(BIG_LINES))


def test_a_50kb_output_spills_and_the_spill_file_reads_back_whole(model_server, flower_env):
    text = big_output()  # 51 KB; the CLI strips the trailing newline
    runs_spill = "{runs}/workbench/spill"
    name = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16] + ".txt"
    command = f"printf 'line %04d {'x' * 40}\\n' $(seq 0 {BIG_LINES - 1})"
    server = model_server({"conversations": []})
    # A user who wants whole outputs raises the CLI's own 30,000-character cut.
    f: Flower = flower_env(server, extra_env={"BASH_MAX_OUTPUT_LENGTH": "200000"})
    spill = Path(runs_spill.format(runs=f.runs)) / name  # known once the run_dir is
    turns = [bash(command), tool("Read", file_path=str(spill)), {"text": "read it."}]
    server.set_script({"conversations": [conv("bench", turns)]})
    code, out = f.run(flow=f"{FLOWS}:bench", timeout=100)
    assert code == 0, out
    assert spill.read_text(encoding="utf-8") == text, "the spill file does not hold it all"
    assert oct(spill.stat().st_mode & 0o777) == "0o600"
    reqs = asked(server, "bench")
    (pointer,) = results_in(reqs[1])
    shown = text_of(pointer)
    assert text[:400] in shown and text[400:800] not in shown, shown[:600]
    assert name in shown and len(shown) < 1200, shown[:600]
    (read,) = results_in(reqs[2])
    body = text_of(read)
    assert f"line {BIG_LINES - 1:04d}" in body and body.count("\n") >= BIG_LINES - 1, (
        "the Read of the spill file was cut or spilled again"
    )
    no_rejections(server)


HELLO = "# desc: 打个招呼\nprint('hi')\n"


def test_a_script_written_to_the_workbench_is_indexed_before_the_next_request(
    model_server, flower_env
):
    server = model_server({"conversations": []})
    f: Flower = flower_env(server)
    script = f.runs / "workbench" / "scripts" / "hello.py"
    server.set_script(
        {
            "conversations": [
                conv(
                    "bench",
                    [
                        tool(
                            "Write",
                            file_path=str(script),
                            content="# desc: 打个招呼\nprint('hi')\n",
                        ),
                        {"text": "written.", "delay": 3, "times": 1},
                    ],
                )
            ]
        }
    )
    proc = f.start(flow=f"{FLOWS}:bench")
    server.wait_for(lambda reqs: any(r.conversation == "bench" and r.turn == 1 for r in reqs), 60)
    index = (f.runs / "workbench" / "INDEX.md").read_text(encoding="utf-8")
    line = next((ln for ln in index.splitlines() if "hello.py" in ln), "")
    assert "打个招呼" in line, index
    proc.communicate(timeout=60)
    assert proc.returncode == 0


def git(ws: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=ws,
        check=True,
        capture_output=True,
        timeout=30,
    )


def test_an_isolated_worker_works_in_its_own_git_worktree(model_server, flower_env):
    server = model_server(
        {
            "conversations": [
                conv(
                    "isolate",
                    [
                        tool(
                            "Agent",
                            subagent_type="coder",
                            description="隔离地干",
                            prompt="[[iso-sub]] 看看你在哪",
                        ),
                        {"text": "isolated."},
                    ],
                ),
                conv("iso-sub", [bash("git rev-parse --show-toplevel"), {"text": "WHERE: done"}]),
            ]
        }
    )
    f: Flower = flower_env(server)
    git(f.ws, "init", "-q")
    (f.ws / "README").write_text("x\n")
    git(f.ws, "add", "README")
    git(f.ws, "commit", "-q", "-m", "init")
    code, out = f.run(flow=f"{FLOWS}:isolating", timeout=100)
    assert code == 0, out
    sub = asked(server, "iso-sub")
    (where,) = results_in(sub[1])
    top = text_of(where).strip()
    assert top != str(f.ws) and "/.claude/worktrees/agent-" in top, top
    no_rejections(server)


def test_the_same_walls_hold_in_process(model_server, tmp_path, monkeypatch):
    """The hooks are built where the attempt runs: a Runtime in this process gets them too."""
    import asyncio

    from flower import Runtime, judge
    from flower.services.cli_env import cli_env

    server = model_server(
        {
            "conversations": [
                conv(
                    "judge",
                    [
                        tool("Write", file_path="verdict.txt", content="pass"),
                        {"text": "## 结论\n未达成"},
                    ],
                )
            ]
        }
    )
    for key, value in cli_env(tmp_path / "home", server.url).items():
        monkeypatch.setenv(key, value)
    ws = tmp_path / "ws"
    ws.mkdir()
    rt = Runtime(workspace=ws, run_dir=tmp_path / "runs")
    try:
        res = asyncio.run(rt.run(judge("判定者", None), "[[judge]] 判一下"))
    finally:
        rt.close()
    assert res.ok, res
    (denied,) = results_in(asked(server, "judge")[1])
    assert denied.get("is_error") and "这是有意的" in text_of(denied), text_of(denied)
    assert not (ws / "verdict.txt").exists()


def test_a_flow_with_its_own_workbench_leaves_the_workspace_alone(model_server, flower_env):
    server = model_server({"conversations": [conv("bench", [{"text": "nothing to do."}])]})
    f: Flower = flower_env(server)
    code, out = f.run(flow=f"{FLOWS}:bench", timeout=100)
    assert code == 0, out
    assert (f.runs / "workbench" / "INDEX.md").exists()
    assert not (f.ws / ".flower").exists(), "a workbench the flow does not use was made"
