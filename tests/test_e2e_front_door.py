"""The front door of a cluster (issue 25, items 1 and 3), tried as a newcomer would:

- a ``--placement`` that cannot be used (nothing listening, a namespace the service does not
  have) is one line with a hint and a non-zero exit within seconds, before anything runs:
  no request reaches the model, nothing is on record in PostgreSQL, no run files on disk;
- the next try, with the address given the way Temporal users give it (``TEMPORAL_ADDRESS``,
  ``temporal:///QUEUE``, a worker started without ``--temporal``), runs the flow as a first
  run, not as "carrying on" a run the failed try left behind;
- ``cluster up`` from a directory holding ``flower/`` and ``supervisor/`` folders runs its
  workers from the installed command, keeps every file under ``--dir``, tells the truth about
  a dead worker and ``--workers N``, names its ``--dir`` in every hint, and ``down`` with
  nothing up exits 1.

Real processes: the suite's Temporal dev server and PostgreSQL, ``flower-super`` and
``flower-super worker`` from the venv, the real CLI against the scripted model server.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from flower.services.cli_env import cli_env
from flower.services.model_server import ModelServer
from flower.testing import starter_script
from tests.e2e import Flower, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

ABC = "tests.flows.cluster:abc"
BIN = Path(sys.executable).parent
SCRIPT = {
    "conversations": [
        {"name": n, "match": {"marker": f"[[{n}]]"}, "turns": [{"text": f"{n} done."}]}
        for n in ("A", "B", "C")
    ]
}
WRITE_HI = {"tool_use": {"name": "Bash", "input": {"command": "echo hi > hi.txt"}}}


def one_line_refusal(code: int, out: str, says: str) -> None:
    lines = [line for line in out.strip().splitlines() if line.strip()]
    assert code not in (0, None), out
    assert "Traceback" not in out and "tonic" not in out and "bug" not in out, out
    assert len(lines) == 2 and says in lines[0], lines
    assert "hint" in lines[1], lines


def on_record(dsn: str) -> dict[str, int]:
    """Rows of the run's own tables (a table not made yet counts 0)."""
    import psycopg

    out = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in ("registry", "manifest", "lineage", "events", "entries"):
            try:
                out[table] = conn.execute(f"SELECT count(*) FROM flower.{table}").fetchone()[0]
            except psycopg.errors.UndefinedTable:
                out[table] = 0
    return out


def nothing_left(f: Flower, dsn: str) -> None:
    assert not f.runs.exists(), sorted(p.name for p in f.runs.rglob("*"))
    assert on_record(dsn) == dict.fromkeys(
        ("registry", "manifest", "lineage", "events", "entries"), 0
    )
    assert [r for r in f.server.requests if r.path == "/v1/messages"] == []


def start_flower(f: Flower, *args: str) -> tuple[int, str, float]:
    """``flower run FLOW`` (the person's command), its exit, output and seconds taken."""
    began = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "supervisor.commands.flower_cli",
            "-w",
            str(f.ws),
            "-r",
            str(f.runs),
            *args,
        ],
        cwd=f.root,
        env=f.env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, done.stdout + done.stderr, time.monotonic() - began


@pytest.fixture
def front(
    model_server: Callable[..., ModelServer],
    flower_env: Callable[..., Flower],
    pg_dsn: str,
) -> Flower:
    f = flower_env(model_server(SCRIPT))
    f.env.update({"FLOWER_STATE": pg_dsn, "FLOWER_LANG": "en"})
    for name in [k for k in f.env if k.startswith("TEMPORAL_")]:
        del f.env[name]
    f.env["TEMPORAL_CONFIG_FILE"] = str(f.root / "no-temporal.toml")  # none of this machine's
    return f


@pytest.mark.parametrize("cmd", ["flower-super start", "flower run"])
def test_an_unreachable_placement_is_one_line_before_anything_runs(
    front: Flower, pg_dsn: str, cmd: str
) -> None:
    placement = "temporal://127.0.0.1:1/flower"
    began = time.monotonic()
    if cmd == "flower-super start":
        code, out = front.run("--placement", placement, flow=ABC, timeout=60)
    else:
        code, out, _ = start_flower(front, "--placement", placement, "run", ABC)
    took = time.monotonic() - began
    one_line_refusal(code, out, "cannot reach Temporal at 127.0.0.1:1: Connection refused")
    assert took < 30, took
    nothing_left(front, pg_dsn)


