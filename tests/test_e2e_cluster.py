"""Cluster drills (issue 19): the real flower-super, real ``flower-super worker`` processes on
a real Temporal dev server, the run state in a real PostgreSQL, the real CLI against the
scripted model server.

Workers are started as a person would start them (``flower-super worker --temporal HOST:PORT
--queue Q --state URL``), each with its own environment, as another machine would have:

- ``ANTHROPIC_CUSTOM_HEADERS`` (the CLI's own setting) makes every request a worker's CLI
  sends carry ``X-Flower-Test-Worker: <name>``, so the model server's request log says which
  worker asked;
- ``FLOWER_TEST_WORKER=<name>`` reaches the tool shells, so a side-effect file says which
  worker ran a Bash call;
- ``HOME`` and ``CLAUDE_CONFIG_DIR`` are the worker's own, so a takeover has only what
  PostgreSQL holds (never the CLI's local transcript of the worker that died);
- ``FLOWER_TEST_TAG`` is the worker's own, so "no process left from that worker's tree" is
  checked against the whole process table.

The supervisor is ``flower-super start`` with ``FLOWER_PLACEMENT=temporal://…/QUEUE`` and
``FLOWER_STATE`` set. Each test has its own task queue and database; every process a test
starts is reaped in teardown.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from flower.services.model_server import ModelServer
from tests.e2e import Flower, kill, tagged, wait_until

# Every test runs a three-step flow (or a map of 8) through Temporal with 2-3 worker
# processes, each importing the SDK (~2 s on a loaded 2-core machine), and waits out at
# least one heartbeat timeout (3 s) before a takeover.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

ABC = "tests.flows.cluster:abc"
SPREAD = "tests.flows.cluster:spread"
HOLD = 90  # seconds the scripted model "thinks" (once) so a drill can act mid-step
HEADER = "x-flower-test-worker"
WORKER_ENV = "FLOWER_TEST_WORKER"
TAG = "FLOWER_TEST_TAG"


# ---------------------------------------------------------------------------------------
# scripts
# ---------------------------------------------------------------------------------------


def bash(command: str) -> dict[str, Any]:
    return {"tool_use": {"name": "Bash", "input": {"command": command, "description": "test"}}}


def abc_script(b_turns: list[Any]) -> dict[str, Any]:
    return {
        "conversations": [
            {"name": "A", "match": {"marker": "[[A]]"}, "turns": [{"text": "A done."}]},
            {"name": "B", "match": {"marker": "[[B]]"}, "turns": b_turns},
            {"name": "C", "match": {"marker": "[[C]]"}, "turns": [{"text": "C done."}]},
        ]
    }


# B's first turn runs a Bash call that counts its runs (and says on which worker); its
# second waits HOLD seconds the first time it is asked: the drills act then.
COUNT = f"echo ${WORKER_ENV} >> b-ran.txt"
B_WAITS = [bash(COUNT), {"text": "B done.", "delay": HOLD, "times": 1}]


def sender(req: Any) -> str | None:
    """The worker whose CLI sent ``req`` (None: not a worker's CLI)."""
    for key, value in req.headers.items():
        if key.lower() == HEADER:
            return str(value)
    return None


def asked(server: ModelServer) -> list[Any]:
    return [r for r in server.requests if r.path == "/v1/messages"]


def block_types(req: Any) -> list[str]:
    return [
        str(b.get("type"))
        for m in req.messages
        if isinstance(m["content"], list)
        for b in m["content"]
    ]


def tool_use_ids(messages: list[dict[str, Any]]) -> set[str]:
    return {
        str(b["id"])
        for m in messages
        if isinstance(m.get("content"), list)
        for b in m["content"]
        if isinstance(b, dict) and b.get("type") == "tool_use"
    }


# ---------------------------------------------------------------------------------------
# the run state in PostgreSQL, read with plain SQL
# ---------------------------------------------------------------------------------------


class Db:
    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def query(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        import psycopg

        try:
            with psycopg.connect(self.dsn, connect_timeout=10) as conn:
                return list(conn.execute(sql, args).fetchall())
        except psycopg.errors.UndefinedTable:
            return []  # flower has not made its tables yet

    def lineage(self) -> dict[str, Any]:
        rows = self.query("SELECT steps FROM flower.lineage")
        return dict(rows[0][0]) if rows else {}

    def session_of(self, label: str) -> str | None:
        value = self.lineage().get(label)
        if isinstance(value, dict):
            value = value.get("session_id") or value.get("id")
        return str(value) if value else None

    def manifest(self) -> list[dict[str, Any]]:
        return [r for (r,) in self.query("SELECT row FROM flower.manifest ORDER BY id")]

    def rows(self, step: str) -> list[dict[str, Any]]:
        return [r for r in self.manifest() if r.get("step") == step]

    def entries(self, session_id: str) -> list[tuple[int, dict[str, Any]]]:
        found = self.query(
            "SELECT seq, data FROM flower.entries WHERE key LIKE %s ORDER BY seq",
            f"%/{session_id}",
        )
        return [(int(seq), json.loads(data)) for seq, data in found]

    def has_tool_result(self, session_id: str) -> bool:
        return any('"tool_result"' in json.dumps(e) for _, e in self.entries(session_id))

    def epoch(self, session_id: str) -> int:
        rows = self.query("SELECT epoch FROM flower.fence WHERE session_id = %s", session_id)
        return int(rows[0][0]) if rows else 0


# ---------------------------------------------------------------------------------------
# workers and the supervisor
# ---------------------------------------------------------------------------------------


class Worker:
    """One ``flower-super worker`` process, as another machine would run it."""

    def __init__(self, name: str, proc: subprocess.Popen[bytes], log: Path, tag: str) -> None:
        self.name, self.proc, self.log, self.tag = name, proc, log, tag

    def out(self) -> str:
        return self.log.read_text("utf-8", "replace") if self.log.exists() else ""

    def took(self, label: str) -> int:
        """How many tries of ``label`` this worker took (its "> LABEL  (run …" lines)."""
        return len(re.findall(rf"^> {re.escape(label)}  \(", self.out(), re.M))

    def tries(self, label: str) -> list[tuple[str, int]]:
        """(run, dispatch try) of every try of ``label`` this worker took."""
        found = re.findall(
            rf"^> {re.escape(label)}  \(run (\S+?),第 (\d+) 次派发\)", self.out(), re.M
        )
        return [(run, int(n)) for run, n in found]

    def attempt_tree(self) -> list[psutil.Process]:
        """What runs below the worker: its step children, their CLIs and tool shells."""
        try:
            return [
                p
                for p in psutil.Process(self.proc.pid).children(recursive=True)
                if p.status() != psutil.STATUS_ZOMBIE
            ]
        except psutil.Error:
            return []

    def survivors(self) -> list[psutil.Process]:
        """Every running process of this worker's tree, wherever it was reparented."""
        return tagged(self.tag)


class Cluster:
    """A flower workspace whose attempts run on workers of this test's own queue."""

    def __init__(self, f: Flower, target: str, queue: str, dsn: str, logs: Path) -> None:
        self.f, self.target, self.queue, self.dsn, self.logs = f, target, queue, dsn, logs
        self.db = Db(dsn)
        self.workers: list[Worker] = []
        logs.mkdir(parents=True, exist_ok=True)
        f.env.update({"FLOWER_STATE": dsn, "FLOWER_PLACEMENT": f"temporal://{target}/{queue}"})

    def worker(
        self,
        name: str,
        *,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        ready: bool = True,
        flags: tuple[str, ...] = (),
    ) -> Worker:
        """``flower-super worker`` with this machine's own environment (see the module
        docstring); waits for its ready line unless ``ready`` is False."""
        tag = f"{self.f.tag}-{name}"
        wenv = {k: v for k, v in self.f.env.items() if k not in ("FLOWER_PLACEMENT",)}
        home = self.f.root / f"home-{name}"  # its own CLI home: no transcript shared
        (home / ".claude").mkdir(parents=True, exist_ok=True, mode=0o700)
        wenv.update(
            {
                TAG: tag,
                WORKER_ENV: name,
                "ANTHROPIC_CUSTOM_HEADERS": f"X-Flower-Test-Worker: {name}",
                "HOME": str(home),
                "CLAUDE_CONFIG_DIR": str(home / ".claude"),
            }
        )
        wenv.update(env or {})
        log = self.logs / f"{name}.log"
        argv = self.f.argv(
            "worker", "--temporal", self.target, "--queue", self.queue, "--state", self.dsn, *flags
        )
        with open(log, "wb") as sink:  # the child writes it
            proc = subprocess.Popen(
                argv,
                cwd=cwd or self.f.root,
                env=wenv,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        w = Worker(name, proc, log, tag)
        self.workers.append(w)
        if ready:
            wait_until(
                lambda: "-- worker " in w.out() or proc.poll() is not None,
                60,
                f"worker {name} to be ready",
                interval=0.1,
            )
            assert proc.poll() is None, f"worker {name} exited: {w.out()}"
        return w

    def start(self, flow: str) -> subprocess.Popen[bytes]:
        return self.f.start(flow=flow)

    def running(self, label: str) -> Worker:
        """The worker that took ``label`` (waits for it)."""
        return wait_until(
            lambda: next((w for w in self.workers if w.took(label)), None),
            60,
            f"a worker to take {label}",
        )

    def logs_text(self) -> str:
        return "\n".join(f"--- {w.name}:\n{w.out()}" for w in self.workers)

    def stop(self) -> None:
        for w in self.workers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(w.proc.pid, signal.SIGCONT)
            if w.proc.poll() is None:
                w.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.proc.wait(timeout=10)
            for p in w.survivors():
                with contextlib.suppress(psutil.Error):
                    p.resume()
                    p.kill()


@pytest.fixture
def cluster(
    model_server: Callable[..., ModelServer],
    flower_env: Callable[..., Flower],
    temporal_target: str,
    temporal_queue: str,
    pg_dsn: str,
    tmp_path: Path,
) -> Iterator[Callable[[dict[str, Any]], Cluster]]:
    made: list[Cluster] = []

    def make(script: dict[str, Any], target: str | None = None) -> Cluster:
        f = flower_env(model_server(script))
        c = Cluster(f, target or temporal_target, temporal_queue, pg_dsn, tmp_path / "workers")
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()


def finish(c: Cluster, proc: subprocess.Popen[bytes], timeout: float = 120) -> str:
    """The supervisor's whole output once it exits (0 expected: the caller asserts it)."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        state = _how_it_is(proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGUSR1)  # its threads' stacks, on its stderr
            time.sleep(2)
        proc.kill()
        out, _ = proc.communicate(timeout=10)
        (c.logs / f"supervisor-{proc.pid}.out").write_bytes(out)
        raise AssertionError(
            f"the supervisor did not finish in {timeout}s ({state}):\n{out.decode()}\n"
            + c.logs_text()
        ) from None
    text = out.decode("utf-8", "replace")
    (c.logs / f"supervisor-{proc.pid}.out").write_text(text)  # kept with the workers' logs
    return text


def _how_it_is(pid: int) -> str:
    """A hung process, described: running or exited, its threads and children."""
    try:
        p = psutil.Process(pid)
        kids = ", ".join(f"{k.pid} {_cmd(k)}" for k in p.children(recursive=True))
        return f"{p.status()}, {p.num_threads()} threads, children: {kids or 'none'}"
    except psutil.Error as exc:
        return f"gone: {exc}"


def waiting_on(server: ModelServer, conversation: str, turn: int, timeout: float = 90) -> Any:
    return server.wait_for(
        lambda reqs: next(
            (r for r in reqs if r.conversation == conversation and r.turn == turn), None
        ),
        timeout=timeout,
    )


def no_tree_left(w: Worker, within: float = 10.0) -> None:
    """Nothing of the attempts ``w`` ran is still running (whatever it was reparented to)."""
    deadline = time.monotonic() + within
    while True:
        left = [p for p in w.survivors() if p.pid != w.proc.pid] + w.attempt_tree()
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not left, f"{w.name} left: " + ", ".join(f"{p.pid} {_cmd(p)}" for p in left)


def _cmd(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())[:120]
    except psutil.Error:
        return "?"


# ---------------------------------------------------------------------------------------
# 1. kill -9 of the worker running B while B waits on the model
# ---------------------------------------------------------------------------------------


def test_kill9_of_the_worker_running_b_hands_b_to_the_other_in_its_own_session(
    cluster: Callable[[dict[str, Any]], Cluster],
) -> None:
    c = cluster(abc_script(B_WAITS))
    server, f = c.f.server, c.f
    c.worker("W1")
    c.worker("W2")
    sup = c.start(ABC)
    held = waiting_on(server, "B", 1)
    victim = c.running("B")
    other = next(w for w in c.workers if w is not victim)
    assert sender(held) == victim.name
    sid = wait_until(lambda: c.db.session_of("B"), 10, "B's session in lineage")
    assert held.session_id == sid
    wait_until(lambda: c.db.has_tool_result(sid), 10, "B's tool result in PostgreSQL")
    killed_at = max(r.seq for r in server.requests)

    assert kill_worker(victim) == -signal.SIGKILL
    # No process of the killed worker's tree is left: its step child, CLI, tool shells.
    wait_until(lambda: not victim.survivors(), 10, f"{victim.name}'s tree to be gone")

    out = finish(c, sup)
    assert sup.returncode == 0, out + c.logs_text()
    # The terminal says where B went: the same session, carried on by the other worker.
    assert f"worker pid {other.proc.pid},第 2 次派发" in out, out
    after = [r for r in asked(server) if r.seq > killed_at]
    assert not [r for r in after if r.conversation == "A"], "A was sent to the model again"
    resumed = [r for r in after if r.conversation == "B"]
    assert resumed, "B was not continued"
    assert {r.session_id for r in resumed} == {sid}, "B's takeover is not B's own session"
    assert {sender(r) for r in resumed} == {other.name}, "B did not continue on the other worker"
    kinds = block_types(resumed[0])
    assert "tool_use" in kinds and "tool_result" in kinds, "B's earlier turns were not sent"
    assert (f.ws / "b-ran.txt").read_text().splitlines() == [victim.name], (
        "B's finished Bash call ran again"
    )
    assert [r.conversation for r in after if r.conversation == "C"] == ["C"], "C did not run"
    assert len([r for r in asked(server) if r.conversation == "A"]) == 1
    assert other.took("B") == 1 and victim.took("B") == 1
    assert [r["ok"] for r in c.db.rows("A")] == [True]
    assert [r["ok"] for r in c.db.rows("B")] == [True]
    assert [r["ok"] for r in c.db.rows("C")] == [True]
    assert c.db.session_of("B") == sid
    no_tree_left(victim)
    no_tree_left(other)
    assert other.proc.poll() is None, "the surviving worker died"


def kill_worker(w: Worker, sig: int = signal.SIGKILL) -> int:
    os.kill(w.proc.pid, sig)
    return w.proc.wait(timeout=30)


_ = kill  # tests.e2e's, for the supervisor


# ---------------------------------------------------------------------------------------
# 2. SIGSTOP of the worker running B, SIGCONT after the takeover
# ---------------------------------------------------------------------------------------

LATE = f"echo ${WORKER_ENV} >> b-late.txt"
FROZEN_ANSWER_S = 3  # B's second answer reaches the frozen worker's socket while it sleeps


def freeze(w: Worker) -> list[psutil.Process]:
    """SIGSTOP the worker and everything below it, as a frozen machine: what was stopped."""
    root = psutil.Process(w.proc.pid)
    root.suspend()
    tree = root.children(recursive=True)
    for p in tree:
        with contextlib.suppress(psutil.Error):
            p.suspend()
    return [root, *tree]


def test_a_frozen_worker_s_attempt_moves_and_on_waking_it_sends_nothing_writes_nothing_and_ends(
    cluster: Callable[[dict[str, Any]], Cluster],
) -> None:
    # B: a counted Bash call; then a second Bash call answered FROZEN_ANSWER_S late the
    # first time (so the frozen CLI has it waiting in its socket when it wakes), then done.
    late = {**bash(LATE), "delay": FROZEN_ANSWER_S, "times": 1}
    c = cluster(abc_script([bash(COUNT), late, {"text": "B done."}]))
    server, f = c.f.server, c.f
    c.worker("W1")
    c.worker("W2")
    sup = c.start(ABC)
    held = waiting_on(server, "B", 1)
    victim = c.running("B")
    other = next(w for w in c.workers if w is not victim)
    assert sender(held) == victim.name
    sid = wait_until(lambda: c.db.session_of("B"), 10, "B's session in lineage")
    wait_until(lambda: c.db.has_tool_result(sid), 10, "B's tool result in PostgreSQL")
    epoch = c.db.epoch(sid)
    frozen = freeze(victim)
    attempt = [p for p in frozen if p.pid != victim.proc.pid]
    assert attempt, "the frozen worker ran no attempt process"

    # The takeover: B's session continues on the other worker, which owns it now.
    waiting_on_from(server, "B", other.name)
    wait_until(lambda: c.db.epoch(sid) > epoch, 30, "the takeover to own B's session")
    took_over_at = max((seq for seq, _ in c.db.entries(sid)), default=0)
    woke_at = max(r.seq for r in server.requests)
    wait_until(
        lambda: time.time() > held.time + FROZEN_ANSWER_S + 0.5,
        30,
        "B's late answer to be sent to the frozen CLI",
        interval=0.1,
    )
    for p in frozen:
        with contextlib.suppress(psutil.Error):
            p.resume()

    # Its attempt's process tree is gone within seconds (the worker itself lives on).
    wait_until(lambda: not [p for p in attempt if alive(p)], 10, "the woken attempt's tree to end")
    # ... and reaped: the dead CLI the woken worker adopted as subreaper is no zombie of it
    wait_until(lambda: not zombies_of(victim), 10, "the woken worker to reap what it adopted")
    out = finish(c, sup)
    assert sup.returncode == 0, out + c.logs_text()

    assert out.count(LATE) == 1, out  # the terminal shows nothing of the woken attempt
    late_b = [r for r in asked(server) if r.seq > woke_at and r.conversation == "B"]
    assert not [r for r in late_b if sender(r) == victim.name], (
        "the frozen worker sent a request for B after it woke"
    )
    assert (f.ws / "b-ran.txt").read_text().splitlines() == [victim.name]
    assert (f.ws / "b-late.txt").read_text().splitlines() == [other.name], (
        "the woken worker ran B's second Bash call"
    )
    # The transcript holds the takeover's turns only: every tool_use it has is one the
    # model saw in the takeover's last request (the woken CLI's copy of B's second answer
    # carries ids of its own), and nothing after the takeover names another.
    last = [r for r in asked(server) if r.conversation == "B"][-1]
    assert sender(last) == other.name
    seen = tool_use_ids(last.messages)
    entries = c.db.entries(sid)
    stored = tool_use_ids([e.get("message") or {} for _, e in entries])
    assert stored == seen, f"entries not from the takeover: {sorted(stored - seen)}"
    after = [e for seq, e in entries if seq > took_over_at]
    assert after, "the takeover wrote nothing after it owned the session"
    assert tool_use_ids([e.get("message") or {} for e in after]) <= seen
    assert [r["ok"] for r in c.db.rows("B")] == [True]
    assert [r.conversation for r in asked(server) if r.conversation == "C"] == ["C"]
    no_tree_left(other)


def waiting_on_from(server: ModelServer, conversation: str, who: str, timeout: float = 90) -> Any:
    return server.wait_for(
        lambda reqs: next(
            (r for r in reqs if r.conversation == conversation and sender(r) == who), None
        ),
        timeout=timeout,
    )


def zombies_of(w: Worker) -> list[int]:
    """The dead children ``w``'s worker process has not reaped."""
    try:
        kids = psutil.Process(w.proc.pid).children(recursive=False)
    except psutil.Error:
        return []
    out = []
    for k in kids:
        with contextlib.suppress(psutil.Error):
            if k.status() == psutil.STATUS_ZOMBIE:
                out.append(k.pid)
    return out


def alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# ---------------------------------------------------------------------------------------
# 3. kill -9 of the supervisor while B runs on a worker
# ---------------------------------------------------------------------------------------

SUPERVISOR_GONE_S = 8  # B's second answer waits this long: the supervisor dies meanwhile


def activity_ids(target: str, queue: str) -> list[str]:
    """Every attempt dispatched on ``queue`` (Temporal's own list)."""
    import asyncio

    from temporalio.client import Client

    async def main() -> list[str]:
        client = await Client.connect(target)
        return [a.activity_id async for a in client.list_activities(f'TaskQueue="{queue}"')]

    return sorted(asyncio.run(main()))


def activity_closed(target: str, activity_id: str) -> bool:
    """Has Temporal closed this attempt (completed, failed, cancelled: not running)?"""
    import asyncio

    from temporalio.client import ActivityExecutionStatus, Client

    async def main() -> bool:
        client = await Client.connect(target)
        d = await client.get_activity_handle(activity_id).describe()
        return bool(d.status != ActivityExecutionStatus.RUNNING)

    return asyncio.run(main())


def test_kill9_of_the_supervisor_leaves_b_running_and_the_same_command_reattaches(
    cluster: Callable[[dict[str, Any]], Cluster],
) -> None:
    slow = {"text": "B done.", "delay": SUPERVISOR_GONE_S, "times": 1}
    c = cluster(abc_script([bash(COUNT), slow]))
    server, f = c.f.server, c.f
    c.worker("W1")
    c.worker("W2")
    sup = c.start(ABC)
    held = waiting_on(server, "B", 1)
    runner = c.running("B")
    sid = wait_until(lambda: c.db.session_of("B"), 10, "B's session in lineage")
    wait_until(lambda: c.db.has_tool_result(sid), 10, "B's tool result in PostgreSQL")
    cli = [p for p in runner.attempt_tree() if p.name() == "claude"]
    assert cli, f"no CLI under {runner.name}"

    assert kill(sup) == -signal.SIGKILL
    f.assert_no_survivors(within=5.0)  # the supervisor's own processes (workers are tagged apart)
    # B's conversation goes on where it runs: the same CLI, still waiting on its answer.
    assert all(alive(p) for p in cli), "B's CLI died with the supervisor"

    assert not re.search(r"^\+ B ", runner.out(), re.M), "B ended before the re-attach"
    again = c.start(ABC)  # the same command
    out = finish(c, again)
    assert again.returncode == 0, out + c.logs_text()
    # It re-attached: it shows B where it runs, from its first tool call to its answer.
    assert f"worker pid {runner.proc.pid})" in out and "B done." in out, out
    assert "* Bash  " + COUNT in out, out
    b = [r for r in asked(server) if r.conversation == "B"]
    assert [r.turn for r in b] == [0, 1], "B was asked again: its first attempt is not the only one"
    assert {r.session_id for r in b} == {sid} and {sender(r) for r in b} == {runner.name}
    assert b[1].seq == held.seq
    assert sum(w.took("B") for w in c.workers) == 1
    assert (f.ws / "b-ran.txt").read_text().splitlines() == [runner.name]
    assert len([r for r in asked(server) if r.conversation == "A"]) == 1, "A was sent again"
    assert [r.conversation for r in asked(server) if r.conversation == "C"] == ["C"]
    rows = c.db.rows("B")
    assert [r["ok"] for r in rows] == [True], rows
    ids = activity_ids(c.target, c.queue)
    assert len([i for i in ids if i.endswith("/B/1")]) == 1, ids
    assert not [i for i in ids if "/B/" in i and not i.endswith("/B/1")], ids
    for w in c.workers:
        no_tree_left(w)


# ---------------------------------------------------------------------------------------
# 4. a map over 8 items on 3 workers, one of them killed in the middle
# ---------------------------------------------------------------------------------------

ITEMS = 8
ITEM_S = 4  # each item's second answer waits this long the first time: time to kill in


def spread_script(delay: float = ITEM_S) -> dict[str, Any]:
    return {
        "conversations": [
            {
                "name": f"M{i}",
                "match": {"marker": f"[[M{i}]]"},
                "turns": [
                    bash(f"echo ${WORKER_ENV} >> m{i}.txt"),
                    {"text": f"M{i} done.", "delay": delay, "times": 1},
                ],
            }
            for i in range(ITEMS)
        ]
    }


def second_item(reqs: list[Any]) -> tuple[str, str] | None:
    """(worker, conversation) of the first worker whose second item waits on the model."""
    seen: dict[str, list[str]] = {}
    for r in reqs:
        who, conv = sender(r), r.conversation or ""
        if who and conv.startswith("M") and r.turn == 1 and conv not in seen.get(who, []):
            seen.setdefault(who, []).append(conv)
            if len(seen[who]) == 2:
                return who, conv
    return None


def test_a_map_spreads_over_workers_and_a_killed_worker_s_item_finishes_elsewhere(
    cluster: Callable[[dict[str, Any]], Cluster],
) -> None:
    c = cluster(spread_script())
    server, f = c.f.server, c.f
    for name in ("W1", "W2", "W3"):
        c.worker(name)
    sup = c.start(SPREAD)
    who, conv = server.wait_for(second_item, timeout=120)
    victim = next(w for w in c.workers if w.name == who)
    item = int(conv[1:])
    sid = wait_until(lambda: c.db.session_of(f"M[{item}]"), 10, f"M[{item}]'s session")
    wait_until(lambda: c.db.has_tool_result(sid), 10, f"M[{item}]'s tool result")
    killed_at = max(r.seq for r in server.requests)
    assert kill_worker(victim) == -signal.SIGKILL
    wait_until(lambda: not victim.survivors(), 10, f"{victim.name}'s tree to be gone")

    out = finish(c, sup)
    assert sup.returncode == 0, out + c.logs_text()
    reqs = asked(server)
    for i in range(ITEMS):
        mine = [r for r in reqs if r.conversation == f"M{i}"]
        assert [r.turn for r in mine if r.turn == 0] == [0], f"M{i} started more than once"
        assert len({r.session_id for r in mine}) == 1, f"M{i} ran in more than one session"
        assert len((f.ws / f"m{i}.txt").read_text().splitlines()) == 1, f"M{i}'s Bash ran twice"
    sessions = {r.session_id for r in reqs if (r.conversation or "").startswith("M")}
    assert len(sessions) == ITEMS, "two items shared a session"
    assert len({sender(r) for r in reqs if r.turn == 0}) > 1, "every item ran on one worker"
    # The killed worker's item finished on another worker, continuing its own session.
    resumed = [r for r in reqs if r.seq > killed_at and r.conversation == conv]
    assert resumed and {r.session_id for r in resumed} == {sid}
    assert victim.name not in {sender(r) for r in resumed}
    kinds = block_types(resumed[0])
    assert "tool_use" in kinds and "tool_result" in kinds, "the item's earlier turns were lost"
    assert (f.ws / f"m{item}.txt").read_text().splitlines() == [victim.name]
    rows = {r["step"]: r for r in c.db.manifest()}
    assert all(rows[f"M[{i}]"]["ok"] for i in range(ITEMS)), rows
    for w in c.workers:
        if w is not victim:
            no_tree_left(w)


# ---------------------------------------------------------------------------------------
# 5. workers that cannot run the attempt hand it back
# ---------------------------------------------------------------------------------------


def refusals(w: Worker) -> list[str]:
    return [line for line in w.out().splitlines() if line.startswith("! ")]


def test_a_worker_that_cannot_see_the_workspace_or_import_the_flow_hands_the_attempt_back(
    cluster: Callable[[dict[str, Any]], Cluster], tmp_path: Path
) -> None:
    c = cluster(abc_script([bash(COUNT), "B done."]))
    server, f = c.f.server, c.f
    elsewhere = tmp_path / "not-here"
    # A machine where the workspace is not (mapped to a path that does not exist there)...
    blind = c.worker("BLIND", flags=("--map", f"{f.ws}={elsewhere}"))
    # ... one where that path is another directory (not the workspace the attempt is of)...
    other = tmp_path / "other-checkout"
    other.mkdir()
    wrong = c.worker("WRONG", flags=("--map", f"{f.ws}={other}"))
    # ... and one where the flow's package is not installed.
    lost = c.worker("NOFLOW", env={"PYTHONPATH": ""})
    sup = c.start(ABC)
    wait_until(
        lambda: refusals(blind) and refusals(wrong) and refusals(lost),
        60,
        "the three workers to refuse A",
    )
    assert not asked(server), "an attempt ran on a worker that cannot run it"
    # The one that can reaches the workspace under another path (a mount elsewhere).
    mount = tmp_path / "mnt-ws"
    mount.symlink_to(f.ws)
    good = c.worker("OK", flags=("--map", f"{f.ws}={mount}"))
    wait_until(lambda: good.took("A"), 60, "the worker that can run A to take it")
    # Shown: A was handed back until it reached a worker that can run it. The others stop
    # now (SIGTERM: they run nothing), so B and C need not bounce off them as well.
    for w in (blind, wrong, lost):
        w.proc.send_signal(signal.SIGTERM)
    for w in (blind, wrong, lost):
        assert w.proc.wait(timeout=30) == 0, w.out()

    out = finish(c, sup)
    assert sup.returncode == 0, out + c.logs_text()
    assert {sender(r) for r in asked(server)} == {good.name}
    assert f"(worker pid {good.proc.pid})" in out, out  # where it runs, said plainly
    assert "原来的 worker 没了" not in out, "a handed-back attempt was shown as a takeover"
    assert good.took("A") == good.took("B") == good.took("C") == 1
    refused = ((blind, str(elsewhere)), (wrong, str(other)), (lost, "tests.flows.cluster"))
    for w, why in refused:
        said = [line for line in w.out().splitlines() if not line.startswith("-- ")]
        assert said and said == refusals(w), f"{w.name} said more than one line each:\n{w.out()}"
        assert all(why in line for line in said), said
        assert not w.took("A") and "Traceback" not in w.out()
    assert not elsewhere.exists(), "something ran in a directory that is not the workspace"
    assert not list(other.iterdir()), "something ran in a directory that is not the workspace"
    assert (f.ws / "b-ran.txt").read_text().splitlines() == [good.name]


# ---------------------------------------------------------------------------------------
# 6. no API key in Temporal
# ---------------------------------------------------------------------------------------


def test_no_api_key_reaches_any_temporal_payload_or_history(
    cluster: Callable[[dict[str, Any]], Cluster], tmp_path: Path
) -> None:
    """A Temporal server of this test's own, so its whole database can be read; a run with a
    takeover (a killed worker), so attempts, heartbeats and a failure are all in it."""
    import asyncio
    import secrets

    from temporalio.client import Client

    from flower.services.temporal import start_temporal

    key = f"sk-ant-api03-{secrets.token_hex(16)}"
    server_t = start_temporal(tmp_path / "temporal")
    try:
        c = cluster(abc_script(B_WAITS), target=server_t.target)
        c.f.env["ANTHROPIC_API_KEY"] = key  # the supervisor's machine and every worker's
        c.worker("W1")
        c.worker("W2")
        sup = c.start(ABC)
        waiting_on(c.f.server, "B", 1)
        victim = c.running("B")
        sid = wait_until(lambda: c.db.session_of("B"), 10, "B's session in lineage")
        wait_until(lambda: c.db.has_tool_result(sid), 10, "B's tool result in PostgreSQL")
        kill_worker(victim)
        out = finish(c, sup)
        assert sup.returncode == 0, out + c.logs_text()

        async def everything() -> dict[str, list[Any]]:
            """Every payload Temporal keeps of each attempt this run dispatched."""
            client = await Client.connect(server_t.target)
            seen: dict[str, list[Any]] = {}
            async for a in client.list_activities(f'TaskQueue="{c.queue}"'):
                d = await client.get_activity_handle(a.activity_id).describe(
                    include_input=True,
                    include_outcome=True,
                    include_heartbeat_details=True,
                    include_last_failure=True,
                )
                seen[a.activity_id] = [
                    d.attempt,
                    await d.input(),
                    await d.heartbeat_details(),
                    await d.result(),
                    str(await d.outcome_failure()),
                    str(d.raw_info),  # the whole description, last failure included
                ]
            return seen

        seen = asyncio.run(everything())
        assert sorted(i.rsplit("/", 2)[-2] for i in seen) == ["A", "B", "C"], seen
        attempts = {i.rsplit("/", 2)[-2]: v[0] for i, v in seen.items()}
        assert attempts["B"] == 2, seen  # the takeover is in what was read
        text = json.dumps(seen, default=str, ensure_ascii=False)
        # the orders themselves were read (ids and references: B's prompt is not in them)
        assert '"call": {"label": "B"}' in text, text
        assert key not in text and key[-20:] not in text, "the API key is in an attempt"
        stored = server_t.stored_bytes()
        assert c.queue.encode() in stored  # what was read is this run's
        assert key.encode() not in stored, "the API key is in Temporal's database"
        assert key[-20:].encode() not in stored
    finally:
        server_t.stop()


# ---------------------------------------------------------------------------------------
# beyond the six: a worker killed while B's tool runs; SIGTERM of the supervisor
# ---------------------------------------------------------------------------------------

SLOW_TOOL = (
    f"echo ${WORKER_ENV} >> tool-started.txt; "
    "python3 -c \"import pathlib,time; pathlib.Path('tool.running').touch(); time.sleep(300)\""
)


def test_kill9_of_the_worker_while_b_s_tool_runs_tells_the_takeover_its_effect_is_unknown(
    cluster: Callable[[dict[str, Any]], Cluster],
) -> None:
    from flower.state.ledger import NOT_FINISHED_TEXT

    c = cluster(abc_script([bash(SLOW_TOOL), {"text": "B done."}]))
    server, f = c.f.server, c.f
    c.worker("W1")
    c.worker("W2")
    sup = c.start(ABC)
    wait_until(lambda: (f.ws / "tool.running").exists(), 90, "B's slow tool to start")
    victim = c.running("B")
    other = next(w for w in c.workers if w is not victim)
    sid = wait_until(lambda: c.db.session_of("B"), 10, "B's session in lineage")
    killed_at = max(r.seq for r in server.requests)
    assert kill_worker(victim) == -signal.SIGKILL
    # The tool's own python process goes with the worker's tree.
    wait_until(lambda: not victim.survivors(), 10, f"{victim.name}'s tree to be gone")

    out = finish(c, sup)
    assert sup.returncode == 0, out + c.logs_text()
    resumed = [r for r in asked(server) if r.seq > killed_at and r.conversation == "B"]
    assert resumed and {r.session_id for r in resumed} == {sid}
    assert {sender(r) for r in resumed} == {other.name}
    assert not [r for r in asked(server) if r.answer == "rejected"], "a tool_use went unanswered"
    results = [
        b
        for m in resumed[0].messages
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result"
    ]
    assert any(NOT_FINISHED_TEXT in json.dumps(b, ensure_ascii=False) for b in results), results
    assert (f.ws / "tool-started.txt").read_text().splitlines() == [victim.name], (
        "the interrupted tool call was run again"
    )
    assert [r.conversation for r in asked(server) if r.conversation == "C"] == ["C"]
    no_tree_left(other)


# SIGHUP takes the very same path in the supervisor (SignalDesk.on_fatal); measured passing
# too, left out to keep the file's time down.
@pytest.mark.parametrize("sig", [signal.SIGTERM], ids=["SIGTERM"])
def test_sigterm_or_sighup_of_the_supervisor_stops_b_on_its_worker_and_the_next_run_continues(
    cluster: Callable[[dict[str, Any]], Cluster], sig: int
) -> None:
    c = cluster(abc_script(B_WAITS))
    server, f = c.f.server, c.f
    c.worker("W1")
    c.worker("W2")
    sup = c.start(ABC)
    waiting_on(server, "B", 1)
    runner = c.running("B")
    sid = wait_until(lambda: c.db.session_of("B"), 10, "B's session in lineage")
    wait_until(lambda: c.db.has_tool_result(sid), 10, "B's tool result in PostgreSQL")
    tree = runner.attempt_tree()
    assert tree, f"no attempt under {runner.name}"

    assert kill(sup, sig) == -sig  # died of the signal: a shell sees 128+n
    # Its attempt on the worker is stopped too: the worker ends the attempt's whole tree,
    # and the attempt is over in Temporal (never retried on a worker with nobody to follow).
    wait_until(lambda: not [p for p in tree if alive(p)], 15, "B's tree on its worker to end")
    # ... and says so (its line comes just after the tree has ended)
    wait_until(lambda: re.search(r"^x B ", runner.out(), re.M), 10, f"{runner.name}'s line")
    (first,) = [i for i in activity_ids(c.target, c.queue) if "/B/" in i]
    wait_until(lambda: activity_closed(c.target, first), 15, "B's attempt to close in Temporal")
    rows = c.db.rows("B")
    assert [(r["ok"], r["error"]) for r in rows] == [(False, "killed-by-signal")], rows
    assert rows[0]["session_id"] == sid
    f.assert_no_survivors(within=5.0)

    again = c.start(ABC)
    out = finish(c, again)
    assert again.returncode == 0, out + c.logs_text()
    b = [r for r in asked(server) if r.conversation == "B"]
    assert {r.session_id for r in b} == {sid}, "B did not continue its own session"
    assert (f.ws / "b-ran.txt").read_text().splitlines() == [runner.name]
    assert [r["error"] for r in c.db.rows("B")] == ["killed-by-signal", None]
    assert len([r for r in asked(server) if r.conversation == "A"]) == 1
    old_run = first.split("/")[1]
    stopped = [t for w in c.workers for t in w.tries("B") if t[0] == old_run]
    assert len(stopped) == 1, f"the stopped attempt was tried again: {stopped}"
    for w in c.workers:
        no_tree_left(w)


def test_sigterm_of_a_supervisor_that_had_not_heard_b_s_session_keeps_it(
    cluster: Callable[[dict[str, Any]], Cluster],
) -> None:
    """The supervisor is frozen as a worker takes B, so the frame naming B's session
    waits in PostgreSQL while B's tool call runs; SIGTERM then: lineage names B's session
    all the same, and the next run continues it, the tool call not run again."""
    c = cluster(abc_script(B_WAITS))
    server, f = c.f.server, c.f
    c.worker("W1")
    c.worker("W2")
    sup = c.start(ABC)
    c.running("B")  # a worker took B ...
    os.kill(sup.pid, signal.SIGSTOP)  # ... and the supervisor hears nothing more of it
    try:
        waiting_on(server, "B", 1)  # B's tool call has run, its next answer is held
        frames = wait_until(
            lambda: [
                json.loads(e["line"])
                for (e,) in c.db.query(
                    "SELECT event FROM flower.events WHERE run LIKE %s ORDER BY pos",
                    "attempt/%/B/%/up",
                )
                if '"type":"session"' in e["line"]
            ],
            10,
            "B's session frame in PostgreSQL",
        )
        sid = frames[-1]["session_id"]
        assert c.db.session_of("B") is None, "the frozen supervisor wrote lineage"
        os.kill(sup.pid, signal.SIGTERM)
    finally:
        os.kill(sup.pid, signal.SIGCONT)
    assert sup.wait(timeout=60) == -signal.SIGTERM
    assert c.db.session_of("B") == sid
    f.assert_no_survivors(within=15.0)

    again = c.start(ABC)
    out = finish(c, again)
    assert again.returncode == 0, out + c.logs_text()
    b = [r for r in asked(server) if r.conversation == "B"]
    assert {r.session_id for r in b} == {sid}, "B did not continue its own session"
    assert len((f.ws / "b-ran.txt").read_text().splitlines()) == 1, "B's tool call ran again"
    for w in c.workers:
        no_tree_left(w)


WORKER_TERM_S = 6  # B's second answer waits this long: the worker is told to stop meanwhile


def test_sigterm_of_a_worker_finishes_b_where_it_runs_and_takes_nothing_more(
    cluster: Callable[[dict[str, Any]], Cluster],
) -> None:
    slow = {"text": "B done.", "delay": WORKER_TERM_S, "times": 1}
    c = cluster(abc_script([bash(COUNT), slow]))
    server, f = c.f.server, c.f
    c.worker("W1")
    c.worker("W2")
    sup = c.start(ABC)
    held = waiting_on(server, "B", 1)
    runner = c.running("B")
    other = next(w for w in c.workers if w is not runner)
    runner.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: "SIGTERM" in runner.out(), 10, f"{runner.name} to say it stops")
    assert runner.proc.wait(timeout=60) == 0, runner.out()  # once B is done
    assert re.search(r"^\+ B  ok", runner.out(), re.M), runner.out()

    out = finish(c, sup)
    assert sup.returncode == 0, out + c.logs_text()
    b = [r for r in asked(server) if r.conversation == "B"]
    assert [r.turn for r in b] == [0, 1] and b[1].seq == held.seq, "B was not finished in place"
    assert {sender(r) for r in b} == {runner.name}
    assert (f.ws / "b-ran.txt").read_text().splitlines() == [runner.name]
    assert {sender(r) for r in asked(server) if r.conversation == "C"} == {other.name}
    assert [r["ok"] for r in c.db.rows("B")] == [True]
    wait_until(lambda: not runner.survivors(), 10, f"{runner.name}'s processes to end")
    no_tree_left(other)


def test_kill9_of_the_supervisor_while_a_waits_for_a_worker_dispatches_a_once(
    cluster: Callable[[dict[str, Any]], Cluster],
) -> None:
    """A supervisor killed while its attempt waits in the queue (no worker has taken it, so
    no worker said where it runs): the same command again attaches to that attempt instead
    of dispatching A a second time (it used to: A ran twice, in two sessions)."""
    c = cluster(abc_script([bash(COUNT), "B done."]))
    server = c.f.server
    sup = c.start(ABC)  # no worker yet: A waits in the queue
    wait_until(lambda: activity_ids(c.target, c.queue), 60, "A to be dispatched", interval=0.2)
    assert kill(sup) == -signal.SIGKILL
    again = c.start(ABC)  # the same command
    c.worker("W1")
    out = finish(c, again)
    assert again.returncode == 0, out + c.logs_text()
    a = [r for r in asked(server) if r.conversation == "A"]
    assert len(a) == 1, f"A was dispatched twice: {activity_ids(c.target, c.queue)}"
    ids = [i for i in activity_ids(c.target, c.queue) if "/A/" in i]
    assert len(ids) == 1, ids
    assert [r["ok"] for r in c.db.rows("A")] == [True]
    assert (c.f.ws / "b-ran.txt").read_text().splitlines() == ["W1"]


def test_sigterm_of_the_supervisor_while_a_waits_for_a_worker_leaves_nothing_to_run(
    cluster: Callable[[dict[str, Any]], Cluster],
) -> None:
    """The supervisor stopped while its attempt waits in the queue: a worker that takes it
    later runs nothing of it (no model request, no tool) and the attempt closes."""
    c = cluster(abc_script([bash(COUNT), "B done."]))
    server = c.f.server
    sup = c.start(ABC)  # no worker yet: A waits in the queue
    (first,) = wait_until(lambda: activity_ids(c.target, c.queue), 60, "A's dispatch", 0.2)
    assert kill(sup, signal.SIGTERM) == -signal.SIGTERM
    w = c.worker("W1")
    wait_until(lambda: activity_closed(c.target, first), 30, "A's attempt to close")
    wait_until(lambda: not w.attempt_tree(), 10, "the worker's attempt processes to end")
    assert not asked(server), "a stopped supervisor's attempt reached the model"
    assert [r["error"] for r in c.db.rows("A")] == ["killed-by-signal"]


def test_kill9_of_the_supervisor_mid_map_the_same_command_attaches_to_every_item(
    cluster: Callable[[dict[str, Any]], Cluster],
) -> None:
    """Items done, running and queued when the supervisor dies: the same command again
    reuses the done ones and attaches to the others; no item is dispatched or started twice."""
    c = cluster(spread_script(delay=1))  # no kill on a clock here: items may be quick
    server, f = c.f.server, c.f
    workers = [c.worker("W1"), c.worker("W2")]
    sup = c.start(SPREAD)
    wait_until(
        lambda: sum(w.out().count("\n+ M[") for w in workers) >= 2,
        120,
        "two items to finish",
        interval=0.1,
    )
    assert kill(sup) == -signal.SIGKILL
    f.assert_no_survivors(within=5.0)

    again = c.start(SPREAD)
    out = finish(c, again)
    assert again.returncode == 0, out + c.logs_text()
    reqs = asked(server)
    for i in range(ITEMS):
        mine = [r for r in reqs if r.conversation == f"M{i}"]
        assert [r.turn for r in mine] == [0, 1], f"M{i} was asked {[r.turn for r in mine]}"
        assert len({r.session_id for r in mine}) == 1, f"M{i} ran in more than one session"
        assert len((f.ws / f"m{i}.txt").read_text().splitlines()) == 1, f"M{i}'s Bash ran twice"
    ids = activity_ids(c.target, c.queue)
    assert len(ids) == ITEMS, f"items dispatched twice: {ids}"
    assert sum(len(w.tries(f"M[{i}]")) for w in workers for i in range(ITEMS)) == ITEMS
    for w in workers:
        no_tree_left(w)


def b_ran_once_on_w1(c: Cluster) -> None:
    """B was asked the model twice (its tool call, its answer) and its tool ran once, on W1."""
    b = [r for r in asked(c.f.server) if r.conversation == "B"]
    assert [r.turn for r in b] == [0, 1], f"B was asked {[r.turn for r in b]}"
    assert (c.f.ws / "b-ran.txt").read_text().splitlines() == ["W1"]


def blocked_on_the_manifest(c: Cluster, but: int = 0, timeout: float = 60) -> int:
    """The PostgreSQL backend (pid) whose write of a manifest row waits on our lock (not
    ``but``, one already terminated that may still be on its way out)."""
    sql = (
        "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        """ AND query LIKE '%%INTO "flower".manifest%%' AND pid <> %s"""
    )
    return int(wait_until(lambda: c.db.query(sql, but), timeout, "a manifest write")[0][0])


def test_kill9_of_supervisors_between_b_s_result_and_its_row_takes_b_s_result_once(
    cluster: Callable[[dict[str, Any]], Cluster],
) -> None:
    """The supervisor has B's result from its worker and dies before B's manifest row is in
    PostgreSQL (here the row's write waits on a lock the test holds); the next start dies
    too, before it reaches B. The third takes B's result from its ended attempt: B is not
    asked again, its tool not run again, its attempt not dispatched again (once, in CI, the
    first half of this made a map item's session go on for a third request)."""
    import psycopg

    c = cluster(abc_script([bash(COUNT), {"text": "B done.", "delay": 3, "times": 1}]))
    server, f = c.f.server, c.f
    runner = c.worker("W1")
    sup = c.start(ABC)
    waiting_on(server, "B", 1)  # B's last answer is 3 s away
    with psycopg.connect(c.dsn) as lock:
        lock.execute("LOCK TABLE flower.manifest IN EXCLUSIVE MODE")  # writes wait; reads go
        first = blocked_on_the_manifest(c)  # B's result came: its row waits
        assert kill(sup) == -signal.SIGKILL
        # The machine is gone: its write never lands (PostgreSQL would finish it otherwise).
        c.db.query("SELECT pg_terminate_backend(%s)", first)
        wait_until(lambda: re.search(r"^\+ B ", runner.out(), re.M), 10, "B's end on W1")
        second = c.start(ABC)
        writer = blocked_on_the_manifest(c, but=first)  # A's reuse row: before it reaches B
        assert kill(second) == -signal.SIGKILL
        c.db.query("SELECT pg_terminate_backend(%s)", writer)
        lock.rollback()
    f.assert_no_survivors(within=5.0)

    third = c.start(ABC)
    out = finish(c, third)
    assert third.returncode == 0, out + c.logs_text()
    b_ran_once_on_w1(c)
    assert [r["ok"] for r in c.db.rows("B")] == [True], c.db.rows("B")
    assert len([i for i in activity_ids(c.target, c.queue) if "/B/" in i]) == 1
    assert runner.took("B") == 1
    assert [r.conversation for r in asked(server) if r.conversation == "C"] == ["C"]
    no_tree_left(runner)


RESULT_FRAME = """event->>'line' LIKE '%%"type":"result"%%'"""  # an attempt's result frame, in SQL


def test_temporal_keeps_ids_only_no_prompt_answer_or_tool_output(
    cluster: Callable[[dict[str, Any]], Cluster], tmp_path: Path
) -> None:
    """A run on a Temporal server of this test's own: afterwards, none of its prompts, the
    agent's instructions, the model's answers or a tool's output is anywhere in that
    server's files (its database and write-ahead log), while they are in PostgreSQL and the
    server's files do hold the run's activity ids (the search looks in the right place)."""
    from flower.services.temporal import temporal_server

    answer, tool_out = "ANSWER-7q1x", "TOOLOUT-k2p9"
    script = {
        "conversations": [
            {"name": "A", "match": {"marker": "[[A]]"}, "turns": [{"text": f"A {answer}."}]},
            {
                "name": "B",
                "match": {"marker": "[[B]]"},
                "turns": [bash(f"echo {tool_out}"), {"text": "B done."}],
            },
            {"name": "C", "match": {"marker": "[[C]]"}, "turns": [{"text": "C done."}]},
        ]
    }
    secret = [b"do the first thing", answer.encode(), tool_out.encode(), b"test agent"]
    with temporal_server(tmp_path / "temporal") as temporal:
        c = cluster(script)
        c = Cluster(c.f, temporal.target, c.queue, c.dsn, tmp_path / "own-workers")
        try:
            c.worker("W1")
            sup = c.start(ABC)
            out = finish(c, sup)
            assert sup.returncode == 0, out + c.logs_text()
            assert [r["ok"] for r in c.db.manifest()] == [True, True, True], out
            held = temporal.stored_bytes()
        finally:
            c.stop()
    run = c.db.manifest()[0]["run"]
    assert f"flower/{run}/A/1".encode() in held, "the search did not see this run's activities"
    # the texts did travel, through PostgreSQL: the B prompt carries A's answer, the
    # tool's output is in B's transcript
    in_pg = json.dumps(c.db.query("SELECT data FROM flower.entries"), ensure_ascii=False)
    assert answer in in_pg and tool_out in in_pg
    found = [m.decode() for m in secret if m in held]
    assert not found, f"Temporal's own files hold {found}"


def test_a_worker_killed_after_sending_b_s_result_leaves_its_takeover_nothing_to_run(
    cluster: Callable[[dict[str, Any]], Cluster], tmp_path: Path
) -> None:
    """W1 sends B's result and dies before Temporal hears that B's attempt ended (a Temporal
    server of this test's own is frozen from B's last answer until W1 is killed). Temporal
    hands B to W2: W2 finds the result in B's mailbox and runs nothing (it used to continue
    B's finished session: one more request, and B's work again beside C's)."""
    from flower.services.temporal import temporal_server

    ended = f"SELECT count(*) FROM flower.events WHERE run LIKE %s AND {RESULT_FRAME}"
    with temporal_server(tmp_path / "temporal") as temporal:
        c = cluster(abc_script([bash(COUNT), {"text": "B done.", "delay": 2, "times": 1}]))
        c = Cluster(c.f, temporal.target, c.queue, c.dsn, tmp_path / "own-workers")
        server = c.f.server
        try:
            w1 = c.worker("W1")
            sup = c.start(ABC)
            waiting_on(server, "B", 1)  # B's last answer is 2 s away
            os.killpg(temporal.pid, signal.SIGSTOP)
            try:
                wait_until(lambda: c.db.query(ended, "attempt/%/B/%/up")[0][0], 30, "B's end")
                kill_worker(w1)
            finally:
                os.killpg(temporal.pid, signal.SIGCONT)
            w2 = c.worker("W2")
            out = finish(c, sup)
            assert sup.returncode == 0, out + c.logs_text()
            wait_until(lambda: w2.took("B"), 60, "B's takeover on W2")
            wait_until(lambda: re.search(r"^[=+] B ", w2.out(), re.M), 60, "W2 to end B")
        finally:
            c.stop()
    assert re.search(r"^= B ", w2.out(), re.M), w2.out()
    b_ran_once_on_w1(c)
    assert [r["ok"] for r in c.db.rows("B")] == [True]
    assert [r.conversation for r in asked(server) if r.conversation == "C"] == ["C"]


# The campaign's loop (issue 23): Claude Code 2.1.337 stores a session's api-request-route
# entry before its prompt; a worker killed between the two left a session id named that no
# CLI could resume. The test holds every entry carrying B's marker (a trigger waits on an
# advisory lock it holds): B's first entry lands, its prompt does not.
HOLD_B_PROMPT = """
CREATE FUNCTION flower.test_hold_b() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.data LIKE '%[[B]]%' THEN
    PERFORM pg_advisory_lock(4223);
    PERFORM pg_advisory_unlock(4223);
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER test_hold_b BEFORE INSERT ON flower.entries
  FOR EACH ROW EXECUTE FUNCTION flower.test_hold_b();
"""
HELD_WRITERS = (
    "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'"
)


def test_a_worker_killed_before_b_s_prompt_is_stored_leaves_b_to_start_afresh(
    cluster: Callable[[dict[str, Any]], Cluster],
) -> None:
    """W1 takes B, its CLI sends B's first request (the session id is known) while the run
    state holds no conversation of B; W1 is killed. W2 takes B over and starts it afresh
    with B's own prompt, said in one line on the supervisor's terminal; the run ends 0 (it
    used to resume the dead id, hear "No conversation found", report an API outage six
    times and exit 1, and the same command again did the same)."""
    import psycopg

    c = cluster(abc_script([{"text": "B done.", "delay": HOLD, "times": 1}]))
    server = c.f.server
    c.worker("W1")
    c.worker("W2")
    with psycopg.connect(c.dsn, autocommit=True) as hold:
        hold.execute(HOLD_B_PROMPT)
        hold.execute("SELECT pg_advisory_lock(4223)")
        sup = c.start(ABC)
        held = waiting_on(server, "B", 0)
        doomed = held.session_id
        victim = c.running("B")
        other = next(w for w in c.workers if w is not victim)
        assert sender(held) == victim.name
        wait_until(lambda: c.db.query(HELD_WRITERS), 10, "B's prompt to wait on the lock")
        stored = [e.get("type") for _, e in c.db.entries(str(doomed))]
        assert "user" not in stored, stored
        assert c.db.session_of("B") != doomed, "lineage named B's session before its prompt"
        killed_at = max(r.seq for r in server.requests)
        assert kill_worker(victim) == -signal.SIGKILL
        for (pid,) in c.db.query(HELD_WRITERS):  # the machine is gone: so are its writes
            c.db.query("SELECT pg_terminate_backend(%s)", pid)
        hold.execute("SELECT pg_advisory_unlock(4223)")

    out = finish(c, sup)
    assert sup.returncode == 0, out + c.logs_text()
    assert out.count("从头开始它") == 1, out
    assert "API 暂时不可用" not in out and "No conversation found" not in out + c.logs_text()
    after = [r for r in asked(server) if r.seq > killed_at and r.conversation == "B"]
    assert after and doomed not in {r.session_id for r in after}, "the dead id was resumed"
    assert len({r.session_id for r in after}) == 1 and {sender(r) for r in after} == {other.name}
    texts = " ".join(after[0].texts())
    assert "[[B]] then the second" in texts, "B's fresh session lacks its own prompt"
    assert "上一轮在中途被打断" not in texts, "B's fresh session was told to carry on"
    assert c.db.session_of("B") == after[0].session_id
    assert [r["ok"] for r in c.db.rows("B")] == [True]
    assert [r.conversation for r in asked(server) if r.conversation == "C"] == ["C"]
    assert other.took("B") == 1
    no_tree_left(victim)
    no_tree_left(other)


def test_an_attempt_whose_result_frame_is_lost_gives_its_result_all_the_same(
    cluster: Callable[[dict[str, Any]], Cluster],
) -> None:
    """The supervisor is killed while B runs; B ends on its worker, and its result frame is
    lost from B's mailbox (deleted here). The same command again attaches to B's ended
    attempt and takes the result the activity returned: B is not run again."""
    c = cluster(abc_script([bash(COUNT), {"text": "B done.", "delay": 3, "times": 1}]))
    server = c.f.server
    runner = c.worker("W1")
    sup = c.start(ABC)
    waiting_on(server, "B", 1)
    assert kill(sup) == -signal.SIGKILL
    wait_until(lambda: re.search(r"^\+ B ", runner.out(), re.M), 30, "B to end on W1")
    (b_id,) = [i for i in activity_ids(c.target, c.queue) if "/B/" in i]
    wait_until(lambda: activity_closed(c.target, b_id), 15, "B's attempt to close in Temporal")
    gone = c.db.query(
        f"DELETE FROM flower.events WHERE run = %s AND {RESULT_FRAME} RETURNING pos",
        f"attempt/{b_id}/up",
    )
    assert len(gone) == 1, gone

    again = c.start(ABC)
    out = finish(c, again)
    assert again.returncode == 0, out + c.logs_text()
    b_ran_once_on_w1(c)
    assert [(r["ok"], r["text"]) for r in c.db.rows("B")] == [(True, "B done.")]
    assert [i for i in activity_ids(c.target, c.queue) if "/B/" in i] == [b_id]


def test_ctrl_c_twice_stops_b_on_its_worker_and_the_next_run_continues_it_in_place(
    cluster: Callable[[dict[str, Any]], Cluster],
) -> None:
    """Ctrl-C twice on the supervisor's terminal (exit 130) with B on a worker: B's attempt
    there ends for good; the same command again continues B's session."""
    from tests.e2e import Pty

    c = cluster(abc_script(B_WAITS))
    server, f = c.f.server, c.f
    c.worker("W1")
    c.worker("W2")
    term = Pty(f, f.argv("start", "--flow", ABC, "-w", str(f.ws), "-r", str(f.runs)))
    try:
        waiting_on(server, "B", 1)
        runner = c.running("B")
        sid = wait_until(lambda: c.db.session_of("B"), 10, "B's session in lineage")
        wait_until(lambda: c.db.has_tool_result(sid), 10, "B's tool result in PostgreSQL")
        tree = runner.attempt_tree()
        term.type(b"\x03")
        term.expect("已打断这一轮")
        term.type(b"\x03")
        assert term.wait() == 130, term.pump()
    finally:
        term.close()
    wait_until(lambda: not [p for p in tree if alive(p)], 15, "B's tree on its worker to end")
    (first,) = [i for i in activity_ids(c.target, c.queue) if "/B/" in i]
    wait_until(lambda: activity_closed(c.target, first), 15, "B's attempt to close in Temporal")
    f.assert_no_survivors(within=5.0)

    again = c.start(ABC)
    out = finish(c, again)
    assert again.returncode == 0, out + c.logs_text()
    b = [r for r in asked(server) if r.conversation == "B"]
    assert {r.session_id for r in b} == {sid}, "B did not continue its own session"
    assert (f.ws / "b-ran.txt").read_text().splitlines() == [runner.name]
    rows = c.db.rows("B")
    assert [(r["ok"], r["attempts"]) for r in rows] == [(True, 1)], (rows, out + c.logs_text())
    assert "~ " not in out, "the stopped attempt was attached to and shown failing"
    assert len([i for i in activity_ids(c.target, c.queue) if "/B/" in i]) == 2
    for w in c.workers:
        no_tree_left(w)


def test_ctrl_c_once_and_a_sentence_reach_b_on_its_worker_in_b_s_own_session(
    cluster: Callable[[dict[str, Any]], Cluster],
) -> None:
    """Ctrl-C once on the supervisor's terminal while B waits on a worker, then a sentence:
    B's attempt there is interrupted and B's own session goes on with what was said."""
    from tests.e2e import Pty

    said = "please also write a summary"
    c = cluster(abc_script(B_WAITS))
    server, f = c.f.server, c.f
    c.worker("W1")
    c.worker("W2")
    term = Pty(f, f.argv("start", "--flow", ABC, "-w", str(f.ws), "-r", str(f.runs)))
    try:
        waiting_on(server, "B", 1)
        sid = wait_until(lambda: c.db.session_of("B"), 10, "B's session in lineage")
        wait_until(lambda: c.db.has_tool_result(sid), 10, "B's tool result in PostgreSQL")
        runner = c.running("B")
        term.type(b"\x03")
        term.expect("已打断这一轮")
        term.type(said.encode() + b"\n")
        assert term.wait() == 0, term.pump() + c.logs_text()
    finally:
        term.close()
    heard = [
        r for r in asked(server) if r.conversation == "B" and any(said in t for t in r.texts())
    ]
    assert heard, "the sentence typed after Ctrl-C never reached B"
    assert {r.session_id for r in heard} == {sid}, "the interrupt did not continue B's session"
    assert (f.ws / "b-ran.txt").read_text().splitlines() == [runner.name]
    rows = c.db.rows("B")
    assert [(r["ok"], r["session_id"]) for r in rows] == [(True, sid)], rows
    assert [r.conversation for r in asked(server) if r.conversation == "C"] == ["C"]
    # The worker says it in its own words (the CLI's diagnostic for a cut turn is not one).
    assert re.search(r"^\+ B  被打断了", runner.out(), re.M), runner.out()
    assert "ede_diagnostic" not in c.logs_text()
    for w in c.workers:
        no_tree_left(w)


# ---------------------------------------------------------------------------------------
# seeing the workers: ``flower-super workers`` and ``worker --metrics``
# ---------------------------------------------------------------------------------------


def workers_listed(c: Cluster, *extra: str) -> tuple[int, str]:
    """``flower-super workers`` as a person on another machine runs it: the state URL from
    FLOWER_STATE, nothing else of the cluster's."""
    env = {k: v for k, v in c.f.env.items() if k != "FLOWER_PLACEMENT"}
    done = subprocess.run(
        c.f.argv("workers", *extra), cwd=c.f.root, env=env, capture_output=True, timeout=30
    )
    return done.returncode, (done.stdout + done.stderr).decode("utf-8", "replace")


def listed(c: Cluster) -> dict[int, dict[str, Any]]:
    """Each worker's row by pid (``workers --json``)."""
    code, out = workers_listed(c, "--json", "--queue", c.queue)
    assert code in (0, 1), out
    return {int(row["pid"]): row for row in json.loads(out)}


def metric(port: int, name: str) -> float | None:
    """``name``'s value at a worker's metrics endpoint (None: not there)."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as got:
        text = got.read().decode()
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_workers_lists_each_worker_and_what_it_runs_and_metrics_count_it(
    cluster: Callable[[dict[str, Any]], Cluster],
) -> None:
    from flower.services._servers import free_port

    c = cluster(abc_script(B_WAITS))
    ports = {"W1": free_port(), "W2": free_port()}
    for name, port in ports.items():
        c.worker(name, flags=("--metrics", f"127.0.0.1:{port}"))
    sup = c.start(ABC)
    waiting_on(c.f.server, "B", 1)
    victim = c.running("B")
    other = next(w for w in c.workers if w is not victim)
    run = c.db.manifest()[0]["run"]

    # While B runs: both workers listed, B on the one that runs it, from the state alone.
    def lists_b() -> tuple[int, str] | None:
        code, out = workers_listed(c)
        return (code, out) if f"run {run}  B" in out else None

    code, out = wait_until(lists_b, 10, "B on the list of workers")
    assert code == 0, out
    assert f"pid {victim.proc.pid}" in out and f"pid {other.proc.pid}" in out, out
    assert f"run {run}  B" in out, out
    rows = listed(c)
    assert [(a["run"], a["label"], a["try"]) for a in rows[victim.proc.pid]["running"]] == [
        (run, "B", 1)
    ]
    assert rows[other.proc.pid]["running"] == []
    assert rows[victim.proc.pid]["slots"] == 1
    assert metric(ports[victim.name], "flower_attempts_running") == 1
    assert metric(ports[other.name], "flower_attempts_running") == 0
    # the Temporal SDK's own metrics on the same endpoint
    assert metric(ports[victim.name], "temporal_num_pollers") is not None

    kill_worker(victim)
    out = finish(c, sup)
    assert sup.returncode == 0, out + c.logs_text()
    rows = listed(c)
    took = rows[other.proc.pid]
    assert took["takeovers"] == 1 and took["running"] == [], took
    assert took["finished"] == other.took("A") + other.took("B") + other.took("C")
    assert metric(ports[other.name], "flower_takeovers") == 1
    assert metric(ports[other.name], "flower_attempts_finished") == took["finished"]
    # The killed worker never said it stopped: its row goes silent, and says so.
    wait_until(
        lambda: listed(c)[victim.proc.pid]["state"] == "silent", 30, "the dead worker silent"
    )
    code, out = workers_listed(c, "--queue", c.queue)
    assert code == 0 and out.count("! ") == 1, out  # one worker alive, one silent

    # A worker stopped as a person stops it is listed as stopped (with --all only).
    kill_worker(other, signal.SIGTERM)
    code, out = workers_listed(c, "--queue", c.queue)
    assert code == 1, out  # no worker of the queue is alive
    assert other.proc.pid not in listed(c)  # listed with --all only
    code, out = workers_listed(c, "--all", "--json", "--queue", c.queue)
    states = {int(r["pid"]): r["state"] for r in json.loads(out)}
    assert states == {victim.proc.pid: "silent", other.proc.pid: "stopped"}, out


# ---------------------------------------------------------------------------------------
# warm workers: the next attempt's child is ready before it is placed
# ---------------------------------------------------------------------------------------

XYZ = "tests.flows.cluster:xyz"


def placed_events(c: Cluster) -> dict[str, list[dict[str, Any]]]:
    """Each step's ``placed`` events (its worker's frames, as the supervisor logged them)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for (event,) in c.db.query("SELECT event FROM flower.events ORDER BY pos"):
        if isinstance(event, dict) and event.get("kind") == "placed":
            out.setdefault(str(event.get("step")), []).append(dict(event.get("payload") or {}))
    return out


def test_a_worker_gets_the_next_step_ready_while_one_runs_and_drops_it_when_not_needed(
    cluster: Callable[[dict[str, Any]], Cluster],
) -> None:
    y_turns = [{"text": "Y done.", "delay": 8, "times": 1}, {"text": "Y done."}]
    script = {
        "conversations": [
            {"name": "X", "match": {"marker": "[[X]]"}, "turns": [{"text": "X done."}]},
            {"name": "Y", "match": {"marker": "[[Y]]"}, "turns": y_turns},
            {"name": "Z", "match": {"marker": "[[Z]]"}, "turns": [{"text": "Z done."}]},
        ]
    }
    c = cluster(script)
    server = c.f.server
    w = c.worker("W1")
    sup = c.start(XYZ)
    waiting_on(server, "Y", 0)

    def clis() -> int:
        return len([p for p in w.attempt_tree() if p.name() == "claude"])

    # X and Y both landed on W1: Z's child is made ready while Y runs (a second CLI under
    # the worker), and no request of Z's is sent.
    wait_until(lambda: clis() >= 2, 30, "Z's CLI started ahead, beside Y's")
    assert not [r for r in asked(server) if r.conversation == "Z"]
    # The supervisor is killed: Y goes on on its worker (the next start attaches to it),
    # and what the worker got ready for the killed supervisor does not outlive it there.
    assert kill(sup) == -signal.SIGKILL
    wait_until(lambda: clis() == 1, 20, "Z's CLI, got ready for a supervisor now gone, to go")
    assert w.proc.poll() is None
    again = c.start(XYZ)
    out = finish(c, again)
    assert again.returncode == 0, out + c.logs_text()
    placed = placed_events(c)
    # X and Y ran cold (a run is hinted once two attempts in a row landed on one worker)
    assert [p["warm"] for p in placed["X"]] == [False]
    assert placed["Y"][0]["warm"] is False, placed["Y"]
    assert len([r for r in asked(server) if r.conversation == "X"]) == 1
    assert len([r for r in asked(server) if r.conversation == "Z"]) == 1
    assert [r["ok"] for r in c.db.manifest() if r["step"] in ("Y", "Z")] == [True, True]
    no_tree_left(w)
