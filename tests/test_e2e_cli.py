"""The command line as a person meets it: the stdio of a step, mistakes, the library path."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from tests.e2e import REPO, Flower

pytestmark = pytest.mark.e2e


@pytest.fixture(autouse=True)
def _english(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests read flower's English lines."""
    monkeypatch.setenv("FLOWER_LANG", "en")


@pytest.mark.timeout(90)  # one flower run with a real tool call
def test_a_stray_print_in_the_child_does_not_break_the_step(model_server, flower_env):
    server = model_server(
        {
            "conversations": [
                {
                    "name": "noisy",
                    "match": {"marker": "[[noisy]]"},
                    "turns": [
                        {
                            "tool_use": {
                                "name": "Bash",
                                "input": {"command": "echo hi", "description": "x"},
                            }
                        },
                        {"text": "noisy done."},
                    ],
                }
            ]
        }
    )
    f: Flower = flower_env(server)
    code, out = f.run(flow="tests.flows.basic:noisy")
    assert code == 0, out
    assert "STRAY PRINT" not in out, "the child's stdout leaked onto the supervisor's terminal"
    logs = list((f.runs / "logs").rglob("noisy.log"))
    assert (
        logs
        and "STRAY PRINT FROM A HOOK" in logs[0].read_text()
        and "stray stderr line" in logs[0].read_text()
    )
    assert oct(logs[0].stat().st_mode & 0o777) == "0o600"
    assert [r["ok"] for r in f.rows("noisy")] == [True]


def _super(args, env, cwd, timeout=60):
    return subprocess.run(
        [sys.executable, "-m", "supervisor", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.timeout(60)
def test_a_missing_key_is_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_"))}
    env.update(HOME=str(tmp_path), PYTHONPATH=str(REPO))
    done = _super(["start", "do something", "-r", str(tmp_path / "runs")], env, tmp_path)
    assert done.returncode == 2
    assert (
        done.stderr.startswith("flower-super: no Anthropic credentials")
        and "Traceback" not in done.stderr
    )
    assert "hint:" in done.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "ref, message",
    [
        ("nope.py:flow", "flow file not found"),
        ("tests.flows.basic:missing", "has no attribute 'missing'"),
        ("no_such_module_xyz:flow", "no module named"),
        ("justtext", "is not FILE.py:ATTR or MODULE:ATTR"),
        ("tests.flows.basic:hands", "not a Workflow"),
    ],
)
def test_a_bad_flow_reference_is_one_line(tmp_path, ref, message):
    env = {
        **os.environ,
        "ANTHROPIC_API_KEY": "sk-test",
        "PYTHONPATH": str(REPO),
        "HOME": str(tmp_path),
    }
    done = _super(["start", "--flow", ref, "-r", str(tmp_path / "runs")], env, REPO)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr


@pytest.mark.timeout(60)
def test_an_unreachable_endpoint_is_one_line_and_it_waits(tmp_path):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "ANTHROPIC_API_KEY": "sk-test",
        "PYTHONPATH": str(REPO),
        "HOME": str(tmp_path),
        "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}",
        "PYTHONUNBUFFERED": "1",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "supervisor",
            "start",
            "do it",
            "-r",
            str(tmp_path / "runs"),
            "-w",
            str(tmp_path),
        ],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        line = proc.stdout.readline()
        assert f"127.0.0.1:{port}" in line and "Traceback" not in line, line
        assert proc.poll() is None, "it should wait for the endpoint, not give up"
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert "Traceback" not in out


