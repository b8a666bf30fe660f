"""``flower-super status`` against local files beside ``status`` against PostgreSQL.

    .venv/bin/python scripts/bench_status_state.py [--rounds 15] [--dsn URL]

The same history is written to both homes through the run state's own objects (no model
call): a workspace with two finished runs and one whose process died mid-step (so status
shows a resume command), lineage, a manifest row per run and their event logs. Every round
runs both commands once, in a shuffled order, so a burst of load on this shared machine
falls on both alike; the table gives medians and minimums, and the ratio of the medians
(the goal, issue 18 point 8: PostgreSQL within 1.5x of local files).

The server is a throwaway one (``flower.services.postgres``) unless ``--dsn`` names one (a
superuser's URL: a database is made for the run and dropped after it). Each command runs
once untimed first (its bytecode written, as an installed flower has it).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GOAL = 1.5
RUNS = (("20260101-090000-aaaaa1", "finished"), ("20260101-100000-bbbbb2", "finished"))
DEAD = "20260101-110000-ccccc3"


def write_history(state: Any) -> None:
    """Three runs of one flow in ``state`` (a LocalState or a SharedState), each with a
    transcript (local status asks sessions.db about the lineage's sessions)."""
    import asyncio

    from flower.state.identity import path_key
    from flower.state.registry import FlowerRecord
    from flower.state.result import Event, StepResult

    for n, (run, end) in enumerate([*RUNS, (DEAD, "running")]):
        record = FlowerRecord(
            run=run,
            flow="two",
            pid=0,  # gone: the third is a run that died mid-step
            pid_started=None,
            workspace=str(state.workspace),
            started_at=time.time() - 3600 + n,
            command=["flower-super", "start", "-w", str(state.workspace)],
            steps=["first", "second"],
            state=end,
            step="second",
            session_id=f"s-{n}",
            woke=n + 1,
        )
        state.registry.write(record)
        state.manifest(run).record(StepResult("first", f"s-{n}", ok=True, num_turns=2))
        log = state.event_log(run)
        log.write(Event("text", "done", payload={"step": "first"}))
        log.close()
        key = {"project_key": path_key(state.workspace), "session_id": f"s-{n}"}
        entry = {"type": "user", "uuid": f"u-{n}", "message": {"role": "user", "content": "hi"}}
        asyncio.run(state.sessions.append(key, [entry]))
    lineage = state.lineage()
    lineage.bump()
    lineage.remember("first", "s-2")


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, check=False)
    took = time.perf_counter() - t0
    if done.returncode not in (0, 3):  # 3: a dead unfinished run, as written
        raise SystemExit(f"{' '.join(cmd)}: exit {done.returncode}\n{done.stderr.decode()}")
    return took


def main() -> int:
    """The status comparison alone (scripts/bench_state.py runs it with the other two)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--dsn", default=None, help="a PostgreSQL superuser's URL")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_state import bench_status

    from flower.services.postgres import start_postgres

    server = None if args.dsn else start_postgres(durable=True)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            admin = args.dsn or server.dsn  # type: ignore[union-attr]
            print("\n".join(bench_status(admin, Path(tmp), args.rounds)).lstrip())
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
