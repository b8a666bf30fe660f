"""status, show, logs and cancel on a run state in PostgreSQL (a real database per test), the
state a command chooses (``--state``, ``FLOWER_STATE`` from the environment or a ``.env``),
and every mistake a person can make with a state URL: one line with a hint, on every
command, never a password.

The runs here are written through the run state's own objects, as a flower writes them
(registry records, manifest rows, lineage, event log, transcripts), without a model; the
end-to-end drills with the real CLI are in test_e2e_state.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from flower.services.cli_env import cli_env
from flower.state.backends import SharedState
from flower.state.postgres.schema import CURRENT
from flower.state.records import LedgerRow
from flower.state.registry import FINISHED, RUNNING, FlowerRecord, process_started
from flower.state.result import Event, StepResult
from supervisor.inspect import show, status
from supervisor.inspect.runstate import Choice, Seen, choose, lacks_password, without_password
from tests.e2e import REPO, wait_until
from tests.transcripts import fixture

# Each command is a fresh interpreter (~0.3 s idle, a few seconds on a loaded machine).
pytestmark = pytest.mark.timeout(120)

SECRET = "sekret-7f3a"  # in every URL a person types here; never in anything flower prints


@pytest.fixture
def en(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWER_LANG", "en")


def shared(dsn: str, ws: Path, run_dir: Path | None = None) -> SharedState:
    ws.mkdir(parents=True, exist_ok=True)
    return SharedState(dsn, run_dir=run_dir or ws.parent / "runs", workspace=ws, create=True)


def record(
    st: SharedState, run: str, *, live: bool = False, pid: int = 0, **fields: Any
) -> FlowerRecord:
    """A registry record as a flower's Runtime writes it."""
    pid = pid or (os.getpid() if live else 0)
    r = FlowerRecord(
        run=run,
        flow="two",
        pid=pid,
        pid_started=process_started(pid) if pid else None,
        workspace=str(st.workspace),
        started_at=time.time(),
        workspace_id=st.workspace_id,
        **{"state": RUNNING if live else FINISHED, **fields},
    )
    st.registry.write(r)
    return r


def seen(state: SharedState, given: str | None = None) -> Seen:
    return Seen(
        state, Choice(state.rows.url.url, given is not None), state.run_dir, state.workspace
    )


