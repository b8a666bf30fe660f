"""Steps on a cluster, measured side by side in one run (issue 19, point 11).

    .venv/bin/python scripts/bench_cluster.py [--rounds 3] [--steps 6] [--kills 3] [--flows 50]
        [--only step,fan,takeover,many]

Everything is real: ``flower-super cluster up`` (the Temporal dev server, a PostgreSQL with
fsync on, ``flower-super worker`` processes), ``flower-super start`` with the real CLI, and
the scripted model server as the API. Three figures:

1. **The marginal step** (goal: through Temporal at most 1.25x the local fork): an N-step
   flow (scripts/bench_supervisor.py's, one text turn a step) with ``FLOWER_STATE`` set, once
   forked here and once with ``FLOWER_PLACEMENT`` on one worker, alternating which goes
   first each round; a step costs the time from its start to the next step's start (the
   manifest rows), the first step left out (the flow's fixed cost).
2. **Fan-out** (goal: 4 workers at most 0.35x the wall time of 1 worker): a map step over 8
   items whose model answers take 4 s each, ``concurrency=8``, on a cluster of 1 worker and
   on one of 4 (one slot each); the map step's span from the first item's start to the last
   item's end.
3. **Takeover** (goal: at most 4 s): a one-step flow on a cluster of 4 workers whose first
   model answer never comes; when the request has arrived, SIGKILL of the worker running it
   (the one ``status`` names), and the time to the resumed attempt's first request at the
   model server.
4. **Many flows at once** (goal: a step costs at most 1.2x what it costs with one flow): the
   6-step flow of figure 1, started 50 times at once on the cluster of 4 workers, against
   the same flow run alone (3 times, one after the other). What a step costs is the
   machine's CPU time (every process: supervisors, workers, CLIs, PostgreSQL, Temporal, the
   model server) divided by the steps run: what the supervisors' mailbox pumps, the
   database's notifications and the workers spend per step, whatever the number of flows.
   The wall time per step is printed beside it (on 2 cores 50 flows queue for the CPU: a
   wall-clock figure measures the machine, not flower), then where the CPU went (by kind
   of process, the CLIs the workers ran apart, and how many CLIs were started per step),
   and the floor: the bundled CLI alone, with nothing of flower's, 4 runs at a time against
   one at a time (a busy machine makes every process dearer per unit of work).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(ROOT))

from flower.services.cli_env import cli_env  # noqa: E402
from flower.services.model_server import ModelServer  # noqa: E402

STEP_GOAL, FAN_GOAL, TAKEOVER_GOAL, MANY_GOAL = 1.25, 0.35, 4.0, 1.2
ITEMS, ITEM_DELAY_S = 8, 4.0

MAP_SRC = """
from flower.agents.agent import AgentSpec
from flower.workflow import MapStep, Workflow
spec = AgentSpec(name="bench", instructions="answer briefly", allowed_tools=[])
flow = Workflow(
    [MapStep("each", spec, prompt=lambda ctx, item: f"[[slow]] item {item}", over="items",
             concurrency=8)],
    name="fan", continuous=False, context={"items": list(range(8))},
)
"""

# A worker imports the flow file itself, in its own environment: what varies is written
# into the file, never read from the supervisor's environment.
STEPS_SRC = """
from flower.agents.agent import AgentSpec
from flower.workflow import Step, Workflow
spec = AgentSpec(name="bench", instructions="answer briefly", allowed_tools=[])
flow = Workflow([Step(f"s{{i}}", spec, f"[[bench]] step {{i}}") for i in range({n})],
                name="bench", continuous=False)
