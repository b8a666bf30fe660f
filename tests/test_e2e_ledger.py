"""Kill -9 right after a tool call: the call never runs again, and the model gets its result.

The real flower-super, the real CLI, the scripted model server. The CLI writes a turn's
entries late (the tool_result about 100 ms after the call finished); before the tool ledger a
SIGKILL in that window lost the result and, when the ``tool_use`` entry was not in yet, ran
the call again. Each Bash command records its run in ``counter.txt`` and prints a value
unique to that run, so the resumed requests show whether the model got the real output.

The drill runs on a quiet machine and with every core kept busy by CPU burners the test
starts and reaps: the windows the ledger closes move with the load.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flower.state.ledger import NOT_FINISHED_TEXT
from flower.testing.rundir import transcript
from tests.e2e import Flower, kill, wait_until

pytestmark = pytest.mark.e2e

FLOW = "tests.flows.roles:ledger"
CALLS = 4  # Bash calls per session, back to back as a model that answers at once makes them
KILL_AFTER = (1, 3)  # the calls after which the supervisor is killed: a new session's first
# call (it also waits for the session to reach sessions.db), and one that came right after
# another (the CLI has written neither the last result nor this call yet)
KILLS = 24  # per load: a leak of 1 kill in 12 goes unseen with probability (11/12)^24 = 12%
WINDOW = 0.08  # a kill lands this long after the call finished, at most (uniform)
HOLD = 0.5  # the last reply is held once, so the step cannot end inside the window


def command(i: int) -> str:
    return f"x=$(date +%s%N); echo {i}-$x >> counter.txt; echo OUT-{i}-$x"


def script(calls: int = CALLS) -> dict:
    def bash(i: int) -> dict:
        return {"tool_use": {"name": "Bash", "input": {"command": command(i), "description": "n"}}}

    turns = [bash(i) for i in range(1, calls + 1)]
    turns.append({"text": "work done.", "delay": HOLD, "times": 1})  # only the killed run waits
    return {
        "conversations": [{"name": "ledger", "match": {"marker": "[[ledger]]"}, "turns": turns}]
    }


def done_calls(runs: Path, *, done: bool = True) -> dict[int, tuple[str, float]]:
    """The Bash calls the ledger recorded as finished (``done=False``: as started at
    least): call number -> (id, when it finished, or started)."""
    db = runs / "sessions.db"
    if not db.exists():
        return {}
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=0.05) as conn:
            rows = conn.execute(
                "SELECT tool_use_id, input, COALESCE(ended_at, started_at) FROM tool_calls"
                " WHERE name = 'Bash' AND (state = 'done' OR NOT ?)",
                (done,),
            ).fetchall()
    except sqlite3.Error:
        return {}
    out = {}
    for tid, text, ended in rows:
        for i in range(1, CALLS + 1):
            if f"echo {i}-" in text:
                out[i] = (tid, float(ended))
    return out


def written(runs: Path, tool_use_id: str) -> str:
    """How far the CLI's own transcript got with a call: "nothing", "tool_use" or
    "tool_result"."""
    seen = "nothing"
    with sqlite3.connect(runs / "sessions.db") as conn:
        sids = [r[0] for r in conn.execute("SELECT DISTINCT session_id FROM tool_calls")]
    for sid in sids:
        for entry in transcript(runs, sid):
            content = (entry.get("message") or {}).get("content")
            for block in content if isinstance(content, list) else ():
                if block.get("type") == "tool_result" and block.get("tool_use_id") == tool_use_id:
                    return "tool_result"
                if block.get("type") == "tool_use" and block.get("id") == tool_use_id:
                    seen = "tool_use"
    return seen


def results_sent(f: Flower) -> dict[str, set[str]]:
    """Every tool_result the model was sent: tool_use id -> the distinct contents."""
    out: dict[str, set[str]] = {}
    for req in f.server.requests:
        for m in req.messages:
            for b in m.get("content") if isinstance(m.get("content"), list) else ():
                if b.get("type") == "tool_result":
                    c = b.get("content")
                    out.setdefault(b["tool_use_id"], set()).add(
                        (c if isinstance(c, str) else str(c)).strip()
                    )
    return out


def ran(f: Flower) -> dict[int, list[str]]:
    """Each call's runs, from counter.txt: call number -> the values its runs printed."""
    path = f.ws / "counter.txt"
    out: dict[int, list[str]] = {}
    for line in path.read_text().split() if path.exists() else ():
        i, _, value = line.partition("-")
        out.setdefault(int(i), []).append(f"OUT-{i}-{value}")
    return out


