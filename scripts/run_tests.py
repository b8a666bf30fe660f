"""Run the test suite as a few pytest processes side by side (stdlib only).

Most of the end-to-end tests wait: on a model server's scripted delay, on a backoff, on a
CLI starting up. Run one after another they take most of the suite's time with the CPU idle,
so the unit tests go as one job and every end-to-end file as a job of its own, the longest
first, ``FLOWER_TEST_WORKERS`` (default: one more than the CPU count, at most 4) at a
time: measured on the 2-core CI machine, an end-to-end file keeps about 60% of one core busy
(test_e2e_kill.py: 67 s of CPU in 114 s), so two jobs left a third of the machine idle.
Each job gets its own ``--basetemp`` and ``TMPDIR``, so tests that look at the temporary
directory (the SDK's ``claude-resume-*`` copies) see only their own.

Every job's output is printed whole when it fails; the last line sums the jobs up. Exit
status: 0 when every job passed, else 1 (2: a file named that is not in tests/).

    python scripts/run_tests.py              # the whole suite
    FLOWER_TEST_WORKERS=1 python scripts/run_tests.py
    python scripts/run_tests.py --drills     # the kill drills only, each file a job
    python scripts/run_tests.py tests/test_ipc.py tests/test_e2e_kill.py   # these, each a job
    python scripts/run_tests.py --drills --report run.json   # and what ran, as JSON

``bash scripts/test.sh --latest`` runs ``--drills`` against the newest releases of the
dependencies (scripts/pins.py turns its ``--report`` into the verdict).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"

# Roughly how long each slow file takes alone (seconds, measured on the 2-core CI machine):
# only the order matters, longest first, so a long file never starts last.
WEIGHT = {
    "test_e2e_ledger.py": 490,  # 48 kills, half with every core busy (measured alone, issue 17)
    "test_e2e_attempts.py": 195,
    "test_e2e_resilience.py": 110,
    "test_e2e_damaged.py": 72,
    "test_e2e_memo.py": 60,
    "test_e2e_prepare.py": 55,
    "test_e2e_flower.py": 53,
    "test_e2e_kill.py": 100,  # every drill twice: local state, then FLOWER_STATE on PostgreSQL
    "test_e2e_starter.py": 44,
    "test_e2e_resume_line.py": 60,  # five kill -9s, two on PostgreSQL, each carried on
    "test_e2e_unstored.py": 105,  # kills before the prompt is stored, both backends
    "test_e2e_roles.py": 35,
    "test_e2e_cli.py": 27,
    "test_e2e_handoff.py": 19,
    "test_e2e_share.py": 18,
    "test_e2e_ctrlc.py": 15,
    "test_e2e_ui.py": 110,  # a real browser on real runs, both backends, and a cluster
    # PostgreSQL: a database per test (CREATE DATABASE), a server of their own (outage)
    "test_pg_outage.py": 40,
    "test_chaos.py": 150,  # a seeded campaign of 8 faults over both backends (scripts/chaos.py)
    # both backends; a server of its own stopped per kind of write; ~40 children killed
    "test_state_conformance.py": 60,
    "test_e2e_pg_outage.py": 80,  # 10 s outage mid-step; a session begun in an outage, kill -9 x2
    "test_pg_store.py": 30,
    "test_pg_rows.py": 20,
    "test_pg_server.py": 15,
    # Temporal: worker processes killed, frozen, stopped; heartbeat timeouts waited out
    "test_temporal_facts.py": 70,
    # Cluster drills: flower-super workers on Temporal, PostgreSQL state, real CLI turns
    "test_e2e_cluster.py": 240,
    "test_temporal_server.py": 20,
    # a whole local cluster (flower-super cluster up: Temporal, PostgreSQL, 2 workers) twice
    "test_e2e_readme_cluster.py": 45,
    "test_e2e_cluster_people.py": 35,
    # the front door: refused placements (seconds each), a flow after one, a local cluster
    # from a clone's directory (restart, scale, down), a failed cluster up
    "test_e2e_front_door.py": 90,
    # nginx as a TLS proxy (mTLS, API key) in front of the dev server: two flows, four refusals
    "test_e2e_temporal_tls.py": 35,
}
DEFAULT_E2E_WEIGHT = 20
# The kill drills: every test file that kill -9s something (a flower, a step child, a worker, a
# writer) and every cluster drill. Found by name, so a new drill file is in without a list to
# keep: what `bash scripts/test.sh --latest` runs against the newest releases.
DRILL_TEXT = re.compile(r"kill_?9")
# An end-to-end file that kills a process with Popen.kill() is a drill too.
E2E_KILL = re.compile(r"\.kill\(\)|SIGKILL")
# pytest's last line: "3 passed, 1 skipped in 4.20s" (-q) or "=== 1 failed, 2 passed in … ===".
SUMMARY = re.compile(
    r"^(?:=+ )?(\d+ (?:passed|failed|errors?|skipped|deselected)[^\n]*?) in [0-9.]+s", re.M
)


@dataclass
class Job:
    name: str
    files: list[str]
    weight: int
    code: int | None = None
    seconds: float = 0.0
    output: str = ""
    summary: str = ""
    tmp: Path = field(default_factory=Path)


def jobs() -> list[Job]:
    files = sorted(p.name for p in TESTS.glob("test_*.py"))
    slow = [f for f in files if f.startswith("test_e2e_") or f in WEIGHT]
    unit = [f for f in files if f not in slow]
    out = [Job(f, [f], WEIGHT.get(f, DEFAULT_E2E_WEIGHT)) for f in slow]
    out.append(Job("unit tests", unit, 90))
    return sorted(out, key=lambda j: -j.weight)


def drills() -> list[str]:
    return sorted(
        p.name
        for p in TESTS.glob("test_*.py")
        if "cluster" in p.name
        or DRILL_TEXT.search(text := p.read_text(encoding="utf-8"))
        or (p.name.startswith("test_e2e_") and E2E_KILL.search(text))
    )


def chosen(files: list[str]) -> list[Job]:
    """Each of ``files`` (a name in tests/, or its path) as a job of its own, longest first."""
    out = []
    for f in files:
        name = Path(f).name
        if not (TESTS / name).is_file():
            raise SystemExit(f"run_tests.py: no test file {f} in {TESTS}")
        if name not in [j.name for j in out]:
            out.append(Job(name, [name], WEIGHT.get(name, DEFAULT_E2E_WEIGHT)))
    return sorted(out, key=lambda j: -j.weight)


def run(job: Job, base: Path) -> None:
    job.tmp = base / re.sub(r"\W+", "-", job.name)
    (job.tmp / "tmp").mkdir(parents=True)
    env = {**os.environ, "TMPDIR": str(job.tmp / "tmp")}
    began = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--basetemp={job.tmp / 'pytest'}",
            *[str(TESTS / f) for f in job.files],
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    job.seconds = time.monotonic() - began
    job.code = done.returncode
    job.output = done.stdout.decode("utf-8", "replace")
    found = SUMMARY.findall(job.output)
    job.summary = found[-1] if found else f"exit status {job.code}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the test suite as parallel pytest jobs.")
    parser.add_argument("files", nargs="*", help="only these test files, each a job")
    parser.add_argument("--drills", action="store_true", help="only the kill drills")
    parser.add_argument("--report", type=Path, help="write what ran and how it went (JSON)")
    args = parser.parse_args(argv)
    workers = int(os.environ.get("FLOWER_TEST_WORKERS") or min(4, (os.cpu_count() or 1) + 1))
    all_drills = drills()
    picked = args.files + (all_drills if args.drills else [])
    todo = chosen(picked) if picked else jobs()
    queue = list(todo)
    lock = threading.Lock()
    base = Path(tempfile.mkdtemp(prefix="flower-tests-"))
    began = time.monotonic()
    print(f"{len(todo)} jobs, {workers} at a time (temporary files under {base})", flush=True)

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                job = queue.pop(0)
            run(job, base)
            with lock:
                mark = "ok  " if job.code == 0 else "FAIL"
                print(f"{mark} {job.name:<28} {job.seconds:6.1f}s  {job.summary}", flush=True)
                if job.code != 0:
                    print(job.output, flush=True)

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    failed = [j for j in todo if j.code != 0]
    total = time.monotonic() - began
    counts: dict[str, int] = {}
    for j in todo:
        for n, what in re.findall(r"(\d+) (passed|failed|errors?|skipped)", j.summary):
            counts[what] = counts.get(what, 0) + int(n)
    tally = ", ".join(f"{n} {what}" for what, n in counts.items())
    print(f"== {tally} in {total:.0f}s wall, {sum(j.seconds for j in todo):.0f}s of jobs")
    if failed:
        print("== failed: " + ", ".join(j.name for j in failed))
    else:
        shutil.rmtree(base, ignore_errors=True)
    if args.report:
        ran = sorted(f for j in todo for f in j.files)
        report = {
            "files": ran,
            "drills": ran == all_drills,
            "counts": counts,
            "failed": [j.name for j in failed],
            "jobs": [
                {
                    "name": j.name,
                    "code": j.code,
                    "seconds": round(j.seconds, 1),
                    "summary": j.summary,
                }
                for j in todo
            ],
        }
        args.report.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
