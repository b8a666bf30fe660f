"""Marginal cost of one more step through flower-super vs one bare ``claude -p`` turn.

Both run the real bundled CLI against the same scripted model server (one text turn each),
interleaved in rounds so machine noise hits both sides alike:

- bare: ``claude -p "<prompt>"`` as a fresh process, wall clock from spawn to exit;
- flower: ``flower-super start`` running an N-step flow; the marginal cost of a step is the
  time from one step's start to the next one's start (manifest ``started_at``), i.e. fork,
  child setup, SDK client, CLI, pipe frames, lineage and manifest writes, all included. While
  a step runs, the next steps' children are prepared (forked, their CLI started), so what a
  step costs is mostly its turn, not a CLI start-up. A flow's first step has nothing before it
  to be prepared during: it is part of the flow's fixed cost and is reported on its own (the
  marginal figure is over the later steps), with the mean over whole flows beside it.

Goal (issue 7): median flower step <= 0.6 x median bare turn, over >= 20 warm samples.
Also printed for reference: a fresh interpreter importing the SDK, the cost a forked step
child does not pay.

Usage: .venv/bin/python scripts/bench_supervisor.py [--rounds 4] [--steps 8]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from flower.services.cli_env import claude_path, cli_env  # noqa: E402
from flower.services.model_server import ModelServer  # noqa: E402

FLOW_SRC = """
import os
from flower.agents.agent import AgentSpec
from flower.workflow import Step, Workflow
spec = AgentSpec(name="bench", instructions="answer briefly", allowed_tools=[])
N = int(os.environ["BENCH_STEPS"])
steps = [Step(f"s{i}", spec, f"[[bench]] step {i}") for i in range(N)]
flow = Workflow(steps, name="bench", continuous=False)
"""


def measured(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """Run ``cmd`` to its end: (wall seconds, CPU seconds of it and every process below it)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{cmd[:4]} failed with {proc.returncode}")
    return time.perf_counter() - t0, usage.ru_utime + usage.ru_stime


def bare_turn(env: dict[str, str], cwd: Path, i: int) -> tuple[float, float]:
    return measured([str(claude_path()), "-p", f"[[bench]] bare {i}"], env, cwd)


def flower_steps(env: dict[str, str], root: Path, n: int, r: int) -> tuple[list[float], float]:
    """The start-to-start durations of one n-step flow's steps (the first step's first), and
    the CPU seconds the whole flow used."""
    runs = root / f"runs-{r}"
    _, cpu = measured(
        [
            sys.executable,
            "-m",
            "supervisor",
            "start",
            "--flow",
            str(root / "bench_flow.py") + ":flow",
            "-w",
            str(root / "ws"),
            "-r",
            str(runs),
        ],
        {**env, "BENCH_STEPS": str(n)},
        root,
    )
    rows = json.loads((runs / "manifest.json").read_text())
    starts = [row["started_at"] for row in rows]
    return [b - a for a, b in itertools.pairwise(starts)], cpu


def sdk_import() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import claude_agent_sdk"], check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument(
        "--steps", type=int, default=8, help="steps per flower run (gives steps-1 samples)"
    )
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="flower-bench-"))
    (root / "ws").mkdir()
    (root / "bench_flow.py").write_text(FLOW_SRC)
    script = {"default": [{"text": "ok."}]}
    with ModelServer(script) as server:
        env = {**cli_env(root / "home", server.url), "PYTHONPATH": str(REPO)}
        for i in range(2):  # warm the disk cache and the CLI's first-run work
            bare_turn(env, root / "ws", -1 - i)
        flower_steps(env, root, 2, -1)
        bare: list[float] = []
        bare_cpu: list[float] = []
        firsts: list[float] = []
        steps: list[float] = []
        step_cpu: list[float] = []
        for r in range(args.rounds):
            for i in range(args.steps - 1):
                wall, cpu = bare_turn(env, root / "ws", r * 100 + i)
                bare.append(wall)
                bare_cpu.append(cpu)
            (first, *later), cpu_n = flower_steps(env, root, args.steps, r)
            firsts.append(first)
            steps += later
            _, cpu_2 = flower_steps(env, root, 2, 1000 + r)  # the same flow's fixed costs
            step_cpu.append((cpu_n - cpu_2) / (args.steps - 2))
    imports = [sdk_import() for _ in range(3)]
    report(bare, steps, firsts, imports)
    cpu_step, cpu_bare = statistics.median(step_cpu), statistics.median(bare_cpu)
    cores = os.cpu_count() or 1
    print(
        f"CPU: one more flower step {cpu_step * 1000:.0f} ms, one bare turn {cpu_bare * 1000:.0f}"
        f" ms; on {cores} cores a step cannot take less than {cpu_step / cores * 1000:.0f} ms of"
        f" wall time ({cpu_step / cores / statistics.median(bare):.2f}x the bare turn)"
    )


def report(
    bare: list[float], steps: list[float], firsts: list[float], imports: list[float]
) -> None:
    def row(name: str, xs: list[float]) -> str:
        q = statistics.quantiles(xs, n=10)
        ms = [statistics.median(xs) * 1000, q[0] * 1000, q[-1] * 1000]
        return f"{name:<34}{len(xs):>4}" + "".join(f"  {v:>8.0f}" for v in ms)

    print(f"{'':<34}{'n':>4}  {'median':>8}  {'p10':>8}  {'p90':>8}   (ms)")
    print(row("bare `claude -p` turn", bare))
    print(row("one more step through flower-super", steps))
    print(row("a flow's first step", firsts))
    print(row("fresh python importing the SDK", imports))
    ratio = statistics.median(steps) / statistics.median(bare)
    per_flow = (sum(steps) + sum(firsts)) / (len(steps) + len(firsts))
    print(f"\nmean step over whole flows, first steps included: {per_flow * 1000:.0f} ms")
    print(f"ratio flower step / bare turn (medians): {ratio:.2f}x   (goal <= 0.6x)")


if __name__ == "__main__":
    main()
