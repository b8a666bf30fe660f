"""The run state's two backends side by side, in one run, on one machine (issue 18, point 8).

    .venv/bin/python scripts/bench_state.py [--rounds 4] [--steps 6] [--status-rounds 15]
        [--writers 1,4,16,32] [--pace-ms 4] [--dsn URL] [--only step,append,status]

Three comparisons, each local files beside PostgreSQL, on one throwaway server (fsync on,
``flower.services.postgres``) unless ``--dsn`` names one (a superuser's URL: databases are
made on it and dropped):

1. **The marginal supervised step** (goal: PostgreSQL at most 1.1x local files):
   ``flower-super start`` runs an N-step flow (scripts/bench_supervisor.py's flow, one text
   turn a step, the real CLI against the scripted model server) in a fresh workspace, once
   with local state and once with ``FLOWER_STATE`` set, alternating which goes first each
   round. A step's cost is the time from its start to the next step's start (the manifest's
   ``started_at``): fork, child, SDK client, CLI, transcript mirroring, lineage, manifest,
   registry and event rows all included. The first step is the flow's fixed cost and left out.
2. **append p99 with 1, 4, 16 and 32 concurrent writers**: ``append`` of one 2 KB transcript
   entry (scripts/bench_store.py's entry), timed per call inside real writer *processes*
   (released together through a barrier), each on a session of its own as step children
   are, pausing 0 to 2x ``--pace-ms`` between appends (the eager mirroring of live steps; 0
   = flat out): ``SqliteSessionStore`` on a fresh ``sessions.db`` beside
   ``PostgresSessionStore`` (with an attempt's epoch, so every append runs the fence) on a
   fresh database. The table says where each wins.
3. **``flower-super status``** (goal: PostgreSQL within 1.5x of local files plus psycopg's
   own import time, ``python -c "import psycopg"`` less ``python -c pass``, timed in the same
   rounds): the same
   history (two finished runs, one that died mid-step) written to both through the run
   state's own objects; each round runs both commands once, in a shuffled order.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(ROOT))
from bench_store import make_entry, quantile  # noqa: E402

BACKENDS = ("sqlite", "postgres")


# ---- worker process --------------------------------------------------------------------


async def worker(backend: str, where: str, writer: int, count: int, pace_s: float) -> None:
    store: Any
    if backend == "sqlite":
        from flower.state.sqlite import SqliteSessionStore

        store = SqliteSessionStore(where)
    else:
        from flower.state.postgres import PostgresSessionStore

        store = PostgresSessionStore(where)
        store.begin_attempt()
        store.claim(f"bench-{writer}")
    session_id = f"bench-{writer}"
    key = {"project_key": "bench", "session_id": session_id}
    entries = [make_entry(session_id, i, None) for i in range(count)]
    await store.append(key, [make_entry(session_id, -1, None)])  # connected, schema there
    print("ready", flush=True)
    sys.stdin.readline()  # the barrier: every writer starts on the same "go"
    samples = []
    for entry in entries:
        t0 = time.perf_counter_ns()
        await store.append(key, [entry])
        samples.append(time.perf_counter_ns() - t0)
        if pace_s:
            await asyncio.sleep(random.uniform(0, 2 * pace_s))
    store.close()
    print(json.dumps({"samples": samples}), flush=True)


# ---- parent ------------------------------------------------------------------------------


def run_writers(backend: str, where: str, writers: int, count: int, pace_s: float) -> dict:
    cmd = [sys.executable, __file__, "--worker", backend, where]
    procs = [
        subprocess.Popen(
            [*cmd, str(w), str(count), str(pace_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for w in range(writers)
    ]
    try:
        for p in procs:
            assert p.stdout and p.stdin
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a {backend} writer died before the barrier")
        t0 = time.perf_counter()
        for p in procs:
            assert p.stdin
            p.stdin.write("go\n")
            p.stdin.flush()
        samples: list[int] = []
        for p in procs:
            assert p.stdout
            samples += json.loads(p.stdout.readline())["samples"]
            if p.wait(timeout=900) != 0:
                raise RuntimeError(f"a {backend} writer exited {p.returncode}")
        wall = time.perf_counter() - t0
        return {"samples": sorted(samples), "rate": len(samples) / wall}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            for stream in (p.stdin, p.stdout):
                if stream:
                    stream.close()


def fresh_database(server_url: str) -> tuple[str, str]:
    import psycopg

    from flower.testing.pytest_postgres import database_url

    name = f"bench_{secrets.token_hex(4)}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return name, database_url(server_url, name)


def drop_database(server_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def bench(server_url: str, tmp: Path, writer_counts: list[int], pace_s: float) -> list[tuple]:
    rows = []
    for writers in writer_counts:
        per_writer = max(200, 2000 // writers)
        for backend in BACKENDS:
            if backend == "sqlite":
                where, name = str(tmp / f"sessions-{writers}.db"), ""
            else:
                name, where = fresh_database(server_url)
            try:
                result = run_writers(backend, where, writers, per_writer, pace_s)
            finally:
                if name:
                    drop_database(server_url, name)
            rows.append((writers, backend, result))
            print(f"  done: {writers} writers, {backend}", file=sys.stderr, flush=True)
    return rows


def report(rows: list[tuple], pace_ms: float) -> list[str]:
    pace = f"0-{2 * pace_ms:g} ms apart" if pace_ms else "flat out"
    out = [f"\n2. append() of one 2 KB entry, writer processes {pace}, ms per call"]
    head = f"{'writers':>7}  {'backend':<9}{'samples':>8}{'p50':>8}{'p99':>8}{'p99.9':>8}{'max':>8}"
    out.append(head + f"{'appends/s':>11}")
    by: dict[tuple[int, str], list[int]] = {}
    for writers, backend, r in rows:
        s = r["samples"]
        by[(writers, backend)] = s
        cells = [quantile(s, 0.5), quantile(s, 0.99), quantile(s, 0.999), s[-1] / 1e6]
        figures = "".join(f"{x:>8.2f}" for x in cells)
        out.append(f"{writers:>7}  {backend:<9}{len(s):>8}{figures}{r['rate']:>11.0f}")
    out.append("   p99 winner per row:")
    for writers in sorted({w for w, _, _ in rows}):
        p99 = {b: quantile(by[(writers, b)], 0.99) for b in BACKENDS if (writers, b) in by}
        best = min(p99, key=lambda b: p99[b])
        other = max(p99, key=lambda b: p99[b])
        out.append(f"   {writers:>2} writers: {best} ({p99[best]:.2f} ms vs {p99[other]:.2f} ms)")
    return out


# ---- 1. the marginal supervised step -------------------------------------------------------


STEP_GOAL = 1.1


def bench_step(server_url: str, tmp: Path, rounds: int, steps: int) -> list[str]:
    from bench_supervisor import FLOW_SRC, measured

    from flower.services.cli_env import cli_env
    from flower.services.model_server import ModelServer

    root = tmp / "step"
    root.mkdir()
    (root / "bench_flow.py").write_text(FLOW_SRC)
    name, url = fresh_database(server_url)
    samples: dict[str, list[float]] = {"local files": [], "PostgreSQL": []}
    try:
        with ModelServer({"default": [{"text": "ok."}]}) as server:
            env = {**cli_env(root / "home", server.url), "PYTHONPATH": str(ROOT)}
            env.pop("FLOWER_STATE", None)
            envs = {"local files": env, "PostgreSQL": {**env, "FLOWER_STATE": url}}

            def flow(backend: str, n: int, tag: str) -> list[float]:
                ws = root / f"ws-{tag}"
                ws.mkdir()
                cmd = [sys.executable, "-m", "supervisor", "start", "--flow"]
                cmd += [f"{root / 'bench_flow.py'}:flow", "-w", str(ws), "-r", str(ws / "runs")]
                measured(cmd, {**envs[backend], "BENCH_STEPS": str(n)}, root)
                state = open_for(envs[backend].get("FLOWER_STATE", ""), ws)
                try:
                    starts = [row["started_at"] for row in state.manifest_rows()]
                finally:
                    state.close()
                return [b - a for a, b in itertools.pairwise(starts)][1:]

            for backend in samples:  # warm: bytecode, the CLI's first run, the schema
                flow(backend, 2, f"warm-{backend[0]}")
            for r in range(rounds):
                order = list(samples) if r % 2 == 0 else list(reversed(samples))
                for backend in order:
                    samples[backend] += flow(backend, steps, f"{r}-{backend[0]}")
                print(f"  done: step round {r + 1}/{rounds}", file=sys.stderr, flush=True)
    finally:
        drop_database(server_url, name)
    med = {b: statistics.median(xs) for b, xs in samples.items()}
    out = [f"1. one more supervised step ({rounds} flows of {steps} steps each, ms)"]
    out.append(f"   {'':<12}{'n':>4}{'median':>9}{'p10':>8}{'p90':>8}")
    for b, xs in samples.items():
        q = statistics.quantiles(xs, n=10) if len(xs) > 1 else xs
        out.append(
            f"   {b:<12}{len(xs):>4}{med[b] * 1000:>9.0f}{q[0] * 1000:>8.0f}{q[-1] * 1000:>8.0f}"
        )
    ratio = med["PostgreSQL"] / med["local files"]
    verdict = "within" if ratio <= STEP_GOAL else "NOT within"
    out.append(f"   ratio {ratio:.2f}x ({verdict} the goal of {STEP_GOAL}x)")
    return out


def open_for(url: str, ws: Path) -> Any:
    from flower.state.backends import open_state

    return open_state(url, run_dir=ws / "runs", workspace=ws, create=False)


# ---- 3. flower-super status -----------------------------------------------------------------


def bench_status(server_url: str, tmp: Path, rounds: int) -> list[str]:
    from bench_status_state import GOAL, timed, write_history

    from flower.state.backends import LocalState, SharedState

    name, url = fresh_database(server_url)
    try:
        ws_local, ws_shared = tmp / "status-local", tmp / "status-shared"
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
            "local files": ([*py, "--state", ""], ws_local),  # whatever a .env says
            "PostgreSQL": ([*py, "--state", url], ws_shared),
            # what the driver alone costs to load, measured beside them (goal: issue 24)
            "python -c pass": ([sys.executable, "-c", "pass"], ws_local),
            "import psycopg": ([sys.executable, "-c", "import psycopg"], ws_local),
        }
        for cmd, cwd in commands.values():
            timed(cmd, cwd, env)  # bytecode first
        times: dict[str, list[float]] = {n: [] for n in commands}
        for _ in range(rounds):
            order = list(commands)
            random.shuffle(order)
            for each in order:
                cmd, cwd = commands[each]
                times[each].append(timed(cmd, cwd, env))
    finally:
        drop_database(server_url, name)
    med = {n: statistics.median(ts) for n, ts in times.items()}
    out = [f"\n3. flower-super status, {rounds} rounds (median / min, ms)"]
    for n, ts in times.items():
        out.append(f"   {n:12s} {med[n] * 1000:7.1f} / {min(ts) * 1000:7.1f}")
    ratio = med["PostgreSQL"] / med["local files"]
    driver = max(0.0, med["import psycopg"] - med["python -c pass"])
    allowed = GOAL * med["local files"] + driver
    verdict = "within" if med["PostgreSQL"] <= allowed else "NOT within"
    out.append(
        f"   ratio {ratio:.2f}x; psycopg's own import {driver * 1000:.0f} ms: PostgreSQL "
        f"{med['PostgreSQL'] * 1000:.0f} ms vs the goal of {GOAL}x local + that = "
        f"{allowed * 1000:.0f} ms ({verdict})"
    )
    return out


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        backend, where, writer, count, pace = sys.argv[2:7]
        asyncio.run(worker(backend, where, int(writer), int(count), float(pace)))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="flows per backend (step)")
    parser.add_argument("--steps", type=int, default=6, help="steps per flow (step)")
    parser.add_argument("--status-rounds", type=int, default=15)
    parser.add_argument("--writers", default="1,4,16,32")
    parser.add_argument("--pace-ms", type=float, default=4.0)
    parser.add_argument("--dsn", default="", help="a PostgreSQL superuser's URL to use")
    parser.add_argument("--only", default="step,append,status")
    args = parser.parse_args()
    only = {x.strip() for x in args.only.split(",")}
    counts = [int(n) for n in args.writers.split(",")]
    from flower.services.postgres import start_postgres

    server = None if args.dsn else start_postgres(durable=True)
    out: list[str] = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-state-") as tmp:
            url = args.dsn or (server.dsn if server else "")
            if "step" in only:
                out += bench_step(url, Path(tmp), args.rounds, args.steps)
            if "append" in only:
                out += report(bench(url, Path(tmp), counts, args.pace_ms / 1000), args.pace_ms)
            if "status" in only:
                out += bench_status(url, Path(tmp), args.status_rounds)
    finally:
        if server is not None:
            server.stop()
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
