"""The resume line resumes: the real flower-super, the real CLI, the scripted model server.

A flow whose first step reads the words given after ``start`` (``ctx["_ask"]``) is killed
(kill -9) in its second step. ``flower-super status`` prints the command that carries it
on; run as printed (through ``bash -c``, with the export line ``status`` prints beside it
when the state URL had a password), it continues the second step's session, sends nothing
for the first step again, and exits 0. Both backends: local files, and PostgreSQL named on
the command line by a URL with the password of a role that needs it.

A bare ``start --flow F`` after such a kill carries on with the recorded words (and says so
in one line), on both backends (PostgreSQL through ``FLOWER_STATE``); other words say in one
``!`` line that they changed, and the steps start over.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from flower.services.model_server import ModelServer
from flower.testing.pytest_postgres import database_url
from tests.e2e import Flower, kill, wait_until
from tests.e2e_pg import STATES

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

FLOW = "tests.flows.basic:asked"
HOLD = 90  # seconds the scripted model "thinks" (once) so the test kills mid-step
WORDS = "rename the parser's --strict flag to --pedantic"
PASSWORD = "horse-battery-" + secrets.token_hex(4)


def script() -> dict[str, Any]:
    return {
        "conversations": [
            {"name": "first", "match": {"marker": "[[first]]"}, "turns": [{"text": "first done."}]},
            {
                "name": "second",
                "match": {"marker": "[[second]]"},
                "turns": [
                    {
                        "tool_use": {
                            "name": "Bash",
                            "input": {"command": "echo ran >> counter.txt", "description": "t"},
                        }
                    },
                    {"text": "second done.", "delay": HOLD, "times": 1},
                ],
            },
        ]
    }


@pytest.fixture
def locked_url(pg_server: str, pg_dsn: str) -> Iterator[str]:
    """The test's database as a role of its own that must give its password (the suite's
    server trusts loopback: one pg_hba line for this role alone asks for it)."""
    role = f"r_{secrets.token_hex(5)}"
    database = pg_dsn.rpartition("/")[2]
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{PASSWORD}'")
        admin.execute(f"GRANT CONNECT, CREATE ON DATABASE {database} TO {role}")
        (hba_file,) = admin.execute("SHOW hba_file").fetchone() or ("",)
    hba = Path(hba_file)
    ours = "".join(f"host all {role} {net} scram-sha-256\n" for net in ("127.0.0.1/32", "::1/128"))
    hba.write_text(ours + hba.read_text())
    _reload(pg_server)
    url = pg_dsn.replace("://postgres@", f"://{role}:{PASSWORD}@")
    assert url != pg_dsn, pg_dsn
    try:
        # The server rereads pg_hba.conf on its own time after the reload signal.
        wait_until(lambda: _refused(pg_dsn.replace("://postgres@", f"://{role}@")), 10, "hba")
        yield url
    finally:
        hba.write_text(hba.read_text().replace(ours, ""))
        _reload(pg_server)
        with psycopg.connect(database_url(pg_server, database), autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}")
        with psycopg.connect(pg_server, autocommit=True) as admin:
            admin.execute(f"DROP ROLE IF EXISTS {role}")


def _refused(url: str) -> bool:
    """Is a connection to ``url`` (no password) refused for want of one?"""
    try:
        psycopg.connect(url, connect_timeout=10).close()
    except psycopg.OperationalError as exc:
        assert "password" in str(exc), exc
        return True
    return False


def _reload(pg_server: str) -> None:
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute("SELECT pg_reload_conf()")


@pytest.fixture(params=STATES)
def state_args(request: pytest.FixtureRequest) -> list[str]:
    """``--state URL`` on the command line (a URL with a password), or nothing (local)."""
    if request.param == "local":
        return []
    return ["--state", request.getfixturevalue("locked_url")]


def start(f: Flower, *args: str) -> subprocess.Popen[bytes]:
    return f.start(*args, flow=FLOW)


def status(f: Flower, state: list[str]) -> tuple[int, str]:
    """``status`` as a person runs it beside the workspace (a database's runs are the
    workspace's: ``-w``)."""
    return f.status("-w", str(f.ws), *state)


def killed_in_second(f: Flower, server: ModelServer, *args: str) -> tuple[str, int]:
    """Start the flow with ``args``, kill -9 it while its second step waits on the model;
    the second step's session and the last request's seq before the kill."""
    proc = start(f, *args)
    server.wait_for(
        lambda reqs: any(r.conversation == "second" and r.turn == 1 for r in reqs), timeout=60
    )
    sid = next(r.session_id for r in server.requests if r.conversation == "second")
    assert sid
    killed_at = max(r.seq for r in server.requests)
    assert kill(proc) == -signal.SIGKILL
    f.assert_no_survivors(within=5.0)
    return sid, killed_at


def carried_on(f: Flower, server: ModelServer, sid: str, killed_at: int) -> None:
    """After the kill: nothing for the first step, the second's session continued, its
    finished tool call not run again."""
    after = [r for r in server.requests if r.seq > killed_at]
    assert not [r for r in after if r.conversation == "first"], (
        "the first step was sent to the model again"
    )
    resumed = [r for r in after if r.conversation == "second"]
    assert resumed and {r.session_id for r in resumed} == {sid}
    assert (f.ws / "counter.txt").read_text().splitlines() == ["ran"]
    f.assert_no_survivors()


def shell_env(f: Flower) -> dict[str, str]:
    """The flower's environment with ``flower-super`` on PATH, as in a person's shell."""
    bin_dir = str(Path(sys.executable).parent)
    return {**f.env, "PATH": bin_dir + os.pathsep + f.env.get("PATH", "")}


def test_the_resume_line_run_as_printed_carries_the_run_on(
    model_server: Any, flower_env: Any, state_args: list[str]
) -> None:
    server: ModelServer = model_server(script())
    f: Flower = flower_env(server)
    sid, killed_at = killed_in_second(f, server, WORDS, *state_args)
    first = [r for r in server.requests if r.conversation == "first"]
    assert first and any(WORDS in text for text in first[0].texts())

    code, text = status(f, state_args)
    assert code == 3, text
    assert PASSWORD not in text, text
    lines = text.splitlines()
    (resume,) = [line for line in lines if re.match(r"\s*(接着做|resume): cd ", line)]
    command = resume.split(": ", 1)[1]
    exports = [line for line in lines if "export FLOWER_STATE=" in line]
    if state_args:
        assert ' --state "${FLOWER_STATE:?}" ' in command, command
        (export,) = exports
        assert lines[lines.index(resume) + 1] == export  # beside it
        masked = export[export.index("export ") :]
        assert "***" in masked and PASSWORD not in masked
        # The person puts the password where *** is, as the line says.
        script_text = masked.replace("***", PASSWORD) + "\n" + command
    else:
        assert not exports, text
        script_text = command
    assert command.endswith(" " + shlex.quote(WORDS)), command  # the words it was started with

    done = subprocess.run(
        ["bash", "-c", script_text],
        cwd=f.root,
        env=shell_env(f),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=150,
    )
    out = done.stdout.decode("utf-8", "replace") + done.stderr.decode("utf-8", "replace")
    assert done.returncode == 0, out
    carried_on(f, server, sid, killed_at)
    code, text = status(f, state_args)
    assert code == 0, text


@pytest.fixture(params=STATES)
def state_env(request: pytest.FixtureRequest) -> str | None:
    """Where the flower keeps its run state: None (local files), or a PostgreSQL database
    of the test's own named by ``FLOWER_STATE`` (tests/e2e_pg.py)."""
    return request.getfixturevalue("pg_dsn") if request.param == "postgres" else None


def test_a_bare_start_carries_on_with_the_recorded_words(
    model_server: Any, flower_env: Any, state_env: str | None
) -> None:
    server: ModelServer = model_server(script())
    f: Flower = flower_env(server, state=state_env)
    sid, killed_at = killed_in_second(f, server, WORDS)
    (dead,) = [r for r in f.status_json()[1]["flowers"]]

    code, out = f.run(flow=FLOW, timeout=150)  # no words
    assert code == 0, out
    said = [line for line in out.splitlines() if dead["run"] in line and WORDS in line]
    assert said == [f'-- 上次的运行 {dead["run"]} 没做完:接着用它的原话 "{WORDS}"'], out
    carried_on(f, server, sid, killed_at)
    assert "+ first  复用(run-only)" in out, out


def test_other_words_say_they_changed_and_start_over(model_server: Any, flower_env: Any) -> None:
    server: ModelServer = model_server(script())
    f: Flower = flower_env(server)
    _, killed_at = killed_in_second(f, server, WORDS)
    (dead,) = [r for r in f.status_json()[1]["flowers"]]

    code, out = f.run("something else entirely", flow=FLOW, timeout=150)
    assert code == 0, out
    changed = [line for line in out.splitlines() if line.startswith("!")]
    assert changed == [f'! 原话变了(没做完的运行 {dead["run"]} 用的是 "{WORDS}"):各步骤从头做'], out
    again = [r for r in server.requests if r.seq > killed_at and r.conversation == "first"]
    assert again and any("something else entirely" in t for t in again[0].texts())
    wait_until(lambda: not f.survivors(), 5, "no process left")
