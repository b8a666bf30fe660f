"""One retry accounting for every placement (issue 7), end to end with the real CLI.

The step loop counts attempts once, in the process that owns the step: a 529 and a step
child killed mid-request are both one failed attempt of the same loop, so ``max_attempts``
(6) bounds a supervised step exactly as it bounds an in-process one; a failure retrying
cannot fix stops the step after one attempt; and one scripted fault sequence yields the same
``StepResult`` whichever placement ran its attempts.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from flower import Runtime, Workbench, read_manifest
from flower.services.model_server import ModelServer, RecordedRequest
from flower.step.resilience import Resilience
from tests.e2e import Flower, attempt_child, cli_under, wait_until
from tests.flows import inside

pytestmark = pytest.mark.e2e

FLOWS = "tests.flows.inside"
DIED = "died without a result (killed by SIGKILL)"


def conversation(name: str, turns: list[Any], marker: str | None = None) -> dict[str, Any]:
    return {"name": name, "match": {"marker": marker or f"[[{name}]]"}, "turns": turns}


def bash(command: str, **extra: Any) -> dict[str, Any]:
    return {
        "tool_use": {"name": "Bash", "input": {"command": command, "description": "test"}},
        **extra,
    }


def asked(server: ModelServer, conv: str) -> list[RecordedRequest]:
    return [r for r in server.requests if r.path == "/v1/messages" and r.conversation == conv]


class Killer:
    """Kills a flower's step child while it waits on request number n, for chosen n."""

    def __init__(self, f: Flower, proc: subprocess.Popen[bytes], conv: str, every: int) -> None:
        self.f, self.proc, self.conv, self.every = f, proc, conv, every
        self.done = 0  # requests dealt with

    def poll(self) -> None:
        reqs = asked(self.f.server, self.conv)
        while self.done < len(reqs):
            self.done += 1
            if self.done % self.every == 0:
                # The request is held by the server: the child that sent it is still waiting.
                child = wait_until(
                    lambda: attempt_child(self.proc.pid), 10, f"the child of request {self.done}"
                )
                child.kill()


@pytest.mark.timeout(420)  # two flowers side by side, each backing off 5 times: 4+8+16+32+64 s ±25%
def test_mixed_faults_share_one_count_and_so_do_deaths_alone(model_server, flower_env):
    server = model_server(
        {
            "conversations": [
                conversation("mixed", [{"error": 529, "delay": 2}]),  # every request: 2 s, 529
                conversation("dead", [{"text": "never answered", "delay": 300}]),
            ]
        }
    )
    mixed, dead = flower_env(server), flower_env(server)
    resumes_in_tmp = set(Path(tempfile.gettempdir()).glob("claude-resume-*"))
    procs = {"mixed": mixed.start(flow=f"{FLOWS}:mixed"), "dead": dead.start(flow=f"{FLOWS}:dead")}
    killers = [Killer(mixed, procs["mixed"], "mixed", 2), Killer(dead, procs["dead"], "dead", 1)]
    deadline = time.monotonic() + 400
    while any(p.poll() is None for p in procs.values()) and time.monotonic() < deadline:
        for k in killers:
            if k.proc.poll() is None:
                k.poll()
        time.sleep(0.05)

    for name, f in (("mixed", mixed), ("dead", dead)):
        proc = procs[name]
        out = proc.communicate(timeout=10)[0].decode("utf-8", "replace")
        assert proc.returncode == 1, out
        (row,) = f.rows(name)
        assert not row["ok"] and row["attempts"] == 6 and len(row["errors"]) == 6, row
        assert len(asked(server, name)) == 6, "more attempts reached the model than max_attempts"
        f.assert_no_survivors()
    kinds = [
        "529" if "529" in e else "died" if DIED in e else e
        for e in mixed.rows("mixed")[0]["errors"]
    ]
    assert kinds == ["529", "died"] * 3, kinds
    assert all(DIED in e for e in dead.rows("dead")[0]["errors"]), dead.rows("dead")[0]["errors"]
    # The SDK copies a resumed session into a temporary directory and cannot remove it when
    # its child is killed: those live in the run_dir and went with the dead children.
    assert set(Path(tempfile.gettempdir()).glob("claude-resume-*")) <= resumes_in_tmp
    for f in (mixed, dead):
        assert not [p for p in (f.runs / "tmp").iterdir()], list((f.runs / "tmp").iterdir())


@pytest.mark.timeout(90)  # one flower run that stops at its first attempt
def test_a_bug_in_flower_in_the_step_child_is_not_retried(model_server, flower_env):
    server = model_server({"conversations": [conversation("buggy", ["never needed"])]})
    f: Flower = flower_env(server)
    code, out = f.run(flow="tests.flows.buggy:flow", timeout=60)
    assert code == 1, out
    (row,) = f.rows("buggy")
    assert not row["ok"] and row["attempts"] == 1 and len(row["errors"]) == 1, row
    assert "not retried" in row["error"] and "AttributeError" in row["error"], row["error"]
    assert "a planted bug" in row["error"]
    log = Path(row["error"].rsplit("traceback in ", 1)[1])
    assert log.is_file() and "Traceback" in log.read_text() and "_see" in log.read_text()
    assert len(asked(server, "buggy")) == 1, "a crash was retried"
    assert "API 暂时不可用" not in out and "Traceback" not in out, out
    assert [line for line in out.splitlines() if "not retried" in line], out
    f.assert_no_survivors()


