"""The cluster's mailbox pump on a real PostgreSQL: what it delivers, and what it reads.

A supervisor of many flows (or a worker of many attempts) follows one mailbox per attempt
through one pump. An event of another run must cost it no read: the pump reads only the
mailboxes the database's notifications name (issue 25, point 8), and still delivers every
frame of the ones it follows, in order.
"""

from __future__ import annotations

import asyncio
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

    def read(self, key: str, after: int = 0) -> list[tuple[int, dict[str, Any]]]:
        self.reads[key] = self.reads.get(key, 0) + 1
        got: list[tuple[int, dict[str, Any]]] = self.rows.read(key, after)
        return got

    def changed(self, timeout: float) -> set[str] | None:
        got: set[str] | None = self.rows.changed(timeout)
        return got


def test_the_pump_reads_only_the_mailboxes_that_changed(pg_dsn: str, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    writer = open_state(pg_dsn, run_dir=tmp_path / "runs", workspace=ws)
    reader = open_state(pg_dsn, run_dir=tmp_path / "runs", workspace=ws)
    rows = Counting(reader.mailboxes)
    pump = Pump(rows)

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

    try:
        got = asyncio.run(main())
    finally:
        pump.close()
        writer.close()
        reader.close()
    assert got == [f"b{i}" for i in range(40)]  # every frame, in order
    # The quiet mailbox is read when it is subscribed, when its own frame comes, and at
    # the pump's sweeps: never once per event of the busy one.
    assert rows.reads["box/quiet"] <= 4, rows.reads
