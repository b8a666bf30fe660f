"""Benchmark the ``glob!:`` fingerprint against hashing the same files in a plain loop.

    .venv/bin/python scripts/bench_memo_glob.py [--files 10000] [--rounds 9]

Builds ``--files`` small files (100 to 4,000 bytes, 100 directories of 100) in a temp dir,
then times, interleaved round by round so both see the same machine load and page cache:

- ``resolve("glob!:**/*", ws)``: list the tree, hash every file, digest the sorted list;
- ``plain``: ``hashlib.sha256(path.read_bytes()).hexdigest()`` over the same files, whose
  list is built before the clock starts (the fingerprint lists the tree inside its time).

Prints each round, the medians and their ratio; issue 11's goal is a ratio of 1.5 or less.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from flower.cache.fingerprint import resolve

GOAL = 1.5


def build(ws: Path, n: int) -> list[Path]:
    rng = random.Random(4)
    per_dir = 100
    files = []
    for i in range(n):
        d = ws / f"d{i // per_dir:03d}"
        if i % per_dir == 0:
            d.mkdir()
        p = d / f"f{i:05d}.txt"
        p.write_bytes(rng.randbytes(rng.randint(100, 4000)))
        files.append(p)
    return sorted(files)


def plain(files: list[Path]) -> int:
    return len([hashlib.sha256(p.read_bytes()).hexdigest() for p in files])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-memo-glob-") as tmp:
        ws = Path(tmp)
        files = build(ws, args.files)
        value = resolve("glob!:**/*", ws)  # warm the page cache and the dentries
        plain(files)
        if not value.startswith(f"{args.files} files "):
            print(f"unexpected value: {value}", file=sys.stderr)
            return 1
        times: dict[str, list[float]] = {"glob!": [], "plain": []}
        for r in range(args.rounds):
            order = ["glob!", "plain"] if r % 2 == 0 else ["plain", "glob!"]
            for name in order:
                t0 = time.perf_counter()
                if name == "glob!":
                    resolve("glob!:**/*", ws)
                else:
                    plain(files)
                times[name].append(time.perf_counter() - t0)
            print(
                f"round {r + 1}: glob! {times['glob!'][-1] * 1e3:7.1f} ms   "
                f"plain {times['plain'][-1] * 1e3:7.1f} ms"
            )
    g = statistics.median(times["glob!"])
    p = statistics.median(times["plain"])
    py = sys.version.split()[0]
    print(f"files {args.files}, rounds {args.rounds}, python {py}, cpus {os.cpu_count()}")
    print(f"median glob!:**/*  {g * 1e3:7.1f} ms  ({g / args.files * 1e6:.1f} us/file)")
    print(f"median plain loop  {p * 1e3:7.1f} ms  ({p / args.files * 1e6:.1f} us/file)")
    ratio = g / p
    print(f"ratio {ratio:.2f} (goal <= {GOAL}): {'ok' if ratio <= GOAL else 'OVER'}")
    return 0 if ratio <= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
