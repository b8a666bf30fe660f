"""The README's "Running on a cluster" section, run as a person would (issue 19, point 9):
its first block in bash, with the venv's commands on PATH, a scripted model server as the
API, and nothing else of ours in the environment. ``cluster up`` starts its own Temporal dev
server, PostgreSQL and workers; ``cluster down`` must leave none of them running.

Also here: ``flower-super status`` names the worker (host, pid) of an attempt that is running
on the cluster, and ``cluster up``/``down`` on their own (idempotent, one line when nothing is
up, a worker that cannot start is one line and takes the cluster down again).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from flower.services.cli_env import cli_env
from flower.services.model_server import ModelServer
from flower.testing import starter_script
from tests.e2e import REPO

# Each test starts a whole cluster (Temporal ~0.5 s, PostgreSQL ~0.7 s, two workers that
# import the SDK ~3 s each on a busy machine) and runs the starter flow's four steps on it.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

FIRST_LINE = "# a cluster on this machine"
BIN = Path(sys.executable).parent
WRITE_HI = {"tool_use": {"name": "Bash", "input": {"command": "echo hi > hi.txt"}}}


def readme_block() -> str:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Running on a cluster") :]
    blocks = re.findall(r"^```bash\n(.*?)^```$", section, flags=re.S | re.M)
    assert blocks and blocks[0].startswith(FIRST_LINE), "the section starts with its block"
    return str(blocks[0])


def env_for(tmp_path: Path, server: ModelServer) -> dict[str, str]:
    """What a person's shell has: the venv activated, a key and a base URL, a temp HOME."""
    env = cli_env(tmp_path / "home", server.url, extra={"FLOWER_LANG": "en"})
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    for name in ("FLOWER_STATE", "FLOWER_PLACEMENT", "PYTHONPATH"):
        env.pop(name, None)
    return env


def cluster_processes(home: Path) -> list[psutil.Process]:
    """Processes of clusters whose files are under ``home`` (workers, servers)."""
    out = []
    for proc in psutil.process_iter(["cmdline", "environ"]):
        try:
            line = " ".join(proc.info["cmdline"] or [])
            environ = proc.info["environ"] or {}
        except psutil.Error:
            continue
        worker = "flower-super worker" in line or "supervisor worker" in line
        mine = environ.get("HOME") == str(home) and worker
        if mine or (str(home) in line and ("temporal" in line or "postgres" in line)):
            out.append(proc)
    return out


def test_the_readme_s_cluster_block_runs_the_starter_flow_on_workers(tmp_path):
    ws = tmp_path / "proj"
    ws.mkdir()
    with ModelServer(starter_script(work=[[WRITE_HI]])) as server:
        env = env_for(tmp_path, server)
        try:
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", readme_block()],
                cwd=ws,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=200,
            )
        finally:  # a block that failed before its last line leaves no cluster behind
            run(["flower-super", "cluster", "down"], env, ws)
        out = done.stdout + done.stderr
        assert done.returncode == 0, out[-4000:]
        assert (ws / "hi.txt").read_text() == "hi\n"
        # every attempt ran on a worker, none forked here: 确认需求, 设定目标, 干活, its judge
        assert out.count("@ running on") == 4, out[-4000:]
        assert "cluster down" in out and "2 worker(s)" in out
        # nothing of the run's state under the workspace's run_dir: it was in PostgreSQL
        for name in ("sessions.db", "lineage.json", "manifest.json"):
            assert not (ws / "runs" / name).exists(), name
        assert {r.conversation for r in server.requests} >= {"clarifier", "goal", "judge-1"}
    assert not (tmp_path / "home" / ".flower" / "cluster").exists()
    assert cluster_processes(tmp_path / "home") == []