# --- one fault sequence, both placements -------------------------------------------------

HANDOFF = """\
## 在做什么
写 seq.txt,写到第三行。

## 已经定下的
一行一个 echo。

## 下一步
[[seq-next]] 接着写。
"""
SENTENCE = "先别写第三行,改成写 README"
BIG = {"input_tokens": 155_000}  # past HandoffPolicy.at = 150K of a 200K window (haiku)


def seq_script() -> dict[str, Any]:
    return {
        "conversations": [
            conversation("seq-next", [{"text": "seq done."}]),
            conversation(
                "seq",
                [
                    bash("echo one >> seq.txt", error=529, times=1),  # a 529, then the call
                    # Held twice: the first time the CLI is killed, the second interrupted.
                    bash("echo two >> seq.txt", delay=60, times=2),
                    # crosses the handoff threshold; its tool is still running when the
                    # handoff interrupts (a quick one had sometimes ended: the CLI then marks
                    # the cut "[Request interrupted by user]", 13 bytes shorter than "… for
                    # tool use", and the two placements' requests, so their costs, differed)
                    bash("timeout 60 tail -f /dev/null; echo three", usage=BIG),
                    {"text": HANDOFF},  # the full session's handoff
                ],
            ),
        ]
    }


def drive(server: ModelServer, runs: Path, under: int, interrupt: Any) -> None:
    """The fault sequence, from outside: kill the CLI in the first held request, interrupt
    with SENTENCE in the second."""
    held = wait_until(lambda: [r for r in asked(server, "seq") if r.turn == 1], 90, "turn 1")
    sid = held[0].session_id
    from flower.testing.rundir import has_tool_result

    wait_until(lambda: has_tool_result(runs, sid), 10, "the first tool result in sessions.db")
    (cli,) = wait_until(lambda: cli_under(under), 10, "the CLI")
    cli.send_signal(signal.SIGKILL)
    wait_until(
        lambda: len([r for r in asked(server, "seq") if r.turn == 1]) == 2, 60, "turn 1 again"
    )
    wait_until(lambda: cli_under(under), 10, "the resumed CLI")
    interrupt()


