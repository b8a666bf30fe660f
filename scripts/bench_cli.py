"""Start-up cost of the commands where nothing runs, each measured beside ``python -c pass``.

Run: .venv/bin/python scripts/bench_cli.py [--rounds 15] [--seed N] [--why 6]

The goal (issue): ``flower --help`` and ``flower-super --help/status/show/logs/cancel`` never
import claude_agent_sdk and each takes at most 3x as long as ``python -c pass`` with the same
interpreter. The machine is shared and noisy, so only ratios are judged: every round runs
every command once, in a shuffled order, so a burst of load falls on all of them alike, and
the table gives medians over the rounds.

The run_dir the commands look at is built here without any model call: a workspace with a
``runs/`` holding two registry records (one finished run, one whose process died mid-step,
so status shows a resume command), lineage.json, manifest rows of both runs, a sessions.db
with their sessions, their event logs (what ``logs`` reads) and step log files. Commands
the CLI does not have yet are listed as "missing". A command's exit status is shown
(status exits 3 for a dead unfinished run, cancel 2 for an unknown run: both expected).

Whether a command imports the SDK is seen in an untimed run with ``-X importtime`` (after
one that wrote the bytecode). ``--why N`` prints each command's N heaviest imports there.

Bytecode: the children run without PYTHONDONTWRITEBYTECODE and with a private
PYTHONPYCACHEPREFIX, and the untimed runs write the .pyc files first, so a source file
edited since its last .pyc is not recompiled in every timed run (an installed flower has
its bytecode too) and nothing is written into the repository.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flower.state.eventlog import EventLog
from flower.state.lineage import Lineage
from flower.state.manifest import Manifest
from flower.state.registry import FINISHED, RUNNING, FlowerRecord, Registry, process_started
from flower.state.result import Event, StepResult

ROOT = Path(__file__).resolve().parents[1]
GOAL = 3.0
SDK = "claude_agent_sdk"
# Loaded by the SDK or by what runs a step; a light command has no use for them either.
HEAVY = (SDK, "anyio", "flower.state.sqlite")
STEPS = ("确认需求", "设定目标", "干活")
MISSING = -1  # exit status stand-in: the console script or subcommand does not exist


@dataclass
class Command:
    name: str
    argv: list[str]
    times_ms: list[float] = field(default_factory=list)
    exit: int | None = None
    imported: set[str] = field(default_factory=set)
    heaviest: list[tuple[int, str]] = field(default_factory=list)  # (cumulative us, module)

    @property
    def missing(self) -> bool:
        return self.exit == MISSING


def bin_dir() -> Path:
    """The venv whose console scripts are measured: this repo's, else this interpreter's."""
    venv = ROOT / ".venv" / "bin"
    return venv if (venv / "python").exists() else Path(sys.executable).parent


def commands(bindir: Path, run_dir: Path) -> list[Command]:
    fs, r = str(bindir / "flower-super"), ["-r", str(run_dir)]
    return [
        Command("python -c pass", [str(bindir / "python"), "-c", "pass"]),
        Command("flower --help", [str(bindir / "flower"), "--help"]),
        Command("flower-super --help", [fs, "--help"]),
        Command("flower-super status", [fs, "status", *r]),
        Command("flower-super show", [fs, "show", *r]),
        Command("flower-super logs", [fs, "logs", *r]),
        Command("flower-super cancel", [fs, "cancel", "no-such-run", *r]),
    ]


# -- the run_dir -----------------------------------------------------------------------


def build_run_dir(workspace: Path) -> Path:
    """A run_dir as two real runs leave it, written with flower's own writers."""
    run_dir = workspace / "runs"
    now = time.time()
    sessions = {step: str(uuid.uuid4()) for step in STEPS}
    finished = _record("20260101-090000-a1b2c3", workspace, now - 7200, FINISHED)
    finished.ended_at, finished.attempt, finished.woke, finished.exit_code = now - 5400, 1, 1, 0
    died = _record("20260101-110000-d4e5f6", workspace, now - 600, RUNNING)
    for rec in (finished, died):
        rec.pid, rec.pid_started = _dead_pid()
    died.step, died.session_id, died.attempt, died.woke = "干活#round2", sessions["干活"], 2, 2
    registry = Registry(run_dir)
    for rec in (finished, died):
        registry.write(rec)
    lineage = Lineage(run_dir / "lineage.json", workspace, woke=2)
    for step, sid in sessions.items():
        lineage.remember(step, sid)
    for rec, steps in ((finished, STEPS), (died, ("干活#round2",))):
        manifest = Manifest(run_dir, rec.run)
        events = EventLog.open(run_dir, rec.run)
        for i, step in enumerate(steps):
            manifest.record(_result(step, sessions[step.split("#")[0]], rec.started_at + 300 * i))
            for ev in _events(step):
                events.write(ev)
            (run_dir / "logs" / rec.run / f"{step}.log").write_text(
                f"{step}: attempt 1\n" * 40, encoding="utf-8"
            )
        events.close()
    asyncio.run(_store_sessions(run_dir / "sessions.db", workspace, sessions.values()))
    return run_dir


def _record(run: str, workspace: Path, started: float, state: str) -> FlowerRecord:
    return FlowerRecord(
        run=run,
        flow="starter",
        pid=0,  # set by the caller
        pid_started=None,
        workspace=str(workspace),
        started_at=started,
        command=["flower-super", "start", "-r", str(workspace / "runs"), "-w", str(workspace)],
        cwd=str(workspace),
        steps=list(STEPS),
        state=state,
        updated_at=started + 60,
    )


