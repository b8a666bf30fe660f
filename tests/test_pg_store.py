"""PostgresSessionStore against a real PostgreSQL: the SDK's conformance suite, the SQLite
store's semantics, fencing, fork, the schema's versions, and the light import."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
import threading
import warnings

import psycopg
import pytest
from claude_agent_sdk import fold_session_summary
from claude_agent_sdk.testing import run_session_store_conformance
from claude_agent_sdk.types import SessionStore

from flower.state.postgres import PostgresSessionStore, PostgresState, SchemaTooNew
from flower.state.postgres.schema import CURRENT, MIGRATIONS, Sql, ensure, statements
from flower.state.seam import LedgerRow, Sessions, Superseded

OPTIONAL = ("list_sessions", "list_session_summaries", "delete", "list_subkeys")
KEY = {"project_key": "proj", "session_id": "sess"}


def e(n: int, **extra: object) -> dict:
    return {"type": "x", "uuid": f"u{n}", "n": n, **extra}


def sql(dsn: str, statement: str, params: tuple = ()) -> list[tuple]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else []


@pytest.fixture
def store(pg_dsn: str):
    s = PostgresSessionStore(pg_dsn)
    yield s
    s.close()


# ---- the SDK's contract ------------------------------------------------------------------


@pytest.mark.timeout(120)  # fifteen stores, each creating its schema (~0.4 s on a busy CI)
def test_conformance_with_every_optional_method(pg_dsn: str) -> None:
    for name in OPTIONAL:  # the suite silently skips a method the class does not override
        assert getattr(PostgresSessionStore, name) is not getattr(SessionStore, name), name
    counter = itertools.count()
    made: list[PostgresSessionStore] = []

    def make_store() -> PostgresSessionStore:  # each contract gets a schema of its own
        made.append(PostgresSessionStore(pg_dsn, schema=f"conf{next(counter)}"))
        return made[-1]

    try:
        asyncio.run(run_session_store_conformance(make_store))
    finally:
        for s in made:
            s.close()
    assert len(made) == 15  # a probe plus one store per contract: nothing was skipped
    assert isinstance(made[0], Sessions)


# ---- SQLite's semantics ----------------------------------------------------------------------


def test_a_retried_batch_lands_once_and_order_is_append_order(store: PostgresSessionStore) -> None:
    async def go() -> None:
        await store.append(KEY, [e(1), e(2)])
        await store.append(KEY, [e(2), e(3), {"type": "title", "t": "no uuid"}])  # retry + more
        await store.append(KEY, [{"type": "title", "t": "no uuid"}, e(4), e(4)])

    asyncio.run(go())
    assert store.load_sync(KEY) == [
        e(1),
        e(2),
        e(3),
        {"type": "title", "t": "no uuid"},
        {"type": "title", "t": "no uuid"},  # without a uuid an entry always appends
        e(4),
    ]


def test_entries_come_back_exactly(store: PostgresSessionStore) -> None:
    odd = e(1, text="nul \u0000 and lone \ud800 and 中文", nested={"b": 1, "a": [1.5, None]})
    asyncio.run(store.append(KEY, [odd]))
    assert store.load_sync(KEY) == [odd]


def test_mtime_rises_per_session_even_past_a_delete(store: PostgresSessionStore) -> None:
    async def mtimes() -> list[int]:
        seen = []
        for n in range(3):
            await store.append(KEY, [e(n)])
            (listed,) = await store.list_sessions("proj")
            seen.append(listed["mtime"])
        await store.delete(KEY)
        await store.append(KEY, [e(9)])
        (listed,) = await store.list_sessions("proj")
        return [*seen, listed["mtime"]]

    seen = asyncio.run(mtimes())
    assert seen == sorted(set(seen)), seen


def test_the_summary_is_folded_in_the_append_transaction(store: PostgresSessionStore) -> None:
    asyncio.run(store.append(KEY, [e(1, timestamp="2026-01-01T00:00:00.000Z")]))
    asyncio.run(store.append(KEY, [e(1, timestamp="2026-01-01T00:00:00.000Z")]))  # no news
    (summary,) = asyncio.run(store.list_session_summaries("proj"))
    (listed,) = asyncio.run(store.list_sessions("proj"))
    assert summary["mtime"] == listed["mtime"]


def test_the_summary_stays_exact_when_another_writer_folded_it_meanwhile(
    store: PostgresSessionStore, pg_dsn: str
) -> None:
    """A process folds a session's summary in one round trip from the one it folded last;
    when that is not the stored one any more, nothing of the try stays and the append
    folds the stored one."""
    first = [e(1, timestamp="2026-01-01T00:00:01.000Z", customTitle="mine")]
    asyncio.run(store.append(KEY, first))
    asyncio.run(store.append(KEY, [e(2, timestamp="2026-01-01T00:00:02.000Z")]))  # one trip
    theirs = fold_session_summary(None, KEY, [*first, e(9, customTitle="theirs")])["data"]
    sql(  # another writer (a process of its own) folded the summary meanwhile
        pg_dsn,
        "UPDATE flower.summaries SET mtime = mtime + 1, data = %s",
        (json.dumps(theirs),),
    )
    last = e(3, timestamp="2026-01-01T00:00:03.000Z")
    asyncio.run(store.append(KEY, [last]))
    assert store.load_sync(KEY) == [*first, e(2, timestamp="2026-01-01T00:00:02.000Z"), last]
    (summary,) = asyncio.run(store.list_session_summaries("proj"))
    assert (
        summary["data"]
        == fold_session_summary(None, KEY, [*first, e(9, customTitle="theirs"), last])["data"]
    )
    (listed,) = asyncio.run(store.list_sessions("proj"))
    assert summary["mtime"] == listed["mtime"]


def test_the_helpers(store: PostgresSessionStore) -> None:
    usage = {"input_tokens": 10, "cache_read_input_tokens": 5, "cache_creation_input_tokens": 1}
    real = {"type": "assistant", "uuid": "a1", "message": {"model": "m", "usage": usage}}
    fake = {
        "type": "assistant",
        "uuid": "a2",
        "isApiErrorMessage": True,
        "message": {"model": "<synthetic>", "usage": {"input_tokens": 99}},
    }
    asyncio.run(store.append(KEY, [real, fake]))
    asyncio.run(store.append({**KEY, "subpath": "subagents/x"}, [e(1)]))
    assert store.last_context("proj", "sess") == 16
    # No user entry yet: nothing the CLI can resume (it answers "No conversation found").
    assert not store.has_session("proj", "sess") and not store.has_session(None, "sess")
    asyncio.run(store.append(KEY, [{"type": "user", "uuid": "p1", "message": {"content": "go"}}]))
    assert store.has_session("proj", "sess") and store.has_session(None, "sess")
    assert not store.has_session("other", "sess") and not store.has_session(None, "x")
    assert store.projects() == ["proj"]


# ---- fencing -----------------------------------------------------------------------------------


def test_a_superseded_attempt_s_append_is_refused_and_nothing_of_it_is_stored(
    pg_dsn: str,
) -> None:
    first, second = PostgresSessionStore(pg_dsn), PostgresSessionStore(pg_dsn)
    try:
        first.begin_attempt()
        first.claim("sess")
        asyncio.run(first.append(KEY, [e(1)]))
        assert second.begin_attempt() > first.epoch
        second.claim("sess")  # the next attempt of the step resumes the session
        with pytest.raises(Superseded):
            asyncio.run(first.append(KEY, [e(2), e(3)]))
        with pytest.raises(Superseded):
            asyncio.run(first.append({**KEY, "subpath": "subagents/a"}, [e(4)]))
        with pytest.raises(Superseded):
            first.claim("sess")
        asyncio.run(second.append(KEY, [e(5)]))
        assert second.load_sync(KEY) == [e(1), e(5)]
        stored = sql(pg_dsn, "SELECT count(*) FROM flower.entries")
        assert stored == [(2,)]  # the refused batches left no row behind, not even in meta
        assert sql(pg_dsn, "SELECT key FROM flower.meta") == [("proj/sess",)]
        assert sql(pg_dsn, "SELECT epoch FROM flower.fence") == [(second.epoch,)]
    finally:
        first.close()


def test_epoch_0_writes_only_sessions_no_attempt_owns(pg_dsn: str) -> None:
    reader = PostgresSessionStore(pg_dsn)  # status, show, an export: never began an attempt
    attempt = PostgresSessionStore(pg_dsn)
    try:
        asyncio.run(reader.append({"project_key": "p", "session_id": "free"}, [e(1)]))
        attempt.begin_attempt()
        attempt.claim("owned")
        with pytest.raises(Superseded):
            asyncio.run(reader.append({"project_key": "p", "session_id": "owned"}, [e(2)]))
        assert reader.load_sync({"project_key": "p", "session_id": "free"}) == [e(1)]
    finally:
        reader.close()


def test_the_ledger_is_fenced_like_its_session(pg_dsn: str) -> None:
    old, new = PostgresState(pg_dsn), PostgresState(f"{pg_dsn}?application_name=second")
    try:
        old.sessions.begin_attempt()
        row = LedgerRow("t1", "sess", None, "Bash", '{"command":"ls"}', "started", 1.0)
        asyncio.run(old.ledger.started(row))
        new.sessions.begin_attempt()
        new.sessions.claim("sess")
        done = LedgerRow(
            "t1", "sess", None, "Bash", "{}", "done", 1.0, None, "{}", '"out"', False, 2.0
        )
        with pytest.raises(Superseded):
            asyncio.run(old.ledger.finished(done))
        with pytest.raises(Superseded):
            later = LedgerRow("t2", "sess", None, "Read", "{}", "started", 3.0)
            asyncio.run(old.ledger.started(later))
        asyncio.run(new.ledger.finished(done))
        with pytest.raises(Superseded):
            old.ledger.exact("t1", '"exact"', True)
        new.ledger.exact("t1", '"exact"', False)
        (got,) = new.ledger.by_ids(["t1", "t2", "t1"])
        assert (got.state, got.content, got.is_error, got.input) == (
            "done",
            '"exact"',
            False,
            '{"command":"ls"}',  # the started row's input stays
        )
        assert [c.tool_use_id for c in new.ledger.in_session("sess", 0.5)] == ["t1"]
        assert new.ledger.in_session("sess", 1.5) == []
    finally:
        old.close()
        new.close()


# ---- processes --------------------------------------------------------------------------------


def test_a_forked_child_uses_its_own_connection(store: PostgresSessionStore) -> None:
    asyncio.run(store.append(KEY, [e(1)]))
    backend = store._db.run(lambda c: c.execute("SELECT pg_backend_pid()").fetchone())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads (3.12+)
        pid = os.fork()
    if pid == 0:  # the child: the parent's object, its own connection
        code = 1
        try:
            mine = store._db.run(lambda c: c.execute("SELECT pg_backend_pid()").fetchone())
            asyncio.run(store.append({"project_key": "proj", "session_id": "child"}, [e(2)]))
            code = 0 if mine != backend and store.load_sync(KEY) == [e(1)] else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # the parent's connection is the one it had: the child neither used nor closed it
    assert store._db.run(lambda c: c.execute("SELECT pg_backend_pid()").fetchone()) == backend
    asyncio.run(store.append(KEY, [e(3)]))
    assert store.load_sync(KEY) == [e(1), e(3)]
    assert store.load_sync({"project_key": "proj", "session_id": "child"}) == [e(2)]


def test_connections_that_create_the_schema_at_once_all_succeed(pg_dsn: str) -> None:
    """Four sessions (as four processes would) race to create the schema in an empty
    database: the advisory lock makes them take turns instead of failing on each other."""
    for _ in range(3):  # a race can be won by luck: run it a few times, each time fresh
        sql(pg_dsn, "DROP SCHEMA IF EXISTS flower CASCADE")
        conns = [psycopg.connect(pg_dsn, autocommit=True) for _ in range(4)]
        barrier = threading.Barrier(len(conns))
        errors: list[BaseException] = []

        threads = [threading.Thread(target=_create, args=(c, barrier, errors)) for c in conns]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=30)
        for c in conns:
            c.close()
        assert errors == []
        assert sql(pg_dsn, "SELECT version FROM flower.schema_version") == [(CURRENT,)]


def _create(conn: psycopg.Connection, barrier: threading.Barrier, errors: list) -> None:
    barrier.wait()
    try:
        ensure(conn, Sql("flower"), "test")
    except BaseException as exc:  # noqa: BLE001 - collected for the assertion
        errors.append(exc)


# ---- the schema's versions -----------------------------------------------------------------


@pytest.mark.parametrize("version", [0, 1, 2])
def test_an_older_schema_is_upgraded_in_place(pg_dsn: str, version: int) -> None:
    q = Sql("flower")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # what an older flower left
        conn.execute(q("CREATE SCHEMA {s}"))
        conn.execute(q("CREATE TABLE {s}.schema_version (version integer NOT NULL)"))
        conn.execute(q("INSERT INTO {s}.schema_version VALUES (%s)"), (version,))
        for migration in MIGRATIONS[:version]:
            for statement in statements(migration):
                conn.execute(q(statement))
        if version >= 1:
            entry = "INSERT INTO {s}.entries (key, uuid, data) VALUES ('proj/sess', 'u1', %s)"
            conn.execute(q(entry), (json.dumps(e(1)),))
            conn.execute(q("INSERT INTO {s}.meta VALUES ('proj/sess', 'proj', 'sess', NULL, 1)"))
    state = PostgresState(pg_dsn)
    try:
        assert sql(pg_dsn, "SELECT version FROM flower.schema_version") == [(CURRENT,)]
        assert state.sessions.load_sync(KEY) == ([e(1)] if version >= 1 else None)
        with state.lineage.update("ws") as box:  # a table of the last migration works
            assert box == [None]
        asyncio.run(state.sessions.append(KEY, [e(2)]))
        assert state.sessions.load_sync(KEY) == [e(1), e(2)] if version else [e(2)]
        state.workers.report("w1", "q", 1.0, {"slots": 2})  # version 3's table
        assert [(r["name"], r["slots"]) for r in state.workers.rows("q")] == [("w1", 2)]
    finally:
        state.close()


def test_a_newer_schema_is_refused_with_one_line(pg_dsn: str) -> None:
    PostgresState(pg_dsn).close()
    sql(pg_dsn, "UPDATE flower.schema_version SET version = %s", (CURRENT + 7,))
    with pytest.raises(SchemaTooNew) as caught:
        PostgresSessionStore(pg_dsn, schema="flower")
    line = caught.value.one_line()
    assert "\n" not in line and str(CURRENT + 7) in line and caught.value.hint
    PostgresState(f"{pg_dsn}?schema=another").close()  # another schema of the same database


def test_the_tables_live_in_their_own_schema(pg_dsn: str) -> None:
    PostgresState(f"{pg_dsn}?schema=team_a").close()
    tables = sql(
        pg_dsn,
        "SELECT DISTINCT table_schema FROM information_schema.tables"
        " WHERE table_schema NOT IN ('pg_catalog', 'information_schema')",
    )
    assert tables == [("team_a",)]


def loaded(code: str, *prefixes: str) -> list[str]:
    """The modules under ``prefixes`` a fresh interpreter has loaded after ``code``."""
    listed = f"sorted(m for m in sys.modules if m.startswith({prefixes!r}))"
    probe = f"{code}\nimport json, sys\nprint(json.dumps({listed}))"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=50, check=False
    )
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout.strip()))


def test_parsing_a_state_url_loads_neither_the_driver_nor_the_sdk() -> None:
    code = "import flower.state.postgres as p\np.parse_state_url('postgres://u:pw@h/db')"
    assert loaded(code, "psycopg", "claude_agent_sdk") == []


@pytest.mark.timeout(120)  # interpreters that import psycopg and flower (seconds on a busy CI)
def test_the_state_s_rows_need_no_sdk(pg_dsn: str) -> None:
    """status reads the registry and the manifest: without the SDK (a second to import)."""
    code = (
        "from flower.state.postgres import PostgresState\n"
        f"s = PostgresState({pg_dsn!r})\n"
        "s.registry.records(); s.manifest.rows(); s.lineage.read('ws'); s.close()"
    )
    assert loaded(code, "claude_agent_sdk", "anyio", "flower.state.stores") == []
    with_sessions = code.replace("s.close()", "s.sessions.has_session(None, 'x'); s.close()")
    assert "claude_agent_sdk" in loaded(with_sessions, "claude_agent_sdk")