def test_an_unknown_namespace_is_one_line_before_anything_runs(
    front: Flower, pg_dsn: str, temporal_target: str
) -> None:
    code, out = front.run(
        "--placement", f"temporal://{temporal_target}/flower?namespace=nope", flow=ABC
    )
    one_line_refusal(code, out, f"Temporal at {temporal_target} has no namespace nope")
    assert "temporal operator namespace create" in out
    nothing_left(front, pg_dsn)


def test_an_address_from_temporal_address_runs_the_flow_after_a_failed_first_try(
    front: Flower, pg_dsn: str, temporal_target: str, temporal_queue: str, tmp_path: Path
) -> None:
    # the first try names a wrong address: refused, nothing left
    code, out = front.run("--placement", f"temporal://127.0.0.1:1/{temporal_queue}", flow=ABC)
    one_line_refusal(code, out, "cannot reach Temporal")
    # a worker started without --temporal: the address and namespace from TEMPORAL_*
    wenv = {**front.env, "TEMPORAL_ADDRESS": temporal_target, "TEMPORAL_NAMESPACE": "default"}
    log = tmp_path / "worker.log"
    with open(log, "wb") as sink:
        worker = subprocess.Popen(
            [str(BIN / "flower-super"), "worker", "--queue", temporal_queue, "--state", pg_dsn],
            cwd=front.root,
            env=wenv,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until(
            lambda: "-- worker " in log.read_text() or worker.poll() is not None, 60, "the worker"
        )
        assert worker.poll() is None, log.read_text()
        assert f"at {temporal_target} · namespace default" in log.read_text()
        front.env["TEMPORAL_ADDRESS"] = temporal_target
        code, out = front.run("--placement", f"temporal:///{temporal_queue}", flow=ABC, timeout=180)
        assert code == 0, out + log.read_text()
        assert out.count("@ running on") == 3, out
        assert "wake 2" not in out and "carrying on" not in out, out
        assert on_record(pg_dsn)["registry"] == 1
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)


# ---------------------------------------------------------------------------------------
# cluster up / down
# ---------------------------------------------------------------------------------------


def cluster_env(home: Path, url: str) -> dict[str, str]:
    env = cli_env(home, url, extra={"FLOWER_LANG": "en"})
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    for name in ("FLOWER_STATE", "FLOWER_PLACEMENT", "PYTHONPATH"):
        env.pop(name, None)
    return env


def run(cmd: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=150)


def workers_of(record: Path) -> list[int]:
    return [int(w["pid"]) for w in json.loads(record.read_text())["workers"]]


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.fixture
def shadowing(tmp_path: Path) -> Path:
    """A project directory as a clone of flower leaves it: ``flower/`` and ``supervisor/``
    folders that are not the installed package (importing either fails loudly)."""
    proj = tmp_path / "proj"
    for name in ("flower", "supervisor"):
        (proj / name).mkdir(parents=True)
        (proj / name / "__init__.py").write_text("raise ImportError('the shadow was imported')\n")
    return proj


@pytest.fixture
def cluster_dir() -> Iterator[Path]:
    """A --dir the PostgreSQL service user can enter when the tests run as root (pytest's
    tmp_path is under a 0700 directory): its data must be under --dir all the same."""
    # not under TMPDIR: scripts/run_tests.py gives each job one inside a 0700 directory
    shared = "/tmp" if os.geteuid() == 0 and os.path.isdir("/tmp") else None
    base = Path(tempfile.mkdtemp(prefix="flower-front-", dir=shared))
    os.chmod(base, 0o711)
    try:
        yield base / "cluster"
    finally:
        import shutil

        shutil.rmtree(base, ignore_errors=True)