def _dead_pid() -> tuple[int, float | None]:
    """The pid and start time of a process that has exited (the flower that died)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2)"])
    started = process_started(proc.pid)
    proc.wait()
    return proc.pid, started


def _events(step: str) -> list[Event]:
    """What the supervisor logs of one step: its start, a reply, two tool calls, its end."""
    on = {"step": step}
    return [
        Event("step", f"开始 {step}", payload=on),
        Event("text", "先看看现在的目录结构,再动手。", payload=on),
        Event("tool_call", "ls -la", tool="Bash", payload={**on, "input": {"command": "ls -la"}}),
        Event("tool_call", "md2html.py", tool="Write", payload={**on, "input": {"path": "x"}}),
        Event("step", f"{step} 完成", payload=on),
    ]


def _result(step: str, session_id: str, started: float) -> StepResult:
    return StepResult(
        step=step,
        session_id=session_id,
        ok=True,
        cost_usd=0.0712,
        num_turns=9,
        text="改好了:把 md 转 html 的脚本加上了代码块高亮,跑了测试全部通过。" * 4,
        started_at=started,
        ended_at=started + 240,
        context=41_000,
    )


async def _store_sessions(db: Path, workspace: Path, session_ids: Iterable[str]) -> None:
    """A few transcript entries per session in a real store (this imports the SDK, here only)."""
    from claude_agent_sdk import project_key_for_directory

    from flower.state.sqlite import SqliteSessionStore

    store = SqliteSessionStore(db)
    project = project_key_for_directory(workspace)
    try:
        for sid in session_ids:
            entries: list[Any] = [  # SDK transcript entries are open-ended dicts
                {"type": kind, "uuid": str(uuid.uuid4()), "sessionId": sid, "message": msg}
                for kind, msg in (
                    ("user", {"role": "user", "content": "写个 md 转 html 的脚本"}),
                    (
                        "assistant",
                        {"role": "assistant", "content": [{"type": "text", "text": "好"}]},
                    ),
                )
            ]
            await store.append({"project_key": project, "session_id": sid}, entries)
    finally:
        store.close()


# -- running ---------------------------------------------------------------------------


def child_env(pycache: Path) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("PYTHONDONTWRITEBYTECODE", "PYTHONPROFILEIMPORTTIME"):
        env.pop(name, None)
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def probe(cmd: Command, env: dict[str, str], cwd: Path) -> None:
    """One untimed run with -X importtime: is it there, its exit status, what it imported."""
    exe = cmd.argv[0]
    if not Path(exe).exists():
        cmd.exit = MISSING
        return
    python = str(Path(exe).parent / "python")
    head = [python, "-X", "importtime", *([] if exe == python else [exe])]
    done = subprocess.run(
        [*head, *cmd.argv[1:]], env=env, cwd=cwd, capture_output=True, text=True, check=False
    )
    if done.returncode == 2 and "No such command" in done.stderr:
        cmd.exit = MISSING
        return
    cmd.exit, cmd.imported, cmd.heaviest = done.returncode, set(), []
    for line in done.stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \| ( *)(\S+)$", line)
        if not m:
            continue
        cmd.imported.add(m.group(3))
        if not m.group(2) and m.group(3) != "site":  # imported by the command, not startup
            cmd.heaviest.append((int(m.group(1)), m.group(3)))
    cmd.heaviest.sort(reverse=True)


def timed(cmd: Command, env: dict[str, str], cwd: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        cmd.argv,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    return (time.perf_counter() - t0) * 1000


def measure(cmds: list[Command], rounds: int, seed: int, env: dict[str, str], cwd: Path) -> None:
    rng = random.Random(seed)
    present = [c for c in cmds if not c.missing]
    for _ in range(rounds):
        order = present[:]
        rng.shuffle(order)
        for c in order:
            c.times_ms.append(timed(c, env, cwd))


# -- the table -------------------------------------------------------------------------


def report(cmds: list[Command], rounds: int, why: int) -> None:
    base = statistics.median(cmds[0].times_ms)
    print(f"{rounds} rounds, each command once per round in shuffled order; medians")
    print(f"{'command':<22} {'median ms':>9} {'min ms':>7} {'ratio':>6}  {'exit':>4}  imports")
    worst: tuple[float, str] | None = None
    for c in cmds:
        if c.missing:
            print(f"{c.name:<22} {'-':>9} {'-':>7} {'-':>6}  {'-':>4}  missing")
            continue
        med = statistics.median(c.times_ms)
        ratio = med / base
        heavy = [m for m in HEAVY if m in c.imported]
        print(
            f"{c.name:<22} {med:>9.1f} {min(c.times_ms):>7.1f} {ratio:>5.2f}x  {c.exit:>4}  "
            + (", ".join(heavy) if heavy else f"no {SDK}")
        )
        if c is not cmds[0] and (worst is None or ratio > worst[0]):
            worst = (ratio, c.name)
        if why and c is not cmds[0]:
            top = ", ".join(f"{name} {us / 1000:.1f}" for us, name in c.heaviest[:why])
            print(f"{'':<22} heaviest (ms, -X importtime): {top}")
    if worst is not None:
        verdict = "within" if worst[0] <= GOAL else "OVER"
        print(f"worst: {worst[1]} at {worst[0]:.2f}x python -c pass ({verdict} the {GOAL:g}x goal)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--why", type=int, default=0, metavar="N", help="show N heaviest imports")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="flower-bench-cli-"))
    try:
        workspace = tmp / "ws"
        workspace.mkdir()
        run_dir = build_run_dir(workspace)
        env = child_env(tmp / "pycache")
        cmds = commands(bin_dir(), run_dir)
        for c in cmds:  # untimed, twice: the first run writes the .pyc files
            probe(c, env, workspace)
            probe(c, env, workspace)
        measure(cmds, max(1, args.rounds), args.seed, env, workspace)
        report(cmds, max(1, args.rounds), args.why)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
