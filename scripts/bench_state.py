"""Benchmark the run state's two backends side by side, in one run, on one machine.

    .venv/bin/python scripts/bench_state.py [--writers 1,4,16,32] [--pace-ms 4] [--dsn URL]

``append`` of one 2 KB transcript entry (scripts/bench_store.py's entry), timed per call
inside real writer *processes* (started with ``sys.executable``, released together through
a barrier), each writer on a session of its own as step children are, pausing 0 to 2x
``--pace-ms`` between appends (eager mirroring of live steps; 0 = flat out). For each count
of writers: ``SqliteSessionStore`` on a fresh ``sessions.db`` and ``PostgresSessionStore``
(with an attempt's epoch, so every append runs the fence) on a fresh database. The server
is a throwaway one with fsync on (``flower.testing.postgres``), unless ``--dsn`` names one
(a superuser's URL: a database is made and dropped on it).

Later (issue 18, point 8): the marginal supervised step and ``status`` against both.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from bench_store import make_entry, quantile

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


def report(rows: list[tuple], pace_ms: float) -> None:
    pace = f"0-{2 * pace_ms:g} ms apart" if pace_ms else "flat out"
    print(f"\nappend() of one 2 KB entry, writer processes {pace}, ms per call")
    head = f"{'writers':>7}  {'backend':<9}{'samples':>8}{'p50':>8}{'p99':>8}{'p99.9':>8}{'max':>8}"
    print(head + f"{'appends/s':>11}")
    by: dict[tuple[int, str], list[int]] = {}
    for writers, backend, r in rows:
        s = r["samples"]
        by[(writers, backend)] = s
        cells = [quantile(s, 0.5), quantile(s, 0.99), quantile(s, 0.999), s[-1] / 1e6]
        figures = "".join(f"{x:>8.2f}" for x in cells)
        print(f"{writers:>7}  {backend:<9}{len(s):>8}{figures}{r['rate']:>11.0f}")
    print("\np99 winner per row:")
    for writers in sorted({w for w, _, _ in rows}):
        p99 = {b: quantile(by[(writers, b)], 0.99) for b in BACKENDS if (writers, b) in by}
        best = min(p99, key=lambda b: p99[b])
        other = max(p99, key=lambda b: p99[b])
        print(f"  {writers:>2} writers: {best} ({p99[best]:.2f} ms vs {p99[other]:.2f} ms)")


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        backend, where, writer, count, pace = sys.argv[2:7]
        asyncio.run(worker(backend, where, int(writer), int(count), float(pace)))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writers", default="1,4,16,32")
    parser.add_argument("--pace-ms", type=float, default=4.0)
    parser.add_argument("--dsn", default="", help="a PostgreSQL superuser's URL to use")
    args = parser.parse_args()
    counts = [int(n) for n in args.writers.split(",")]
    from flower.testing.postgres import start_postgres

    server = None if args.dsn else start_postgres(durable=True)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-state-") as tmp:
            url = args.dsn or (server.dsn if server else "")
            rows = bench(url, Path(tmp), counts, args.pace_ms / 1000)
    finally:
        if server is not None:
            server.stop()
    report(rows, args.pace_ms)
    return 0


if __name__ == "__main__":
    sys.exit(main())