def run(cmd: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_status_shows_the_worker_of_a_running_attempt_and_up_down_are_idempotent(tmp_path):
    ws = tmp_path / "proj"
    ws.mkdir()
    slow = {"text": "still thinking", "delay": 60}  # the work step waits on the model
    with ModelServer(starter_script(work=[[slow]])) as server:
        env = env_for(tmp_path, server)
        up = run(["flower-super", "cluster", "up", "--workers", "2"], env, ws)
        try:
            assert up.returncode == 0, up.stderr
            exports = up.stdout.strip().splitlines()
            assert [line.split("=")[0] for line in exports] == [
                "export FLOWER_STATE",
                "export FLOWER_PLACEMENT",
            ]
            again = run(["flower-super", "cluster", "up"], env, ws)
            assert again.returncode == 0 and again.stdout == up.stdout, again.stderr
            assert "already up" in again.stderr
            for line in exports:
                name, _, value = line.removeprefix("export ").partition("=")
                env[name] = value
            flower = subprocess.Popen(
                ["flower", "make hi.txt", "--timeout", "0"],
                cwd=ws,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            try:
                placed = wait_for_placed(ws, env, "干活")
                worker = psutil.Process(int(placed["pid"]))
                assert "worker" in " ".join(worker.cmdline())
                assert placed["host"] == socket.gethostname()
                text = run(["flower-super", "status"], env, ws).stdout
                assert f"@ 干活  runs on {placed['host']} (worker pid {placed['pid']}" in text
            finally:
                flower.terminate()  # SIGTERM: a killed-by-signal row, its attempt cancelled
                flower.communicate(timeout=60)
        finally:
            down = run(["flower-super", "cluster", "down"], env, ws)
        assert down.returncode == 0 and "cluster down" in down.stderr, down.stderr
        assert cluster_processes(tmp_path / "home") == []
        again = run(["flower-super", "cluster", "down"], env, ws)
        assert again.returncode == 1 and "no cluster is up" in again.stderr


def wait_for_placed(ws: Path, env: dict[str, str], label: str) -> dict[str, object]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        done = run(["flower-super", "status", "--json"], env, ws)
        if done.returncode in (0, 3) and done.stdout.strip():
            for f in json.loads(done.stdout).get("flowers", []):
                where = (f.get("placed") or {}).get(label) or {}
                if "pid" in where:  # on record from its dispatch; where, once a worker has it
                    return dict(where)
        time.sleep(0.3)
    raise AssertionError(f"{label} was never placed on a worker")


def test_a_bad_worker_count_is_one_line_and_starts_nothing(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLOWER_", "ANTHROPIC_"))}
    env.update(HOME=str(tmp_path / "home"), FLOWER_LANG="en")
    env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"
    done = run(["flower-super", "cluster", "up", "--workers", "0"], env, tmp_path)
    assert done.returncode == 2 and "--workers must be 1 to" in done.stderr
    assert "Traceback" not in done.stderr and "hint" in done.stderr
    assert not (tmp_path / "home" / ".flower" / "cluster").exists()


def test_a_directory_that_holds_something_else_is_never_a_cluster_s(tmp_path):
    """``--dir`` naming a directory of someone's: refused before anything starts, and
    ``down`` there removes nothing that a cluster did not make."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLOWER_", "ANTHROPIC_"))}
    env.update(HOME=str(tmp_path / "home"), FLOWER_LANG="en")
    env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"
    project = tmp_path / "proj"
    project.mkdir()
    (project / "keep.txt").write_text("mine")
    done = run(["flower-super", "cluster", "up", "--dir", str(project)], env, tmp_path)
    assert done.returncode == 2 and "already holds something else" in done.stderr
    assert "Traceback" not in done.stderr and "hint" in done.stderr
    down = run(["flower-super", "cluster", "down", "--dir", str(project)], env, tmp_path)
    assert down.returncode == 1 and "no cluster is up" in down.stderr
    assert sorted(p.name for p in project.iterdir()) == ["keep.txt"]
    assert cluster_processes(tmp_path / "home") == []
