"""The cluster's mailbox pump on a real PostgreSQL: what it delivers, and what it reads.

A supervisor of many flows (or a worker of many attempts) follows one mailbox per attempt
through one pump. An event of another run must cost it no read: the pump reads only the
mailboxes the database's notifications name (issue 25, point 8), and still delivers every
frame of the ones it follows, in order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

import pytest

from flower.state.backends import open_state
from supervisor.cluster.remote import Pump

pytestmark = pytest.mark.timeout(60)


class Counting:
    """The state's event rows, counting the reads of each key."""

    def __init__(self, rows: Any) -> None:
        self.rows = rows
        self.reads: dict[str, int] = {}
        self.wakes = 0

    def read(self, key: str, after: int = 0) -> list[tuple[int, dict[str, Any]]]:
        self.reads[key] = self.reads.get(key, 0) + 1
        got: list[tuple[int, dict[str, Any]]] = self.rows.read(key, after)
        return got

    def changed(self, timeout: float, runs: AbstractSet[str]) -> set[str] | None:
        self.wakes += 1
        got: set[str] | None = self.rows.changed(timeout, runs)
        return got

    def nudge(self) -> None:
        self.rows.nudge()


Pumped = tuple[Any, Counting, Pump]


@pytest.fixture
def pumped(pg_dsn: str, tmp_path: Path) -> Iterator[Pumped]:
    """A writer's state, and a pump over another connection's mailboxes, counting."""
    ws = tmp_path / "ws"
    ws.mkdir()
    writer = open_state(pg_dsn, run_dir=tmp_path / "runs", workspace=ws)
    reader = open_state(pg_dsn, run_dir=tmp_path / "runs", workspace=ws)
    pump = Pump(Counting(reader.mailboxes))
    try:
        yield writer, pump.rows, pump
    finally:
        pump.close()
        writer.close()
        reader.close()


def test_the_pump_reads_only_the_mailboxes_that_changed(pumped: Pumped) -> None:
    writer, rows, pump = pumped

    async def main() -> list[str]:
        quiet = pump.subscribe("box/quiet", 0)
        busy = pump.subscribe("box/busy", 0)
        got: list[str] = []
        for i in range(40):  # another attempt's traffic, as fast as the database takes it
            writer.mailboxes.append("box/busy", {"line": f"b{i}"})
        writer.mailboxes.append("box/quiet", {"line": "q0"})
        while len(got) < 40:
            got.extend(await asyncio.wait_for(busy.get(), 10.0))
        assert await asyncio.wait_for(quiet.get(), 10.0) == ["q0"]
        return got

    got = asyncio.run(main())
    assert got == [f"b{i}" for i in range(40)]  # every frame, in order
    # The quiet mailbox is read when it is subscribed, when its own frame comes, and at
    # the pump's sweeps: never once per event of the busy one.
    assert rows.reads["box/quiet"] <= 4, rows.reads


def test_another_attempts_frames_do_not_wake_the_pump(pumped: Pumped) -> None:
    """Fifty supervisors on one database each follow their own attempts: a frame of one
    must wake only the pump that follows it (a wake-up costs a process CPU, fifty times a
    frame), while a mailbox subscribed later is still listened to and delivered."""
    import time

    writer, rows, pump = pumped

    async def main() -> tuple[int, float]:
        mine = pump.subscribe("box/mine", 0)
        writer.mailboxes.append("box/mine", {"line": "m0"})
        assert await asyncio.wait_for(mine.get(), 10.0) == ["m0"]
        wakes, began = rows.wakes, time.monotonic()
        for i in range(200):  # the other supervisors' traffic
            writer.mailboxes.append(f"box/other-{i % 7}", {"line": f"o{i}"})
        await asyncio.sleep(0.2)  # their notifications have come
        took = time.monotonic() - began
        woke = rows.wakes - wakes
        later = pump.subscribe("box/later", 0)  # listened to from now on, and read
        writer.mailboxes.append("box/later", {"line": "l0"})
        assert await asyncio.wait_for(later.get(), 10.0) == ["l0"]
        writer.mailboxes.append("box/mine", {"line": "m1"})
        assert await asyncio.wait_for(mine.get(), 10.0) == ["m1"]
        return woke, took

    woke, took = asyncio.run(main())
    # its own half-second timeouts (and a sweep), never a wake per frame of the others
    assert woke <= took / 0.5 + 3, (woke, took)
    assert not any(k.startswith("box/other") for k in rows.reads), rows.reads


def test_an_idle_pump_sleeps_until_something_comes(pumped: Pumped) -> None:
    """Fifty supervisors wait in a queue for four workers: a pump whose mailboxes are quiet
    must not wake on a timer of its own between two sweeps (a wake costs each of them CPU
    all the while), yet it delivers at once what comes, and close() ends its thread now."""
    import time

    writer, rows, pump = pumped

    async def main() -> tuple[int, float]:
        mine = pump.subscribe("box/idle", 0)
        writer.mailboxes.append("box/idle", {"line": "i0"})
        assert await asyncio.wait_for(mine.get(), 10.0) == ["i0"]
        await asyncio.sleep(0.6)  # the pump has settled on listening (its first look is blind)
        wakes = rows.wakes
        await asyncio.sleep(2.0)  # nothing comes
        idle = rows.wakes - wakes
        began = time.monotonic()
        writer.mailboxes.append("box/idle", {"line": "i1"})
        assert await asyncio.wait_for(mine.get(), 10.0) == ["i1"]
        return idle, time.monotonic() - began

    idle, took = asyncio.run(main())
    thread = pump._thread
    pump.close()
    assert thread is not None
    thread.join(2.0)
    assert not thread.is_alive()  # woken by close(), not at the end of its sleep
    assert idle <= 1, idle  # at most the sweep's own wake; half-second timers would give 4
    assert took < 2.0, took  # a notification still wakes it at once
