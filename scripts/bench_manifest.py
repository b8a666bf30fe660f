"""Cost of one manifest row write as history grows: flower's Manifest vs a naive rewrite.

Run: .venv/bin/python scripts/bench_manifest.py [--writes K] [--sizes 100,1000,10000]

For each history size N, a run_dir is pre-filled with N rows of another run (~1 KB each,
with text), then one writer records K rows and each write is timed; the table shows the
median. "naive" is the plain approach: under the same file lock, read the whole array,
replace this run's rows, and rewrite it through a temp file + fsync + atomic replace.
The Manifest's first write (its one full validation of the file) is shown apart;
"obj/write" is the same Manifest used as Runtime uses it, a new object for every write.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from filelock import FileLock

from flower.state.manifest import MANIFEST_NAME, Manifest, manifest_row
from flower.state.result import StepResult
from flower.util.fsutil import atomic_write_text, private_dir

_TEXT = (
    "改好了:把 md 转 html 的脚本加上了代码块高亮,用的是 pygments;"
    "跑了 tests/test_render.py 全部通过。Changed render.py to wrap fenced blocks, "
    "added a CSS file for the highlight theme and a regression test for nested lists. "
)


def sample_result(i: int) -> StepResult:
    """A realistic row: about 1 KB of JSON once serialised."""
    now = time.time()
    return StepResult(
        step=f"干活#retry{i % 3}" if i % 3 else "干活",
        session_id=str(uuid.uuid4()),
        ok=i % 5 != 0,
        cost_usd=0.4123 + i / 1000,
        num_turns=12 + i % 7,
        text=(_TEXT * 3)[: 560 + i % 40],
        error=None if i % 5 else "API Error: 529 overloaded_error",
        started_at=now - 200.0,
        ended_at=now,
        attempts=1 + i % 2,
        errors=["API Error: Connection refused"] * (i % 2),
        resumed=bool(i % 2),
        retired=[],
        context=80_213 + i,
    )


def prefill(run_dir: Path, n: int) -> None:
    """n rows of run "other" in the one-row-per-line layout (also valid for the naive writer)."""
    private_dir(run_dir)
    lines = [
        json.dumps(manifest_row(sample_result(i), "20250101-000000-aaaaaa"), ensure_ascii=False)
        for i in range(n)
    ]
    body = "[\n" + ",\n".join(lines) + "\n]\n" if lines else "[\n]\n"
    (run_dir / MANIFEST_NAME).write_text(body, encoding="utf-8")


class NaiveManifest:
    """Re-read the whole array, replace our rows, rewrite atomically: O(history) per write."""

    def __init__(self, run_dir: Path, run_id: str) -> None:
        self.path = run_dir / MANIFEST_NAME
        self.run_id = run_id
        self.mine: list[dict[str, Any]] = []
        self.lock = FileLock(run_dir / f"{MANIFEST_NAME}.lock", poll_interval=0.002)

    def record(self, result: StepResult) -> None:
        self.mine.append(manifest_row(result, self.run_id))
        with self.lock:
            rows = json.loads(self.path.read_text(encoding="utf-8"))
            rows = [r for r in rows if r.get("run") != self.run_id] + self.mine
            atomic_write_text(self.path, json.dumps(rows, ensure_ascii=False))


class PerWriteManifest:
    """How Runtime uses it: a new Manifest object for every write (same run id)."""

    def __init__(self, run_dir: Path, run_id: str) -> None:
        self.run_dir, self.run_id = run_dir, run_id

    def record(self, result: StepResult) -> None:
        Manifest(self.run_dir, self.run_id).record(result)


def time_writes(writer: Any, writes: int) -> tuple[float, list[float]]:
    """(first write in ms, the following writes in ms)."""
    costs = []
    for i in range(writes + 1):
        result = sample_result(10_000 + i)
        t0 = time.perf_counter()
        writer.record(result)
        costs.append((time.perf_counter() - t0) * 1000)
    return costs[0], costs[1:]


def bench(n: int, writes: int, naive_writes: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-manifest-") as tmp:
        ours_dir, per_dir, naive_dir = Path(tmp, "ours"), Path(tmp, "per"), Path(tmp, "naive")
        for d in (ours_dir, per_dir, naive_dir):
            prefill(d, n)
        first, ours = time_writes(Manifest(ours_dir, "20250102-000000-bbbbbb"), writes)
        _, per = time_writes(PerWriteManifest(per_dir, "20250102-000000-bbbbbb"), writes)
        _, naive = time_writes(NaiveManifest(naive_dir, "20250102-000000-bbbbbb"), naive_writes)
        size_kb = (ours_dir / MANIFEST_NAME).stat().st_size / 1024
        return {
            "rows": n,
            "row_bytes": size_kb * 1024 / (n + writes + 1),
            "first": first,
            "ours": statistics.median(ours),
            "ours_p90": statistics.quantiles(ours, n=10)[-1],
            "per": statistics.median(per),
            "naive": statistics.median(naive),
        }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--writes", type=int, default=200, help="timed writes per size (Manifest)")
    ap.add_argument("--naive-writes", type=int, default=30, help="timed writes per size (naive)")
    ap.add_argument("--sizes", default="100,1000,10000")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    results = [bench(n, args.writes, args.naive_writes) for n in sizes]
    print(f"one row write, median ms (rows ~{results[-1]['row_bytes']:.0f} B, fsync on)")
    print(
        f"{'rows present':>12} | {'Manifest':>9} | {'p90':>7} | {'obj/write':>9} | "
        f"{'1st write':>9} | {'naive':>9}"
    )
    for r in results:
        print(
            f"{r['rows']:>12,} | {r['ours']:>9.3f} | {r['ours_p90']:>7.3f} | {r['per']:>9.3f} | "
            f"{r['first']:>9.2f} | {r['naive']:>9.2f}"
        )
    lo, hi = results[0], results[-1]
    print(
        f"ratio {hi['rows']:,}/{lo['rows']:,}: Manifest {hi['ours'] / lo['ours']:.2f}x, "
        f"naive {hi['naive'] / lo['naive']:.1f}x (goal for Manifest: <= 3x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
