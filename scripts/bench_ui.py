"""The web view's cost with many runs and long runs, side by side in one run.

Run: .venv/bin/python scripts/bench_ui.py [--runs 1000] [--rounds 5]

It builds run_dirs with flower's own writers (registry records, manifest rows, event logs;
no model call): one with ``--runs`` finished three-step runs, and one run each of 20, 40,
80 and 160 steps (one attempt per step, every fifth step killed and woken, as a long run
that was interrupted looks). Then it serves each with ``flower-super ui`` and measures,
over ``--rounds`` rounds (medians):

- server: the JSON the page asks for (``/api/runs``; ``/api/runs/<run>/timeline``), over
  HTTP on loopback;
- paint: headless Chromium (Debian's, through Playwright) from navigation to the page's
  first complete render (the app marks ``body[data-rendered]`` after it put the data in
  the DOM, then one animation frame is waited for).

Goals (issue 26): each under 1 s on this machine, and the timeline's cost growing no faster
than linearly from 20 to 160 steps (the per-step cost at 160 at most the one at 20 x 1.25,
a margin for fixed costs).
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from flower.state.eventlog import EventLog  # noqa: E402
from flower.state.manifest import Manifest  # noqa: E402
from flower.state.registry import FINISHED, FlowerRecord, Registry  # noqa: E402
from flower.state.result import Event, StepResult  # noqa: E402

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def record(run: str, ws: Path, started: float, steps: list[str], woke: int) -> FlowerRecord:
    return FlowerRecord(
        run=run,
        flow="bench",
        pid=0,
        pid_started=None,
        workspace=str(ws),
        started_at=started,
        steps=steps,
        state=FINISHED,
        woke=woke,
        ended_at=started + 10.0 * len(steps),
        command=["flower-super", "start", "--flow", "bench.py:flow"],
    )


def write_run(run_dir: Path, ws: Path, run: str, started: float, steps: list[str]) -> None:
    """One finished run: a record, a step event and a manifest row per step."""
    Registry(run_dir).write(record(run, ws, started, steps, 0))
    manifest = Manifest(run_dir, run)
    log = EventLog.open(run_dir, run)
    t = started
    for i, step in enumerate(steps):
        sid = f"00000000-0000-4000-8000-{abs(hash((run, step))) % 10**12:012d}"
        log.write(Event("step", step, payload={"step": step, "index": i, "total": len(steps)}))
        log.write(Event("tool_call", "ls", tool="Bash", payload={"step": step, "session_id": sid}))
        manifest.record(
            StepResult(step, sid, True, 0.01, 2, "done", None, t, t + 9.0, 1, [], False)
        )
        t += 10.0
    log.close()


def build_many(root: Path, n: int) -> Path:
    run_dir, ws = root / "many" / "runs", root / "many" / "ws"
    ws.mkdir(parents=True)
    base = time.time() - n * 60
    for i in range(n):
        write_run(run_dir, ws, f"20260101-{i:06d}-aaaaaa", base + 60 * i, ["a", "b", "c"])
    return run_dir


def build_long(root: Path, steps: int) -> tuple[Path, str]:
    """A run of ``steps`` steps whose every fifth step was killed and woken (two runs)."""
    run_dir, ws = root / f"long{steps}" / "runs", root / f"long{steps}" / "ws"
    ws.mkdir(parents=True)
    names = [f"step-{i:03d}" for i in range(steps)]
    start = time.time() - 20 * steps
    first, second = "20260102-000000-bbbbbb", "20260102-000001-cccccc"
    Registry(run_dir).write(record(first, ws, start, names, 0))
    rec = record(first, ws, start, names, 0)
    rec.state = "killed"
    Registry(run_dir).write(rec)
    manifest = Manifest(run_dir, first)
    log = EventLog.open(run_dir, first)
    t = start
    for i, step in enumerate(names[: steps // 2]):
        log.write(Event("step", step, payload={"step": step, "index": i, "total": steps}))
        manifest.record(StepResult(step, f"s-{i}", True, 0.01, 2, "", None, t, t + 9.0))
        t += 10.0
    log.close()
    Registry(run_dir).write(record(second, ws, t + 5, names, 1))
    manifest = Manifest(run_dir, second)
    log = EventLog.open(run_dir, second)
    t += 5
    for i, step in enumerate(names[steps // 2 :], start=steps // 2):
        log.write(Event("step", step, payload={"step": step, "index": i, "total": steps}))
        if i % 5 == 0:
            log.write(Event("retry", "again", payload={"step": step, "attempt": 2}))
        manifest.record(StepResult(step, f"s-{i}", True, 0.01, 2, "", None, t, t + 9.0))
        t += 10.0
    log.close()
    return run_dir, second


class Server:
    def __init__(self, run_dir: Path) -> None:
        ws = run_dir.parent / "ws"
        cmd = [sys.executable, "-m", "supervisor", "ui", "-r", str(run_dir), "-w", str(ws)]
        self.proc = subprocess.Popen(
            [*cmd, "--port", "0"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        found = re.search(r"(http://\S+)/\?token=(\S+)", line)
        if not found:
            raise SystemExit(f"flower-super ui printed no URL: {line!r}")
        self.base, self.token = found.group(1), found.group(2)

    def get_s(self, path: str) -> float:
        started = time.perf_counter()
        with urllib.request.urlopen(self.base + path, timeout=60) as res:
            res.read()
        return time.perf_counter() - started

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def paint_s(browser: object, server: Server, fragment: str) -> float:
    page = browser.new_page(viewport={"width": 1280, "height": 800})  # type: ignore[attr-defined]
    page.goto(f"{server.base}/?token={server.token}")
    page.wait_for_selector("body[data-rendered]")
    page.goto("about:blank")
    started = time.perf_counter()
    page.goto(f"{server.base}/{fragment}")
    page.wait_for_selector("body[data-rendered]", timeout=60_000)
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => r(0)))")
    took = time.perf_counter() - started
    page.close()
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    root = Path(tempfile.mkdtemp(prefix="flower-bench-ui-"))
    try:
        t0 = time.perf_counter()
        many = build_many(root, args.runs)
        longs = {n: build_long(root, n) for n in (20, 40, 80, 160)}
        print(
            f"built {args.runs} runs and runs of 20-160 steps in {time.perf_counter() - t0:.1f} s"
        )
        rows: list[tuple[str, float, float]] = []
        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=CHROMIUM,
                args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
            )
            server = Server(many)
            try:
                api = [server.get_s("/api/runs") for _ in range(args.rounds)]
                paint = [paint_s(browser, server, "") for _ in range(args.rounds)]
                rows.append(
                    (
                        f"runs page, {args.runs} runs",
                        statistics.median(api),
                        statistics.median(paint),
                    )
                )
            finally:
                server.stop()
            for n, (run_dir, run) in longs.items():
                server = Server(run_dir)
                try:
                    path = f"/api/runs/{run}/timeline"
                    api = [server.get_s(path) for _ in range(args.rounds)]
                    paint = [paint_s(browser, server, f"#/run/{run}") for _ in range(args.rounds)]
                    rows.append(
                        (f"timeline, {n} steps", statistics.median(api), statistics.median(paint))
                    )
                finally:
                    server.stop()
            browser.close()
        print(f"{'page':<26}{'server':>10}{'paint':>10}   (medians of {args.rounds} rounds)")
        for name, api_s, paint_s_ in rows:
            print(f"{name:<26}{api_s * 1000:>8.0f}ms{paint_s_ * 1000:>8.0f}ms")
        worst = max(max(a, p) for _, a, p in rows)
        t20 = next(p for name, _, p in rows if name == "timeline, 20 steps")
        t160 = next(p for name, _, p in rows if name == "timeline, 160 steps")
        s20 = next(a for name, a, _ in rows if name == "timeline, 20 steps")
        s160 = next(a for name, a, _ in rows if name == "timeline, 160 steps")
        growth_paint = (t160 / 160) / (t20 / 20)
        growth_server = (s160 / 160) / (s20 / 20)
        print(
            f"timeline per-step cost, 160 vs 20 steps: server {growth_server:.2f}x, "
            f"paint {growth_paint:.2f}x (linear or better: <= 1.25)"
        )
        ok = worst < 1.0 and growth_paint <= 1.25 and growth_server <= 1.25
        verdict = "PASS" if ok else "FAIL"
        print(f"bench_ui: {verdict} (every page under 1 s: {worst * 1000:.0f} ms at worst)")
        return 0 if ok else 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
