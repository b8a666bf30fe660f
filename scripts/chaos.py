"""A seeded kill campaign: random faults at random moments of multi-step flows, checked.

    .venv/bin/python scripts/chaos.py [--faults 40] [--seed 1] [--backends local,postgres]
        [--steps 3] [--per-flow 3] [--jobs 1] [--dsn URL] [--json FILE] [--progress] [--keep]

The real ``flower-super start`` (as a person runs it), the real CLI, the project's scripted
model server, real processes and signals. Each flow has ``--steps`` steps; every step makes
one Bash tool call with a side effect (a line in ``effects.txt``) and then answers. A flow
gets 1 to ``--per-flow`` faults, each at a random moment of a run, then runs to its end:

- ``kill -9``: SIGKILL to the supervisor (its step child and CLI go down with it);
- ``kill -9 child``: SIGKILL to the step's child process only (the supervisor carries on);
- ``SIGTERM``: what a shutdown sends (the supervisor writes killed-by-signal rows and exits);
- ``SIGSTOP``: the supervisor frozen for 1-4 s, then SIGCONT;
- ``outage`` (PostgreSQL state only): the database server down for 2-6 s, then up.

``--backends cluster`` runs flows with their state in PostgreSQL and their attempts on a
Temporal dev server's queue, served by ``--workers`` (3) ``flower-super worker`` processes
started as a person starts them; its faults are kill -9 and SIGTERM of the supervisor, the
outage, and:

- ``kill -9 worker``: SIGKILL to the worker running the flow's attempt (an idle one when
  none runs it); a new worker takes its place, as an operator's restart policy would;
- ``freeze worker``: the worker and everything below it stopped for 4-7 s (longer than the
  heartbeat timeout: its attempt moves), then continued;
- ``temporal restart``: the Temporal server killed and started again 1-3 s later on its
  port and database.

A supervisor killed leaves its attempt running on its worker (the command again attaches
to it), so a run's survivors are counted outside the workers until the flow's end, and
everything of the flow's at its end.

After a fault that ends the run, the command is run again as printed, until the flow
finishes. Checked after every fault, and at each flow's end:

- **re-sent**: no request for a step after that step's row says it finished;
- **re-run**: no tool call's side effect happens twice (``effects.txt``);
- **lost**: a step whose session lineage named when the run died continues that session
  (the next request for the step carries its id), and no step is seen in a second session
  after its first one carried a tool result back (a session that had something to resume);
- **survivors**: no process of the run outlives it (10 s after it ended);
- **finished**: the flow ends with exit 0.

The table counts faults by kind and by the moment they hit (``startup``: before the run's
first request; ``model``: a request held by the model server; ``tool``: the Bash call
running; ``between``: flower's or the CLI's own work), and the outcomes. Exit 1 when any
check failed. ``--json`` writes every fault and its outcome.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from flower.services.cli_env import cli_env  # noqa: E402
from flower.services.model_server import ModelServer  # noqa: E402
from flower.services.postgres import PgServer, postgres_server  # noqa: E402
from flower.services.temporal import TemporalServer, temporal_server  # noqa: E402
from flower.state.backends import open_state  # noqa: E402

FLOW_SRC = """
from flower.agents.agent import AgentSpec
from flower.workflow import Step, Workflow
hands = AgentSpec(name="chaos", instructions="do the step", allowed_tools=["Bash"])
N = {steps}  # in the file: a cluster's worker imports it in an environment of its own
flow = Workflow(
    [Step(f"s{i}", hands, f"[[s{i}]] step {i}") for i in range(N)], name="chaos"
)
"""
TOOL = "touch tool-{step}.started; sleep 0.4; echo {step} >> effects.txt"
KINDS = ("kill -9", "kill -9 child", "SIGTERM", "SIGSTOP", "outage")
CLUSTER_KINDS = (
    "kill -9",
    "SIGTERM",
    "outage",
    "kill -9 worker",
    "freeze worker",
    "temporal restart",
)
QUEUE = "chaos"
ENDS_RUN = {"kill -9", "SIGTERM"}
MOMENTS = ("startup", "model", "tool", "between")
RUN_TIMEOUT_S = 240.0


def script(steps: int) -> dict[str, Any]:
    def bash(step: str) -> dict[str, Any]:
        command = TOOL.format(step=step)
        return {"tool_use": {"name": "Bash", "input": {"command": command, "description": "e"}}}

    return {
        "conversations": [
            {
                "name": f"s{i}",
                "match": {"marker": f"[[s{i}]]"},
                "turns": [
                    {**bash(f"s{i}"), "delay": 0.6},
                    {"text": f"s{i} done.", "delay": 0.8},
                ],
            }
            for i in range(steps)
        ]
    }


@dataclass
class Fault:
    backend: str
    flow: int
    kind: str
    moment: str = ""
    at_s: float = 0.0
    problems: list[str] = field(default_factory=list)
    job: int = 0  # --jobs: the campaign it ran in (1..N)


@dataclass
class Tally:
    faults: list[Fault] = field(default_factory=list)
    flows: int = 0
    finished: int = 0
    resent: int = 0
    rerun: int = 0
    lost: int = 0
    survivors: int = 0
    unknown_effects: int = 0  # a tool call cut off before its effect: reported, not re-run
    problems: list[str] = field(default_factory=list)


class Flow:
    """One flow in a fresh workspace, on one backend, against the shared model server."""

    def __init__(
        self,
        root: Path,
        n: int,
        backend: str,
        server: ModelServer,
        state: str | None,
        steps: int,
        placement: str | None = None,
    ) -> None:
        self.root = root / f"{backend}-{n}"
        self.ws = self.root / "ws"
        self.ws.mkdir(parents=True)
        self.runs = self.ws / "runs"
        self.server = server
        self.state = state
        self.steps = [f"s{i}" for i in range(steps)]
        self.flow_file = self.root / "chaos_flow.py"
        self.flow_file.write_text(FLOW_SRC.replace("{steps}", str(steps)), encoding="utf-8")
        extra = {"FLOWER_LANG": "en"}
        if state:
            extra["FLOWER_STATE"] = state
        if placement:
            extra["FLOWER_PLACEMENT"] = placement
        # The CLI's own retry default, as a person has it.
        self.env = cli_env(self.root / "home", server.url, max_retries=None, extra=extra)
        self.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{self.env.get('PATH', '')}"
        self.first_seq = server.requests[-1].seq if server.requests else 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.run_began = 0.0

    def start(self) -> subprocess.Popen[bytes]:
        argv = ["flower-super", "start", "--flow", f"{self.flow_file}:flow", "-w", str(self.ws)]
        self.run_began = time.time()
        self.proc = subprocess.Popen(
            argv,
            cwd=self.ws,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        return self.proc

    def mine(self) -> list[Any]:
        return [r for r in self.server.requests if r.seq > self.first_seq and r.conversation]

    def mine_now(self) -> list[Any]:
        """This run's requests so far."""
        return [r for r in self.mine() if r.time >= self.run_began]

    def moment(self) -> str:
        now = time.time()
        mine = [r for r in self.mine() if r.time >= self.run_began]
        if not mine:
            return "startup"
        if any(r.time <= now < r.time + r.delay for r in mine):
            return "model"
        for step in self.steps:
            started = (self.ws / f"tool-{step}.started").exists()
            answered = any(r.conversation == step and r.turn == 1 for r in mine)
            if started and not answered:
                return "tool"
        return "between"

    def opened(self) -> Any:
        # "": the run_dir's files, whatever FLOWER_STATE this shell has
        return open_state(self.state or "", run_dir=self.runs, workspace=self.ws, create=False)

    def finished_at(self) -> dict[str, float]:
        """Each step's first row that says it finished (its end time)."""
        st = self.opened()
        try:
            rows = st.manifest_rows()
        finally:
            st.close()
        out: dict[str, float] = {}
        for row in rows:
            if row.get("ok") and not row.get("reused") and row.get("step") in self.steps:
                out.setdefault(str(row["step"]), float(row.get("ended_at") or 0))
        return out

    def finished(self) -> bool:
        """Does the flow's last run say it finished (whatever its exit status)?"""
        st = self.opened()
        try:
            records = st.registry.records()
        finally:
            st.close()
        return bool(records) and records[-1].state == "finished"

    def lineage(self) -> dict[str, str]:
        st = self.opened()
        try:
            return dict(st.peek_lineage().get("steps") or {})
        finally:
            st.close()

    def survivors(self, spare: set[int] | None = None) -> list[psutil.Process]:
        """Processes of this flow still running (but those in ``spare``)."""
        out = []
        root = str(self.root)
        spare = spare or set()
        for p in psutil.process_iter(["cmdline", "cwd", "pid"]):
            with contextlib.suppress(psutil.Error):
                text = " ".join(p.info["cmdline"] or []) + " " + (p.info["cwd"] or "")
                if (
                    root in text
                    and p.pid != os.getpid()
                    and p.pid not in spare
                    and p.status() != psutil.STATUS_ZOMBIE
                ):
                    out.append(p)
        return out


