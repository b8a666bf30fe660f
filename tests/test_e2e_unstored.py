"""A session that was never stored, or that the CLI will not resume (issue 23).

Claude Code 2.1.337 writes an ``api-request-route`` entry before the prompt, so a step killed
between the two used to be named in lineage (the store "had" it) and resumed for ever: the
CLI answered ``No conversation found`` before any request, and flower took that for an API
outage. These drills run the real flower-super and the real CLI against the scripted model
server, on local state and on PostgreSQL (``state``):

- a step child killed after its session id is known (the model server has its request) and
  before the store holds its conversation (the test holds the store's writes, as a busy
  database would): the next attempt starts the step afresh, said in one line, exit 0;
- a session the store holds but the CLI refuses to resume (its one prompt entry is a
  sidechain's, as a stray subagent entry would be): one line, a fresh session with the
  step's own prompt, exit 0, and the next run never tries the refused id again;
- a failure of the CLI on this machine before any request that is not a refusal (a
  ``resume_at`` naming no message): classified as local, one attempt, no retry.

And every manifest row (and ``status --json``) names the SDK and the CLI that ran it, so a
difference between two runs shows.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from flower.step.resilience import CLI_FAILED, RESUME_PROMPT, classify
from tests.e2e import Flower, attempt_child, wait_until
from tests.e2e_pg import STATES, PgFlower

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

ONE = "tests.flows.basic:one"  # Step("only", hands, "[[only]] do it")
WARM = "tests.flows.basic:alpha"  # a first run: the run state exists before the test holds it
PROMPT = "[[only]] do it"
HOLD = 90  # seconds the scripted model "thinks" (once), so the drill acts mid-request
# How long the store's writes stay held once the request is in: longer than the 5 s after
# which flower, before issue 23, named a session the store did not hold.
HELD_S = 6.0
FRESH_DIED = "会话还没存下:"  # term.retry.died.fresh
FRESH_REFUSED = "接不上了(CLI 说没有这段对话"  # term.fresh
OUTAGE = "API 暂时不可用"  # term.retry.api: never for a failure of the CLI itself


@pytest.fixture(params=STATES)
def state(request: pytest.FixtureRequest) -> str | None:
    return request.getfixturevalue("pg_dsn") if request.param == "postgres" else None


def script(only_turns: list) -> dict:
    return {
        "conversations": [
            {"name": "alpha", "match": {"marker": "[[alpha]]"}, "turns": ["alpha done."]},
            {"name": "only", "match": {"marker": "[[only]]"}, "turns": only_turns},
        ]
    }


@contextlib.contextmanager
def writes_held(f: Flower) -> Iterator[None]:
    """Every write to the run state's transcripts waits (a database busy elsewhere); reads
    go on. Local: an exclusive transaction on sessions.db (WAL: readers are not blocked);
    PostgreSQL: ``LOCK TABLE … IN EXCLUSIVE MODE`` on the entries."""
    if isinstance(f, PgFlower):
        import psycopg

        with psycopg.connect(f.dsn) as conn:
            conn.execute("LOCK TABLE flower.entries IN EXCLUSIVE MODE")
            yield
            conn.rollback()
        return
    conn = sqlite3.connect(f.runs / "sessions.db", timeout=10, isolation_level=None)
    try:
        conn.execute("BEGIN EXCLUSIVE")
        yield
        conn.execute("ROLLBACK")
    finally:
        conn.close()


def stored_types(f: Flower, sid: str) -> list[str]:
    """The types of the entries the run state holds for session ``sid`` (read by SQL)."""
    if isinstance(f, PgFlower):
        rows = f._rows("SELECT data FROM {s}.entries WHERE key LIKE %s ORDER BY seq", (f"%/{sid}",))
    else:
        with contextlib.closing(sqlite3.connect(f.runs / "sessions.db", timeout=10)) as conn:
            rows = conn.execute(
                "SELECT data FROM entries WHERE key LIKE ? ORDER BY seq", (f"%/{sid}",)
            ).fetchall()
    return [str(json.loads(d).get("type")) for (d,) in rows]


def lineage_of(f: Flower, step: str) -> str | None:
    try:
        return f.lineage()["steps"].get(step)
    except (LookupError, OSError, ValueError):
        return None


def first_texts(req) -> list[str]:
    return [t for t in req.texts() if t.strip()]


def test_a_step_killed_before_its_prompt_is_stored_starts_afresh_in_one_line(
    model_server, flower_env, state
):
    server = model_server(script([{"text": "only done.", "delay": HOLD, "times": 1}]))
    f: Flower = flower_env(server, state=state)
    code, out = f.run(flow=WARM)
    assert code == 0, out

    with writes_held(f):
        proc = f.start(flow=ONE)
        held = server.wait_for(
            lambda reqs: next((r for r in reqs if r.conversation == "only"), None), timeout=60
        )
        doomed = held.session_id
        assert doomed, "the request names no session"
        child = wait_until(lambda: attempt_child(proc.pid), 10, "the attempt's child")
        # The session is known (its request is in) and nothing of it is a conversation in
        # the store; flower must not name it while that lasts.
        until = time.monotonic() + HELD_S
        while time.monotonic() < until:
            assert "user" not in stored_types(f, doomed), "the held store took the prompt"
            assert lineage_of(f, "only") != doomed, "lineage named a session never stored"
            time.sleep(0.2)
        child.kill()
    out_b, _ = proc.communicate(timeout=120)
    out = out_b.decode("utf-8", "replace")
    assert proc.returncode == 0, out

    asked = [r for r in server.requests if r.conversation == "only"]
    fresh = {r.session_id for r in asked} - {doomed}
    assert len(fresh) == 1, f"sessions asked: {[r.session_id for r in asked]}"
    (new,) = fresh
    again = [r for r in asked if r.session_id == new]
    assert PROMPT in " ".join(first_texts(again[0])), "the fresh session lacks its own prompt"
    assert RESUME_PROMPT not in " ".join(first_texts(again[0])), "told to carry on from nothing"
    assert out.count(FRESH_DIED) == 1, out
    assert OUTAGE not in out and "No conversation found" not in out, out
    assert lineage_of(f, "only") == new
    (row,) = f.rows("only")
    assert row["ok"] and row["attempts"] == 2 and row["session_id"] == new, row
    assert not row["resumed"], row
    f.assert_no_survivors()


def _refuse(f: Flower, sid: str) -> None:
    """Make the stored transcript of ``sid`` one the CLI will not resume: its prompt
    entries become a sidechain's (the store still holds a user entry)."""
    if isinstance(f, PgFlower):
        import psycopg

        with psycopg.connect(f.dsn, autocommit=True) as conn:
            conn.execute(
                "UPDATE flower.entries SET data = jsonb_set(data::jsonb, '{isSidechain}',"
                " 'true')::text WHERE key LIKE %s",
                (f"%/{sid}",),
            )
        return
    with contextlib.closing(sqlite3.connect(f.runs / "sessions.db", timeout=10)) as conn:
        conn.execute(
            "UPDATE entries SET data = json_set(data, '$.isSidechain', json('true'))"
            " WHERE key LIKE ?",
            (f"%/{sid}",),
        )
        conn.commit()


