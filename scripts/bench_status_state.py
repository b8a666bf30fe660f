"""``flower-super status`` against local files beside ``status`` against PostgreSQL.

    .venv/bin/python scripts/bench_status_state.py [--rounds 15] [--dsn URL]

The same history is written to both homes through the run state's own objects (no model
call): a workspace with two finished runs and one whose process died mid-step (so status
shows a resume command), lineage, a manifest row per run and their event logs. Every round
runs both commands once, in a shuffled order, so a burst of load on this shared machine
falls on both alike; the table gives medians and minimums, and the ratio of the medians
(the goal, issue 18 point 8: PostgreSQL within 1.5x of local files).

The server is a throwaway one (``flower.testing.postgres``) unless ``--dsn`` names one (a
superuser's URL: a database is made for the run and dropped after it). Each command runs
once untimed first (its bytecode written, as an installed flower has it).
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def database(dsn: str | None) -> Iterator[str]:
    """A fresh database for the run: on ``dsn``'s server, or on a throwaway one."""
    import psycopg

    from flower.testing.postgres import start_postgres
    from flower.testing.pytest_postgres import database_url

    server = None if dsn else start_postgres(durable=True)
    admin = dsn or server.dsn  # type: ignore[union-attr]
    name = f"bench_{secrets.token_hex(4)}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield database_url(admin, name)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        if server is not None:
            server.stop()


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, check=False)
    took = time.perf_counter() - t0
    if done.returncode not in (0, 3):  # 3: a dead unfinished run, as written
        raise SystemExit(f"{' '.join(cmd)}: exit {done.returncode}\n{done.stderr.decode()}")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--dsn", default=None, help="a PostgreSQL superuser's URL")
    args = parser.parse_args()

    from flower.state.backends import LocalState, SharedState

    with tempfile.TemporaryDirectory() as tmp, database(args.dsn) as url:
        root = Path(tmp)
        ws_local, ws_shared = root / "local", root / "shared"
        for ws in (ws_local, ws_shared):
            ws.mkdir()
        local = LocalState(ws_local / "runs", ws_local)
        shared = SharedState(url, run_dir=ws_shared / "runs", workspace=ws_shared)
        write_history(local)
        write_history(shared)
        local.close()
        shared.close()
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("FLOWER_STATE", None)
        py = [sys.executable, "-m", "supervisor", "status"]
        commands = {
            "local files": (py, ws_local),
            "PostgreSQL": ([*py, "--state", url], ws_shared),
        }
        for cmd, cwd in commands.values():
            timed(cmd, cwd, env)  # bytecode first
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.rounds):
            order = list(commands)
            random.shuffle(order)
            for name in order:
                cmd, cwd = commands[name]
                times[name].append(timed(cmd, cwd, env))
    med = {name: statistics.median(ts) for name, ts in times.items()}
    print(f"flower-super status, {args.rounds} rounds (median / min, ms)")
    for name, ts in times.items():
        print(f"  {name:12s} {med[name] * 1000:7.1f} / {min(ts) * 1000:7.1f}")
    ratio = med["PostgreSQL"] / med["local files"]
    verdict = "within" if ratio <= GOAL else "NOT within"
    print(f"  ratio {ratio:.2f} ({verdict} the goal of {GOAL}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
