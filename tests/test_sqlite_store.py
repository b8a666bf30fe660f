"""SqliteSessionStore: the SDK's conformance suite, many writer processes, fork, files."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import sqlite3
import stat
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest
from claude_agent_sdk.testing import run_session_store_conformance
from claude_agent_sdk.types import SessionStore

import flower.state.sqlite as sqlite_store
from flower.state.seam import Sessions
from flower.state.sqlite import (
    SessionStoreBusy,
    SessionStoreDamaged,
    SessionStoreError,
    SqliteSessionStore,
)

WRITER = Path(__file__).parent / "fixtures" / "sqlite_writer.py"
OPTIONAL = ("list_sessions", "list_session_summaries", "delete", "list_subkeys")
KEY = {"project_key": "proj", "session_id": "sess"}


def e(n: int, **extra) -> dict:
    return {"type": "x", "uuid": f"u{n}", "n": n, **extra}


def prompt(n: int) -> dict:
    """A user entry: what makes a stored transcript a conversation the CLI can resume."""
    return e(n, type="user", message={"role": "user", "content": f"prompt {n}"})


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteSessionStore]:
    s = SqliteSessionStore(tmp_path / "runs" / "sessions.db")
    yield s
    s.close()


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen]]:
    """Every process a test starts, reaped at the end whatever happened."""
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)
        for stream in (p.stdin, p.stdout, p.stderr):
            if stream:
                stream.close()


def integrity(db: Path) -> str:
    with sqlite3.connect(db) as conn:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]


# ---- the SDK's contract -------------------------------------------------------------


def test_conformance_with_every_optional_method(tmp_path: Path) -> None:
    for name in OPTIONAL:  # the suite silently skips a method the class does not override
        assert getattr(SqliteSessionStore, name) is not getattr(SessionStore, name), name
    counter = itertools.count()
    made: list[SqliteSessionStore] = []

    def make_store() -> SqliteSessionStore:
        made.append(SqliteSessionStore(tmp_path / f"conf-{next(counter)}.db"))
        return made[-1]

    asyncio.run(run_session_store_conformance(make_store))
    assert len(made) == 15  # a probe plus one store per contract: nothing was skipped
    for s in made:
        s.close()


def test_it_is_a_full_sessions_whose_attempts_are_never_refused(tmp_path: Path) -> None:
    """The seam's fencing on one machine: a counter and a no-op. Two attempts of one step
    by hand, the older one writing after the newer claimed the session: both land (the
    supervisor keeps one writer per session; nothing here refuses one)."""
    db = tmp_path / "sessions.db"
    older, newer = SqliteSessionStore(db), SqliteSessionStore(db)
    try:
        assert isinstance(older, Sessions) and older.epoch == 0
        assert [older.begin_attempt(), older.begin_attempt()] == [1, 2]
        older.claim("sess")
        asyncio.run(older.append(KEY, [e(1)]))
        newer.begin_attempt()
        newer.claim("sess")
        asyncio.run(older.append(KEY, [e(2)]))
        older.claim("sess")
        asyncio.run(newer.append(KEY, [e(3)]))
        assert newer.load_sync(KEY) == [e(1), e(2), e(3)]
    finally:
        older.close()
        newer.close()


def test_entries_are_stored_as_compact_json_text(store: SqliteSessionStore) -> None:
    entry = {"type": "user", "uuid": "u1", "text": "需求 ✓", "nested": {"b": 1, "a": [1.5]}}
    odd = {"type": "x", "text": "lone \ud800 surrogate"}
    asyncio.run(store.append(KEY, [entry, odd]))
    with sqlite3.connect(store.path) as conn:
        raw = [r[0] for r in conn.execute("SELECT data FROM entries ORDER BY seq")]
    assert raw[0] == json.dumps(entry, ensure_ascii=False, separators=(",", ":"))
    assert store.load_sync(KEY) == [entry, odd]


def test_keys_that_would_collide_are_refused(store: SqliteSessionStore) -> None:
    with pytest.raises(ValueError, match="project_key"):
        asyncio.run(store.append({"project_key": "a/b", "session_id": "c"}, [e(1)]))
    with pytest.raises(ValueError, match="session_id"):
        store.load_sync({"project_key": "a", "session_id": "b/c"})


# ---- idempotency and the sidecar ----------------------------------------------------


def test_a_retried_batch_stores_each_uuid_once(store: SqliteSessionStore) -> None:
    plain = {"type": "tag", "tag": "t"}  # no uuid: appended every time
    sub = {**KEY, "subpath": "subagents/agent-1"}

    async def scenario() -> None:
        await store.append(KEY, [e(1), e(2), plain])
        await store.append(KEY, [e(1), e(2), plain, e(3), e(3)])  # the SDK retries whole batches
        await store.append(sub, [e(1)])  # a uuid is unique per key, not per file

    asyncio.run(scenario())
    assert store.load_sync(KEY) == [e(1), e(2), plain, plain, e(3)]
    assert store.load_sync(sub) == [e(1)]


def test_a_fully_duplicate_batch_changes_nothing(store: SqliteSessionStore) -> None:
    async def scenario() -> tuple[list, list, list, list]:
        await store.append(KEY, [e(1, customTitle="first"), e(2, customTitle="second")])
        before = (await store.list_sessions("proj"), await store.list_session_summaries("proj"))
        await store.append(KEY, [e(1, customTitle="first")])
        after = (await store.list_sessions("proj"), await store.list_session_summaries("proj"))
        return *before, *after

    sessions0, summaries0, sessions1, summaries1 = asyncio.run(scenario())
    assert sessions1 == sessions0
    assert summaries1 == summaries0  # the re-sent entry did not fold "first" back in
    assert summaries1[0]["data"]["custom_title"] == "second"


def test_sidecar_and_list_sessions_share_one_clock(store: SqliteSessionStore) -> None:
    async def scenario() -> tuple[list, list]:
        for n in range(5):
            await store.append(KEY, [e(n)])
            await store.append({**KEY, "subpath": "subagents/a"}, [e(n)])
        return await store.list_sessions("proj"), await store.list_session_summaries("proj")

    sessions, summaries = asyncio.run(scenario())
    assert [s["mtime"] for s in sessions] == [s["mtime"] for s in summaries]


# ---- has_session, reopen, clocks ------------------------------------------------------


def test_has_session(store: SqliteSessionStore) -> None:
    assert not store.has_session(None, "sess")
    asyncio.run(store.append({**KEY, "session_id": "only-sub", "subpath": "subagents/a"}, [e(1)]))
    assert not store.has_session(
        None, "only-sub"
    )  # a subagent transcript is not a session to resume
    # Entries that are not a conversation (Claude Code 2.1.337 writes an api-request-route
    # entry before the prompt): nothing the CLI can resume ("No conversation found").
    asyncio.run(store.append(KEY, [e(1), {"type": "api-request-route", "sessionId": "sess"}]))
    assert not store.has_session(None, "sess")
    asyncio.run(store.append(KEY, [prompt(2)]))
    assert store.has_session(None, "sess")
    assert store.has_session("proj", "sess")
    assert not store.has_session("elsewhere", "sess")
    asyncio.run(store.delete(KEY))
    assert not store.has_session(None, "sess")


def test_a_reopened_store_sees_old_data(tmp_path: Path) -> None:
    db = tmp_path / "sessions.db"
    first = SqliteSessionStore(db)
    asyncio.run(first.append(KEY, [e(1, customTitle="kept"), prompt(2)]))
    listed = asyncio.run(first.list_sessions("proj"))
    first.close()
    second = SqliteSessionStore(db)
    assert second.load_sync(KEY) == [e(1, customTitle="kept"), prompt(2)]
    assert second.has_session(None, "sess")
    assert asyncio.run(second.list_sessions("proj")) == listed
    summary = asyncio.run(second.list_session_summaries("proj"))[0]
    assert summary["data"]["custom_title"] == "kept"
    second.close()


def test_mtimes_stay_monotonic_across_store_objects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "sessions.db"
    a, b = SqliteSessionStore(db), SqliteSessionStore(db)
    frozen = time.time_ns()
    monkeypatch.setattr(sqlite_store.time, "time_ns", lambda: frozen)  # wall clock stands still

    async def scenario() -> list[int]:
        stamps = []
        for n in range(30):
            writer, sid = (a, "from-a") if n % 2 else (b, "from-b")
            if n == 20:  # drop the newest session: b alone would now reuse a's last stamp
                await a.delete({"project_key": "proj", "session_id": "from-a"})
            await writer.append({"project_key": "proj", "session_id": sid}, [e(n)])
            listed = {s["session_id"]: s["mtime"] for s in await a.list_sessions("proj")}
            stamps.append(listed[sid])
        return stamps

    stamps = asyncio.run(scenario())
    assert all(later > earlier for earlier, later in itertools.pairwise(stamps)), stamps
    assert stamps[0] >= frozen // 1_000_000
    a.close()
    b.close()


def test_appends_checkpoint_the_wal_in_the_background(store: SqliteSessionStore) -> None:
    empty = store.path.stat().st_size

    async def scenario() -> None:
        await store.append(KEY, [e(0)])  # a process's first append checkpoints
        assert store._checkpointing is not None
        await store._checkpointing
        for n in range(1, sqlite_store.CHECKPOINT_EVERY + 1):  # and every CHECKPOINT_EVERY
            await store.append(KEY, [e(n, pad="x" * 2000)])
        await store._checkpointing

    asyncio.run(scenario())
    # far below SQLite's own threshold, so only the worker's checkpoint moved them there
    assert store.path.stat().st_size > empty + sqlite_store.CHECKPOINT_EVERY * 2000


# ---- many processes ---------------------------------------------------------------------


@pytest.mark.timeout(120)  # 8,000 appends by 4 processes: ~5 s alone, slower on a busy machine
def test_four_writer_processes_at_once(tmp_path: Path, procs: list[subprocess.Popen]) -> None:
    db, writers, count = tmp_path / "sessions.db", 4, 2000
    for w in range(writers):
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WRITER), str(db), str(w), str(count)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for p in procs:  # the barrier: all are open and waiting before any starts
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    spans, errors = [], []
    for p in procs:
        out, err = p.communicate(timeout=110)
        errors.append(err)
        assert p.returncode == 0, err
        spans.append(json.loads(out))
    assert not any("locked" in err or "busy" in err for err in errors)
    assert max(s["started"] for s in spans) < min(s["ended"] for s in spans)  # they overlapped

    store = SqliteSessionStore(db)
    shared = store.load_sync({"project_key": "proj", "session_id": "shared"})
    assert len(shared) == writers * count
    assert len({(x["writer"], x["i"]) for x in shared}) == writers * count  # no duplicates
    for w in range(writers):
        assert [x["i"] for x in shared if x["writer"] == w] == list(range(count))  # in order
        own = store.load_sync({"project_key": "proj", "session_id": f"w{w}"})
        assert [x["i"] for x in own] == list(range(0, count, 50))
    sessions = asyncio.run(store.list_sessions("proj"))
    assert len({s["mtime"] for s in sessions}) == len(sessions) == writers + 1
    store.close()
    assert integrity(db) == "ok"


def test_acknowledged_appends_survive_kill_9_of_the_writer(
    tmp_path: Path, procs: list[subprocess.Popen]
) -> None:
    db = tmp_path / "sessions.db"
    writer = subprocess.Popen(
        [sys.executable, str(WRITER), str(db), "0", "1000000", "--ack"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    procs.append(writer)
    assert writer.stdout.readline().strip() == "ready"
    writer.stdin.write("go\n")
    writer.stdin.flush()
    acked = -1
    while acked < 300:  # mid-burst: the next append may be half written when it dies
        acked = int(writer.stdout.readline())
    writer.kill()
    writer.wait(timeout=10)
    assert integrity(db) == "ok"
    store = SqliteSessionStore(db)
    stored = [x["i"] for x in store.load_sync({"project_key": "proj", "session_id": "shared"})]
    store.close()
    assert stored[: acked + 1] == list(range(acked + 1))  # every acknowledged one, in order
    assert stored == list(range(len(stored)))  # and nothing torn or doubled after them


def test_a_lock_held_past_the_deadline_raises_a_clear_error(
    store: SqliteSessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_store, "BUSY_DEADLINE_S", 0.2)
    holder = sqlite3.connect(store.path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    with pytest.raises(SessionStoreBusy, match="stayed locked") as info:
        asyncio.run(store.append(KEY, [e(1)]))
    assert isinstance(info.value, TimeoutError) and info.value.hint
    assert store.load_sync(KEY) is None  # readers are never blocked by a writer in WAL
    holder.execute("ROLLBACK")
    holder.close()
    asyncio.run(store.append(KEY, [e(1)]))
    assert store.load_sync(KEY) == [e(1)]


def test_a_briefly_held_lock_is_waited_out(
    store: SqliteSessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    busy_seen = threading.Event()
    real = sqlite_store._is_busy

    def spy(exc: BaseException) -> bool:
        busy = real(exc)
        if busy:
            busy_seen.set()
        return busy

    monkeypatch.setattr(sqlite_store, "_is_busy", spy)
    holder = sqlite3.connect(store.path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")

    def release_once_the_store_waits() -> None:
        busy_seen.wait(10)
        holder.execute("ROLLBACK")

    releaser = threading.Thread(target=release_once_the_store_waits)
    releaser.start()
    asyncio.run(store.append(KEY, [e(1)]))
    releaser.join()
    holder.close()
    assert busy_seen.is_set()
    assert store.load_sync(KEY) == [e(1)]


# ---- fork ----------------------------------------------------------------------------------


def _in_child(work) -> None:
    """Run ``work`` in a forked child; fail the test if it raised."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            work()
        except BaseException:  # noqa: BLE001 - a child's failure is its exit status
            traceback.print_exc()
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_forked_child_appends_through_the_inherited_store(store: SqliteSessionStore) -> None:
    asyncio.run(store.append(KEY, [e(1)]))

    def child() -> None:
        asyncio.run(store.append(KEY, [prompt(2)]))
        assert store.has_session(None, "sess")

    _in_child(child)
    asyncio.run(store.append(KEY, [e(3)]))
    assert store.load_sync(KEY) == [e(1), prompt(2), e(3)]
    store.close()
    assert integrity(store.path) == "ok"


