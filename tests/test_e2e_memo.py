"""Paying only for what changed (seed 004), end to end under flower-super: the request log
is the judge of what ran.

A four-step flow whose every step is cross-run, each keyed on a different fingerprint
(``glob!:``, ``glob:``, ``git:HEAD``, ``env:``; the last one also reads the first step's
output). Run after run, exactly the steps whose input or fingerprint changed are sent to
the model; the rest come from ``<run_dir>/cache`` at $0.00 without a child process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from flower.services.model_server import ModelServer
from tests.e2e import Flower

# Six short runs of a four-step flow (each step one CLI turn when it runs).
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

FLOW = "tests.flows.memo:flow"
STEPS = ("m-data", "m-src", "m-head", "m-sum")


def conv(name: str, turns: list[Any]) -> dict[str, Any]:
    return {"name": name, "match": {"marker": f"[[{name}]]"}, "turns": turns}


def git(ws: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=ws,
        check=True,
        capture_output=True,
    )


def sent(server: ModelServer, since: int) -> dict[str, int]:
    """Messages requests per conversation after request ``since``."""
    out: dict[str, int] = {}
    for r in server.requests[since:]:
        if r.path == "/v1/messages" and r.conversation:
            out[r.conversation] = out.get(r.conversation, 0) + 1
    return out


def test_only_what_changed_is_sent_to_the_model(model_server, flower_env):
    server = model_server(
        {
            "conversations": [
                # The data step's answer changes the second time, and with it sum's prompt.
                conv("m-data", [{"text": "data v1", "times": 1}, "data v2"]),
                conv("m-src", ["src read"]),
                conv("m-head", ["head noted"]),
                conv("m-sum", ["summed"]),
            ]
        }
    )
    f: Flower = flower_env(server, extra_env={"FLOWER_MEMO_TEST": "one"})
    (f.ws / "data").mkdir()
    (f.ws / "src").mkdir()
    (f.ws / "data" / "a.txt").write_text("alpha\n")
    (f.ws / "src" / "x.py").write_text("print(1)\n")
    git(f.ws, "init", "-q")
    git(f.ws, "add", "-A")
    git(f.ws, "commit", "-qm", "one")

    def run(**env: str) -> dict[str, int]:
        mark = len(server.requests)
        saved = dict(f.env)
        f.env.update(env)
        try:
            code, out = f.run(flow=FLOW, timeout=120)
        finally:
            f.env = saved
        assert code == 0, out
        return sent(server, mark)

    assert set(run()) == set(STEPS)  # the first run: everything
    assert run() == {}  # nothing changed: not one request
    rows = [r for r in f.manifest() if r.get("reused")]
    assert {r["reused"] for r in rows} == {"cross-run"} and all(r["cost_usd"] == 0 for r in rows)

    (f.ws / "data" / "a.txt").write_text("beta\n")  # new content: glob!: moves
    assert set(run()) == {"m-data", "m-sum"}  # and sum, whose prompt reads data's output

    for p in (f.ws / "data" / "a.txt", f.ws / "src" / "x.py"):
        st = p.stat()
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))  # touch -m
    assert set(run()) == {"m-src"}  # glob: sees the mtime, glob!: the same content

    git(f.ws, "commit", "-qm", "two", "--allow-empty")
    assert set(run()) == {"m-head"}  # a new commit: git:HEAD moves

    assert set(run(FLOWER_MEMO_TEST="two")) == {"m-sum"}  # env: changed

    # The reuse report of the last run matches its manifest rows.
    _, js = f.status_json()
    last = js["flowers"][-1]
    report = last["reuse"]
    mine = [r for r in f.manifest() if r["run"] == last["run"]]
    reused = [r for r in mine if r.get("reused")]
    assert report["reused"] == len(reused) == 3 and report["executed"] == 1
    assert report["saved_usd"] == pytest.approx(sum(r["saved_usd"] for r in reused))
    why = {e["step"]: e["why"] for e in report["steps"]}
    assert "env:FLOWER_MEMO_TEST" in why["sum"], why
    f.assert_no_survivors()


def test_verify_names_every_problem_and_start_refuses_before_any_model_call(
    model_server, flower_env
):
    server = model_server({"conversations": []})
    f: Flower = flower_env(server)
    done = subprocess.run(
        [sys.executable, "-m", "supervisor", "verify", "--flow", "tests.flows.memo:bad"],
        cwd=f.root,
        env={**f.env, "FLOWER_LANG": "en"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    err = done.stderr
    assert "step 'judged': cross-run is not allowed: it has a gate" in err, err
    assert "step 'deploy': cross-run is not allowed: idempotent=False" in err, err
    assert "step 'odd': unknown fingerprint prefix 'svn:'" in err, err
    assert "step 'stale':" in err and "7w" in err, err
    ok = subprocess.run(
        [sys.executable, "-m", "supervisor", "verify", "--flow", FLOW],
        cwd=f.root,
        env={**f.env, "FLOWER_LANG": "en"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0 and "is valid: 4 steps" in ok.stdout, ok.stdout + ok.stderr
    code, out = f.run(flow="tests.flows.memo:bad")
    assert code == 2 and "unknown fingerprint prefix" in out, out
    assert not [r for r in server.requests if r.path == "/v1/messages"]


HOLD = 90  # the scripted model "thinks" this long (once) so the drill can kill mid-step


def test_kill_9_in_step_3_of_4_resumes_there_and_pays_nothing_twice(model_server, flower_env):
    from tests.e2e import kill, wait_until

    server = model_server(
        {
            "conversations": [
                conv("k-one", ["one done."]),
                conv("k-two", ["two done."]),
                conv("k-three", [{"text": "three done.", "delay": HOLD, "times": 1}]),
                conv("k-four", ["four done."]),
            ]
        }
    )
    f: Flower = flower_env(server)
    proc = f.start(flow="tests.flows.memo:four")
    server.wait_for(lambda reqs: any(r.conversation == "k-three" for r in reqs), timeout=60)
    doomed = next(r.session_id for r in server.requests if r.conversation == "k-three")
    wait_until(lambda: f.lineage()["steps"].get("three") == doomed, 10, "lineage to name it")
    mark = len(server.requests)
    kill(proc)
    f.assert_no_survivors(within=5.0)

    code, out = f.run(flow="tests.flows.memo:four", timeout=120)
    assert code == 0, out
    after = sent(server, mark)
    assert "k-one" not in after and "k-two" not in after, after  # steps 1-2: no request
    three = [r for r in server.requests[mark:] if r.conversation == "k-three"]
    assert three and {r.session_id for r in three} == {doomed}  # step 3 carries its session on
    assert after.get("k-four") == 1  # step 4 runs
    reused = {r["step"]: r for r in f.manifest() if r.get("reused")}
    assert set(reused) == {"one", "two"} and all(r["cost_usd"] == 0 for r in reused.values())
    assert "(skipped — cache: run-only" in out or "跳过 —— 缓存:run-only" in out, out
    f.assert_no_survivors()


def test_incremental_reuses_what_it_may_and_never_an_irreversible_step(model_server, flower_env):
    server = model_server(
        {"conversations": [conv("i-look", ["looked"]), conv("i-ship", ["shipped"])]}
    )
    f: Flower = flower_env(server)
    mark = len(server.requests)
    code, out = f.run(flow="tests.flows.memo:inc", timeout=120)
    assert code == 0, out
    assert set(sent(server, mark)) == {"i-look", "i-ship"}
    mark = len(server.requests)
    code, out = f.run(flow="tests.flows.memo:inc", timeout=120)
    assert code == 0, out
    assert sent(server, mark) == {"i-ship": 1}  # look: a cross-run hit; ship: never cached
    rows = [r for r in f.manifest() if r["step"] == "look"]
    assert [r.get("reused") for r in rows] == [None, "cross-run"]
    assert "idempotent=False" in out  # the report says why ship ran


def map_env(f: Flower, n: int = 10) -> None:
    (f.ws / "items").mkdir()
    for i in range(n):
        (f.ws / "items" / f"f{i}").write_text(f"item {i}\n")
    f.env["FLOWER_MEMO_WS"] = str(f.ws)


def test_a_map_reruns_only_the_item_that_changed(model_server, flower_env):
    server = model_server({"conversations": [conv("m-item", ["read."])]})
    f: Flower = flower_env(server)
    map_env(f)
    mark = len(server.requests)
    code, out = f.run(flow="tests.flows.memo:files", timeout=150)
    assert code == 0, out
    assert sent(server, mark) == {"m-item": 10}
    items = sorted(r["step"] for r in f.manifest() if r["step"].startswith("read["))
    assert items == sorted(f"read[{i}]" for i in range(10))
    assert not {"read"} & set(f.lineage()["steps"])  # items are in lineage as read[i] only
    (f.ws / "items" / "f3").write_text("item three, changed\n")
    mark = len(server.requests)
    code, out = f.run(flow="tests.flows.memo:files", timeout=150)
    assert code == 0, out
    assert sent(server, mark) == {"m-item": 1}
    changed = [r for r in server.requests[mark:] if r.conversation == "m-item"]
    assert any("item three, changed" in x for x in changed[0].texts())
    f.assert_no_survivors()


def test_kill_9_mid_map_resumes_the_unfinished_item_in_its_own_session(model_server, flower_env):
    from tests.e2e import kill, wait_until

    server = model_server(
        {
            "conversations": [
                {
                    "name": "slow",
                    "match": {"marker": "read f5"},
                    "turns": [{"text": "read slowly.", "delay": HOLD, "times": 1}, "read."],
                },
                conv("m-item", ["read."]),
            ]
        }
    )
    f: Flower = flower_env(server)
    map_env(f)
    proc = f.start(flow="tests.flows.memo:files")

    def nine_done() -> bool:
        rows = [r for r in f.manifest() if r["step"].startswith("read[") and r["ok"]]
        return len(rows) == 9

    wait_until(nine_done, 90, "nine items finished, f5 still waiting on the model")
    doomed = next(r.session_id for r in server.requests if r.conversation == "slow")
    wait_until(lambda: f.lineage()["steps"].get("read[5]") == doomed, 10, "lineage of read[5]")
    _, js = f.status_json()  # per-item progress of the live map
    (live,) = [fl for fl in js["flowers"] if fl["alive"]]
    assert live["map_items_done"] == {"read": 9}, live
    mark = len(server.requests)
    kill(proc)
    f.assert_no_survivors(within=5.0)

    code, out = f.run(flow="tests.flows.memo:files", timeout=150)
    assert code == 0, out
    after = sent(server, mark)
    assert "m-item" not in after, after  # the nine finished items: no request
    resumed = [r for r in server.requests[mark:] if r.conversation == "slow"]
    assert resumed and {r.session_id for r in resumed} == {doomed}
    # The reuse report says why it ran: it had begun (was "never ran" unless it was the
    # item started last).
    assert "> read[5]  执行:上次没跑完" in out, out
    f.assert_no_survivors()
