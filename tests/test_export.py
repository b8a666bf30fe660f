"""``flower-super state export``: a run_dir's state, as runs wrote it, copied into a real
PostgreSQL; every kind of state arrives whole and in order, a second export changes nothing,
and the local files are left byte for byte as they were."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from flower import FlowerError
from flower.cache import CacheStore, Entry, cache_key
from flower.i18n import t
from flower.state.backends import SharedState
from flower.state.eventlog import EventLog
from flower.state.export import export_state
from flower.state.identity import IDENTITY_FILE, path_key
from flower.state.lineage import Lineage
from flower.state.manifest import Manifest, read_manifest
from flower.state.records import LedgerRow
from flower.state.registry import FINISHED, RUNNING, FlowerRecord, Registry, process_started
from flower.state.result import Event, StepResult
from flower.state.sqlite import SqliteSessionStore
from tests.e2e import REPO
from tests.transcripts import fixture

MINE, FOREIGN = "20260101-000000-aaaaa1", "20260101-000001-fffff1"
SUB = "subagents/agent-a1"
TABLES = {  # every table of flower's schema, in an order that makes a dump stable
    "entries": "seq",
    "meta": "key",
    "summaries": "project_key, session_id",
    "fence": "session_id",
    "tool_calls": "tool_use_id",
    "lineage": "workspace_id",
    "lineage_archive": "id",
    "manifest": "id",
    "registry": "run",
    "cache": "key",
    "events": "pos",
}


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` and its bytes."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def dump(dsn: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of flower's tables, as text, in a stable order."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {
            table: conn.execute(f"SELECT t::text FROM flower.{table} t ORDER BY {order}").fetchall()
            for table, order in TABLES.items()
        }


def flower_record(ws: Path, run: str, **fields: Any) -> FlowerRecord:
    given = {"pid": 0, "pid_started": None, "state": FINISHED, **fields}
    return FlowerRecord(run=run, flow="two", workspace=str(ws), started_at=time.time(), **given)


@pytest.fixture
def local(tmp_path: Path) -> tuple[Path, Path, str]:
    """A workspace and the run_dir its runs wrote: a session with a subagent's transcript
    and an entry without a uuid, another project's session, two ledger rows, lineage,
    manifest rows, records (one of another workspace), cache entries and last.json, event
    logs. Returns (workspace, run_dir, the main session's id)."""
    ws, runs = tmp_path / "ws", tmp_path / "runs"
    ws.mkdir()
    pk = path_key(ws)
    main = fixture("h-subagent.jsonl")
    sid = str(main[0]["sessionId"])
    store = SqliteSessionStore(runs / "sessions.db")

    async def write() -> None:
        await store.append({"project_key": pk, "session_id": sid}, main)
        sub = {"project_key": pk, "session_id": sid, "subpath": SUB}
        await store.append(sub, fixture("h-subagent.sub.jsonl"))
        await store.append({"project_key": pk, "session_id": sid}, [{"type": "note", "n": 1}])
        other = {"project_key": "-elsewhere", "session_id": "s-other"}
        await store.append(other, fixture("d-bash-and-read.jsonl"))

    asyncio.run(write())
    store.close()
    with sqlite3.connect(runs / "sessions.db") as conn:
        conn.execute(
            "INSERT INTO tool_calls(tool_use_id, session_id, name, input, message, state,"
            " response, content, is_error, started_at, ended_at)"
            " VALUES ('t1', ?, 'Bash', '{\"command\":\"ls\"}', '{\"m\":1}', 'done',"
            ' \'{"stdout":"a"}\', \'"a"\', 0, 1.5, 2.5)',
            (sid,),
        )
        conn.execute(
            "INSERT INTO tool_calls(tool_use_id, session_id, name, input, state, started_at)"
            " VALUES ('t2', ?, 'Read', '{}', 'started', 3.5)",
            (sid,),
        )
    conn.close()
    lineage = Lineage(runs / "lineage.json", ws)
    lineage.bump()
    lineage.remember("first", sid)
    for run, where in ((MINE, ws), (FOREIGN, tmp_path / "other")):
        Registry(runs).write(flower_record(where, run, session_id=sid))
        Manifest(runs, run).record(StepResult("first", sid, ok=True, cost_usd=0.25, num_turns=3))
        log = EventLog.open(runs, run)
        for text in ("one", "two", "three"):
            log.write(Event("text", f"{text} of {run}", payload={"step": "first"}))
        log.close()
    cache = CacheStore(runs / "cache")
    key = cache_key("h" * 64, "f" * 64)
    entry = Entry(
        key, "first", "h" * 64, {}, {"step": "first", "ok": True}, "v", time.time(), "two"
    )
    assert cache.put(key, entry)
    cache.write_last({"first": {"hash": "h" * 64}})
    return ws, runs, sid


def test_export_copies_every_kind_of_state_and_leaves_the_files_as_they_were(
    local: tuple[Path, Path, str], pg_dsn: str
) -> None:
    ws, runs, sid = local
    before = snapshot(runs)
    done = export_state(runs, ws, pg_dsn)
    assert snapshot(runs) == before, "the local files changed"
    ident = path_key(ws)
    assert (ws / IDENTITY_FILE).read_text().strip() == ident == done.workspace_id
    assert done.counts["lineage"] == (1, 0) and done.counts["registry"] == (1, 0)
    assert len(done.lines) >= 7 and done.copied() > 0

    # a run there (create=True) finds the identity export wrote, and keeps it
    st = SharedState(pg_dsn, run_dir=runs, workspace=ws, create=True)
    local_store = SqliteSessionStore(runs / "sessions.db")
    try:
        assert st.workspace_id == ident and (ws / IDENTITY_FILE).read_text().strip() == ident
        for key in (
            {"project_key": ident, "session_id": sid},
            {"project_key": ident, "session_id": sid, "subpath": SUB},
            {"project_key": "-elsewhere", "session_id": "s-other"},
        ):
            assert st.rows.sessions.load_sync(key) == local_store.load_sync(key), key
        assert st.peek_lineage() == {"workspace": str(ws), "woke": 1, "steps": {"first": sid}}
        assert st.manifest_rows() == [r for r in read_manifest(runs) if r["run"] == MINE]
        assert [r.run for r in st.registry.records()] == [MINE]
        assert st.registry.get(MINE).session_id == sid
        assert st.ledger.by_ids(["t1", "t2"]) == [
            LedgerRow("t1", sid, None, "Bash", '{"command":"ls"}', "done", 1.5, '{"m":1}',
                      '{"stdout":"a"}', '"a"', False, 2.5),
            LedgerRow("t2", sid, None, "Read", "{}", "started", 3.5),
        ]  # fmt: skip
        key = cache_key("h" * 64, "f" * 64)
        assert st.cache.get(key, ttl_s=None) == CacheStore(runs / "cache").get(key, ttl_s=None)
        assert st.cache.read_last() == {"first": {"hash": "h" * 64}}
        events = [ev["text"] for _, ev in st.rows.events.read(MINE)]
        assert events == [f"{n} of {MINE}" for n in ("one", "two", "three")]
        assert st.rows.events.read(FOREIGN) == []
    finally:
        st.close()
        local_store.close()


def test_a_second_export_changes_nothing(local: tuple[Path, Path, str], pg_dsn: str) -> None:
    ws, runs, _ = local
    first = export_state(runs, ws, pg_dsn)
    rows = dump(pg_dsn)
    assert all(rows[t] for t in ("entries", "tool_calls", "manifest", "registry", "events"))
    again = export_state(runs, ws, pg_dsn)
    assert dump(pg_dsn) == rows
    assert again.copied() == 0 and first.copied() > 0
    assert {what: there for what, (_, there) in again.counts.items()} == {
        what: copied for what, (copied, _) in first.counts.items()
    }


def test_what_ran_locally_since_is_copied_and_what_ran_in_the_database_is_kept(
    local: tuple[Path, Path, str], pg_dsn: str
) -> None:
    ws, runs, sid = local
    export_state(runs, ws, pg_dsn)
    key = {"project_key": path_key(ws), "session_id": sid}
    more = [{"type": "note", "uuid": "later-1"}, {"type": "note", "n": 2}]
    store = SqliteSessionStore(runs / "sessions.db")
    asyncio.run(store.append(key, more))
    local_now = store.load_sync(key)
    store.close()
    Lineage(runs / "lineage.json", ws).bump()  # a local wake since: woke 2
    st = SharedState(pg_dsn, run_dir=runs, workspace=ws, create=False)
    try:
        done = export_state(runs, ws, pg_dsn)
        assert st.rows.sessions.load_sync(key) == local_now
        assert done.counts["sessions"][0] == 2
        assert st.peek_lineage()["woke"] == 2 and done.counts["lineage"] == (1, 0)
        with st.rows.lineage.update(st.workspace_id) as box:  # then runs in the database
            box[0] = type(box[0])(box[0].workspace, 4, dict(box[0].steps))
        Lineage(runs / "lineage.json", ws).bump()  # and one more local wake: woke 3
        again = export_state(runs, ws, pg_dsn)
        assert st.peek_lineage()["woke"] == 4, "the database's own lineage is never overwritten"
        assert again.counts["lineage"] == (0, 1)
        assert t("export.lineage.kept", woke=4, steps=1) in again.lines
    finally:
        st.close()


def test_a_workspace_with_an_identity_keeps_it(local: tuple[Path, Path, str], pg_dsn: str) -> None:
    ws, runs, sid = local
    (ws / IDENTITY_FILE).parent.mkdir()
    (ws / IDENTITY_FILE).write_text("ws-" + "ab" * 16 + "\n")
    done = export_state(runs, ws, pg_dsn)
    assert done.workspace_id == "ws-" + "ab" * 16
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        keys = {k for (k,) in conn.execute("SELECT DISTINCT key FROM flower.entries")}
        (woke,) = conn.execute(
            "SELECT woke FROM flower.lineage WHERE workspace_id = %s", (done.workspace_id,)
        ).fetchone()
    assert f"{done.workspace_id}/{sid}" in keys and f"{done.workspace_id}/{sid}/{SUB}" in keys
    assert not any(k.startswith(path_key(ws)) for k in keys) and woke == 1


def test_export_is_refused_while_a_flower_runs_there(
    local: tuple[Path, Path, str], pg_dsn: str
) -> None:
    ws, runs, _ = local
    live = flower_record(ws, "20260102-000000-cccccc", pid=os.getpid(), state=RUNNING)
    live.pid_started = process_started(os.getpid())
    Registry(runs).write(live)
    with pytest.raises(FlowerError, match=f"flower pid {os.getpid()}"):
        export_state(runs, ws, pg_dsn)
    assert not (ws / IDENTITY_FILE).exists()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # refused before it connected
        assert (
            conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = 'flower'").fetchone() is None
        )


@pytest.mark.timeout(90)  # two fresh interpreters, each importing the SDK
def test_the_command_says_one_line_per_thing_and_in_english_too(
    local: tuple[Path, Path, str], pg_dsn: str, tmp_path: Path
) -> None:
    ws, runs, _ = local
    env = {**os.environ, "PYTHONPATH": str(REPO), "FLOWER_LANG": "en"}
    argv = [sys.executable, "-m", "supervisor", "state", "export", "--to", pg_dsn]
    done = subprocess.run(argv, cwd=ws, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "no run directory" in done.stderr  # ./runs of the workspace
    argv += ["-r", str(runs)]
    done = subprocess.run(argv, cwd=ws, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    heads = [line.split()[0] for line in lines[:-1] if not line.startswith(" ")]
    assert heads == ["sessions", "ledger", "lineage", "manifest", "runs", "cache", "events"]
    assert lines[0].startswith("sessions   3 keys (subagents' included): copied ")
    assert "           1 other run belongs to other workspaces: not copied" in lines
    assert lines[-1].startswith(f"exported to {pg_dsn}. The workspace's identity")