@pytest.mark.filterwarnings("ignore:This process.*multi-threaded:DeprecationWarning")
def test_a_child_never_touches_a_connection_the_parent_was_using(
    store: SqliteSessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_store, "FORK_WAIT_S", 0.05)  # the fork gives up waiting soon
    asyncio.run(store.append(KEY, [e(1)]))
    parent_conn = store._db.current
    holding, done = threading.Event(), threading.Event()

    def busy_elsewhere() -> None:  # another thread is inside the store while we fork
        with store._db.lock:
            holding.set()
            done.wait(10)

    thread = threading.Thread(target=busy_elsewhere)
    thread.start()
    assert holding.wait(10)

    def child() -> None:
        assert store._db.current is None  # the inherited one was set aside, not closed
        asyncio.run(store.append(KEY, [e(2)]))  # its lock is fresh: no deadlock
        assert store._db.current is not None and store._db.current is not parent_conn

    try:
        _in_child(child)
    finally:
        done.set()
        thread.join()
    assert store._db.current is parent_conn  # the parent kept its connection through the fork
    asyncio.run(store.append(KEY, [e(3)]))
    assert store.load_sync(KEY) == [e(1), e(2), e(3)]
    store.close()
    assert integrity(store.path) == "ok"


# ---- files -----------------------------------------------------------------------------------


