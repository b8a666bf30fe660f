"""``--placement`` on ``flower`` and ``flower-super start`` (issue 19, point 3): a mistake is
one line with a hint before anything runs or is made; the cluster needs shared state."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e import REPO

pytestmark = pytest.mark.timeout(90)  # a few short processes each, no model, no service


def run(
    tmp_path: Path, module: str, *args: str, **env_extra: str
) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ANTHROPIC_", "CLAUDE_", "FLOWER_"))
    }
    env.update(
        HOME=str(tmp_path / "home"),
        PYTHONPATH=str(REPO),
        FLOWER_LANG="en",
        ANTHROPIC_API_KEY="sk-ant-test-dummy",
        **env_extra,
    )
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )


def refused(done: subprocess.CompletedProcess[str], says: str) -> None:
    lines = done.stderr.strip().splitlines()
    assert done.returncode in (1, 2), (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    assert len(lines) == 2 and says in lines[0], lines
    assert "hint" in lines[1], lines


SUPER = ("supervisor", "start", "do it")
FLOWER = ("supervisor.commands.flower_cli", "do it")


@pytest.mark.parametrize("cmd", [SUPER, FLOWER], ids=["flower-super start", "flower"])
def test_an_address_that_is_not_temporal_s_is_one_line_and_makes_nothing(tmp_path, cmd):
    done = run(tmp_path, *cmd, "--placement", "http://127.0.0.1:7233")
    refused(done, "temporal://HOST:PORT/QUEUE")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("cmd", [SUPER, FLOWER], ids=["flower-super start", "flower"])
def test_a_cluster_with_local_state_is_refused_in_one_line(tmp_path, cmd):
    done = run(tmp_path, *cmd, "--placement", "temporal://127.0.0.1:7233/flower")
    refused(done, "needs the run state in PostgreSQL")
    assert not (tmp_path / "runs" / "sessions.db").exists()


def test_flower_placement_from_the_environment_is_checked_as_well(tmp_path):
    done = run(tmp_path, *SUPER, FLOWER_PLACEMENT="temporal://nowhere")
    refused(done, "temporal://HOST:PORT/QUEUE")


def test_flower_once_says_it_runs_here(tmp_path):
    done = run(
        tmp_path, "supervisor.commands.flower_cli", "once", "hi", "--placement", "temporal://h:1/q"
    )
    assert done.returncode == 2, done.stderr
    assert "--placement is for flows" in done.stderr and "Traceback" not in done.stderr
    assert "hint" in done.stderr


@pytest.mark.parametrize(
    "cmd", [("supervisor", "start", "--help"), ("supervisor.commands.flower_cli", "--help")]
)
def test_help_explains_it(tmp_path, cmd):
    done = run(tmp_path, *cmd)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "--placement" in text and "FLOWER_PLACEMENT" in text and "PostgreSQL" in text
