"""The throwaway Temporal dev server (flower.services.temporal): its command line for
scripts/test.sh, loopback only, a taken port retried, one clear error when it cannot start,
and a stop that leaves nothing behind."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client

from flower.services import temporal
from flower.services.temporal import TemporalServer, TemporalStartError, start_temporal

# A start is 0.3-1 s idle; an interpreter importing temporalio for the command line ~1 s;
# a loaded 2-core machine multiplies both.
pytestmark = pytest.mark.timeout(120)

COMMAND = [sys.executable, "-m", "flower.services.temporal"]


def answers(target: str) -> bool:
    """Does a client connect to ``target`` and find the namespace?"""

    async def probe() -> None:
        client = await Client.connect(target)
        await client.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace="default")
        )

    try:
        asyncio.run(asyncio.wait_for(probe(), 10))
    except Exception:  # noqa: BLE001 - any failure is "no"
        return False
    return True


def servers_in(directory: Path) -> list[psutil.Process]:
    """Live processes whose command line names ``directory`` (the server's --db-filename)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if str(directory) in " ".join(proc.info["cmdline"] or []):
            found.append(proc)
    return found


@pytest.fixture
def taken_port(listening_url: str) -> int:
    """A loopback port something else listens on."""
    return int(listening_url.rsplit(":", 1)[1])


def test_the_command_line_starts_a_server_on_loopback_only_and_stops_it_leaving_nothing() -> None:
    began = time.monotonic()
    started = subprocess.run([*COMMAND, "start"], capture_output=True, text=True, timeout=100)
    took = time.monotonic() - began
    assert started.returncode == 0, started.stderr
    target, directory = started.stdout.split()
    server = TemporalServer.load(directory)
    try:
        print(f"\npython -m flower.services.temporal start: {took:.2f} s")
        assert server.target == target and target.startswith("127.0.0.1:")
        assert answers(target)
        listening = [
            c.laddr
            for c in psutil.Process(server.pid).net_connections("inet")
            if c.status == psutil.CONN_LISTEN
        ]
        assert listening and {addr.ip for addr in listening} == {"127.0.0.1"}
        assert server.db.exists()  # its state is a file inside the directory
    finally:
        stopped = subprocess.run([*COMMAND, "stop", directory], timeout=60, check=False)
    assert stopped.returncode == 0
    assert not Path(directory).exists()
    assert not psutil.pid_exists(server.pid) or servers_in(Path(directory)) == []
    assert not answers(target)


def test_the_command_line_s_mistakes() -> None:
    usage = subprocess.run([*COMMAND, "begin"], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and "usage:" in usage.stderr
    gone = subprocess.run([*COMMAND, "stop", "/nonexistent/dir"], timeout=60, check=False)
    assert gone.returncode == 0  # nothing to stop is not an error (an EXIT trap's second go)


def test_a_port_taken_before_the_server_binds_it_is_retried_on_another(
    tmp_path: Path, taken_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    ports = iter([taken_port])
    free = temporal.free_port
    monkeypatch.setattr(temporal, "free_port", lambda: next(ports, None) or free())
    server = start_temporal(tmp_path / "t")
    try:
        assert server.port != taken_port and answers(server.target)
        assert "address already in use" in server.log.read_text("utf-8")
    finally:
        server.stop()
    assert not server.dir.exists() and servers_in(server.dir) == []


def test_a_server_that_cannot_start_fails_with_one_line_from_its_log_and_leaves_no_process(
    tmp_path: Path, taken_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(temporal, "free_port", lambda: taken_port)  # every try: taken
    home = tmp_path / "t"
    with pytest.raises(TemporalStartError) as caught:
        start_temporal(home)
    line = caught.value.one_line()
    assert "address already in use" in line and str(taken_port) in line
    assert "\n" not in line and str(home / "server.log") in line
    assert (home / "server.log").exists()  # the log the hint names stays; the rest goes
    assert sorted(p.name for p in home.iterdir()) == ["server.log"]
    assert servers_in(home) == []


def test_stop_never_kills_a_process_that_reused_the_server_s_pid(tmp_path: Path) -> None:
    """A state file outliving its server (a reboot) names a pid some other process may have
    now: stop removes the directory and leaves that process alone."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        home = tmp_path / "t"
        home.mkdir()
        record = {
            "dir": str(home),
            "port": 1,
            "binary": "temporal",
            "pid": other.pid,
            "created": psutil.Process(other.pid).create_time() - 3600,  # an hour older
            "namespace": "default",
        }
        (home / temporal.STATE_FILE).write_text(json.dumps(record), encoding="utf-8")
        stopped = subprocess.run([*COMMAND, "stop", str(home)], timeout=60, check=False)
        assert stopped.returncode == 0 and not home.exists()
        assert other.poll() is None
    finally:
        other.kill()
        other.wait(timeout=10)


def test_the_fixture_s_server_runs_an_activity(temporal_target: str, temporal_queue: str) -> None:
    """What every Temporal test builds on: the suite's server (FLOWER_TEST_TEMPORAL under
    scripts/test.sh, else the session's own) and a task queue of this test's own."""
    from datetime import timedelta

    from temporalio import activity
    from temporalio.worker import Worker

    @activity.defn(name="echo")
    async def echo(text: str) -> str:
        return text

    async def main() -> str:
        client = await Client.connect(temporal_target)
        async with Worker(client, task_queue=temporal_queue, activities=[echo]):
            handle = await client.start_activity(
                echo,
                "hi",
                id=f"{temporal_queue}-echo",
                task_queue=temporal_queue,
                start_to_close_timeout=timedelta(seconds=30),
            )
            result: str = await handle.result()
            return result

    assert asyncio.run(main()) == "hi"
