"""Mistakes a new user made with ``flower-super`` (issue 7): each is one line with a hint,
never a traceback, and a refused start leaves nothing behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flower import __version__
from tests.e2e import REPO

pytestmark = pytest.mark.timeout(60)  # a few short flower-super processes, no model


@pytest.fixture(autouse=True)
def _english(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests read flower's English lines."""
    monkeypatch.setenv("FLOWER_LANG", "en")


def flower_super(tmp_path: Path, *args: str, key: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_"))}
    env.update(HOME=str(tmp_path / "home"), PYTHONPATH=str(REPO))
    if key:
        env["ANTHROPIC_API_KEY"] = "sk-ant-test-dummy"
    return subprocess.run(
        [sys.executable, "-m", "supervisor", *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=50,
    )


def one_line_with_hint(done: subprocess.CompletedProcess[str], says: str) -> list[str]:
    lines = done.stderr.splitlines()
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    assert len(lines) == 2 and lines[0].startswith("flower-super: ") and says in lines[0], lines
    assert lines[1].startswith("  hint: "), lines
    return lines


def test_a_run_dir_under_a_file_is_one_line(tmp_path):
    (tmp_path / "somefile").write_text("not a directory")
    done = flower_super(tmp_path, "start", "do it", "-r", "somefile/runs", "-w", str(tmp_path))
    (line, _) = one_line_with_hint(done, "lies under")
    assert str(tmp_path / "somefile") in line


def test_a_run_dir_that_is_a_file_is_one_line(tmp_path):
    (tmp_path / "runs").write_text("oops")
    one_line_with_hint(flower_super(tmp_path, "start", "do it", "-w", str(tmp_path)), "is a file")
    one_line_with_hint(flower_super(tmp_path, "status"), "is a file")


def test_a_syntax_error_in_a_flow_file_points_at_that_file_and_line(tmp_path):
    flow = tmp_path / "myflow.py"
    flow.write_text(
        "from flower import Workflow\n\nflow = Workflow([\n    Step(\n", encoding="utf-8"
    )
    done = flower_super(tmp_path, "start", "--flow", "myflow.py:flow", "-w", str(tmp_path))
    (_, hint) = one_line_with_hint(done, "is not valid Python")
    assert f"at {flow}:" in hint or "at myflow.py:" in hint, hint
    assert "supervisor" not in hint and "flower/" not in hint, hint


def test_an_error_raised_by_a_flow_file_points_at_the_users_line(tmp_path):
    (tmp_path / "raises.py").write_text("x = 1\nflow = undefined_name\n", encoding="utf-8")
    done = flower_super(tmp_path, "start", "--flow", "raises.py:flow", "-w", str(tmp_path))
    (_, hint) = one_line_with_hint(done, "NameError")
    assert hint.endswith("raises.py:2"), hint


@pytest.mark.parametrize("why", ["no key", "bad flow"])
def test_a_refused_start_leaves_no_run_dir_behind(tmp_path, why):
    if why == "no key":
        done = flower_super(tmp_path, "start", "do it", "-w", str(tmp_path), key=False)
    else:
        done = flower_super(tmp_path, "start", "--flow", "nope.py:flow", "-w", str(tmp_path))
    assert done.returncode == 2, done.stderr
    assert not (tmp_path / "runs" / "sessions.db").exists()
    assert not (tmp_path / "runs").exists(), sorted(p.name for p in (tmp_path / "runs").iterdir())


def test_status_json_answers_an_error_as_json(tmp_path):
    done = flower_super(tmp_path, "status", "--json", "-r", "nowhere")
    assert done.returncode == 2
    answer = json.loads(done.stdout)
    assert set(answer) == {"error", "hint"} and "nowhere" in answer["error"] and answer["hint"]


def test_version(tmp_path):
    done = flower_super(tmp_path, "--version")
    assert done.returncode == 0 and done.stdout.strip() == f"flower-super {__version__}"
