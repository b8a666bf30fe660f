"""Kill -9 right after a tool call: the call never runs again, and the model gets its result.

The real flower-super, the real CLI, the scripted model server. The CLI writes a turn's
entries late (the tool_result about 100 ms after the call finished); before the tool ledger a
SIGKILL in that window lost the result and, when the ``tool_use`` entry was not in yet, ran
the call again. The Bash command records each run in ``counter.txt`` and prints a value
unique to that run, so the resumed request shows whether the model got the real output.
"""

from __future__ import annotations

import random
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from flower.state.ledger import NOT_FINISHED_TEXT
from flower.testing.rundir import transcript
from tests.e2e import Flower, kill, wait_until

pytestmark = pytest.mark.e2e

FLOW = "tests.flows.roles:ledger"
COMMAND = "x=$(date +%s%N); echo $x >> counter.txt; echo OUT-$x"


def script() -> dict:
    turns = [
        {"tool_use": {"name": "Bash", "input": {"command": COMMAND, "description": "count"}}},
        # held long enough that the step cannot finish inside the 100 ms after the call
        {"text": "work done.", "delay": 0.4, "times": 1},
    ]
    return {
        "conversations": [{"name": "ledger", "match": {"marker": "[[ledger]]"}, "turns": turns}]
    }


def finished_at(runs: Path) -> float | None:
    """When the ledger recorded the Bash call as finished (None: not yet)."""
    db = runs / "sessions.db"
    if not db.exists():
        return None
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=0.05) as conn:
            row = conn.execute(
                "SELECT ended_at FROM tool_calls WHERE name = 'Bash' AND state = 'done'"
            ).fetchone()
    except sqlite3.Error:
        return None
    return float(row[0]) if row else None


def written(runs: Path) -> str:
    """How far the CLI's own transcript got: "nothing", "tool_use" or "tool_result"."""
    seen = "nothing"
    with sqlite3.connect(runs / "sessions.db") as conn:
        sids = [r[0] for r in conn.execute("SELECT DISTINCT session_id FROM tool_calls")]
    for sid in sids:
        for entry in transcript(runs, sid):
            content = (entry.get("message") or {}).get("content")
            kinds = {b.get("type") for b in content} if isinstance(content, list) else set()
            if "tool_result" in kinds:
                return "tool_result"
            if "tool_use" in kinds:
                seen = "tool_use"
    return seen


def tool_results(req) -> list[str]:
    out = []
    for m in req.messages:
        if isinstance(m.get("content"), list):
            for b in m["content"]:
                if b.get("type") == "tool_result":
                    c = b.get("content")
                    out.append(c if isinstance(c, str) else str(c))
    return out


def resume_and_judge(f: Flower, killed_at_seq: int) -> tuple[str, str]:
    """Run the flow again to the end; return the tool result the model got on resume
    and the value the one run of the command printed."""
    code, out = f.run(flow=FLOW)
    assert code == 0, out
    runs = (f.ws / "counter.txt").read_text().split()
    assert len(runs) == 1, f"the Bash call ran {len(runs)} times"
    after = [r for r in f.server.requests if r.seq > killed_at_seq and r.conversation == "ledger"]
    assert after, "the step was not resumed"
    assert not [r for r in f.server.requests if r.answer == "rejected"], (
        "a request with a tool_use and no tool_result was sent"
    )
    for r in after:
        assert not any("API Error" in t for t in r.texts())
    results = [t for r in after for t in tool_results(r)]
    assert results, "the resumed request carries no tool_result"
    assert len({*results}) == 1, results
    return results[0].strip(), runs[0]


@pytest.mark.timeout(600)  # up to 30 kill-and-resume rounds of two CLI sessions each (~6 s)
def test_kill9_in_the_100ms_after_a_bash_call_finishes_never_repeats_it(model_server, flower_env):
    """20 kills that land after the call finished (the ledger has its result) and before
    the step ended; each resumed request carries the call's real output."""
    rng = random.Random(20261201)
    landed, tries = 0, 0
    stages: dict[str, int] = {}
    while landed < 20:
        tries += 1
        assert tries <= 30, f"only {landed} of {tries - 1} kills landed in the window"
        server = model_server(script())
        f: Flower = flower_env(server)
        proc = f.start(flow=FLOW)
        done = wait_until(lambda f=f: finished_at(f.runs), 60, "the Bash call to finish", 0.001)
        time.sleep(max(0.0, done + rng.uniform(0, 0.1) - time.time()))
        killed_at = max(r.seq for r in server.requests)
        if kill(proc) != -signal.SIGKILL:
            continue  # it ended on its own first: not a kill in the window
        f.assert_no_survivors(within=5.0)
        landed += 1
        stage = written(f.runs)
        stages[stage] = stages.get(stage, 0) + 1
        got, value = resume_and_judge(f, killed_at)
        assert got == f"OUT-{value}", f"kill {landed} ({stage} written): the model got {got!r}"
        f.cleanup()
    print(f"what the CLI had written at the {landed} kills: {stages}")
    # The window the ledger exists for: the CLI had not written the call's result yet.
    assert stages.get("nothing", 0) + stages.get("tool_use", 0) >= 5, stages


@pytest.mark.timeout(300)  # 6 kill-and-resume rounds
def test_kill9_as_the_call_takes_effect_never_repeats_it(model_server, flower_env):
    """Kills from the moment the command's effect appears, before the CLI may have its
    result: never a second run; the model gets the real output or is told, neutrally,
    that the call's effect is unknown."""
    for n in range(6):
        server = model_server(script())
        f: Flower = flower_env(server)
        proc = f.start(flow=FLOW)
        wait_until(lambda f=f: (f.ws / "counter.txt").exists(), 60, "the command's effect", 0.0005)
        time.sleep(n * 0.002)
        killed_at = max(r.seq for r in server.requests)
        assert kill(proc) == -signal.SIGKILL
        f.assert_no_survivors(within=5.0)
        got, value = resume_and_judge(f, killed_at)
        assert got in (f"OUT-{value}", NOT_FINISHED_TEXT), got
        f.cleanup()