"""

KILL_SRC = """
from flower.agents.agent import AgentSpec
from flower.workflow import Step, Workflow
spec = AgentSpec(name="bench", instructions="answer briefly", allowed_tools=[])
flow = Workflow([Step("wait", spec, "[[{mark}]] go")], name="kill", continuous=False)
"""


def script(kills: int) -> dict[str, Any]:
    slow = {"name": "slow", "match": {"marker": "[[slow]]"}}
    slow["turns"] = [{"text": "slow done.", "delay": ITEM_DELAY_S}]
    out: dict[str, Any] = {"conversations": [slow], "default": ["ok."]}
    for k in range(kills):
        out["conversations"].append(
            {
                "name": f"kill{k}",
                "match": {"marker": f"[[kill{k}]]"},
                "turns": [{"text": "never.", "delay": 300, "times": 1}, {"text": "resumed."}],
            }
        )
    return out


class Bench:
    def __init__(self, root: Path, server: ModelServer) -> None:
        self.root = root
        self.server = server
        self.env = {**cli_env(root / "home", server.url), "PYTHONPATH": str(ROOT)}
        for name in ("FLOWER_STATE", "FLOWER_PLACEMENT"):
            self.env.pop(name, None)
        (root / "fan.py").write_text(MAP_SRC)
        self.n = 0
        self.spent: dict[str, float] = {}

    # -- the cluster ---------------------------------------------------------------------

    def up(self, workers: int) -> Any:
        from supervisor.cluster.local import up

        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(self.env)  # what the workers inherit: this machine's credentials
        try:
            cluster = up(self.root / f"cluster-{workers}", workers, lambda line: None)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        return cluster

    def down(self, cluster: Any) -> None:
        from supervisor.cluster.local import down

        down(cluster.dir, lambda line: None)

    # -- one flow --------------------------------------------------------------------------

    def start(self, cluster: Any, flow: str, placed: bool) -> tuple[Path, Any]:
        self.n += 1
        ws = self.root / f"ws-{self.n}"
        ws.mkdir()
        env = {**self.env, "FLOWER_STATE": cluster.state}
        if placed:
            env["FLOWER_PLACEMENT"] = cluster.placement
        cmd = [sys.executable, "-m", "supervisor", "start", "--flow", f"{self.root / flow}:flow"]
        cmd += ["-w", str(ws), "-r", str(ws / "runs")]
        proc = subprocess.Popen(
            cmd, env=env, cwd=ws, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        return ws, proc

    def flow(self, name: str, src: str) -> str:
        path = self.root / name
        if not path.exists():
            path.write_text(src)
        return name

    def run(self, cluster: Any, flow: str, placed: bool) -> list[dict[str, Any]]:
        ws, proc = self.start(cluster, flow, placed)
        out, _ = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise SystemExit(f"{flow} exited {proc.returncode}:\n{out[-3000:]}")
        return self.rows(cluster, ws)

    def rows(self, cluster: Any, ws: Path) -> list[dict[str, Any]]:
        state = self.state(cluster, ws)
        try:
            return list(state.manifest_rows())
        finally:
            state.close()

    def state(self, cluster: Any, ws: Path) -> Any:
        from flower.state.backends import open_state

        return open_state(cluster.state, run_dir=ws / "runs", workspace=ws, create=False)


# ---- 1. the marginal step ------------------------------------------------------------------


def marginal_step(b: Bench, cluster: Any, rounds: int, steps: int) -> list[str]:
    samples: dict[str, list[float]] = {"local fork": [], "Temporal": []}

    def flow(kind: str, n: int) -> list[float]:
        rows = b.run(cluster, b.flow(f"steps{n}.py", STEPS_SRC.format(n=n)), kind == "Temporal")
        starts = [row["started_at"] for row in rows]
        return [y - x for x, y in itertools.pairwise(starts)][1:]

    for kind in samples:  # warm: bytecode, the CLI's first run, the worker's first fork
        flow(kind, 2)
    for r in range(rounds):
        for kind in samples if r % 2 == 0 else reversed(list(samples)):
            samples[kind] += flow(kind, steps)
        say(f"step round {r + 1}/{rounds}")
    med = {k: statistics.median(v) for k, v in samples.items()}
    out = [f"1. one more step, {rounds} flows of {steps} steps each way (ms)"]
    out.append(f"   {'':<11}{'n':>4}{'median':>9}{'p10':>8}{'p90':>8}")
    for k, xs in samples.items():
        q = statistics.quantiles(xs, n=10) if len(xs) > 1 else xs
        cells = f"{med[k] * 1000:>9.0f}{q[0] * 1000:>8.0f}{q[-1] * 1000:>8.0f}"
        out.append(f"   {k:<11}{len(xs):>4}{cells}")
    ratio = med["Temporal"] / med["local fork"]
    out.append(f"   ratio {ratio:.2f}x ({verdict(ratio <= STEP_GOAL)} the goal of {STEP_GOAL}x)")
    return out


# ---- 2. fan-out ----------------------------------------------------------------------------


def fan_out(b: Bench, cluster: Any) -> float:
    rows = [r for r in b.run(cluster, "fan.py", True) if str(r["step"]).startswith("each[")]
    if len(rows) != ITEMS or not all(r["ok"] for r in rows):
        raise SystemExit(f"the map did not run its {ITEMS} items once each: {rows}")
    return max(r["started_at"] + r["duration_s"] for r in rows) - min(r["started_at"] for r in rows)


# ---- 3. takeover -----------------------------------------------------------------------------


def takeover(b: Bench, cluster: Any, k: int) -> float:
    import psutil

    mark = f"kill{k}"
    ws, proc = b.start(cluster, b.flow(f"{mark}.py", KILL_SRC.format(mark=mark)), True)
    try:
        first = wait(lambda: asked(b, mark), 120, f"{mark}'s first request")
        pid = wait(lambda: placed_pid(b, cluster, ws), 30, f"{mark}'s worker")
        assert "worker" in " ".join(psutil.Process(pid).cmdline())
        killed = time.time()
        os.kill(pid, signal.SIGKILL)
        again = wait(lambda: asked(b, mark)[len(first) :], 60, f"{mark}'s resumed request")
        took = again[0].time - killed
        out, _ = proc.communicate(timeout=120)
        if proc.returncode != 0:
            raise SystemExit(f"the killed worker's flow exited {proc.returncode}:\n{out[-3000:]}")
        return took
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ---- 4. many flows at once --------------------------------------------------------------------


def busy_s() -> float:
    """CPU seconds the whole machine has spent busy so far."""
    import psutil

    t = psutil.cpu_times()
    return float(
        sum(
            getattr(t, f)
            for f in ("user", "nice", "system", "irq", "softirq", "steal")
            if hasattr(t, f)
        )
    )


def settle(limit_s: float = 120.0, quiet: float = 0.1) -> None:
    """Until the machine is quiet (under ``quiet`` of a core busy over a second): what an
    earlier figure left running (workers started again after the kills, a database still
    writing) is not charged to the next burst, the one-flow baseline least of all."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        before = busy_s()
        time.sleep(1.0)
        if busy_s() - before < quiet:
            return
    say(f"the machine did not settle in {limit_s:g} s: the figure below is less sure")