def super_(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``flower-super ARGS`` in a fresh interpreter."""
    full = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "supervisor", *args],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# -- status ------------------------------------------------------------------------------


def test_status_in_each_workspace_shows_its_own_runs(pg_dsn: str, tmp_path: Path) -> None:
    a = shared(pg_dsn, tmp_path / "a" / "ws")
    b = shared(pg_dsn, tmp_path / "b" / "ws")
    record(a, "20260101-000000-aaaaa1", session_id="sa")
    record(b, "20260101-000000-bbbbb1", session_id="sb")
    record(a, "20260101-000001-aaaaa2", live=True, step="first", session_id="sa")
    a.manifest("20260101-000000-aaaaa1").record(StepResult("first", "sa", ok=True))
    b.manifest("20260101-000000-bbbbb1").record(StepResult("second", "sb", ok=False))
    a.lineage().remember("first", "sa")
    try:
        rep_a, rep_b = status.collect(seen(a)), status.collect(seen(b))
    finally:
        a.close()
        b.close()
    assert [f.record.run for f in rep_a.flowers] == [
        "20260101-000000-aaaaa1",
        "20260101-000001-aaaaa2",
    ]
    assert [f.record.run for f in rep_b.flowers] == ["20260101-000000-bbbbb1"]
    assert [f.state for f in rep_a.flowers] == [FINISHED, RUNNING]
    assert [r["step"] for r in rep_a.rows] == ["first"] and [r["step"] for r in rep_b.rows] == [
        "second"
    ]
    assert (rep_a.steps, rep_b.steps) == ({"first": "sa"}, {})
    doc = json.loads(json.dumps(rep_a.to_json()))
    assert doc["state"] == pg_dsn and doc["damaged"] == [] and doc["set_aside"] == []


def test_status_text_names_the_database_and_the_commands_name_the_state(
    pg_dsn: str, tmp_path: Path, en: None
) -> None:
    ws = tmp_path / "ws"
    st = shared(pg_dsn, ws)
    done = record(st, "20260101-000000-aaaaa1", session_id="sa")
    try:
        text = status.render_text(status.collect(seen(st, given=pg_dsn)))
        listed = status.commands(done, False, seen(st, given=pg_dsn))
        from_env = status.commands(done, False, seen(st))
    finally:
        st.close()
    assert text.splitlines()[0] == f"state      {pg_dsn}"
    where = f"-w {ws} --state {pg_dsn}"
    assert listed == [
        f"flower-super show 20260101-000000-aaaaa1 {where}",
        f"flower-super logs 20260101-000000-aaaaa1 {where}",
    ]
    assert from_env[0] == f"flower-super show 20260101-000000-aaaaa1 -w {ws}"


def test_a_resume_command_keeps_a_given_state_without_its_password(
    pg_dsn: str, tmp_path: Path, en: None
) -> None:
    url = pg_dsn.replace("postgres@", f"postgres:{SECRET}@")
    given = choose(url, tmp_path)
    assert given.resume_args() == ["--state", pg_dsn]
    assert choose(None, tmp_path).resume_args() == []  # from the environment: found there again
    assert without_password(f"postgresql://u@h/db?password={SECRET}&sslmode=require") == (
        "postgresql://u@h/db?sslmode=require"
    )
    st = shared(pg_dsn, tmp_path / "ws")
    command = ["flower-super", "start", "-w", str(st.workspace), *given.resume_args()]
    record(st, "20260101-000000-aaaaa1", state="killed", command=command, session_id="s")
    try:
        text = status.render_text(status.collect(seen(st, given=url)))
    finally:
        st.close()
    assert lacks_password(command) and SECRET not in text
    resume = next(line for line in text.splitlines() if "resume:" in line)
    assert resume.endswith(f"--state {pg_dsn}")
    assert "PGPASSWORD" in text.splitlines()[text.splitlines().index(resume) + 1]


def test_a_resume_command_takes_a_given_password_from_flower_state(
    pg_dsn: str, tmp_path: Path, en: None
) -> None:
    """A start given ``--state`` with a password keeps it masked in its command; status
    prints ``--state "${FLOWER_STATE:?}"`` and, beside it, the export line (masked)."""
    url = pg_dsn.replace("postgres@", f"postgres:{SECRET}@")
    masked = pg_dsn.replace("postgres@", "postgres:***@")
    given = choose(url, tmp_path)
    assert given.carry_args() == ["--state", masked]
    assert choose(None, tmp_path).carry_args() == []  # from the environment: found there again
    assert choose(pg_dsn, tmp_path).carry_args() == ["--state", pg_dsn]  # no password: as is
    st = shared(pg_dsn, tmp_path / "ws")
    command = ["flower-super", "start", "--flow", "f.py:x", "-w", str(st.workspace)]
    command += [*given.carry_args(), "fix it"]
    record(st, "20260101-000000-aaaaa1", state="killed", command=command, session_id="s")
    try:
        report = status.collect(seen(st, given=url))
        text = status.render_text(report)
    finally:
        st.close()
    assert SECRET not in text and SECRET not in json.dumps(report.to_json())
    lines = text.splitlines()
    resume = next(line for line in lines if "resume:" in line)
    assert resume.endswith(f"-w {st.workspace} --state \"${{FLOWER_STATE:?}}\" 'fix it'")
    assert lines[lines.index(resume) + 1].startswith(
        f"      first: export FLOWER_STATE='{masked}'  # *** is the password"
    )
    (view,) = report.to_json()["flowers"]
    assert view["resume"] == resume.split(": ", 1)[1].split(" && ", 1)[1]
    assert view["resume_export"] == f"'{masked}'"


def test_a_record_without_the_words_field_still_loads() -> None:
    """Records written before ``ask`` was kept load, with no words."""
    old = {"run": "r", "flow": "two", "pid": 1, "pid_started": None, "workspace": "/w"}
    rec = FlowerRecord.from_dict({**old, "started_at": 1.0, "command": ["flower-super"]})
    assert rec.ask is None and rec.command == ["flower-super"]


# -- show, logs, cancel -------------------------------------------------------------------


def test_show_reads_the_conversation_and_the_ledger_from_the_database(
    pg_dsn: str, tmp_path: Path, en: None
) -> None:
    st = shared(pg_dsn, tmp_path / "ws")
    entries = fixture("d-bash-and-read.jsonl")
    calls = [e for e in entries if e.get("type") == "assistant"]
    key = {"project_key": st.workspace_id, "session_id": "s-first"}
    live_key = {**key, "session_id": "s-live"}

    async def write() -> None:
        await st.sessions.append(key, entries)
        await st.sessions.append(live_key, calls)  # the calls are in, their results not yet
        tid = next(
            b["id"] for e in calls for b in e["message"]["content"] if b.get("type") == "tool_use"
        )
        row = LedgerRow(
            tid, "s-live", None, "Bash", "{}", "done", 1.0, content=json.dumps("stdout of it")
        )
        await st.ledger.started(row)
        await st.ledger.finished(row)

    asyncio.run(write())
    record(st, "20260101-000000-aaaaa1", session_id="s-first")
    record(st, "20260101-000001-bbbbb1", live=True, step="work", session_id="s-live")
    st.manifest("20260101-000000-aaaaa1").record(
        StepResult("first", "s-first", ok=True, num_turns=2)
    )
    try:
        text = show.render(st, show.resolve(st, "first"), 100)
        live = show.render(st, show.resolve(st, None), 100)
        doc = show.document(st, show.resolve(st, "20260101-000000-aaaaa1"))
    finally:
        st.close()
    assert text.startswith("== first  · session s-first\n   + first  run 20260101-000000-aaaaa1")
    assert "* Bash  seq 1 700" in text
    assert "running now: run 20260101-000001-bbbbb1" in live
    assert "-> stdout of it  (result from the tool ledger)" in live
    assert json.loads(json.dumps(doc))["steps"][0]["turns"][0]["kind"] == "prompt"


def test_logs_follows_a_live_run_in_the_database_until_it_ends(
    pg_dsn: str, tmp_path: Path, en: None
) -> None:
    st = shared(pg_dsn, tmp_path / "ws")
    run = "20260101-000000-aaaaa1"
    mine = record(st, run, live=True, step="first")
    log = st.event_log(run)
    log.write(Event("text", "hello from the first step", payload={"step": "first"}))
    follower = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "supervisor",
            "logs",
            "-f",
            "--state",
            pg_dsn,
            "-w",
            str(st.workspace),
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert follower.stdout is not None
        wait_until(lambda: "following" in follower.stdout.readline(), 30, "logs -f following")
        log.write(Event("tool_call", "ls -la", tool="Bash", payload={"step": "first"}))
        log.write(Event("text", "the last word", payload={"step": "first"}))
        mine.state = FINISHED
        st.registry.write(mine)  # the flower ends: logs -f prints the rest and stops
        out, _ = follower.communicate(timeout=30)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.communicate()
        st.close()
    assert follower.returncode == 0, out
    assert "ls -la" in out and "the last word" in out
    assert out.rstrip().endswith(f"that flower has ended ({FINISHED})")


def test_cancel_stops_a_live_run_of_this_machine_and_names_another_machines(
    pg_dsn: str, tmp_path: Path, en: None
) -> None:
    st = shared(pg_dsn, tmp_path / "ws")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        record(st, "20260101-000000-aaaaa1", live=True, pid=sleeper.pid)
        record(st, "20260101-000001-bbbbb1", live=True, pid=sleeper.pid)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:  # the same pid, elsewhere
            conn.execute("UPDATE flower.registry SET host = 'elsewhere' WHERE run LIKE '%bbbbb1'")
        where = ["--state", pg_dsn, "-w", str(st.workspace)]
        other = super_("cancel", "20260101-000001", *where, cwd=tmp_path)
        assert sleeper.poll() is None, "a signal went to a pid of another machine"
        unknown = super_("cancel", "nosuch", *where, cwd=tmp_path)
        done = super_("cancel", "20260101-000000", *where, cwd=tmp_path)
        sleeper.wait(timeout=30)
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
        sleeper.wait()
        st.close()
    assert done.returncode == 0 and sleeper.returncode == -signal.SIGTERM, done.stderr
    assert "stopped run 20260101-000000-aaaaa1" in done.stdout
    assert other.returncode == 2 and "runs on another machine, elsewhere" in other.stderr
    assert "hint: run flower-super cancel 20260101-000001-bbbbb1 on elsewhere" in other.stderr
    assert unknown.returncode == 2 and "no flower run 'nosuch' in" in unknown.stderr


# -- which state ---------------------------------------------------------------------------


def test_the_state_is_found_where_a_start_finds_it(
    pg_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, en: None
) -> None:
    """FLOWER_STATE in the workspace's .env, or in the per-user file: status reads the same
    database a start there would; --state '' is the local files whatever FLOWER_STATE says."""
    monkeypatch.delenv("FLOWER_STATE", raising=False)
    ws = tmp_path / "ws"
    st = shared(pg_dsn, ws)
    record(st, "20260101-000000-aaaaa1")
    st.close()
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config"), "HOME": str(tmp_path)}
    (ws / ".env").write_text(f"FLOWER_STATE={pg_dsn}\n")
    from_ws = super_("status", "--json", "-w", str(ws), cwd=tmp_path, env=env)
    (ws / ".env").unlink()
    (tmp_path / "config" / "flower").mkdir(parents=True)
    (tmp_path / "config" / "flower" / ".env").write_text(f"export FLOWER_STATE='{pg_dsn}'\n")
    from_user = super_("status", "--json", "-w", str(ws), cwd=tmp_path, env=env)
    local = super_("status", "--json", "--state", "", "-w", str(ws), cwd=tmp_path, env=env)
    for done in (from_ws, from_user):
        doc = json.loads(done.stdout)
        assert doc["state"] == pg_dsn, done.stderr
        assert [f["run"] for f in doc["flowers"]] == ["20260101-000000-aaaaa1"]
    assert local.returncode == 2 and json.loads(local.stdout)["error"].startswith(
        "no run directory"
    )


# -- mistakes ------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def newer(pg_dsn: str) -> str:
    """A database whose flower schema was written by a newer flower."""
    SharedState(pg_dsn, run_dir="runs", workspace=".", create=False).close()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("UPDATE flower.schema_version SET version = %s", (CURRENT + 1,))
    return pg_dsn


MISTAKES = {
    "scheme": ("mysql://u:{pw}@h/db", "is not a postgresql:// URL"),
    "password": ("postgresql://nosuch:{pw}@{host}/{db}", "refused the user or password"),
    "database": ("postgresql://postgres:{pw}@{host}/nosuchdb", "has no database nosuchdb"),
    "down": ("postgresql://postgres:{pw}@127.0.0.1:{port}/db", "cannot reach PostgreSQL"),
    "newer": ("postgresql://postgres:{pw}@{host}/{db}", "newer"),
}
COMMANDS = {
    "start": ["start", "do it", "--flow", "tests.flows.basic:one"],
    "status": ["status"],
    "status --json": ["status", "--json"],
    "show": ["show"],
    "logs": ["logs"],
    "cancel": ["cancel", "20260101"],
    "export": ["state", "export"],
    "flower": [],
}


@pytest.mark.timeout(300)  # 5 kinds of mistake x 8 commands, each a fresh interpreter;
# a database that is down is waited for 30 s by the two that start
@pytest.mark.parametrize("kind", sorted(MISTAKES))
def test_every_state_mistake_is_one_line_on_every_command(
    kind: str, pg_dsn: str, newer: str, tmp_path: Path, en: None
) -> None:
    del newer  # pg_dsn's schema is the newer one: only the "newer" URL names that database
    host, _, db = pg_dsn.split("@", 1)[1].partition("/")
    pattern, says = MISTAKES[kind]
    url = pattern.format(
        pw=SECRET, host=host, db=db if kind == "newer" else "postgres", port=_free_port()
    )
    env = cli_env(tmp_path / "home", "http://127.0.0.1:9")  # a key, so only the state can refuse
    env.update(PYTHONPATH=str(REPO), FLOWER_LANG="en")
    ws, runs = tmp_path / "ws", tmp_path / "runs"
    ws.mkdir()
    for name, args in COMMANDS.items():
        if name == "export":
            argv = ["-m", "supervisor", *args, "--to", url, "-w", str(ws), "-r", str(runs)]
            runs.mkdir(exist_ok=True)  # export reads a run_dir: the database is what refuses
        elif name == "flower":
            argv = [
                "-m",
                "supervisor.commands.flower_cli",
                "-w",
                str(ws),
                "-r",
                str(runs),
                "--state",
                url,
            ]
            argv += ["run", "tests.flows.basic:one"]
        else:
            argv = ["-m", "supervisor", *args, "--state", url, "-w", str(ws), "-r", str(runs)]
        done = subprocess.run(
            [sys.executable, *argv],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if name == "export":
            runs.rmdir()
        shown = done.stdout + done.stderr
        assert SECRET not in shown and "Traceback" not in shown, (name, shown)
        assert says in shown, (name, shown)
        if name == "status --json":
            assert done.returncode == 2 and set(json.loads(done.stdout)) == {"error", "hint"}
            continue
        lines = done.stderr.splitlines()
        if kind == "down" and name in ("start", "flower"):
            # a start waits for a database that is down (30 s), saying so first, then gives up
            waited, *lines = lines
            assert waited.startswith("! ") and "waiting up to 30 s" in waited, done.stderr
        assert len(lines) == 2 and "hint:" in lines[1], (name, done.stderr)
        assert done.returncode == (1 if name == "flower" else 2), (name, shown)
        assert not runs.exists(), f"{name} left a run_dir behind"
        assert not (ws / ".flower" / "workspace-id").exists(), name


# -- --new ---------------------------------------------------------------------------------


def test_new_archives_the_databases_lineage_and_waits_for_a_live_flower(
    pg_dsn: str, tmp_path: Path, en: None
) -> None:
    from flower import RunDirBusy
    from flower.workflow.starter import archive, wake_state
    from supervisor.run.flows import refuse_new_while_live

    st = shared(pg_dsn, tmp_path / "ws")
    lineage = st.lineage()
    lineage.bump()
    lineage.remember("干活", "s-work")
    notes = st.workspace / ".flower" / "notes"
    notes.mkdir(parents=True)
    (notes / "需求.md").write_text("# 需求\n")
    try:
        assert wake_state(st.workspace, run_dir=st.run_dir, state=st)["steps"] == {"干活": "s-work"}
        live = record(st, "20260101-000000-aaaaa1", live=True)
        with pytest.raises(RunDirBusy, match=f"in use by flower pid {live.pid}"):
            refuse_new_while_live(st)
        live.state = FINISHED
        st.registry.write(live)
        refuse_new_while_live(st)
        into = archive(st.workspace, st.run_dir, notes, state=st)
        assert st.peek_lineage() == {}
        assert wake_state(st.workspace, run_dir=st.run_dir, state=st)["woke"] == 0
    finally:
        st.close()
    assert (into / "需求.md").exists() and not (notes / "需求.md").exists()
    assert not st.run_dir.exists(), "nothing of the state under the run_dir"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        kept = conn.execute("SELECT woke, steps FROM flower.lineage_archive").fetchall()
    assert kept == [(1, {"干活": "s-work"})]
