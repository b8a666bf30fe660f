"""PostgreSQL stopped under a writer: nothing is lost, nothing is out of order, nothing
escapes the fence; and the errors a person can cause at start, one line each.

These tests stop and restart a server, so they use one of their own (module-scoped), not
the suite's: a fresh database on it per test.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from flower.services.postgres import PgServer
from flower.state.backends import open_state
from flower.state.postgres import (
    NoSuchDatabase,
    PasswordRefused,
    PostgresSessionStore,
    PostgresState,
    PostgresUnavailable,
    StateURLError,
    parse_state_url,
)
from flower.state.postgres.spool import spool_dir
from flower.state.seam import Superseded
from flower.testing.pytest_postgres import database_url
from tests.pg_own import own_database

# initdb + start of this module's own server: ~1 s idle, 5 s measured on a loaded machine.
pytestmark = pytest.mark.timeout(120)

WRITER = Path(__file__).parent / "fixtures" / "pg_writer.py"
KEY = {"project_key": "proj", "session_id": "sess"}


def e(i: int) -> dict:
    return {"type": "x", "uuid": f"u{i}", "i": i}


@pytest.fixture
def dsn(own_server: PgServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    return own_database(own_server, tmp_path, monkeypatch)


def stored(dsn: str) -> list[int]:
    """The ``i`` of every entry of proj/sess, in order, read without flower."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT data::json->>'i' FROM flower.entries WHERE key = 'proj/sess' ORDER BY seq"
        ).fetchall()
    return [int(i) for (i,) in rows]


def spooled(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "state").glob("flower/spool/*/*.spool"))


def wait_until(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


class Writer:
    """tests/fixtures/pg_writer.py, driven line by line."""

    def __init__(self, dsn: str, *, attempt: bool = False) -> None:
        args = [sys.executable, str(WRITER), dsn] + (["--attempt"] if attempt else [])
        self.proc = subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=os.environ.copy()
        )
        assert self.ask(None) == "ready"

    def ask(self, command: str | None) -> str:
        assert self.proc.stdin and self.proc.stdout
        if command is not None:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream:
                stream.close()


@pytest.fixture
def writers() -> Iterator[Callable[..., Writer]]:
    made: list[Writer] = []

    def make(dsn: str, **kw: bool) -> Writer:
        made.append(Writer(dsn, **kw))
        return made[-1]

    yield make
    for w in made:
        w.close()


# ---- outages ---------------------------------------------------------------------------


def test_kill_9_during_an_outage_loses_no_entry(
    server: PgServer, dsn: str, tmp_path: Path, writers: Callable[..., Writer]
) -> None:
    writer = writers(dsn)
    assert writer.ask("append 0 3") == "appended 3"
    server.down()
    assert writer.ask("append 3 8") == "appended 8"  # acknowledged: in the spool, fsynced
    (spool,) = spooled(tmp_path)
    assert stat.S_IMODE(spool.stat().st_mode) == 0o600  # it holds transcripts
    assert stat.S_IMODE(spool.parent.stat().st_mode) == 0o700
    writer.kill()
    server.up()
    assert stored(dsn) == [0, 1, 2]  # nobody delivered the dead writer's spool yet
    store = PostgresSessionStore(dsn)  # a process that starts delivers dead spools first
    try:
        assert asyncio.run(store.load(KEY)) == [e(i) for i in range(8)]
        assert spooled(tmp_path) == []
    finally:
        store.close()