@pytest.mark.timeout(120)  # two in-process runs of a real CLI turn
def test_in_process_workflow_continues_the_same_session(model_server, tmp_path, monkeypatch):
    """Seed 000's minimal example: run twice in one directory, _woke 1 then 2, same session."""
    from flower import AgentSpec, Runtime, Step, Workflow
    from flower.services.cli_env import cli_env

    server = model_server(
        {
            "conversations": [
                {
                    "name": "w",
                    "match": {"marker": "[[word]]"},
                    "turns": [
                        {
                            "tool_use": {
                                "name": "Read",
                                "input": {"file_path": str(tmp_path / "seed.txt")},
                            }
                        },
                        {"text": "flower"},
                        {"text": "still flower"},
                    ],
                }
            ]
        }
    )
    (tmp_path / "seed.txt").write_text("flower\n")
    for k, v in cli_env(tmp_path / "home", server.url).items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(tmp_path)
    terse = AgentSpec(
        name="terse", instructions="回答极简", allowed_tools=["Read", "Glob"], max_turns=4
    )

    async def main() -> dict:
        wf = Workflow([Step("取词", terse, "[[word]] 读 seed.txt,只回文件里那个词。")])
        rt = Runtime(workspace=".", run_dir="runs")
        try:
            return await wf.run(rt)
        finally:
            rt.close()

    first = asyncio.run(main())
    second = asyncio.run(main())
    assert (first["_woke"], second["_woke"]) == (1, 2)
    assert second["_sessions"]["取词"] == first["_sessions"]["取词"]
    assert first["取词"] == "flower" and second["取词"] == "still flower"
    assert {r.session_id for r in server.requests if r.conversation == "w"} == {
        first["_sessions"]["取词"]
    }


@pytest.mark.timeout(90)  # two flower runs of a real CLI turn
def test_new_archives_lineage_and_starts_a_fresh_session(model_server, flower_env):
    server = model_server(
        {
            "conversations": [
                {
                    "name": "only",
                    "match": {"marker": "[[only]]"},
                    "turns": [{"text": "one."}, {"text": "two."}],
                }
            ]
        }
    )
    f: Flower = flower_env(server)
    notes = f.ws / ".flower" / "notes"
    notes.mkdir(parents=True)
    (notes / "需求.md").write_text("# 需求\n")
    code, out = f.run(flow="tests.flows.basic:one")
    assert code == 0, out
    old = f.lineage()["steps"]["only"]
    db = (f.runs / "sessions.db").stat().st_size

    code, out = f.run("--new", flow="tests.flows.basic:one")
    assert code == 0, out
    lineage = f.lineage()
    assert lineage["woke"] == 1 and lineage["steps"]["only"] != old
    (archive,) = (f.ws / ".flower" / "notes" / "archive").iterdir()
    assert json.loads((archive / "lineage.json").read_text())["steps"]["only"] == old
    assert (archive / "需求.md").exists() and not (notes / "需求.md").exists()
    assert (f.runs / "sessions.db").stat().st_size >= db, "sessions.db is never touched by --new"


@pytest.mark.timeout(90)  # one flower run with a real tool call
def test_no_key_in_any_file_and_the_run_dir_is_owner_only(model_server, flower_env):
    import stat

    secret = "sk-ant-secret-" + "7" * 24
    server = model_server(
        {
            "conversations": [
                {
                    "name": "two",
                    "match": {"marker": "[[first]]"},
                    "turns": [
                        {
                            "tool_use": {
                                "name": "Bash",
                                "input": {"command": "echo done", "description": "x"},
                            }
                        },
                        {"text": "first done."},
                    ],
                },
                {
                    "name": "second",
                    "match": {"marker": "[[second]]"},
                    "turns": [{"text": "second done."}],
                },
            ]
        }
    )
    f: Flower = flower_env(server, extra_env={"ANTHROPIC_API_KEY": secret})
    code, out = f.run(flow="tests.flows.basic:two")
    assert code == 0, out
    leaked = [
        p
        for p in [*f.runs.rglob("*"), *(f.ws / ".flower").rglob("*")]
        if p.is_file() and secret.encode() in p.read_bytes()
    ]
    assert not leaked, leaked
    for p in f.runs.rglob("*"):
        mode = stat.S_IMODE(p.stat().st_mode)
        assert mode & 0o077 == 0, f"{p} is {oct(mode)}"