def by_kind(places: list[str]) -> dict[str, float]:
    """CPU seconds so far of the kinds of processes of the bench (everything whose command
    line or directory is under one of ``places``: the bench's root and the cluster's
    PostgreSQL, whose data a root user's server keeps under /tmp), each with what it
    reaped: a worker's step children and their CLIs, and PostgreSQL's backends; supervisors
    that ended are in this process's own ``children`` times."""
    import psutil

    me = psutil.Process()
    mine = me.cpu_times()
    out = {
        "supervisors": mine.children_user + mine.children_system,
        "model server": mine.user + mine.system,
    }
    for p in psutil.process_iter():
        try:
            line, t, cwd = " ".join(p.cmdline()), p.cpu_times(), p.cwd()
        except psutil.Error:
            continue
        if p.pid == me.pid or not any(place in f"{line} {cwd}" for place in places):
            continue
        kind = next((k for k in ("worker", "postgres", "temporal", "supervisor") if k in line), "")
        if not kind or _below_a_worker(p):
            continue
        key = {"worker": "workers", "supervisor": "supervisors"}.get(kind, kind)
        spent = t.user + t.system + t.children_user + t.children_system
        if kind in ("worker", "postgres"):  # what runs below it, not yet reaped
            below = 0.0
            for c in p.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    ct = c.cpu_times()
                    below += ct.user + ct.system
            spent += below
            if kind == "worker":  # its step children and their CLIs, apart
                cli = "  their CLIs"
                out[cli] = out.get(cli, 0.0) + below + t.children_user + t.children_system
        out[key] = out.get(key, 0.0) + spent
    return out


def _below_a_worker(p: Any) -> bool:
    import psutil

    try:
        return any("worker" in " ".join(a.cmdline()) for a in p.parents())
    except psutil.Error:
        return True


def count_clis(seen: set[int], done: threading.Event) -> None:
    """The CLI processes seen until ``done`` (a look every 0.1 s: a CLI lives longer)."""
    import psutil

    while not done.wait(0.1):
        for p in psutil.process_iter(["name"]):
            if p.info["name"] == "claude":
                seen.add(p.pid)