def child_of(pid: int) -> psutil.Process | None:
    """The supervisor's step child that runs the step (the one with a CLI under it; a
    child prepared for the next step has none yet), else any."""
    with contextlib.suppress(psutil.Error):
        kids = psutil.Process(pid).children()
        for c in kids:
            with contextlib.suppress(psutil.Error):
                if any("claude" in (g.name() or "") for g in c.children(recursive=True)):
                    return c
        return kids[0] if kids else None
    return None


def wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> tuple[int | None, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, ""
    return proc.returncode, out.decode("utf-8", "replace")


def wait_for(cond: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return bool(cond())


def reap(flow: Flow, cluster: Cluster | None = None, *, end: bool = True) -> int:
    """Survivors of a run that ended (after 10 s), killed so the campaign goes on. Before
    the flow's end, what runs on a cluster's workers is theirs (a killed supervisor's attempt
    goes on there, for the command again to attach to)."""

    def spare() -> set[int]:
        return set() if end or cluster is None else cluster.trees()

    if wait_for(lambda: not flow.survivors(spare()), 10):
        return 0
    left = flow.survivors(spare())
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.kill()
    return len(left)


def run_flow(
    flow: Flow,
    backend: str,
    n: int,
    faults: int,
    rng: random.Random,
    pg: PgServer | None,
    cluster: Cluster | None = None,
) -> tuple[list[Fault], dict[str, Any]]:
    """Run one flow to its end with ``faults`` faults along the way: several in one run
    while none ends it, and the command again only after one that does (kill -9, SIGTERM).
    A run that ends by itself is the flow's verdict, whatever its exit status: one that
    fails after a fault it should have lived through is not forgiven by running it again."""
    made: list[Fault] = []
    checks: dict[str, Any] = {"survivors": 0, "lost": [], "exit": None, "out": ""}
    if backend == "cluster":
        kinds = list(CLUSTER_KINDS if pg is not None else CLUSTER_KINDS[:2] + CLUSTER_KINDS[3:])
    else:
        kinds = [k for k in KINDS if k != "outage" or pg is not None]
    left = faults
    while True:
        proc = flow.start()
        killed = False
        first = True
        while left > 0:
            fault = Fault(backend, n, rng.choice(kinds))
            # A run's first fault: one in five while it starts up, the rest once it has
            # asked the model something, up to 5 s later (its steps take about 2 s each).
            # Later ones in the same run: 0.5 to 4 s after the one before.
            if not first:
                fault.at_s = round(rng.uniform(0.5, 4.0), 2)
            elif rng.random() >= 0.2:
                wait_for(lambda p=proc: bool(flow.mine_now()) or p.poll() is not None, 90)
                fault.at_s = round(rng.uniform(0.0, 5.0), 2)
            else:
                fault.at_s = round(rng.uniform(0.3, 3.0), 2)
            first = False
            if proc.poll() is not None:
                break  # it ended by itself: judged below
            code, _ = wait_exit(proc, fault.at_s)
            if code is not None:
                break
            left -= 1
            fault.moment = flow.moment()
            made.append(fault)
            if inject(fault, flow, proc, rng, pg, cluster):
                code, out = wait_exit(proc, 60)
                if code is None:
                    proc.kill()
                    code, out = wait_exit(proc, 30)
                    fault.problems.append("the run did not end after the fault")
                n_left = reap(flow, cluster, end=False)
                if n_left:
                    fault.problems.append(f"{n_left} processes outlived the run")
                    checks["survivors"] += n_left
                if code == 0 or flow.finished():
                    # it had finished as the signal came (its record says so): that is its
                    # end; the command again would be a new wake, not a fault's aftermath
                    checks["exit"], checks["out"] = 0, out
                    checks["survivors"] += reap(flow, cluster)
                    return made, checks
                # What lineage names now must be what the next run continues.
                checks["lost"].append((fault, flow.lineage(), len(flow.server.requests)))
                killed = True
                break
        if killed:
            continue  # the command again, as a person would
        code, out = wait_exit(proc, RUN_TIMEOUT_S)
        if code is None:
            proc.kill()
            code, out = wait_exit(proc, 30)
            out += "\n(chaos: killed after the run timeout)"
        checks["exit"], checks["out"] = code, out
        checks["survivors"] += reap(flow, cluster)
        return made, checks


def inject(
    fault: Fault,
    flow: Flow,
    proc: subprocess.Popen[bytes],
    rng: random.Random,
    pg: PgServer | None,
    cluster: Cluster | None = None,
) -> bool:
    """Do ``fault`` to the running ``proc``; True when it ends the run."""
    if fault.kind in ("kill -9 worker", "freeze worker", "temporal restart"):
        assert cluster is not None
        if fault.kind == "temporal restart":
            cluster.temporal.down()
            try:
                time.sleep(rng.uniform(1, 3))
            finally:
                cluster.temporal.up()
            return False
        i, idle = cluster.running(flow.ws, rng)
        if idle:
            fault.moment += " (idle worker)"
        if fault.kind == "kill -9 worker":
            cluster.kill(i)
        else:
            cluster.freeze(i, rng.uniform(4, 7))
        return False
    if fault.kind == "kill -9":
        proc.send_signal(signal.SIGKILL)
        return True
    if fault.kind == "SIGTERM":
        proc.send_signal(signal.SIGTERM)
        return True
    if fault.kind == "kill -9 child":
        child = child_of(proc.pid)
        if child is None:
            fault.moment += " (no child)"
        else:
            with contextlib.suppress(psutil.Error):
                child.kill()
        return False
    if fault.kind == "SIGSTOP":
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGSTOP)
            time.sleep(rng.uniform(1, 4))
            proc.send_signal(signal.SIGCONT)
        return False
    assert fault.kind == "outage" and pg is not None
    pg.down()
    try:
        time.sleep(rng.uniform(2, 6))
    finally:
        pg.up()
    return False


def judge(flow: Flow, checks: dict[str, Any], tally: Tally, made: list[Fault]) -> None:
    label = flow.root.name
    if checks["exit"] != 0:
        tally.problems.append(f"{label}: ended {checks['exit']}: {checks['out'][-600:]}")
    else:
        tally.finished += 1
    tally.survivors += checks["survivors"]
    # re-sent: a request for a step after its row said it finished
    done = flow.finished_at()
    mine = flow.mine()
    for step, ended in done.items():
        late = [r for r in mine if r.conversation == step and r.time > ended + 0.5]
        if late:
            tally.resent += 1
            what = ", ".join(f"{r.answer} turn {r.turn} +{r.time - ended:.1f}s" for r in late)
            tally.problems.append(f"{label}: {step} finished, then sent again: {what}")
    # re-run: a side effect twice
    effects = flow.ws / "effects.txt"
    lines = effects.read_text().split() if effects.exists() else []
    for step in flow.steps:
        count = lines.count(step)
        if count > 1:
            tally.rerun += 1
            tally.problems.append(f"{label}: {step}'s tool call ran {count} times")
        elif count == 0 and step in done:
            tally.unknown_effects += 1
    # lost: what lineage named at a fault is what the next request for the step carries
    for fault, named, seen in checks["lost"]:
        after = [r for r in flow.server.requests[seen:] if r.conversation]
        for step, sid in named.items():
            nxt = next((r for r in after if r.conversation == step), None)
            if nxt is not None and nxt.session_id != sid:
                tally.lost += 1
                msg = f"{label}: {step} named {sid[:8]}, continued in {str(nxt.session_id)[:8]}"
                fault.problems.append(msg)
    by_step: dict[str, list[Any]] = collections.defaultdict(list)
    for r in mine:
        by_step[str(r.conversation)].append(r)
    for step, reqs in by_step.items():
        sessions = list(dict.fromkeys(r.session_id for r in reqs))
        for sid in sessions[:-1]:
            if sum(1 for r in reqs if r.session_id == sid) >= 2:
                tally.lost += 1
                tally.problems.append(f"{label}: {step} left session {str(sid)[:8]} behind")
    for fault in made:
        tally.problems += [f"{label}: {fault.kind}: {p}" for p in fault.problems]
    tally.faults += made


def report(tally: Tally, args: argparse.Namespace, took: float) -> None:
    counts = collections.Counter((f.kind, f.moment.split(" ")[0]) for f in tally.faults)
    every = list(dict.fromkeys(KINDS + CLUSTER_KINDS))
    kinds = [k for k in every if any(f.kind == k for f in tally.faults)]
    print(
        f"chaos: seed {args.seed}"
        + (f" ({args.jobs} jobs side by side)" if args.jobs > 1 else "")
        + f", {len(tally.faults)} faults over {tally.flows} flows "
        f"({args.steps} steps each; {args.backends}), {took / 60:.1f} min"
    )
    head = f"{'fault':<16}" + "".join(f"{m:>9}" for m in MOMENTS) + f"{'total':>9}"
    print(head)
    for k in kinds:
        row = [counts[(k, m)] for m in MOMENTS]
        print(f"{k:<16}" + "".join(f"{c:>9}" for c in row) + f"{sum(row):>9}")
    by_backend = collections.Counter(f.backend for f in tally.faults)
    print("by backend: " + ", ".join(f"{b} {n}" for b, n in sorted(by_backend.items())))
    print(
        f"outcomes: flows finished {tally.finished}/{tally.flows}, finished steps re-sent "
        f"{tally.resent}, finished tool calls re-run {tally.rerun}, sessions lost "
        f"{tally.lost}, survivors {tally.survivors}"
        f" (tool calls cut off before their effect, told to the model: {tally.unknown_effects})"
    )
    for p in tally.problems[:20]:
        print(f"  ! {p}")
    print(f"chaos: {'PASS' if ok(tally) else 'FAIL'}")


def ok(tally: Tally) -> bool:
    return not tally.problems and tally.finished == tally.flows and not tally.survivors


def _stop(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # the finally blocks stop the flow and the servers


def side_by_side(args: argparse.Namespace) -> int:
    """``--jobs N``: N campaigns of their own (seeds SEED*100+1..N, the faults shared out),
    one table for all."""
    began = time.monotonic()
    parts = Path(tempfile.mkdtemp(prefix="flower-chaos-jobs-"))
    procs = []
    for i in range(args.jobs):
        share = args.faults // args.jobs + (1 if i < args.faults % args.jobs else 0)
        argv = [sys.executable, __file__, "--faults", str(share), "--seed"]
        argv += [str(args.seed * 100 + i + 1), "--backends", args.backends]
        argv += ["--steps", str(args.steps), "--per-flow", str(args.per_flow)]
        argv += ["--workers", str(args.workers)]
        argv += ["--json", str(parts / f"{i}.json")]
        if args.dsn:
            argv += ["--dsn", args.dsn]
        if args.progress:
            argv.append("--progress")
        if args.keep:
            argv.append("--keep")
        procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL))
    try:
        for proc in procs:
            proc.wait()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait()
    tally = Tally()
    for i in range(args.jobs):
        try:
            part = json.loads((parts / f"{i}.json").read_text(encoding="utf-8"))["tally"]
        except (OSError, ValueError, KeyError):
            tally.problems.append(f"job {i + 1} left no report")
            continue
        # which job a flow ran in (each numbers its flows from 0): "2:cluster-21"
        tally.faults += [Fault(**{**f, "job": i + 1}) for f in part.pop("faults")]
        tally.problems += [f"job {i + 1}: {p}" for p in part.pop("problems")]
        for name, value in part.items():
            setattr(tally, name, getattr(tally, name) + value)
    shutil.rmtree(parts, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"tally": asdict(tally)}, indent=1, default=str), encoding="utf-8"
        )
    report(tally, args, time.monotonic() - began)
    return 0 if ok(tally) else 1