def normalized(row: dict[str, Any]) -> dict[str, Any]:
    """A result with its timings dropped, its session ids named by first appearance."""
    names: dict[str, str] = {}
    for sid in [*row["retired"], row["session_id"]]:
        names.setdefault(sid, f"S{len(names) + 1}")
    keep = {
        k: v for k, v in row.items() if k not in ("started_at", "ended_at", "duration_s", "run")
    }
    keep["session_id"] = names[row["session_id"]]
    keep["retired"] = [names[s] for s in row["retired"]]
    keep["cost_usd"] = round(row["cost_usd"], 6)
    # The CLI's error text names the gateway it talked to: each run has its own server.
    keep["errors"] = [re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", e) for e in row["errors"]]
    return keep


def in_process(f: Flower, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The sequence with ``Runtime``'s default placement, in this very process."""
    for key, value in f.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(f.root)
    # the same workbench flower-super start gives a flow (<workspace>/.flower)
    rt = Runtime(
        workspace=f.ws,
        run_dir=f.runs,
        workbench=Workbench(f.ws),
        trim=True,
        resilience=Resilience(),
    )

    async def go() -> None:
        run = asyncio.ensure_future(inside.seq.run(rt))

        def interrupt() -> None:
            rt.interrupt(SENTENCE)  # from another thread, as a UI would

        await asyncio.to_thread(drive, f.server, f.runs, os.getpid(), interrupt)
        await run

    try:
        asyncio.run(go())
    finally:
        rt.close()
    (row,) = read_manifest(f.runs)
    return row


def forked(f: Flower) -> dict[str, Any]:
    """The sequence under ``flower-super``: every attempt in its own step child."""
    proc = f.start(flow=f"{FLOWS}:seq", stdin=subprocess.PIPE)
    assert proc.stdin is not None

    def interrupt() -> None:
        proc.stdin.write(SENTENCE.encode() + b"\n")  # read by the supervisor once it asks
        proc.stdin.flush()
        proc.send_signal(signal.SIGINT)  # what the terminal's Ctrl-C sends the supervisor

    drive(f.server, f.runs, proc.pid, interrupt)
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 0, out.decode("utf-8", "replace")
    (row,) = f.rows("seq")
    return row


@pytest.mark.timeout(240)  # two runs of the sequence, each ~4 s + ~8 s of backoff and 7 CLI turns
def test_one_fault_sequence_gives_the_same_result_in_both_placements(
    model_server, flower_env, monkeypatch
):
    env = {"ANTHROPIC_MODEL": "claude-haiku-4-5"}  # a 200K window: the handoff fires at 150K
    here = flower_env(model_server(seq_script()), extra_env=env)
    there = flower_env(model_server(seq_script()), extra_env=env)
    a, b = in_process(here, monkeypatch), forked(there)
    assert normalized(a) == normalized(b)
    # And the sequence did happen: a 529 and a dead CLI counted, the interrupt and the
    # handoff did not; the successor finished.
    assert a["ok"] and a["attempts"] == 3 and len(a["errors"]) == 2, a
    assert "529" in a["errors"][0] and "-9" in a["errors"][1], a["errors"]
    assert a["resumed"] and len(a["retired"]) == 1 and a["text"] == "seq done.", a
    for f in (here, there):
        told = [r for r in asked(f.server, "seq") if any(SENTENCE in t for t in r.texts())]
        assert told and {r.session_id for r in told} == {a_sid(f)}, "the sentence went elsewhere"
        assert (f.ws / "seq.txt").read_text().splitlines() == ["one", "two"], "a call ran twice"
        f.assert_no_survivors()


def a_sid(f: Flower) -> str:
    """The first session of the step (the one the faults hit)."""
    return asked(f.server, "seq")[0].session_id


class CountingProbes(Resilience):
    """The default policy, counting its network probes."""

    probes = 0

    def reachable(self) -> bool:
        CountingProbes.probes += 1
        return super().reachable()


@pytest.mark.timeout(60)  # one in-process attempt
def test_a_bug_in_flower_in_process_fails_the_step_at_once(model_server, flower_env, monkeypatch):
    server = model_server({"conversations": [conversation("inbug", ["never needed"])]})
    f: Flower = flower_env(server)
    for key, value in f.env.items():
        monkeypatch.setenv(key, value)

    def see(self: Any, msg: Any) -> None:
        raise KeyError("usage (a planted bug)")

    monkeypatch.setattr("flower.step.attempt.AttemptState.see", see)
    CountingProbes.probes = 0
    rt = Runtime(workspace=f.ws, run_dir=f.runs, resilience=CountingProbes())
    try:
        res = asyncio.run(rt.run(inside.hands, "[[inbug]] go", step_name="inbug"))
    finally:
        rt.close()
    assert not res.ok and res.attempts == 1 and res.errors == [res.error], res
    assert "not retried" in (res.error or "") and "KeyError" in (res.error or ""), res.error
    log = f.runs / "logs" / rt.run_id / "inbug.log"
    assert str(log) in (res.error or "") and "a planted bug" in log.read_text()
    assert "Traceback" in log.read_text()
    assert CountingProbes.probes == 0, "a crash probed the network"
    assert len(asked(server, "inbug")) == 1
    f.assert_no_survivors()


# --- per-step settings travel with the step call (issue 18) ------------------------------


@pytest.mark.timeout(90)  # three in-process CLI turns side by side, then three quick attempts
def test_a_map_of_irreversible_items_leaves_the_next_step_its_full_max_attempts(
    model_server, flower_env, monkeypatch
):
    """Each ``idempotent=False`` item gets one attempt, and that is the item's own: two of
    them side by side leave the Runtime's policy whole, so the step after the map is
    retried after a 529 exactly as often as the policy says (before, the items restored
    each other's swapped policy and left ``max_attempts=1`` behind)."""
    from flower import MapStep, Step, Workflow

    server = model_server(
        {
            "conversations": [
                conversation("map-a", [{"text": "map-a done."}]),
                # Still answering when map-a has finished: the two items overlap.
                conversation("map-b", [{"error": 529, "delay": 2}]),
                conversation("after", [{"error": 529}]),  # every request: a 529
            ]
        }
    )
    f: Flower = flower_env(server)
    for key, value in f.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(f.root)
    flow = Workflow(
        [
            MapStep(
                "each",
                inside.hands,
                prompt=lambda ctx, item: f"[[{item}]] go",
                over="items",
                idempotent=False,
                on_fail="continue",
            ),
            Step("after", inside.hands, "[[after]] go"),
        ],
        name="irreversible-map",
        context={"items": ["map-a", "map-b"]},
    )
    policy = Resilience(max_attempts=3, base_delay=0.2, max_delay=1.0)
    rt = Runtime(workspace=f.ws, run_dir=f.runs, resilience=policy)
    try:
        asyncio.run(flow.run(rt))
    finally:
        rt.close()
    rows = {row["step"]: row for row in read_manifest(f.runs)}
    assert rows["each[0]"]["ok"] and rows["each[0]"]["attempts"] == 1, rows["each[0]"]
    assert not rows["each[1]"]["ok"] and rows["each[1]"]["attempts"] == 1, rows["each[1]"]
    assert len(asked(server, "map-b")) == 1, "an irreversible item was retried"
    after = rows["after"]
    assert not after["ok"] and after["attempts"] == 3 and len(after["errors"]) == 3, after
    assert len(asked(server, "after")) == 3, "the step after the map did not get max_attempts"
    assert rt.resilience is policy
    f.assert_no_survivors()
