"""A short seeded kill campaign (scripts/chaos.py) in CI: both backends, every check.

The script runs the real ``flower-super start`` and the real CLI against the scripted model
server with its own PostgreSQL server (an ``outage`` fault stops it), injects kill -9s,
SIGTERMs, SIGSTOPs and database outages at random moments, runs each flow to its end and
checks that nothing finished is re-sent or re-run, every named session is continued and no
process survives. The README quotes a long campaign; this one keeps the script honest.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
CAMPAIGN = ("--faults", "8", "--seed", "1")


def test_a_short_seeded_campaign_over_both_backends_finds_nothing(tmp_path: Path) -> None:
    report = tmp_path / "chaos.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "chaos.py"), *CAMPAIGN, "--json", str(report)],
        capture_output=True,
        text=True,
        timeout=840,
        cwd=tmp_path,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert out.splitlines()[-1] == "chaos: PASS", out
    tally = json.loads(report.read_text())["tally"]
    faults = tally["faults"]
    assert len(faults) == 8, out
    assert {f["backend"] for f in faults} == {"local", "postgres"}, out
    assert len({f["kind"] for f in faults}) >= 3, out
    assert tally["finished"] == tally["flows"] > 0, out
    counts = [tally[k] for k in ("resent", "rerun", "lost", "survivors")]
    assert counts == [0, 0, 0, 0] and not tally["problems"], out
    assert "finished steps re-sent 0, finished tool calls re-run 0, sessions lost 0" in out


def test_a_violation_fails_the_campaign(tmp_path: Path) -> None:
    """The judge is not blind: a tool call's effect twice and a step sent after it finished
    are each counted and fail the run."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import chaos
    finally:
        sys.path.remove(str(REPO / "scripts"))

    class Req:
        def __init__(self, seq: int, conv: str, turn: int, t: float, sid: str) -> None:
            self.seq, self.conversation, self.turn, self.time = seq, conv, turn, t
            self.session_id, self.answer, self.delay = sid, "text", 0.0

    sent = [Req(1, "s0", 0, 10.0, "a"), Req(2, "s0", 1, 11.0, "a"), Req(3, "s0", 0, 30.0, "b")]

    class Server:
        requests = sent

    class FakeFlow:
        root = tmp_path / "local-0"
        ws = tmp_path
        steps = ("s0",)
        server = Server()

        def finished_at(self) -> dict[str, float]:
            return {"s0": 12.0}

        def mine(self) -> list[Req]:
            return list(sent)

    (tmp_path / "effects.txt").write_text("s0\ns0\n")
    tally = chaos.Tally()
    flow = FakeFlow()
    chaos.judge(flow, {"exit": 0, "out": "", "survivors": 0, "lost": []}, tally, [])  # type: ignore[arg-type]
    assert (tally.resent, tally.rerun, tally.lost) == (1, 1, 1), tally.problems


def test_a_run_that_fails_by_itself_is_the_flow_s_verdict_not_run_again(tmp_path: Path) -> None:
    """A run that ends non-zero without a fault that kills it is judged as it ended: the
    campaign does not run the command again until it passes (that would forgive a flower
    that fails after an outage)."""
    import random

    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import chaos
    finally:
        sys.path.remove(str(REPO / "scripts"))
    started: list[subprocess.Popen[bytes]] = []

    class Failing:
        root = tmp_path

        def start(self) -> subprocess.Popen[bytes]:
            proc = subprocess.Popen(
                [sys.executable, "-c", "raise SystemExit(3)"], stdout=subprocess.PIPE
            )
            started.append(proc)
            return proc

        def survivors(self, spare: set[int] | None = None) -> list[Any]:
            return []

        def mine_now(self) -> list[Any]:
            return []

    made, checks = chaos.run_flow(Failing(), "local", 0, 2, random.Random(1), None)  # type: ignore[arg-type]
    assert checks["exit"] == 3 and len(started) == 1 and made == []
    tally = chaos.Tally(flows=1)
    assert not chaos.ok(tally) and chaos.ok(chaos.Tally(flows=1, finished=1))
    assert not chaos.ok(chaos.Tally(flows=1, finished=1, survivors=1))
