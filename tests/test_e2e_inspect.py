"""``show``, ``logs [-f]`` and the commands ``status`` lists, against one real flower run.

One run of the two-step flow serves every assertion: ``first`` makes a tool call with a
three-line result and finishes; ``second`` runs a tool that waits for a file the test
creates, so the flower is held live (no fixed sleep anywhere) while a second process
follows its events, ``show`` reads its half-written session and ``status`` lists what
applies; then the gate opens, the flower ends, and the finished run is looked at.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
from pathlib import Path

import pytest

from tests.e2e import Flower, wait_until
from tests.test_e2e_kill import FLOW, bash

pytestmark = pytest.mark.e2e  # one flower run, ~15 short flower-super calls: ~8 s here

CJK = re.compile(r"[\u2e80-\u9fff\uf900-\ufaff\uff00-\uffef]")
GATE = """\
import pathlib, sys, time
pathlib.Path("gate.waiting").touch()
deadline = time.monotonic() + 90
while not pathlib.Path("go").exists():
    if time.monotonic() > deadline:
        sys.exit("the test never opened the gate")
    time.sleep(0.05)
print("gate open")
"""


def script() -> dict:
    return {
        "conversations": [
            {
                "name": "first",
                "match": {"marker": "[[first]]"},
                "turns": [bash("printf 'l1\\nl2\\nl3\\n'"), {"text": "first done."}],
            },
            {
                "name": "second",
                "match": {"marker": "[[second]]"},
                "turns": [bash("python3 gate.py"), {"text": "second done."}],
            },
        ]
    }


def cli(f: Flower, *args: str, lang: str = "en") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        f.argv(*args, "-r", str(f.runs)),
        cwd=f.root,
        env={**f.env, "FLOWER_LANG": lang},
        capture_output=True,
        text=True,
        timeout=60,
    )


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return done.stdout


class Follower:
    """``flower-super logs -f RUN`` in a second process; its lines collected as they come."""

    def __init__(self, f: Flower, run: str, procs: list[subprocess.Popen[str]]) -> None:
        self.proc = subprocess.Popen(
            f.argv("logs", "-f", run, "-r", str(f.runs)),
            cwd=f.root,
            env={**f.env, "FLOWER_LANG": "en"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        procs.append(self.proc)  # killed and reaped after the test, whatever happened
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def saw(self, pattern: str) -> bool:
        return any(re.search(pattern, line) for line in self.lines)


def test_show_logs_and_status_commands_of_a_live_then_finished_flower(
    model_server, flower_env, procs
):
    server = model_server(script())
    f: Flower = flower_env(server)
    (f.ws / "gate.py").write_text(GATE)
    flower = f.start(flow=FLOW)
    record = wait_until(lambda: next((f.runs / "flowers").glob("*.json"), None), 60, "a record")
    run = Path(record).stem
    follower = Follower(f, run, procs)

    # -- live: the second step's tool call waits at the gate ----------------------------
    wait_until(lambda: (f.ws / "gate.waiting").exists(), 60, "the second step's tool call")
    sid = f.lineage()["steps"]["second"]
    wait_until(lambda: "gate.py" in json.dumps(f.transcript(sid)), 10, "the call in sessions.db")
    assert wait_until(lambda: follower.saw(r"second  tool_call  Bash  python3 gate\.py"), 20, "-f")
    assert follower.proc.poll() is None, "logs -f ended while the flower runs"

    live = ok(cli(f, "show"))  # nothing named: the step in flight of the latest run
    assert live.startswith(f"== second  · session {sid}"), live
    assert f"running now: run {run}" in live and "* Bash  python3 gate.py" in live, live
    assert "… still running" in live, live
    assert not CJK.search(live), live

    first = ok(cli(f, "show", "first"))  # a finished step, read while the flower runs
    assert re.search(r"^model  \* Bash  printf 'l1\\nl2\\nl3\\n'$", first, re.M), first
    assert re.search(r"^ +-> l1  \(3 lines\)$", first, re.M), first
    assert not re.search(r"^\s*l2$", first, re.M), "the result was not folded"
    doc = json.loads(ok(cli(f, "show", "first", "--json")))
    assert doc["session_id"] == f.lineage()["steps"]["first"] and doc["live"] is None
    kinds = [turn["kind"] for turn in doc["turns"]]
    assert kinds == ["prompt", "tool_call", "tool_result", "text"], kinds
    assert doc["turns"][1]["tool"] == "Bash" and doc["turns"][2]["text"] == "l1\nl2\nl3"
    assert doc["rows"][0]["ok"] is True and doc["rows"][0]["run"] == run

    status = ok(cli(f, "status"))
    for command in (f"show {run}", f"logs -f {run}", f"cancel {run}"):
        assert f"flower-super {command}" in status, status
    assert not CJK.search(status.replace(str(f.root), "")), status
    js = json.loads(ok(cli(f, "status", "--json")))
    assert js["flowers"][0]["commands"] == [
        f"flower-super show {run}",
        f"flower-super logs -f {run}",
        f"flower-super cancel {run}",
    ], js["flowers"]
    zh = ok(cli(f, "show", "second", lang="zh"))
    assert "正在进行" in zh and "还在执行" in zh, zh

    # -- the gate opens: the flower ends, and so does logs -f ---------------------------
    (f.ws / "go").touch()
    out, _ = flower.communicate(timeout=60)
    assert flower.returncode == 0, out.decode()
    assert follower.proc.wait(timeout=20) == 0, "\n".join(follower.lines)
    follower.reader.join(timeout=10)
    assert follower.saw(r"second  text  second done\.") and follower.saw(r"^-- that flower"), (
        "\n".join(follower.lines)
    )

    # -- finished ---------------------------------------------------------------------
    logs = ok(cli(f, "logs"))  # the latest run
    assert logs.splitlines()[0] == f"-- run {run} · two · finished", logs
    assert re.search(r"^\d\d:\d\d:\d\d  first  step  first 1/2$", logs, re.M), logs
    assert re.search(r"^\d\d:\d\d:\d\d  first  tool_result  l1 ⏎ l2 ⏎ l3$", logs, re.M), logs
    assert re.search(r"  second  text  second done\.$", logs, re.M), logs
    assert not CJK.search(logs), logs
    whole = ok(cli(f, "show", run[:15]))  # a run (by a prefix): its conversations in order
    assert whole.index("== first") < whole.index("== second") and "-> gate open" in whole, whole
    assert not CJK.search(whole), whole
    status = ok(cli(f, "status"))
    assert f"flower-super logs {run}" in status and "cancel" not in status, status

    for args in (("show", "19990101-000000-abcdef"), ("logs", "19990101")):
        done = cli(f, *args)
        assert done.returncode == 2 and not done.stdout, done
        lines = done.stderr.strip().splitlines()  # one line and its hint
        assert len(lines) == 2 and lines[1].lstrip().startswith("hint:"), done.stderr
    done = cli(f, "show", "nosuch", "--json")
    assert done.returncode == 2 and "error" in json.loads(done.stdout), done
    f.assert_no_survivors()