def judge(f: Flower, finished: set[str], calls: int) -> None:
    """After the last run: no call ran twice; the model got one result per call: the real
    output of a call finished at a kill; of one unfinished at a kill, that or
    NOT_FINISHED_TEXT (then it may never have run: the model is told to check first)."""
    code, out = f.run(flow=FLOW)
    assert code == 0, out
    runs = ran(f)
    twice = {i: v for i, v in runs.items() if len(v) > 1}
    assert not twice, f"calls ran again: {twice}"
    assert not [r for r in f.server.requests if r.answer == "rejected"], (
        "a request with a tool_use and no tool_result was sent"
    )
    assert not any("API Error" in t for r in f.server.requests for t in r.texts())
    ids = {tid: i for i, (tid, _) in done_calls(f.runs, done=False).items()}
    sent = results_sent(f)
    assert sorted(ids.values()) == list(range(1, calls + 1)) and set(sent) == set(ids)
    for tid, i in ids.items():
        real = runs[i][0] if i in runs else None
        if tid in finished:
            allowed = {real}
        else:
            allowed = {real, NOT_FINISHED_TEXT} if real else {NOT_FINISHED_TEXT}
        assert len(sent[tid]) == 1 and sent[tid] <= allowed, (
            f"call {i} ({'finished' if tid in finished else 'unfinished'} at a kill): "
            f"the model got {sent[tid]}, the call printed {real!r}"
        )


def explain(f: Flower, proc: subprocess.Popen[bytes]) -> str:
    """What a drill that waited in vain saw: the supervisor's output, the requests the model
    server got, the ledger's rows and the step logs (the supervisor is killed first)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGKILL)
    try:
        out, _ = proc.communicate(timeout=30)
    except (ValueError, subprocess.TimeoutExpired):
        out = b""
    lines = ["-- supervisor:", out.decode("utf-8", "replace")[-4000:], "-- requests:"]
    for r in f.server.requests:
        lines.append(
            f"{r.time:.3f} {r.path} {r.answer} {r.status} session={r.session_id} "
            f"turn={r.turn} messages={len(r.messages)} {r.detail[:200]}"
        )
    lines.append(f"-- ledger: {done_calls(f.runs, done=False)} done: {done_calls(f.runs)}")
    for log in sorted(f.runs.glob("logs/*/*.log")):
        lines += [f"-- {log.relative_to(f.runs)}:", log.read_text("utf-8", "replace")[-3000:]]
    return "\n".join(lines)


@contextlib.contextmanager
def burners(n: int) -> Iterator[None]:
    """``n`` processes spinning on the CPU, at the tests' own priority; reaped on exit."""
    procs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
        for _ in range(n)
    ]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(timeout=10)