def test_a_live_writer_spools_in_order_and_delivers_when_the_server_is_back(
    server: PgServer, dsn: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = PostgresSessionStore(dsn)
    try:
        asyncio.run(store.append(KEY, [e(0)]))  # type: ignore[list-item]
        server.down()
        with caplog.at_level(logging.WARNING, logger="flower"):
            for i in (1, 2, 3):
                asyncio.run(store.append(KEY, [e(i)]))  # type: ignore[list-item]
        warned = [r.getMessage() for r in caplog.records if r.name == "flower"]
        assert len(warned) == 1 and "PostgreSQL" in warned[0], warned  # one line, not three
        assert len(spooled(tmp_path)) == 1
        server.up()
        asyncio.run(store.append(KEY, [e(4)]))  # type: ignore[list-item]
        # no read of ours: the background delivery alone puts them in, in order
        wait_until(lambda: stored(dsn) == [0, 1, 2, 3, 4])
        wait_until(lambda: spooled(tmp_path) == [])
        asyncio.run(store.append(KEY, [e(5)]))  # type: ignore[list-item]
        assert asyncio.run(store.load(KEY)) == [e(i) for i in range(6)]
    finally:
        store.close()


def test_a_run_s_rows_written_during_an_outage_are_kept_and_delivered_in_order(
    server: PgServer, dsn: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A step goes on through an outage; the supervisor's manifest rows, registry record and
    # events of that time must not be lost (nor cost a second line on the terminal).
    state = PostgresState(dsn)
    try:
        state.events.append("r1", {"n": 0})
        server.down()
        with caplog.at_level(logging.WARNING, logger="flower"):
            state.events.append("r1", {"n": 1})  # no raise: kept on this machine
            state.manifest.append("ws", {"step": "a", "ok": True})
            kept_at = time.time()
            state.registry.write({"run": "r1", "workspace_id": "ws", "state": "finished"})
            state.events.append("r1", {"n": 2})
        warned = [r.getMessage() for r in caplog.records if r.name == "flower"]
        assert len(warned) == 1 and "PostgreSQL" in warned[0], warned
        # Not a wait for anything: the outage must outlast the 1 s the heartbeat check below
        # allows, or a record stamped at delivery would pass it too.
        time.sleep(2.0)
        back_at = time.time()
        server.up()
        wait_until(lambda: spooled(tmp_path) == [])  # the process's own thread delivered
        assert [e["n"] for _, e in state.events.read("r1")] == [0, 1, 2]
        assert state.manifest.rows("ws") == [{"step": "a", "ok": True}]
        (record,) = state.registry.records("ws")
        assert record["state"] == "finished"
        # the heartbeat of a record delivered late is when it was written, not delivered
        assert kept_at <= record["heartbeat_at"] < back_at, (kept_at, back_at, record)
    finally:
        state.close()


def test_the_connection_back_after_an_outage_delivers_a_dead_process_s_spool(
    server: PgServer, dsn: str, tmp_path: Path, writers: Callable[..., Writer]
) -> None:
    # A step child whose attempt ended during the outage left its spool; the supervisor,
    # spooling too, reconnects in its delivering thread: that connection delivers the
    # child's spool as every new connection does, with no call of ours.
    store = PostgresSessionStore(dsn)
    try:
        child = writers(dsn)
        assert child.ask("append 0 2") == "appended 2"
        server.down()
        assert child.ask("append 2 5") == "appended 5"  # spooled
        child.kill()
        other = {"project_key": "proj", "session_id": "other"}
        asyncio.run(store.append(other, [e(9)]))  # type: ignore[arg-type,list-item]
        server.up()  # this process's thread delivers its spool on a connection of its own
        wait_until(lambda: stored(dsn) == [0, 1, 2, 3, 4])
        wait_until(lambda: spooled(tmp_path) == [])
    finally:
        store.close()


def test_settle_waits_for_the_database_to_take_what_was_kept(
    server: PgServer, dsn: str, tmp_path: Path, writers: Callable[..., Writer]
) -> None:
    state = PostgresState(dsn)
    try:
        assert state.settle(0)  # nothing kept: at once
        child = writers(dsn)
        server.down()
        assert child.ask("append 0 2") == "appended 2"
        child.kill()  # a step child that ended during the outage
        state.manifest.append("ws", {"step": "a"})
        assert not state.settle(0)  # still down: both spools wait
        assert len(spooled(tmp_path)) == 2
        back = threading.Timer(1.0, server.up)
        back.start()
        try:
            assert state.settle(60)
        finally:
            back.join()
        assert spooled(tmp_path) == []
        assert stored(dsn) == [0, 1]
        assert state.manifest.rows("ws") == [{"step": "a"}]
    finally:
        state.close()


def test_a_read_delivers_this_process_s_spool_first(server: PgServer, dsn: str) -> None:
    store = PostgresSessionStore(dsn)
    try:
        server.down()
        asyncio.run(store.append(KEY, [e(0), e(1)]))  # type: ignore[list-item]
        with pytest.raises(PostgresUnavailable):
            store.load_sync(KEY)  # a read cannot be spooled: the caller waits and retries
        server.up()
        assert store.load_sync(KEY) == [e(0), e(1)]
    finally:
        store.close()


def test_an_entry_delivered_late_still_goes_through_the_fence(
    server: PgServer,
    dsn: str,
    tmp_path: Path,
    writers: Callable[..., Writer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    old = writers(dsn, attempt=True)
    assert old.ask("claim").startswith("claimed ")
    assert old.ask("append 0 2") == "appended 2"
    server.down()
    assert old.ask("append 2 4") == "appended 4"  # spooled
    old.kill()
    server.up()
    with psycopg.connect(dsn, autocommit=True) as conn:  # a newer attempt takes the session
        (newer,) = conn.execute("SELECT nextval('flower.epochs')").fetchone() or (0,)
        conn.execute("UPDATE flower.fence SET epoch = %s WHERE session_id = 'sess'", (newer,))
    with caplog.at_level(logging.WARNING, logger="flower"):
        store = PostgresSessionStore(dsn)  # delivers the dead attempt's spool: refused
    try:
        assert stored(dsn) == [0, 1]
        assert spooled(tmp_path) == []
        refused = [r.getMessage() for r in caplog.records if "sess" in r.getMessage()]
        assert len(refused) == 2, refused
    finally:
        store.close()


# ---- errors a person can cause ------------------------------------------------------------


def one_line(exc: BaseException) -> str:
    text = exc.one_line()  # type: ignore[attr-defined]
    assert "\n" not in text and exc.hint, text  # type: ignore[attr-defined]
    return str(text)


def test_a_refused_password_is_one_line_and_never_shows_the_password(
    own_server: PgServer, dsn: str
) -> None:
    hba = own_server.data / "pg_hba.conf"
    text = hba.read_text()
    if "alice" not in text:
        hba.write_text("host all alice 127.0.0.1/32 scram-sha-256\n" + text)
    with psycopg.connect(own_server.dsn, autocommit=True) as admin:
        admin.execute("DROP ROLE IF EXISTS alice")
        admin.execute("CREATE ROLE alice LOGIN PASSWORD 'right-horse'")
        admin.execute("SELECT pg_reload_conf()")
    wrong = dsn.replace("postgres@", "alice:s3cret-battery@")
    with pytest.raises(PasswordRefused) as caught:
        PostgresState(wrong)
    line = one_line(caught.value)
    assert "s3cret-battery" not in line and "***" in line, line


def test_a_database_that_does_not_exist_is_one_line(own_server: PgServer) -> None:
    with pytest.raises(NoSuchDatabase) as caught:
        PostgresState(database_url(own_server.dsn, "no_such_db"))
    assert "no_such_db" in one_line(caught.value)


def test_a_server_that_is_down_at_start_is_one_line(server: PgServer, dsn: str) -> None:
    server.down()
    started = time.monotonic()
    with pytest.raises(PostgresUnavailable) as caught:
        PostgresSessionStore(dsn)
    assert time.monotonic() - started < 10
    assert str(server.port) in one_line(caught.value)


def test_a_start_waits_for_a_server_that_is_down_then_says_it_in_one_line(
    server: PgServer, dsn: str, tmp_path: Path
) -> None:
    server.down()
    said: list[str] = []
    started = time.monotonic()
    with pytest.raises(PostgresUnavailable) as caught:
        open_state(
            dsn, run_dir=tmp_path / "runs", workspace=tmp_path, wait_s=1.5, waiting=said.append
        )
    took = time.monotonic() - started
    assert 1.5 <= took < 10, took  # it tried for the time it was given, then gave up
    assert len(said) == 1 and str(server.port) in said[0], said  # said once, not per try
    assert str(server.port) in one_line(caught.value)


def test_a_start_s_reads_after_the_opening_wait_for_the_server_too(
    server: PgServer, dsn: str, tmp_path: Path
) -> None:
    # What a start reads between its state's opening and its run (the last run, the
    # placement's checks): the server going away then is waited for like at the opening,
    # one line for the block, instead of the start stopping with the error.
    state = open_state(dsn, run_dir=tmp_path / "runs", workspace=tmp_path)
    try:
        state.registry.records()
        server.down()
        back = threading.Timer(2.0, server.up)
        back.start()
        said: list[str] = []
        try:
            with state.patient(60.0, said.append):
                assert state.registry.records() == []
                assert state.registry.records() == []
        finally:
            back.join()
        assert len(said) == 1 and str(server.port) in said[0], said
        # outside the block a read raises at once, as the run's own outage handling wants
        server.down()
        try:
            with pytest.raises(PostgresUnavailable):
                state.registry.records()
        finally:
            server.up()
    finally:
        state.close()


def test_a_url_that_is_not_postgresql_is_one_line() -> None:
    with pytest.raises(StateURLError) as caught:
        PostgresState("mysql://root:hunter2@db/flower")
    line = one_line(caught.value)
    assert "hunter2" not in line and "postgresql://" in line


def test_a_superseded_write_says_so_in_one_line(dsn: str) -> None:
    old, new = PostgresSessionStore(dsn), PostgresSessionStore(dsn)
    try:
        old.begin_attempt()
        new.begin_attempt()
        new.claim("sess")
        with pytest.raises(Superseded) as caught:
            asyncio.run(old.append(KEY, [e(0)]))  # type: ignore[list-item]
        assert "sess" in one_line(caught.value)
    finally:
        old.close()


def test_an_unreadable_spool_of_a_dead_process_is_set_aside_not_in_the_way(
    dsn: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    PostgresSessionStore(dsn).close()  # the database's spool directory, as the store names it
    directory = spool_dir(parse_state_url(dsn).database_key)
    directory.mkdir(parents=True)
    (directory / "1-1-aaaaaa.spool").write_bytes(b"\x00garbage, not a spool\n")
    with caplog.at_level(logging.WARNING, logger="flower"):
        store = PostgresSessionStore(dsn)
    try:
        asyncio.run(store.append(KEY, [e(1)]))  # type: ignore[list-item]
        assert store.load_sync(KEY) == [e(1)]
        kept = [p.name for p in directory.iterdir()]
        assert len(kept) == 1 and kept[0].startswith("1-1-aaaaaa.spool.unreadable-"), kept
        assert any("1-1-aaaaaa.spool" in r.getMessage() for r in caplog.records)
    finally:
        store.close()


def test_a_spooled_append_whose_remembered_summary_went_stale_is_delivered(
    server: PgServer, dsn: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = PostgresSessionStore(dsn)
    try:
        asyncio.run(store.append(KEY, [e(0)]))  # type: ignore[list-item]
        asyncio.run(store.append(KEY, [e(1)]))  # the one-round-trip path from here on
        with psycopg.connect(dsn, autocommit=True) as conn:  # another writer folded it since
            conn.execute("UPDATE flower.summaries SET mtime = mtime + 1")
        server.down()
        with caplog.at_level(logging.WARNING, logger="flower"):
            asyncio.run(store.append(KEY, [e(2)]))  # type: ignore[list-item]
        server.up()
        with caplog.at_level(logging.WARNING, logger="flower"):
            wait_until(lambda: stored(dsn) == [0, 1, 2])
            wait_until(lambda: spooled(tmp_path) == [])
        (outage,) = [r.getMessage() for r in caplog.records]  # that line and no other
        assert "PostgreSQL" in outage
    finally:
        store.close()