def test_a_session_the_cli_refuses_to_resume_starts_afresh_once_and_is_forgotten(
    model_server, flower_env, state
):
    server = model_server(script(["only done.", "only again.", "only once more."]))
    f: Flower = flower_env(server, state=state)
    code, out = f.run(flow=ONE)
    assert code == 0, out
    refused = lineage_of(f, "only")
    assert refused
    _refuse(f, refused)

    code, out = f.run(flow=ONE)  # a wake: the step would continue its session
    assert code == 0, out
    assert out.count(FRESH_REFUSED) == 1, out
    assert refused[:8] in out, out
    assert OUTAGE not in out and "Traceback" not in out, out
    new = lineage_of(f, "only")
    assert new and new != refused
    asked = [r for r in server.requests if r.conversation == "only"]
    assert refused not in {r.session_id for r in asked[1:]}, "the refused session was asked"
    assert PROMPT in " ".join(first_texts(asked[1])), "the fresh session lacks its own prompt"
    rows = f.rows("only")
    assert rows[-1]["ok"] and rows[-1]["session_id"] == new and rows[-1]["attempts"] == 1

    code, out = f.run(flow=ONE)  # the next wake continues the new session, never the old
    assert code == 0, out
    assert FRESH_REFUSED not in out, out
    assert {r.session_id for r in server.requests if r.conversation == "only"} - {refused} == {new}
    assert lineage_of(f, "only") == new
    f.assert_no_survivors()


SCRIPT_RESUME_AT = """
import asyncio, sys
from flower import AgentSpec, Runtime

async def main():
    rt = Runtime(workspace=sys.argv[1], run_dir=sys.argv[2])
    spec = AgentSpec(name="hands", instructions="test agent")
    first = await rt.run(spec, "[[only]] do it")
    events = []
    second = await rt.run(spec, "[[only]] again", resume=first.session_id,
                          resume_at="00000000-0000-4000-8000-000000000000",
                          on_event=events.append)
    print("RESULT", second.ok, second.attempts, repr(second.error))
    print("KINDS", sorted({e.kind for e in events}))

asyncio.run(main())
"""


def test_a_cli_failure_before_any_request_is_local_one_attempt_and_no_retry(
    model_server, flower_env
):
    server = model_server(script(["only done.", "only again."]))
    f: Flower = flower_env(server)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT_RESUME_AT, str(f.ws), str(f.runs)],
        env=f.env,
        cwd=f.root,
        capture_output=True,
        timeout=90,
    )
    out = done.stdout.decode() + done.stderr.decode()
    assert done.returncode == 0, out
    result = next(line for line in out.splitlines() if line.startswith("RESULT "))
    assert result.startswith("RESULT False 1 "), out
    error = result.split(" ", 3)[3]
    assert error.strip("'\"").startswith(CLI_FAILED), error
    assert classify(error.strip("'\"")) == "local"
    kinds = next(line for line in out.splitlines() if line.startswith("KINDS "))
    assert "retry" not in kinds and "offline" not in kinds, kinds
    assert len([r for r in server.requests if r.conversation == "only"]) == 1, "asked again"


def bundled_cli_version() -> str:
    from flower.services.cli_env import claude_path

    return (claude_path().parent / "claude.version").read_text().split()[0]


def test_each_row_and_status_json_name_the_sdk_and_cli_that_ran_it(model_server, flower_env, state):
    import claude_agent_sdk

    server = model_server(script(["only done."]))
    f: Flower = flower_env(server, state=state)
    code, out = f.run(flow=ONE)
    assert code == 0, out
    (row,) = f.rows("only")
    want = {"sdk": claude_agent_sdk.__version__, "cli": bundled_cli_version()}
    assert {k: row.get(k) for k in want} == want, row
    code, js = f.status_json()
    assert code == 0
    (shown,) = [r for r in js["rows"] if r["step"] == "only"]
    assert {k: shown.get(k) for k in want} == want, shown
