"""What a cross-run hit costs (seed 004), measured side by side in one run.

A 20-step and a 1-step flow, every step ``Cache("cross-run")``, are run once for real (the
bundled CLI against the scripted model server) so the store holds them; then, in shuffled
rounds, each is run again fully reused, in a fresh ``Runtime`` every time. Printed: the
median of each, the ratio 20-step / 1-step (goal: within 3x), the cost per reused step
(goal: under 30 ms), and what the reused runs started: attempts placed (every attempt goes
through the placement: 0 means no CLI and no child) and requests the model server got.

    .venv/bin/python scripts/bench_memo.py [--rounds N]

The third figure of the issue (``glob!:`` against a hashlib loop) is
``scripts/bench_memo_glob.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def flows() -> tuple[Any, Any]:
    from flower import AgentSpec, Cache, Step, Workflow

    hands = AgentSpec(name="hands", instructions="bench", allowed_tools=["Read"])

    def steps(n: int, tag: str) -> list[Step]:
        return [
            Step(f"s{i}", hands, f"[[bench]] {tag} step {i}", cache=Cache("cross-run"))
            for i in range(n)
        ]

    return Workflow(steps(20, "twenty"), name="twenty"), Workflow(steps(1, "one"), name="one")


class Counting:
    """A placement that counts the attempts it is given (and runs them in-process)."""

    def __init__(self) -> None:
        from flower.step.inprocess import InProcess

        self.inner = InProcess()
        self.attempts = 0

    async def attempt(self, call: Any, seat: Any, watch: Any) -> Any:
        self.attempts += 1
        return await self.inner.attempt(call, seat, watch)

    def prepare(self, calls: Any, seat: Any) -> None:
        self.inner.prepare(calls, seat)

    async def close(self) -> None:
        await self.inner.close()


def run_once(wf: Any, ws: Path, runs: Path, placement: Counting) -> float:
    from flower import Runtime

    began = time.perf_counter()
    rt = Runtime(workspace=ws, run_dir=runs, placement=placement)  # type: ignore[arg-type]
    try:
        asyncio.run(wf.run(rt))
    finally:
        rt.close()
    return time.perf_counter() - began


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args(argv)

    from flower.services.cli_env import cli_env
    from flower.services.model_server import ModelServer

    tmp = Path(tempfile.mkdtemp(prefix="flower-bench-memo-"))
    ws, runs = tmp / "ws", tmp / "runs"
    ws.mkdir()
    server = ModelServer({"conversations": [], "default": ["done."]}).start()
    os.environ.update(cli_env(tmp / "home", server.url))
    twenty, one = flows()
    try:
        filling = Counting()
        for wf in (twenty, one):
            run_once(wf, ws, runs, filling)  # for real: the store now holds every step
        print(f"filled the store: {filling.attempts} attempts through the CLI")
        sent_before = len(server.requests)
        times: dict[str, list[float]] = {"twenty": [], "one": []}
        placed = Counting()
        rng = random.Random(7)
        for _ in range(args.rounds):
            order = [twenty, one]
            rng.shuffle(order)
            for wf in order:
                times[wf.name].append(run_once(wf, ws, runs, placed))
        sent = len(server.requests) - sent_before
    finally:
        server.stop()
    t20, t1 = (statistics.median(times[k]) for k in ("twenty", "one"))
    per_step = (t20 - t1) / 19
    print(f"{args.rounds} rounds, shuffled; a fresh Runtime per run; medians")
    print(f"  1-step flow, fully reused    {t1 * 1000:8.1f} ms")
    print(f"  20-step flow, fully reused   {t20 * 1000:8.1f} ms")
    print(f"  ratio 20 / 1                 {t20 / t1:8.2f}x   (goal: within 3x)")
    print(f"  per reused step              {per_step * 1000:8.1f} ms   (goal: under 30 ms)")
    print(f"  attempts placed while reused {placed.attempts:8d}     (no CLI, no child)")
    print(f"  requests the model got       {sent:8d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
