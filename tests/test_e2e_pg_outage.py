"""PostgreSQL stopped for 10 s in the middle of a step, end to end (issue 18).

The real ``flower-super start`` with ``FLOWER_STATE`` on a PostgreSQL server of this
module's own (the test stops it: never the suite's shared server), the real CLI against the
scripted model server. The second step is held in a Bash tool call; the server is stopped;
the tool is let go, so the CLI finishes the call, asks the model again, runs one more tool
call and ends the step while the database is down; ten seconds after it went down the
server is started again. The run must finish (exit 0) with one ``!`` line about the state
database on the terminal, and nothing lost: the transcript in PostgreSQL holds every entry
the CLI wrote, in its order, the ledger has both tool calls finished, the manifest and
lineage rows are complete, and no spool is left on the machine.

Then a session that begins during an outage (issue 24): the first step ends and the second
starts its session while the database is down; a kill -9 after it is back, or while it is
still down (the next flower delivers the dead one's spool): the next run continues that
session and sends nothing finished again.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from flower.services.model_server import ModelServer
from flower.services.postgres import PgServer
from flower.testing.pytest_postgres import database_url
from tests.e2e import answers, kill, wait_until
from tests.e2e_pg import PgFlower

# One flower run of real CLI turns, a 10 s outage in the middle, this module's own server
# (initdb + start: ~1 s idle, 5 s on a loaded machine).
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

FLOW = "tests.flows.basic:two"
OUTAGE_S = 10.0
GATED = "touch tool.started; until [ -e {gate} ]; do sleep 0.1; done; echo through"
# Entry types of the CLI's own jsonl that it never mirrors to a session store
CLI_LOCAL = {"api-request", "api-request-shape", "api-request-blob", "cost-state"}
# what it appends after its result (not mirrored either); Claude Code 2.1.337 also writes an
# api-request-route entry there
AFTER_RESULT = {"last-prompt", "api-request-route"}


# own_server: tests/pg_own.py (through conftest), a server of this module's own
@pytest.fixture
def state(own_server: PgServer) -> Iterator[str]:
    """A fresh database on the module's server; the server is up again afterwards."""
    name = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(own_server.dsn, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    yield database_url(own_server.dsn, name)
    if not (own_server.data / "postmaster.pid").exists():
        own_server.up()


def bash(command: str) -> dict[str, Any]:
    return {"tool_use": {"name": "Bash", "input": {"command": command, "description": "t"}}}


def test_postgres_stopped_for_10s_mid_step(
    model_server: Any, flower_env: Any, own_server: PgServer, state: str, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    server: ModelServer = model_server(
        {
            "conversations": [
                {
                    "name": "first",
                    "match": {"marker": "[[first]]"},
                    "turns": [{"text": "first done."}],
                },
                {
                    "name": "second",
                    "match": {"marker": "[[second]]"},
                    "turns": [
                        bash(GATED.format(gate=gate)),
                        bash("echo ran >> during.txt"),
                        {"text": "second done."},
                    ],
                },
            ]
        }
    )
    f: PgFlower = flower_env(server, state=state)
    proc = f.start(flow=FLOW)
    try:
        wait_until(lambda: (f.ws / "tool.started").exists(), 90, "the held tool call to start")
        sid = f.lineage()["steps"]["second"]
        own_server.down()
        down_at = time.monotonic()
        gate.touch()
        # the step goes on while the database is down: the CLI asks the model again and
        # runs the next tool call
        server.wait_for(
            lambda reqs: any(r.conversation == "second" and r.turn == 2 for r in reqs),
            timeout=OUTAGE_S,
        )
        assert (f.ws / "during.txt").exists()
        # The outage lasts OUTAGE_S whatever the step does meanwhile: its length is what is
        # tested here, not a wait for something to happen.
        time.sleep(max(0.0, down_at + OUTAGE_S - time.monotonic()))
        own_server.up()
        out, _ = proc.communicate(timeout=120)
    finally:
        gate.touch()
    text = out.decode("utf-8", "replace")
    assert proc.returncode == 0, text

    warned = [line for line in text.splitlines() if line.startswith("!")]
    assert len(warned) == 1 and "PostgreSQL" in warned[0], text
    # Nothing left on the machine: the supervisor's spool and the step child's (the child
    # ended its attempt during the outage, or wrote through it) are in the database.
    assert not list((f.root / "home").rglob("*.spool*")), "a spool was left undelivered"

    # The transcript in PostgreSQL is what the CLI wrote, whole entries in its order: its
    # own jsonl less what it keeps locally (request records, its cost state) and what it
    # writes after its result, which is never mirrored (the same with no outage: measured).
    stored = f.transcript(sid)
    (jsonl,) = (f.root / "home").rglob(f"{sid}.jsonl")
    lines = jsonl.read_text(encoding="utf-8").splitlines()
    cli = [e for e in map(json.loads, filter(None, lines)) if e.get("type") not in CLI_LOCAL]
    assert stored == cli[: len(stored)], "the transcript in PostgreSQL differs from the CLI's"
    assert {e.get("type") for e in cli[len(stored) :]} <= AFTER_RESULT, cli[len(stored) :]
    # ...and it holds the turns the step took during the outage: both tool calls and their
    # results, in the order the model was sent them, and the last answer.
    asked = [r for r in server.requests if r.conversation == "second"]
    assert [r.session_id for r in asked] == [sid] * 3
    sent = tool_ids(asked[-1].messages)
    assert len(sent) == 4 and tool_ids([e["message"] for e in stored if "message" in e]) == sent
    # (the CLI may write bookkeeping entries after it, such as an "atis-latch": seen in CI)
    last = [e for e in stored if e.get("type") == "assistant"][-1]
    assert "second done." in json.dumps(last, ensure_ascii=False)

    # The ledger has both calls finished; the manifest, the registry and the event log
    # every row the supervisor wrote during the outage.
    calls = f.ledger(sid)
    assert [(c["name"], c["state"]) for c in calls] == [("Bash", "done")] * 2, calls
    assert [c["tool_use_id"] for c in calls] == sent[::2]
    rows = f.manifest()
    assert [(r["step"], r["ok"]) for r in rows] == [("first", True), ("second", True)], rows
    assert rows[1]["session_id"] == sid and rows[1]["num_turns"] == 3, rows[1]
    run = rows[1]["run"]
    commands = [e["text"] for e in f.events(run) if e["kind"] == "tool_call"]
    assert len(commands) == 2 and "echo ran" in commands[1], commands
    assert f.lineage()["steps"] == {"first": rows[0]["session_id"], "second": sid}
    code, report = f.status_json()
    assert code == 0 and [fl["state"] for fl in report["flowers"]] == ["finished"], report

    assert (f.ws / "during.txt").read_text().splitlines() == ["ran"]
    f.assert_no_survivors()
    f.assert_state_home()


def tool_ids(messages: list[dict[str, Any]]) -> list[str]:
    """The tool_use and tool_result ids in ``messages``, in order."""
    out = []
    for m in messages:
        content = m.get("content")
        for block in content if isinstance(content, list) else []:
            if block.get("type") == "tool_use":
                out.append(block["id"])
            elif block.get("type") == "tool_result":
                out.append(block["tool_use_id"])
    return out


def spooled(home: Path) -> list[dict[str, Any]]:
    """Every record in the spools under ``home`` (a cut last line is skipped)."""
    out = []
    for spool in home.rglob("*.spool"):
        for line in spool.read_text(encoding="utf-8").splitlines()[1:]:
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


@pytest.mark.parametrize("killed", ["after it is back", "while it is down"])
def test_a_session_begun_during_an_outage_is_continued_after_a_kill_9(
    model_server: Any,
    flower_env: Any,
    own_server: PgServer,
    state: str,
    tmp_path: Path,
    killed: str,
) -> None:
    """PostgreSQL goes down while the first step still works, so the second step starts its
    session during the outage; kill -9 once the database is back (and the spool delivered),
    or while it is still down (the next flower delivers the dead one's spool): the next run
    continues that session, with its earlier turns, and sends nothing of the first again."""
    gate = tmp_path / "gate"
    server: ModelServer = model_server(
        {
            "conversations": [
                {
                    "name": "first",
                    "match": {"marker": "[[first]]"},
                    "turns": [bash(GATED.format(gate=gate)), {"text": "first done."}],
                },
                {
                    "name": "second",
                    "match": {"marker": "[[second]]"},
                    "turns": [
                        bash("echo ran >> counter.txt"),
                        {"text": "second done.", "delay": 90, "times": 1},
                    ],
                },
            ]
        }
    )
    f: PgFlower = flower_env(server, state=state)
    home = f.root / "home"
    proc = f.start(flow=FLOW)
    try:
        wait_until(lambda: (f.ws / "tool.started").exists(), 90, "the held tool call to start")
        own_server.down()
        gate.touch()
        # the second step's session begins while the database is down, and gets as far as
        # its second request (the tool ran, its result is in the transcript)
        server.wait_for(
            lambda reqs: any(r.conversation == "second" and r.turn == 1 for r in reqs),
            timeout=60,
        )
        (sid,) = {r.session_id for r in server.requests if r.conversation == "second"}
        if killed == "after it is back":
            own_server.up()
            wait_until(
                lambda: f.lineage()["steps"].get("second") == sid and f.has_tool_result(sid),
                60,
                "the spooled lineage and transcript to reach PostgreSQL",
            )
        else:
            # the session is on the machine, in the spool, and only there
            wait_until(
                lambda: (
                    any(
                        r["op"] == "lineage.put" and r["args"].get("sid") == sid
                        for r in spooled(home)
                    )
                    and any(
                        r["op"] == "append" and "tool_result" in json.dumps(r["args"])
                        for r in spooled(home)
                    )
                ),
                30,
                "the second step's lineage and tool result in the spool",
            )
        killed_at = max(r.seq for r in server.requests)
        assert kill(proc) == -signal.SIGKILL
        f.assert_no_survivors(within=5.0)
        if killed == "while it is down":
            own_server.up()
    finally:
        gate.touch()
        if not (own_server.data / "postmaster.pid").exists():
            own_server.up()

    code, out = f.run(flow=FLOW, timeout=120)
    assert code == 0, out
    after = [r for r in server.requests if r.seq > killed_at]
    assert not [r for r in after if r.conversation == "first"], "a finished step was re-sent"
    resumed = [r for r in after if r.conversation == "second"]
    assert resumed and {r.session_id for r in resumed} == {sid}, (
        f"the second step did not continue its session {sid}: "
        f"{[(r.conversation, r.session_id) for r in after]}"
    )
    assert tool_ids(resumed[0].messages), "the earlier turns were not sent on resume"
    assert (f.ws / "counter.txt").read_text().splitlines() == ["ran"], "a tool call ran again"
    assert f.lineage()["steps"]["second"] == sid
    # the first step once as run and once reused (no model call), the second once done
    done = [(r["step"], r.get("reused")) for r in f.manifest() if r["ok"]]
    assert done == [("first", None), ("first", "run-only"), ("second", None)], done
    assert not list(home.rglob("*.spool*")), "a spool was left undelivered"
    for req in server.requests:
        assert not any("API Error" in t for t in req.texts()), f"request {req.seq} fed an error"
    f.assert_no_survivors()
    f.assert_state_home()


def test_a_start_while_the_database_is_down_waits_for_it_and_runs(
    model_server: Any, flower_env: Any, own_server: PgServer, state: str
) -> None:
    """The database down as the start begins (a server restart, an outage as a scheduled
    run fires): the start says so in one line and waits; back 4 s later, the run is made
    and ends as any other, nothing written before the database was there."""
    server: ModelServer = model_server(answers("first", "second"))
    f: PgFlower = flower_env(server, state=state)
    own_server.down()
    proc = f.start(flow=FLOW)
    lines: list[str] = []
    reader = threading.Thread(target=_collect, args=(proc, lines), daemon=True)
    reader.start()
    try:
        wait_until(lambda: any("Ctrl-C" in x for x in lines), 60, "the start's waiting line")
        time.sleep(2.0)  # down 2 s more after it said so: how long is what is tested
        assert proc.poll() is None, "the start gave up on a database that was down"
        assert not server.requests, "a step ran before the run state was there"
        own_server.up()
        proc.wait(timeout=120)
        reader.join(timeout=30)
    finally:
        if proc.poll() is None:
            kill(proc)
    text = "".join(lines)
    assert proc.returncode == 0, text
    waited = [line for line in text.splitlines() if "Ctrl-C" in line and "PostgreSQL" in line]
    assert len(waited) == 1 and waited[0].startswith("! "), text
    assert [r.conversation for r in server.requests if r.conversation] == ["first", "second"]
    assert [(r["step"], r["ok"]) for r in f.manifest()] == [("first", True), ("second", True)]


def _collect(proc: Any, into: list[str]) -> None:
    """What ``proc`` prints, line by line into ``into``, as it prints it."""
    for raw in iter(proc.stdout.readline, b""):
        into.append(raw.decode("utf-8", "replace"))