@contextlib.contextmanager
def postgres(dsn: str | None, root: Path) -> Iterator[PgServer | None]:
    if dsn:
        yield None
        return
    with postgres_server(root / "pg", durable=False) as server:
        yield server


class Cluster:
    """A Temporal dev server and ``--workers`` workers on one queue, with the run state in
    one database (every cluster flow a workspace of it), as a team would run them."""

    def __init__(
        self, root: Path, temporal: TemporalServer, state: str, server: ModelServer, n: int
    ) -> None:
        self.root, self.temporal, self.state, self.server = root, temporal, state, server
        self.procs: list[subprocess.Popen[bytes]] = []
        self.started = 0
        for _ in range(n):
            self.procs.append(self._start())

    @property
    def placement(self) -> str:
        return f"temporal://{self.temporal.target}/{QUEUE}"

    def _start(self) -> subprocess.Popen[bytes]:
        self.started += 1
        home = self.root / f"worker-{self.started}"
        home.mkdir(parents=True, exist_ok=True)
        env = cli_env(home / "home", self.server.url, max_retries=None, extra={"FLOWER_LANG": "en"})
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env["FLOWER_STATE"] = self.state
        argv = ["flower-super", "worker", "--temporal", self.temporal.target, "--queue", QUEUE]
        with open(home / "worker.log", "wb") as log:
            proc = subprocess.Popen(
                argv,
                cwd=home,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        ready = wait_for(
            lambda: b"-- worker " in (home / "worker.log").read_bytes() or proc.poll() is not None,
            60,
        )
        if not ready or proc.poll() is not None:
            raise SystemExit(f"a worker did not start: {(home / 'worker.log').read_text()[-2000:]}")
        return proc

    def trees(self) -> set[int]:
        """Every process below a worker (and the workers)."""
        out: set[int] = set()
        for proc in self.procs:
            with contextlib.suppress(psutil.Error):
                out.add(proc.pid)
                out |= {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
        return out

    def running(self, ws: Path, rng: random.Random) -> tuple[int, bool]:
        """The worker running an attempt of the workspace ``ws`` (by its CLI's directory),
        else a random one: (its index, whether it is idle for this flow)."""
        for i, proc in enumerate(self.procs):
            with contextlib.suppress(psutil.Error):
                for c in psutil.Process(proc.pid).children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        if c.cwd() == str(ws):
                            return i, False
        return rng.randrange(len(self.procs)), True

    def kill(self, i: int) -> None:
        proc = self.procs[i]
        proc.kill()
        proc.wait()
        self.procs[i] = self._start()

    def freeze(self, i: int, seconds: float) -> None:
        try:
            tree = [psutil.Process(self.procs[i].pid)]
            tree += tree[0].children(recursive=True)
        except psutil.Error:
            return
        for p in tree:
            with contextlib.suppress(psutil.Error):
                p.suspend()
        time.sleep(seconds)
        for p in tree:
            with contextlib.suppress(psutil.Error):
                p.resume()

    def stop(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextlib.contextmanager
def cluster_of(
    backends: list[str],
    root: Path,
    pg: PgServer | None,
    dsn: str | None,
    server: ModelServer,
    workers: int,
) -> Iterator[Cluster | None]:
    if "cluster" not in backends:
        yield None
        return
    name = "chaos_cluster"
    if pg is not None:
        state = pg.create_database(name)
    else:
        import psycopg

        assert dsn is not None
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        state = dsn.rsplit("/", 1)[0] + f"/{name}"
    with temporal_server(root / "temporal") as temporal:
        made = Cluster(root / "cluster", temporal, state, server, workers)
        try:
            yield made
        finally:
            made.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--faults", type=int, default=40, help="faults in all (default 40)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--backends", default="local,postgres")
    ap.add_argument("--steps", type=int, default=3, help="steps per flow (default 3)")
    ap.add_argument("--per-flow", type=int, default=3, help="most faults in one flow")
    ap.add_argument("--workers", type=int, default=3, help="a cluster's workers (default 3)")
    ap.add_argument("--dsn", help="a PostgreSQL superuser URL (default: a server of its own)")
    ap.add_argument("--json", help="write every fault and its outcome here")
    ap.add_argument("--progress", action="store_true", help="one line on stderr per flow")
    ap.add_argument(
        "--keep",
        action="store_true",
        help="keep the campaign's directory (workspaces, workers' logs) to look into",
    )
    ap.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="campaigns side by side, each with its own servers and seed (default 1)",
    )
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    if args.jobs > 1:
        return side_by_side(args)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="flower-chaos-"))
    tally = Tally()
    began = time.monotonic()
    try:
        with (
            ModelServer(script(args.steps)) as server,
            postgres(args.dsn, root) as pg,
            cluster_of(backends, root, pg, args.dsn, server, args.workers) as cluster,
        ):
            n = 0
            while len(tally.faults) < args.faults:
                backend = backends[n % len(backends)]
                state = None
                if backend == "postgres":
                    name = f"chaos_{secrets.token_hex(4)}"
                    if pg is not None:
                        state = pg.create_database(name)
                    else:
                        import psycopg

                        with psycopg.connect(args.dsn, autocommit=True) as conn:
                            conn.execute(f"CREATE DATABASE {name}")
                        state = args.dsn.rsplit("/", 1)[0] + f"/{name}"
                placement = None
                if backend == "cluster":
                    assert cluster is not None
                    state, placement = cluster.state, cluster.placement
                flow = Flow(root, n, backend, server, state, args.steps, placement)
                faults = min(rng.randint(1, args.per_flow), args.faults - len(tally.faults))
                try:
                    made, checks = run_flow(flow, backend, n, faults, rng, pg, cluster)
                finally:  # stopped (Ctrl-C, SIGTERM) or not: the flow's processes go
                    if flow.proc is not None and flow.proc.poll() is None:
                        flow.proc.kill()
                    for p in flow.survivors():
                        with contextlib.suppress(psutil.Error):
                            p.kill()
                tally.flows += 1
                before = len(tally.problems)
                judge(flow, checks, tally, made)
                n += 1
                if args.progress:
                    for problem in tally.problems[before:]:
                        print(f"chaos: ! {problem}", file=sys.stderr, flush=True)
                    print(
                        f"chaos: {len(tally.faults)}/{args.faults} faults, {tally.flows} flows,"
                        f" {len(tally.problems)} problems, {(time.monotonic() - began) / 60:.1f}"
                        " min",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        took = time.monotonic() - began
        if args.json:
            Path(args.json).write_text(
                json.dumps({"tally": asdict(tally)}, indent=1, default=str), encoding="utf-8"
            )
        if args.keep:
            print(f"chaos: kept {root}", file=sys.stderr, flush=True)
        else:
            shutil.rmtree(root, ignore_errors=True)
    report(tally, args, took)
    return 0 if ok(tally) else 1


if __name__ == "__main__":
    raise SystemExit(main())