def burst(b: Bench, cluster: Any, flows: int, steps: int) -> tuple[float, float, list[float]]:
    """``flows`` runs of the ``steps``-step flow started at once: (CPU s per step, wall s,
    each flow's marginal steps). Where the CPU went is kept in ``b.spent``."""
    name = b.flow(f"steps{steps}.py", STEPS_SRC.format(n=steps))
    clis: set[int] = set()
    done = threading.Event()
    watching = threading.Thread(target=count_clis, args=(clis, done), daemon=True)
    watching.start()
    settle()
    places = [str(b.root), cluster.pg_dir]
    cpu, began, kinds = busy_s(), time.monotonic(), by_kind(places)
    started = [b.start(cluster, name, True) for _ in range(flows)]
    for _ws, proc in started:
        out, _ = proc.communicate(timeout=1800)
        if proc.returncode != 0:
            raise SystemExit(f"a flow of the burst exited {proc.returncode}:\n{out[-3000:]}")
    wall, cpu = time.monotonic() - began, busy_s() - cpu
    after = by_kind(places)
    done.set()
    watching.join()
    b.spent = {k: (after.get(k, 0.0) - kinds.get(k, 0.0)) / (flows * steps) for k in after}
    named = sum(v for k, v in b.spent.items() if not k.startswith(" "))
    b.spent["the rest"] = cpu / (flows * steps) - named  # the kernel's threads, the bench's
    b.spent["CLIs per step"] = len(clis) / (flows * steps)
    marginal: list[float] = []
    for ws, _ in started:
        starts = sorted(row["started_at"] for row in b.rows(cluster, ws))
        if len(starts) != steps:
            raise SystemExit(f"a flow of the burst ran {len(starts)} steps, not {steps}")
        marginal += [y - x for x, y in itertools.pairwise(starts)][1:]
    return cpu / (flows * steps), wall, marginal


def many(b: Bench, cluster: Any, flows: int, steps: int) -> list[str]:
    live = sum(1 for w in cluster.workers if w.running())
    if live != len(cluster.workers):
        raise SystemExit(f"figure 4 needs all {len(cluster.workers)} workers: {live} run")
    b.run(cluster, b.flow("steps2.py", STEPS_SRC.format(n=2)), True)  # warm
    alone = [burst(b, cluster, 1, steps) for _ in range(3)]
    spent1 = dict(b.spent)
    say("one flow at a time")
    together = burst(b, cluster, flows, steps)
    say(f"{flows} flows at once")
    cpu1 = statistics.median(a[0] for a in alone)
    wall1 = statistics.median(a[1] for a in alone) / steps
    step1 = statistics.median(x for a in alone for x in a[2])
    cpu_n, wall_n = together[0], together[1] / (flows * steps)
    step_n = statistics.median(together[2])
    ratio = cpu_n / cpu1
    out = [f"\n4. {flows} flows of {steps} steps at once on 4 workers, against one flow alone"]
    out.append(f"   {'':<16}{'CPU s/step':>11}{'wall s/step':>12}{'one more step':>15}")
    out.append(f"   {'one flow':<16}{cpu1:>11.2f}{wall1:>12.2f}{step1:>14.2f}s")
    out.append(f"   {f'{flows} at once':<16}{cpu_n:>11.2f}{wall_n:>12.2f}{step_n:>14.2f}s")
    out.append(
        f"   CPU per step {ratio:.2f}x ({verdict(ratio <= MANY_GOAL)} the goal of {MANY_GOAL}x);"
        f" wall per step {wall_n / wall1:.2f}x, one more step of a flow {step_n / step1:.2f}x"
    )
    out.append(f"   CPU s/step by process (the last single flow; {flows} at once):")
    for k in sorted(b.spent, key=lambda k: -b.spent[k]):
        out.append(f"     {k:<14}{spent1.get(k, 0.0):>7.2f}{b.spent[k]:>7.2f}")
    one, four = cli_floor(b)
    say("the bare CLI's floor")
    out.append(
        f"   floor: the bare CLI alone (no flower), 4 runs at a time (as 4 one-slot workers)"
        f" against one at a time: {four:.2f} s against {one:.2f} s of CPU a run, {four / one:.2f}x"
    )
    return out