@pytest.mark.timeout(900)  # KILLS kills, 3 flower-super starts per 2 kills: ~2 min quiet, ~4 busy
@pytest.mark.parametrize("load", ["quiet", "busy"])
def test_kill9_in_the_80ms_after_a_bash_call_finishes_never_repeats_it(
    load: str, model_server, flower_env
):
    """KILLS kills of the supervisor, each 0-80 ms after a Bash call finished (the ledger
    has its result, the CLI most often not), on a quiet machine and with every core busy:
    no call ever runs twice, and the model gets each finished call's real output."""
    rng = random.Random(f"20261202-{load}")
    stages: dict[str, int] = {}
    late: list[float] = []
    started = time.monotonic()
    skipped = 0  # kills left out (every call had started by the one before): made up for
    with burners(os.cpu_count() or 2) if load == "busy" else contextlib.nullcontext():
        while len(late) < KILLS:
            f: Flower = flower_env(model_server(script()))
            finished: set[str] = set()
            for after in KILL_AFTER:
                # A model that answers at once can have the next calls started inside the
                # window of a kill: one started then is never "done" (the model is told it
                # did not finish), so the next kill follows the first call not yet started.
                i = max([after, *(j + 1 for j in done_calls(f.runs, done=False))])
                if i > CALLS:
                    skipped += 1
                    continue
                proc = f.start(flow=FLOW)
                try:
                    tid, ended = wait_until(
                        lambda f=f, i=i: done_calls(f.runs).get(i), 90, f"call {i} to finish", 0.001
                    )
                except AssertionError as e:
                    raise AssertionError(f"{e}\n{explain(f, proc)}") from None
                time.sleep(max(0.0, ended + rng.uniform(0, WINDOW) - time.time()))
                at = time.time()
                assert kill(proc) == -signal.SIGKILL, "the step ended before the kill"
                late.append(at - ended)
                f.assert_no_survivors(within=10.0)
                finished |= {t for t, _ in done_calls(f.runs).values()}
                stage = written(f.runs, tid)
                stages[stage] = stages.get(stage, 0) + 1
            judge(f, finished, CALLS)
            f.cleanup()
    late.sort()
    print(
        f"{load}: {len(late)} kills ({skipped} left out) in {time.monotonic() - started:.0f} s, "
        f"{late[len(late) // 2] * 1000:.0f} ms after the call finished at the median "
        f"(max {late[-1] * 1000:.0f} ms); what the CLI had written of the call: {stages}"
    )
    # The window the ledger exists for: the CLI had not written the call's result yet.
    assert stages.get("nothing", 0) + stages.get("tool_use", 0) >= len(late) // 4, stages


@pytest.mark.timeout(300)  # 6 kill-and-resume rounds
def test_kill9_as_the_call_takes_effect_never_repeats_it(model_server, flower_env):
    """Kills from the moment the command's effect appears, before the CLI may have its
    result: never a second run; the model gets the real output or is told, neutrally,
    that the call's effect is unknown."""
    for n in range(6):
        f: Flower = flower_env(model_server(script(1)))
        proc = f.start(flow=FLOW)
        wait_until(lambda f=f: (f.ws / "counter.txt").exists(), 60, "the command's effect", 0.0005)
        time.sleep(n * 0.002)
        assert kill(proc) == -signal.SIGKILL
        f.assert_no_survivors(within=5.0)
        judge(f, set(), 1)
        assert len(ran(f)[1]) == 1  # it had taken effect before the kill: it ran, once
        f.cleanup()


@pytest.mark.timeout(120)  # one start held 3 s, a kill, a resume
def test_a_first_call_waits_until_the_supervisor_has_recorded_its_session(model_server, flower_env):
    """A step child's new session is written into lineage.json by the supervisor. While
    the supervisor cannot record it (here: stopped), the session's first call must not run:
    a kill then would leave nothing to resume it by, and the call would run again on a
    fresh session (seen in the busy drill: the supervisor took over 200 ms to record it)."""
    f: Flower = flower_env(model_server(script(1)))
    proc = f.start(flow=FLOW)
    # The child logs its attempt once it has its start, long before its CLI has a session.
    wait_until(
        lambda: any("attempt 1" in p.read_text() for p in f.runs.glob("logs/*/work.log")),
        60,
        "the step child to start",
        0.005,
    )
    os.kill(proc.pid, signal.SIGSTOP)  # the supervisor: it reads no more session reports
    try:
        with contextlib.suppress(AssertionError):  # the call must NOT take effect meanwhile
            wait_until(lambda: (f.ws / "counter.txt").exists(), 3, "the command", 0.01)
        assert not (f.ws / "counter.txt").exists(), "the call ran before its session was kept"
    finally:
        assert kill(proc) == -signal.SIGKILL
    f.assert_no_survivors(within=10.0)
    judge(f, set(), 1)
    assert len(ran(f)[1]) == 1
