"""Benchmark SqliteSessionStore: append latency under contention, and load() speed.

    .venv/bin/python scripts/bench_store.py [--appends 2000] [--load-entries 20000]

1. ``append`` of one 2 KB entry, timed per call inside real writer processes (started with
   ``sys.executable``, released together through a barrier), each writer on its own session
   as step children are. Scenarios: 1 writer flat out; 4 writers flat out (the write lock is
   saturated); 4 writers pausing 0-8 ms between appends (busy but not saturated, closer to
   eager mirroring of four live steps). Variants, same run, same machine:
   - ``flower``: the store as shipped (no SQLite busy handler, own jittered retries),
   - ``sqlite-default``: the same store with SQLite's default busy handler (``timeout=5``),
   - ``flower FULL``: as shipped but ``synchronous=FULL`` (what the NORMAL choice saves).
   "loop stall" is the longest a 1 ms timer in the writer's event loop fired late: the
   default handler sleeps inside SQLite, so its waits stall everything else on the loop.
2. ``load()`` of one 20,000-entry transcript against ``json.loads`` of the same entries read
   from a JSONL file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from flower.state.sqlite import SqliteSessionStore

ENTRY_BYTES = 2048


class DefaultBusyHandlerStore(SqliteSessionStore):
    """The same store with SQLite's default busy handler doing the waiting."""

    _busy_timeout_s = 5.0


class FullSyncStore(SqliteSessionStore):
    """The same store with an fsync at every commit."""

    _synchronous = "FULL"


VARIANTS = {
    "flower": SqliteSessionStore,
    "sqlite-default": DefaultBusyHandlerStore,
    "flower FULL": FullSyncStore,
}


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


async def worker(db: str, variant: str, writer: int, count: int, pace_s: float) -> None:
    store = VARIANTS[variant](db)
    session_id = f"bench-{writer}"
    key = {"project_key": "bench", "session_id": session_id}
    entries = [make_entry(session_id, i, None) for i in range(count)]
    stall = [0.0]
    running = True

    async def ticker() -> None:  # how late does a 1 ms timer fire while we append?
        while running:
            t0 = time.perf_counter()
            await asyncio.sleep(0.001)
            stall[0] = max(stall[0], time.perf_counter() - t0 - 0.001)

    print("ready", flush=True)
    sys.stdin.readline()  # the barrier: every writer starts on the same "go"
    tick = asyncio.create_task(ticker())
    samples = []
    for entry in entries:
        t0 = time.perf_counter_ns()
        await store.append(key, [entry])
        samples.append(time.perf_counter_ns() - t0)
        await asyncio.sleep(random.uniform(0, 2 * pace_s) if pace_s else 0)
    running = False
    await tick
    store.close()
    print(json.dumps({"samples": samples, "stall": stall[0]}), flush=True)


# ---- parent --------------------------------------------------------------------------


def run_writers(db: Path, variant: str, writers: int, count: int, pace_s: float) -> dict:
    cmd = [sys.executable, __file__, "--worker", str(db), variant]
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
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError("a writer died before the barrier")
        t0 = time.perf_counter()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        samples, stall = [], 0.0
        for p in procs:
            out = json.loads(p.stdout.readline())
            samples += out["samples"]
            stall = max(stall, out["stall"])
            if p.wait(timeout=600) != 0:
                raise RuntimeError(f"writer exited {p.returncode}")
        wall = time.perf_counter() - t0
        return {"samples": sorted(samples), "stall_ms": stall * 1000, "rate": len(samples) / wall}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def quantile(sorted_ns: list[int], q: float) -> float:
    return sorted_ns[min(len(sorted_ns) - 1, int(q * len(sorted_ns)))] / 1e6


def bench_appends(tmp: Path, count: int) -> list[tuple[str, str, dict]]:
    scenarios = [
        ("1 writer, flat out", 1, 2 * count, 0.0),
        ("4 writers, flat out", 4, count, 0.0),
        ("4 writers, 0-8 ms apart", 4, count // 2, 0.004),
    ]
    rows = []
    for n, (label, writers, per_writer, pace) in enumerate(scenarios):
        for variant in VARIANTS:
            db = tmp / f"append-{n}-{variant.replace(' ', '-')}.db"
            rows.append((label, variant, run_writers(db, variant, writers, per_writer, pace)))
            print(f"  done: {label}, {variant}", file=sys.stderr, flush=True)
    return rows


async def fill(store: SqliteSessionStore, key: dict, entries: list[dict]) -> None:
    for i in range(0, len(entries), 500):
        await store.append(key, entries[i : i + 500])


def median_ms(fn, repeat: int = 5) -> float:
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
    store_ms = median_ms(lambda: asyncio.run(store.load(key)))
    jsonl_ms = median_ms(from_jsonl)
    store.close()
    return store_ms, jsonl_ms, jsonl.stat().st_size


def report(rows: list[tuple[str, str, dict]], load: tuple[float, float, int], n: int) -> None:
    print(f"\nappend() of one {ENTRY_BYTES // 1024} KB entry, ms per call")
    head = f"{'scenario':<25}{'variant':<16}{'samples':>8}{'p50':>7}{'p99':>8}{'p99.9':>8}"
    print(head + f"{'max':>8}{'loop stall':>11}{'appends/s':>10}")
    cells = {}
    for label, variant, r in rows:
        s = r["samples"]
        cells[(label, variant)] = (quantile(s, 0.5), quantile(s, 0.99), s[-1] / 1e6)
        print(
            f"{label:<25}{variant:<16}{len(s):>8}{quantile(s, 0.5):>7.2f}"
            f"{quantile(s, 0.99):>8.2f}{quantile(s, 0.999):>8.2f}{s[-1] / 1e6:>8.1f}"
            f"{r['stall_ms']:>11.1f}{r['rate']:>10.0f}"
        )
    print("\nsqlite-default / flower (above 1 = flower is faster)")
    for label in dict.fromkeys(label for label, _, _ in rows):
        f, d = cells[(label, "flower")], cells[(label, "sqlite-default")]
        print(
            f"  {label:<25} p50 x{d[0] / f[0]:.2f}   p99 x{d[1] / f[1]:.2f}"
            f"   max x{d[2] / f[2]:.2f}"
        )
    store_ms, jsonl_ms, size = load
    print(f"\nload() of a {n:,}-entry transcript ({size / 1e6:.1f} MB of JSON), median of 5")
    print(f"  SqliteSessionStore.load()       {store_ms:8.1f} ms")
    print(f"  json.loads per line of a JSONL  {jsonl_ms:8.1f} ms")
    print(f"  ratio store / jsonl             {store_ms / jsonl_ms:8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--appends", type=int, default=2000, help="per writer, 4 writers")
    parser.add_argument("--load-entries", type=int, default=20000)
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        db, variant, writer, count, pace = args.worker
        asyncio.run(worker(db, variant, int(writer), int(count), float(pace)))
        return
    load_avg = os.getloadavg()[0]
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, load {load_avg:.1f}")
    with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp:
        rows = bench_appends(Path(tmp), args.appends)
        load = bench_load(Path(tmp), args.load_entries)
    report(rows, load, args.load_entries)


if __name__ == "__main__":
    main()
