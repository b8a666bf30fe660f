"""Temporal going away mid-run is an outage, not a bug (issue 25, point 6).

A Temporal dev server of this module's own (the test kills it: never the suite's shared
one), the run state on PostgreSQL, two ``flower-super worker``s, the real CLI against the
scripted model server. While B's second model turn (turn 1) is held 2 s on a worker, the
server is killed (SIGKILL) and started again on its port and database 6 s later: B ends
while it is away (its result comes through the state database) and C is to be placed then.
The run must end 0, with one ``!`` line about Temporal on the terminal, no ``flower bug``
line, none of the SDK's own log lines, B's tool call run once, and C placed once it is back.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from flower.services.model_server import ModelServer
from flower.services.temporal import TemporalServer, start_temporal
from tests.e2e import Flower
from tests.test_e2e_cluster import ABC, Cluster, abc_script, bash, finish

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

DOWN_S = 6.0  # longer than B's last turn is held: B ends, and C is placed, while it is down


@pytest.fixture(scope="module")
def own_temporal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TemporalServer]:
    server = start_temporal(tmp_path_factory.mktemp("temporal"))
    try:
        yield server
    finally:
        server.stop()


def test_temporal_killed_and_back_mid_step_is_waited_for_and_the_run_ends_0(
    model_server: Callable[..., ModelServer],
    flower_env: Callable[..., Flower],
    own_temporal: TemporalServer,
    temporal_queue: str,
    pg_dsn: str,
    tmp_path: Path,
) -> None:
    turns: list[Any] = [bash("echo ran >> b-ran.txt"), {"text": "B done.", "delay": 2, "times": 1}]
    f = flower_env(model_server(abc_script(turns)))
    c = Cluster(f, own_temporal.target, temporal_queue, pg_dsn, tmp_path / "workers")
    try:
        c.worker("W1")
        c.worker("W2")
        sup = c.start(ABC)
        f.server.wait_for(
            lambda reqs: any(r.conversation == "B" and r.turn == 1 for r in reqs), timeout=90
        )
        own_temporal.down()
        time.sleep(DOWN_S)  # how long it is away is what is tested, not a wait for an event
        own_temporal.up()
        out = finish(c, sup, timeout=180)
    finally:
        c.stop()
    assert sup.returncode == 0, out + c.logs_text()
    marks = [line for line in out.splitlines() if line.startswith("!")]
    assert len(marks) == 1 and "Temporal" in marks[0], out
    assert "flower bug" not in out and "WARN" not in out and "\x1b[" not in out, out
    assert (f.ws / "b-ran.txt").read_text().splitlines() == ["ran"], "B's tool call ran again"
    placed_c = [r for r in f.server.requests if r.conversation == "C"]
    assert len(placed_c) == 1, "C did not run once after the outage"


def test_a_start_while_the_workers_service_restarts_waits_for_it_and_runs(
    model_server: Callable[..., ModelServer],
    flower_env: Callable[..., Flower],
    own_temporal: TemporalServer,
    temporal_queue: str,
    pg_dsn: str,
    tmp_path: Path,
) -> None:
    """The front door refuses an address where nothing answers at once (a typo must be one
    line within seconds), but the service this queue's workers reported being on a moment
    ago is restarting: the start says so in one ``!`` line, waits, and the run goes on."""
    f = flower_env(model_server(abc_script([{"text": "B done."}])))
    c = Cluster(f, own_temporal.target, temporal_queue, pg_dsn, tmp_path / "workers")
    try:
        c.worker("W1")
        own_temporal.down()
        sup = c.start(ABC)
        time.sleep(3.0)  # how long it is away is what is tested, not a wait for an event
        own_temporal.up()
        out = finish(c, sup, timeout=180)
    finally:
        c.stop()
    assert sup.returncode == 0, out + c.logs_text()
    marks = [line for line in out.splitlines() if line.startswith("!")]
    assert len(marks) == 1 and "Temporal" in marks[0] and "worker" in marks[0], out
    assert "flower bug" not in out and "WARN" not in out, out
    assert [r.conversation for r in f.server.requests if r.conversation] == ["A", "B", "C"]