def cli_floor(b: Bench, rounds: int = 2) -> tuple[float, float]:
    """CPU seconds per run of the bundled CLI itself (``claude -p``, one text answer from
    the model server), one at a time and 4 at a time: what running more steps at once
    costs the machine with nothing of flower's around (the best design's floor)."""
    from concurrent.futures import ThreadPoolExecutor

    from flower.services.cli_env import claude_path

    cwd = b.root / "floor"
    cwd.mkdir(exist_ok=True)

    def one(_: int = 0) -> None:
        argv = [str(claude_path()), "-p", "[[bench]] floor", "--output-format", "json"]
        done = subprocess.run(argv, env=b.env, cwd=cwd, capture_output=True, timeout=300)
        if done.returncode != 0:
            raise SystemExit(f"the bare CLI exited {done.returncode}: {done.stderr[-2000:]!r}")

    def spent() -> float:
        t = os.times()
        return t.children_user + t.children_system

    one()  # warm
    per: dict[int, list[float]] = {1: [], 4: []}
    for _ in range(rounds):
        for at_once, runs in ((1, 12), (4, 48)):
            before = spent()
            with ThreadPoolExecutor(at_once) as pool:
                list(pool.map(one, range(runs)))
            per[at_once].append((spent() - before) / runs)
    return statistics.median(per[1]), statistics.median(per[4])


def asked(b: Bench, mark: str) -> list[Any]:
    return [r for r in b.server.requests if r.conversation == mark]


def placed_pid(b: Bench, cluster: Any, ws: Path) -> int | None:
    state = b.state(cluster, ws)
    try:
        for record in state.registry.records():
            where = record.placed.get("wait")
            if where and where.get("pid"):
                return int(where["pid"])
    finally:
        state.close()
    return None


def wait(probe: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


def verdict(ok: bool) -> str:
    return "within" if ok else "NOT within"


def say(line: str) -> None:
    print(f"  done: {line}", file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--flows", type=int, default=50)
    parser.add_argument("--only", default="step,fan,takeover,many", metavar="WHICH,…")
    args = parser.parse_args()
    only = set(args.only.split(","))
    out: list[str] = []
    alone = spread = 0.0
    takeovers: list[float] = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp,
        ModelServer(script(args.kills)) as server,
    ):
        b = Bench(Path(tmp), server)
        if only & {"step", "fan"}:
            one = b.up(1)
            try:
                if "step" in only:
                    out += marginal_step(b, one, args.rounds, args.steps)
                if "fan" in only:
                    alone = fan_out(b, one)
                    say("map on 1 worker")
            finally:
                b.down(one)
        four = b.up(4)
        try:
            if "fan" in only:
                spread = fan_out(b, four)
                say("map on 4 workers")
            if "takeover" in only:
                for k in range(args.kills):
                    takeovers.append(takeover(b, four, k))
                    say(f"kill {k + 1}/{args.kills}")
                # each kill took a worker for good: up again starts them (as a person would),
                # or figure 4 would run on what the kills left (1 of 4 after 3 kills)
                four = b.up(4)
            if "many" in only:
                many_lines = many(b, four, args.flows, args.steps)
        finally:
            b.down(four)
    if "fan" in only:
        ratio = spread / alone
        out.append(f"\n2. a map of {ITEMS} items, {ITEM_DELAY_S:g} s model answers, concurrency 8")
        out.append(f"   1 worker  {alone:6.1f} s")
        out.append(f"   4 workers {spread:6.1f} s")
        out.append(f"   ratio {ratio:.2f}x ({verdict(ratio <= FAN_GOAL)} the goal of {FAN_GOAL}x)")
    if takeovers:
        worst = max(takeovers)
        out.append(
            "\n3. SIGKILL of the worker -> the resumed attempt's first request"
            f" ({args.kills} kills)"
        )
        out.append("   " + ", ".join(f"{x:.1f} s" for x in takeovers))
        out.append(
            f"   median {statistics.median(takeovers):.1f} s, worst {worst:.1f} s "
            f"({verdict(worst <= TAKEOVER_GOAL)} the goal of {TAKEOVER_GOAL:g} s)"
        )
    if "many" in only:
        out += many_lines
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