def test_cluster_up_from_a_clone_s_directory_runs_a_flow_and_tells_the_truth(
    tmp_path: Path, shadowing: Path, cluster_dir: Path
) -> None:
    ws = shadowing
    with ModelServer(starter_script(work=[[WRITE_HI]])) as server:
        env = cluster_env(tmp_path / "home", server.url)
        d = str(cluster_dir)
        up = run(["flower-super", "cluster", "up", "--workers", "2", "--dir", d], env, ws)
        try:
            assert up.returncode == 0, up.stderr
            # the hints name the --dir they were given
            assert f"cluster down --dir {d}" in up.stderr and f"up --dir {d}" in up.stderr
            record = cluster_dir / "cluster.json"
            pg_dir = Path(json.loads(record.read_text())["pg_dir"])
            assert pg_dir.is_relative_to(cluster_dir), pg_dir  # PostgreSQL's data is under it
            for pid in workers_of(record):
                line = " ".join(psutil.Process(pid).cmdline())
                assert str(BIN / "flower-super") in line and " -m " not in line, line
            for line in up.stdout.strip().splitlines():
                name, _, value = line.removeprefix("export ").partition("=")
                env[name] = value
            done = run(["flower", "make hi.txt", "--timeout", "0"], env, ws)
            assert done.returncode == 0, done.stdout + done.stderr
            assert (ws / "hi.txt").read_text() == "hi\n"
            assert (done.stdout + done.stderr).count("@ running on") == 4

            # a dead worker: up starts it again and says so
            first, second = workers_of(record)
            os.kill(first, signal.SIGKILL)
            wait_until(lambda: not running(first), 10, "the worker to die")
            again = run(["flower-super", "cluster", "up", "--dir", d], env, ws)
            assert again.returncode == 0, again.stderr
            assert "worker 1 was gone" in again.stderr and "a new one was started" in again.stderr
            assert again.stdout == up.stdout
            pids = workers_of(record)
            assert pids[1] == second and pids[0] != first and all(map(running, pids))

            # --workers N on a running cluster scales it, and says so
            three = run(["flower-super", "cluster", "up", "--workers", "3", "--dir", d], env, ws)
            assert three.returncode == 0 and "1 more worker(s) started: 3 now" in three.stderr
            assert len(workers_of(record)) == 3 and all(map(running, workers_of(record)))
            one = run(["flower-super", "cluster", "up", "--workers", "1", "--dir", d], env, ws)
            assert one.returncode == 0 and "2 worker(s) stopped" in one.stderr, one.stderr
            assert len(workers_of(record)) == 1
            gone = pids[1:] + workers_of(record)[1:]
            wait_until(lambda: not any(map(running, gone)), 30, "the extra workers to stop")
        finally:
            down = run(["flower-super", "cluster", "down", "--dir", d], env, ws)
        assert down.returncode == 0 and "cluster down" in down.stderr, down.stderr
        assert not cluster_dir.exists()
        nothing = run(["flower-super", "cluster", "down", "--dir", d], env, ws)
        assert nothing.returncode == 1, nothing.stderr
        assert f"no cluster is up in {d}" in nothing.stderr and "hint" in nothing.stderr
        assert "Traceback" not in nothing.stderr


def test_a_failed_cluster_up_keeps_the_log_it_points_to(tmp_path: Path, cluster_dir: Path) -> None:
    """A worker that cannot start (the agent SDK it preloads fails to import) takes the
    cluster down again, and the log its hint names is still there to read."""
    env = cluster_env(tmp_path / "home", "http://127.0.0.1:9")
    broken = tmp_path / "broken" / "claude_agent_sdk"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('the SDK is broken here')\n")
    env["PYTHONPATH"] = str(broken.parent)  # reaches the workers, not cluster up's own imports
    d = str(cluster_dir)
    done = run(["flower-super", "cluster", "up", "--workers", "1", "--dir", d], env, tmp_path)
    assert done.returncode == 2, done.stderr
    assert "worker 1 did not start" in done.stderr and "the SDK is broken here" in done.stderr
    log = cluster_dir / "worker-1.log"
    assert f"its log is {log} (kept)" in done.stderr, done.stderr
    assert "the SDK is broken here" in log.read_text()
    assert sorted(p.name for p in cluster_dir.iterdir()) == ["worker-1.log"]
    # nothing was left up: down has nothing to stop
    nothing = run(["flower-super", "cluster", "down", "--dir", d], env, tmp_path)
    assert nothing.returncode == 1, nothing.stderr