def test_files_are_owner_only(tmp_path: Path) -> None:
    old_umask = os.umask(0o022)
    try:
        db = tmp_path / "new" / "runs" / "sessions.db"
        store = SqliteSessionStore(db)
        asyncio.run(store.append(KEY, [e(1)]))
        modes = {
            p.name: stat.S_IMODE(p.stat().st_mode)
            for p in (db, db.with_name("sessions.db-wal"), db.with_name("sessions.db-shm"))
        }
        store.close()
    finally:
        os.umask(old_umask)
    assert modes == {"sessions.db": 0o600, "sessions.db-wal": 0o600, "sessions.db-shm": 0o600}
    assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700


def test_a_file_that_is_not_a_database_gets_a_clear_error(tmp_path: Path) -> None:
    db = tmp_path / "sessions.db"
    db.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(SessionStoreError, match="not a usable SQLite database") as info:
        SqliteSessionStore(db)
    assert "move it aside" in info.value.hint
    assert db.read_bytes() == b"this is not sqlite" * 100  # never touched


def test_a_disk_error_is_not_damage_and_the_file_stays(tmp_path: Path, monkeypatch) -> None:
    """Only SQLite saying the contents are bad sets a database aside: a full disk, a read-only
    directory or an I/O error is one clear error, and the (healthy) file stays where it is."""
    from types import SimpleNamespace

    from flower.state.backends import LocalState
    from flower.state.stores import open_store

    SqliteSessionStore(tmp_path / "sessions.db").close()  # a healthy database

    def disk_trouble(self, conn):  # what SQLite raises for ENOSPC / EIO
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(SqliteSessionStore, "_configure", disk_trouble)
    runtime = SimpleNamespace(workspace=tmp_path, state=LocalState(tmp_path, tmp_path))
    with pytest.raises(SessionStoreError, match="cannot be opened: disk I/O error") as info:
        open_store(runtime)
    assert not isinstance(info.value, SessionStoreDamaged) and info.value.hint
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sessions.db"]
