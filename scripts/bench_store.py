"""Benchmark SqliteSessionStore: append latency under contention, and load() speed.

    .venv/bin/python scripts/bench_store.py [--appends 2000] [--load-entries 20000]

1. ``append`` of one 2 KB entry, timed per call in real writer processes (started with
   ``sys.executable``, released together through a barrier), 1 writer and 4 concurrent
   writers, each writer on its own session as step children are. Two variants side by side:
   flower's own busy retries (no SQLite busy handler) and SQLite's default busy handler
   (``timeout=5``, the usual ``sqlite3.connect`` setting).
2. ``load()`` of one 20,000-entry transcript against ``json.loads`` of the same entries read
   from a JSONL file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from flower.stores.sqlite import SqliteSessionStore

ENTRY_BYTES = 2048


class DefaultBusyHandlerStore(SqliteSessionStore):
    """The same store with SQLite's default busy handler doing the waiting."""

    _busy_timeout_s = 5.0


VARIANTS = {"flower": SqliteSessionStore, "sqlite-default": DefaultBusyHandlerStore}


def make_entry(session_id: str, n: int, parent: str | None) -> dict:
    """A transcript-shaped entry of about ENTRY_BYTES bytes of JSON."""
    entry = {
        "type": "assistant",
        "uuid": str(uuid.uuid4()),
        "parentUuid": parent,
        "sessionId": session_id,
        "timestamp": "2026-01-01T00:00:00.000Z",
        "cwd": "/work/demo",
        "message": {"role": "assistant", "content": [{"type": "text", "text": ""}]},
    }
    pad = ENTRY_BYTES - len(json.dumps(entry, separators=(",", ":")))
    entry["message"]["content"][0]["text"] = (f"line {n} " * ENTRY_BYTES)[: max(pad, 0)]
    return entry


# ---- worker process ------------------------------------------------------------------


async def worker(db: str, variant: str, writer: int, count: int) -> None:
    store = VARIANTS[variant](db)
    session_id = f"bench-{writer}"
    key = {"project_key": "bench", "session_id": session_id}
    entries = [make_entry(session_id, i, None) for i in range(count)]
    print("ready", flush=True)
    sys.stdin.readline()  # the barrier: every writer starts on the same "go"
    samples = []
    for entry in entries:
        t0 = time.perf_counter_ns()
        await store.append(key, [entry])
        samples.append(time.perf_counter_ns() - t0)
    store.close()
    print(json.dumps(samples), flush=True)


# ---- parent --------------------------------------------------------------------------


def run_writers(db: Path, variant: str, writers: int, count: int) -> list[int]:
    cmd = [sys.executable, __file__, "--worker", str(db), variant]
    procs = [
        subprocess.Popen(
            [*cmd, str(w), str(count)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for w in range(writers)
    ]
    try:
        for p in procs:
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError("a writer died before the barrier")
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        samples: list[int] = []
        for p in procs:
            samples += json.loads(p.stdout.readline())
            if p.wait(timeout=600) != 0:
                raise RuntimeError(f"writer exited {p.returncode}")
        return samples
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def quantile(sorted_ns: list[int], q: float) -> float:
    return sorted_ns[min(len(sorted_ns) - 1, int(q * len(sorted_ns)))] / 1e6


def bench_appends(tmp: Path, count: int) -> list[tuple]:
    rows = []
    for writers in (1, 4):
        for variant in VARIANTS:
            db = tmp / f"append-{variant}-{writers}.db"
            per_writer = count * 2 if writers == 1 else count
            t0 = time.perf_counter()
            samples = sorted(run_writers(db, variant, writers, per_writer))
            wall = time.perf_counter() - t0
            rows.append((writers, variant, samples, wall))
    return rows


async def fill(store: SqliteSessionStore, key: dict, entries: list[dict]) -> None:
    for i in range(0, len(entries), 500):
        await store.append(key, entries[i : i + 500])


def best_of(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def bench_load(tmp: Path, n: int) -> tuple[float, float, int]:
    key = {"project_key": "bench", "session_id": "long"}
    entries, parent = [], None
    for i in range(n):
        entries.append(make_entry("long", i, parent))
        parent = entries[-1]["uuid"]
    store = SqliteSessionStore(tmp / "load.db")
    asyncio.run(fill(store, key, entries))
    jsonl = tmp / "long.jsonl"
    jsonl.write_text("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in entries))

    def from_jsonl() -> list:
        return [json.loads(line) for line in jsonl.read_text().splitlines()]

    assert asyncio.run(store.load(key)) == from_jsonl() == entries
    store_ms = best_of(lambda: asyncio.run(store.load(key)))
    jsonl_ms = best_of(from_jsonl)
    store.close()
    return store_ms, jsonl_ms, jsonl.stat().st_size


def report(rows: list[tuple], load: tuple[float, float, int], n_load: int) -> None:
    print(f"\nappend() of one {ENTRY_BYTES // 1024} KB entry, synchronous=FULL (ms per call)")
    print(f"{'writers':>7}  {'busy handling':<22}{'samples':>8}{'p50':>8}{'p99':>8}"
          f"{'p99.9':>8}{'max':>9}{'appends/s':>11}")
    by = {}
    for writers, variant, samples, wall in rows:
        label = "flower retries" if variant == "flower" else "sqlite default (5 s)"
        p50, p99 = quantile(samples, 0.5), quantile(samples, 0.99)
        by[(writers, variant)] = (p50, p99)
        print(f"{writers:>7}  {label:<22}{len(samples):>8}{p50:>8.2f}{p99:>8.2f}"
              f"{quantile(samples, 0.999):>8.2f}{samples[-1] / 1e6:>9.1f}"
              f"{len(samples) / wall:>11.0f}")
    for writers in (1, 4):
        (f50, f99), (d50, d99) = by[(writers, "flower")], by[(writers, "sqlite-default")]
        print(f"  {writers} writer(s): sqlite-default / flower = p50 x{d50 / f50:.2f},"
              f" p99 x{d99 / f99:.2f}")
    store_ms, jsonl_ms, size = load
    print(f"\nload() of a {n_load:,}-entry transcript ({size / 1e6:.1f} MB of JSON), median of 5")
    print(f"  SqliteSessionStore.load()       {store_ms:8.1f} ms")
    print(f"  json.loads per line of a JSONL  {jsonl_ms:8.1f} ms")
    print(f"  ratio store / jsonl             {store_ms / jsonl_ms:8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--appends", type=int, default=2000, help="appends per writer with 4")
    parser.add_argument("--load-entries", type=int, default=20000)
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        db, variant, writer, count = args.worker
        asyncio.run(worker(db, variant, int(writer), int(count)))
        return
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp:
        rows = bench_appends(Path(tmp), args.appends)
        load = bench_load(Path(tmp), args.load_entries)
    report(rows, load, args.load_entries)


if __name__ == "__main__":
    main()
