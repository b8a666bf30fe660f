"""The run state's conformance suite: one set of rules, written once, held by both backends.

Like the SDK's session-store conformance suite (which runs here too, against
``state.sessions``), every test below is written against the seam alone —
:func:`flower.state.backends.open_state` and the :class:`~flower.state.backends.RunState` it
returns — and runs once per backend: ``local`` (the files of a run_dir) and ``postgres``
(a fresh database on the suite's server). No test asks which backend it has, except where
the backends' documented behaviour differs (the mailboxes: PostgreSQL's only).

Three parts:

1. **Contracts**, a handful per store (sessions, the tool ledger, lineage, manifest,
   registry, cache, events, mailbox, scope): what is written reads back equal and in order,
   and a second ``open_state`` on the same place — another process's view — sees it.
2. **The database away at each kind of write** (session append, ledger started+finished,
   lineage remember+forget, manifest row, registry write+remove, event, and all of them
   interleaved as a step writes them — ``every``): with a PostgreSQL server of the module's
   own stopped, each write returns without raising, kept on the machine in owner-only files
   (0600 in a 0700 directory); ``settle`` says False while the server is away; once it is
   back ``settle`` delivers them all, in order, and leaves no spool file, and a read of the
   writing process sees its own writes. A cache put is no durable record: while the
   database is away it is a miss, never an error. Local files have no outage: their variant
   asserts instead that each write is durable — read back by another view — the moment it
   returns.
3. **kill -9 right after each kind of write** (the cache's too): a child process
   (:mod:`tests.state_writes`) writes, says so, and is killed; a fresh ``open_state`` sees
   exactly what it wrote. For PostgreSQL also with the server down during the write: once
   it is back, the next ``open_state`` delivers the dead process's spool.

The kinds of write and how each reads back live in :mod:`tests.state_writes`, shared by the
test process and the child it kills.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from claude_agent_sdk.testing import run_session_store_conformance

from flower import FlowerError
from flower.cache import Entry
from flower.cache.store import cache_key
from flower.services.postgres import PgServer
from flower.state.backends import RunState, open_state
from flower.state.records import LedgerRow
from flower.state.registry import FINISHED, RUNNING, process_started
from flower.state.result import Event, StepResult
from tests.pg_own import own_database
from tests.state_writes import DURABLE, KINDS, SESSION, cache_entry, entry, events, key, record

# A server of the module's own for the fault suites (initdb + start, ~1-5 s), children that
# load the SDK (~1 s each).
pytestmark = pytest.mark.timeout(120)

BACKENDS = ("local", "postgres")
ROOT = Path(__file__).resolve().parent.parent


class Place:
    """Where one run state lives: a run_dir and a workspace, and the database's URL for
    PostgreSQL (None: local files). :meth:`open` is one more view of it, as another process
    would open it; every view is closed after the test."""

    def __init__(self, kind: str, tmp_path: Path, url: str | None) -> None:
        self.kind, self.url = kind, url
        self.run_dir = tmp_path / "runs"
        self.workspace = tmp_path / "ws"
        self.workspace.mkdir(exist_ok=True)
        self.opened: list[RunState] = []

    def __repr__(self) -> str:
        return self.kind

    def open(self, url: str | None = None) -> RunState:
        state = open_state(url or self.url, run_dir=self.run_dir, workspace=self.workspace)
        self.opened.append(state)
        return state

    def close(self) -> None:
        for state in self.opened:
            state.close()


@pytest.fixture(params=BACKENDS)
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    url = request.getfixturevalue("pg_dsn") if request.param == "postgres" else None
    made = Place(request.param, tmp_path, url)
    yield made
    made.close()


@pytest.fixture
def state(place: Place) -> RunState:
    return place.open()


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert text and "\n" not in text, text
    return text


# =============================================================================================
# 1. contracts
# =============================================================================================

# -- sessions ---------------------------------------------------------------------------------


def test_sessions_hold_the_sdk_s_session_store_conformance(place: Place, tmp_path: Path) -> None:
    counter = itertools.count()

    def make_store() -> Any:  # each contract gets a place of its own
        n = next(counter)
        if place.url is None:
            return open_state(None, run_dir=tmp_path / f"conf{n}", workspace=place.workspace)
        return open_state(
            f"{place.url}?schema=conf{n}", run_dir=place.run_dir, workspace=place.workspace
        )

    made: list[RunState] = []

    def sessions() -> Any:
        made.append(make_store())
        return made[-1].sessions

    try:
        asyncio.run(run_session_store_conformance(sessions))
    finally:
        for s in made:
            s.close()
    assert len(made) == 15  # a probe plus one store per contract: nothing was skipped


def test_sessions_read_back_equal_in_order_from_every_view(place: Place, state: RunState) -> None:
    sessions = state.sessions
    asyncio.run(sessions.append(key(state), [entry(0), entry(1)]))  # type: ignore[arg-type, list-item]
    asyncio.run(sessions.append(key(state), [entry(1), entry(2)]))  # type: ignore[arg-type, list-item]
    want = [entry(0), entry(1), entry(2)]  # a retried entry (same uuid) lands once
    assert asyncio.run(sessions.load(key(state))) == want  # type: ignore[arg-type]
    other = place.open()
    assert other.transcript(SESSION) == want
    assert asyncio.run(other.sessions.load(key(other))) == want  # type: ignore[arg-type]


def test_sessions_resumable_is_a_stored_transcript(place: Place, state: RunState) -> None:
    assert state.resumable(SESSION) is False
    asyncio.run(state.sessions.append(key(state), [entry(0)]))  # type: ignore[arg-type, list-item]
    other = place.open()
    assert other.resumable(SESSION) is True
    assert other.sessions.has_session(None, SESSION)
    asyncio.run(other.sessions.delete(key(other)))  # type: ignore[arg-type]
    assert place.open().resumable(SESSION) is False


def test_sessions_an_attempt_superseded_is_fenced_out_where_attempts_can_race(
    place: Place, state: RunState
) -> None:
    """PostgreSQL: attempts on several machines can race for a session, so a newer attempt's
    claim refuses the older one's writes (Superseded, nothing written). Local files: one
    machine and one writer per session (the supervisor's), so nothing is ever refused."""
    from flower.state.errors import Superseded

    old, new = state.sessions, place.open().sessions
    old.begin_attempt()
    old.claim(SESSION)
    asyncio.run(old.append(key(state), [entry(0)]))  # type: ignore[arg-type, list-item]
    assert new.begin_attempt() > 0
    new.claim(SESSION)
    late = old.append(key(state), [entry(1)])  # type: ignore[arg-type, list-item]
    if place.kind == "postgres":
        with pytest.raises(Superseded):
            asyncio.run(late)
        assert [e["i"] for e in place.open().transcript(SESSION)] == [0]
    else:
        asyncio.run(late)
        assert [e["i"] for e in place.open().transcript(SESSION)] == [0, 1]


# -- the tool ledger -------------------------------------------------------------------------


def row(i: int, state: str = "started", **kw: Any) -> LedgerRow:
    return LedgerRow(f"toolu_{i}", SESSION, None, "Bash", f'{{"i": {i}}}', state, 100.0 + i, **kw)


def test_ledger_calls_read_back_in_order_from_every_view(place: Place, state: RunState) -> None:
    for i in (0, 1, 2):
        asyncio.run(state.ledger.started(row(i)))
    asyncio.run(state.ledger.finished(row(1, "done", content='"one"', ended_at=200.0)))
    other = place.open()
    calls = other.tool_calls(SESSION)
    assert [(c.tool_use_id, c.state) for c in calls] == [
        ("toolu_0", "started"),
        ("toolu_1", "done"),
        ("toolu_2", "started"),
    ]
    assert calls[1] == row(1, "done", content='"one"', ended_at=200.0)
    by_ids = other.ledger.by_ids(["toolu_2", "toolu_0"])
    assert sorted(c.tool_use_id for c in by_ids) == ["toolu_0", "toolu_2"]


def test_ledger_tool_calls_are_the_main_thread_s_since_a_time(
    place: Place, state: RunState
) -> None:
    asyncio.run(state.ledger.started(row(0)))
    sub = LedgerRow("toolu_sub", SESSION, "agent-1", "Read", "{}", "started", 100.5)
    asyncio.run(state.ledger.started(sub))
    asyncio.run(state.ledger.started(row(5)))
    other = place.open()
    assert [c.tool_use_id for c in other.tool_calls(SESSION)] == ["toolu_0", "toolu_5"]
    assert [c.tool_use_id for c in other.ledger.in_session(SESSION, 101.0)] == ["toolu_5"]
    (got,) = other.ledger.by_ids(["toolu_sub"])  # a subagent's call is kept all the same
    assert got.agent_id == "agent-1"


def test_ledger_a_started_call_is_never_overwritten_by_a_second_start(
    place: Place, state: RunState
) -> None:
    asyncio.run(state.ledger.started(row(0)))
    asyncio.run(state.ledger.finished(row(0, "done", content='"x"', ended_at=101.0)))
    asyncio.run(state.ledger.started(row(0)))  # a replayed hook: the row exists already
    (call,) = place.open().tool_calls(SESSION)
    assert (call.state, call.content) == ("done", '"x"')


def test_ledger_exact_replaces_what_the_model_was_sent(place: Place, state: RunState) -> None:
    asyncio.run(state.ledger.started(row(0)))
    asyncio.run(state.ledger.finished(row(0, "done", content='"long"', ended_at=101.0)))
    state.ledger.exact("toolu_0", '"cut"', False)
    (call,) = place.open().ledger.by_ids(["toolu_0"])
    assert (call.state, call.content, call.is_error) == ("done", '"cut"', False)


# -- lineage ---------------------------------------------------------------------------------


def test_lineage_remember_names_a_session_every_view_sees(place: Place, state: RunState) -> None:
    lineage = state.lineage()
    assert lineage.load() == {}
    lineage.remember("a", "sid-1")
    lineage.remember("b#retry2", "sid-2")  # an attempt's label: the bare step
    lineage.remember("a·判定#1", "sid-judge")  # a judge: never in lineage
    lineage.remember("a", "sid-3")  # the later session names it
    want = {"a": "sid-3", "b": "sid-2"}
    other = place.open()
    assert other.lineage().load() == want
    assert other.peek_lineage()["steps"] == want


def test_lineage_forget_drops_only_the_session_it_still_names(
    place: Place, state: RunState
) -> None:
    state.lineage().remember("a", "sid-1")
    state.lineage().remember("b", "sid-2")
    state.lineage().forget("a", "sid-old")  # names another session by now: kept
    state.lineage().forget("b", "sid-2")
    assert place.open().lineage().load() == {"a": "sid-1"}


def test_lineage_bump_counts_wakes_across_views(place: Place, state: RunState) -> None:
    assert state.lineage().bump() == 1
    state.lineage().remember("a", "sid-1")
    assert place.open().lineage().bump() == 2
    third = place.open().lineage()
    assert third.bump() == 3 and third.steps == {"a": "sid-1"}
    assert place.open().peek_lineage()["woke"] == 3


def test_lineage_a_session_the_store_no_longer_has_is_not_used(
    place: Place, state: RunState
) -> None:
    state.lineage().remember("a", "sid-kept")
    state.lineage().remember("b", "sid-gone")
    lineage = place.open().lineage(has_session=lambda sid: sid != "sid-gone")
    assert lineage.load() == {"a": "sid-kept"}
    assert lineage.bump(["a", "b"]) == 1  # a wake drops the gone one
    assert place.open().peek_lineage()["steps"] == {"a": "sid-kept"}


def test_lineage_is_one_workspace_s(place: Place, state: RunState, tmp_path: Path) -> None:
    """Another workspace on the same place reads none of it. What its first write does to
    the first one's is each backend's own: a run_dir's file holds one workspace's (set
    aside, kept beside itself); a database holds one per workspace."""
    state.lineage().remember("a", "sid-1")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    other = open_state(place.url, run_dir=place.run_dir, workspace=elsewhere)
    place.opened.append(other)
    assert other.lineage().load() == {}
    other.lineage().bump()
    other.lineage().remember("a", "sid-2")
    assert other.lineage().load() == {"a": "sid-2"}
    mine = place.open().lineage().load()
    if place.kind == "local":
        assert mine == {}
        assert [p.name for p in place.run_dir.glob("lineage.json.workspace-*")]
    else:
        assert mine == {"a": "sid-1"}


def test_lineage_archive_moves_it_out_of_the_way(
    place: Place, state: RunState, tmp_path: Path
) -> None:
    lineage = state.lineage()
    lineage.bump()
    lineage.remember("a", "sid-1")
    target = lineage.archive(tmp_path / "archive")
    assert (lineage.steps, lineage.woke) == ({}, 0)
    other = place.open()
    assert other.lineage().load() == {} and other.peek_lineage() == {}
    assert other.lineage().bump() == 1  # a fresh start counts from one again
    if place.kind == "local":  # the file moved into the folder (a database keeps its copy)
        assert (target / "lineage.json").exists()


# -- manifest --------------------------------------------------------------------------------


def test_manifest_rows_read_back_in_order_from_every_view(place: Place, state: RunState) -> None:
    first, second = state.manifest("run-1"), place.open().manifest("run-2")
    written = [
        first.record(StepResult("a", "sid-a", ok=True, cost_usd=0.25, num_turns=3)),
        second.record(StepResult("b", "sid-b", ok=False, error="boom")),
        first.record(StepResult("c", "sid-c", ok=True), {"reused": True, "saved_usd": 0.5}),
    ]
    for view in (state, place.open()):
        rows = view.manifest_rows()
        assert rows == written
        assert [(r["run"], r["step"]) for r in rows] == [
            ("run-1", "a"),
            ("run-2", "b"),
            ("run-1", "c"),
        ]
        assert rows[2]["reused"] is True and rows[1]["error"] == "boom"
    assert state.manifest("run-1").rows() == written


# -- registry --------------------------------------------------------------------------------


def test_registry_records_read_back_oldest_start_first(place: Place, state: RunState) -> None:
    state.registry.write(record("late", started_at=20.0, step="a"))
    state.registry.write(record("early", started_at=10.0, completed={"a": {"hash": "h"}}))
    other = place.open().registry
    assert [r.run for r in other.records()] == ["early", "late"]
    got = other.get("early")
    assert got is not None and got.completed == {"a": {"hash": "h"}} and got.host
    assert other.get("nobody") is None
    other.remove("late")
    assert [r.run for r in state.registry.records()] == ["early"]


def test_workspaces_are_each_workspace_with_runs_seen_on_its_own(
    place: Place, state: RunState, tmp_path: Path
) -> None:
    state.registry.write(record("mine", started_at=10.0))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    other = open_state(place.url, run_dir=place.run_dir, workspace=elsewhere)
    place.opened.append(other)
    other.registry.write(record("theirs", started_at=20.0))
    seen = place.open().workspaces()
    assert seen[0].workspace_id == state.workspace_id  # its own first
    runs = [[r.run for r in each.registry.records()] for each in seen]
    if state.shared:  # a database holds each workspace apart: two views, one run each
        assert runs == [["mine"], ["theirs"]]
        assert seen[1].workspace_id == other.workspace_id
    else:  # a run_dir holds whoever ran in it: one view with both
        assert runs == [["mine", "theirs"]]


def test_registry_live_is_a_running_record_of_a_living_process(
    place: Place, state: RunState
) -> None:
    me = os.getpid()
    running = record("mine", state=RUNNING, started_at=1.0)
    running.pid, running.pid_started = me, process_started(me)
    state.registry.write(running)
    state.registry.write(record("ended", state=FINISHED, started_at=2.0))
    dead = record("dead", state=RUNNING, started_at=3.0)
    dead.pid = 2**22 + 7  # no such process
    state.registry.write(dead)
    other = place.open().registry
    assert [r.run for r in other.live()] == ["mine"]
    assert other.live(exclude="mine") == []


def test_registry_a_rewritten_record_is_the_last_one_written(place: Place, state: RunState) -> None:
    rec = record("r", step="a")
    state.registry.write(rec)
    rec.step, rec.attempt, rec.state = "b", 2, FINISHED
    state.registry.write(rec)
    got = place.open().registry.get("r")
    assert got is not None and (got.step, got.attempt, got.state) == ("b", 2, FINISHED)


# -- cache -----------------------------------------------------------------------------------


def cached(step: str, created_at: float, value: Any = 1) -> Entry:
    k = cache_key(f"in-{step}", "fp")
    return Entry(
        k, step, f"in-{step}", {"m": "fp"}, {"step": step, "ok": True}, value, created_at, "f"
    )


def test_cache_an_entry_reads_back_equal_from_every_view(place: Place, state: RunState) -> None:
    now = time.time()
    e = cached("a", now, {"list": [1, 2], "text": "ü"})
    assert state.cache.put(e.key, e) is True
    assert place.open().cache.get(e.key, ttl_s=None) == e
    assert state.cache.get(cache_key("other", "fp"), ttl_s=None) is None


def test_cache_freshness_is_the_ttl(place: Place, state: RunState) -> None:
    now = time.time()
    e = cached("a", now - 100)
    state.cache.put(e.key, e)
    cache = place.open().cache
    assert cache.get(e.key, ttl_s=1000) == e
    assert cache.get(e.key, ttl_s=50) is None  # older than the ttl: stale
    assert cache.get(e.key, ttl_s=50, now=now - 60) == e  # as seen earlier, fresh
    assert cache.get(e.key, ttl_s=None) == e


def test_cache_a_later_put_replaces_the_entry(place: Place, state: RunState) -> None:
    now = time.time()
    first, second = cached("a", now - 5, "old"), cached("a", now, "new")
    state.cache.put(first.key, first)
    state.cache.put(second.key, second)
    got = place.open().cache.get(first.key, ttl_s=None)
    assert got is not None and got.ctx_value == "new"


def test_cache_a_damaged_entry_is_a_miss_and_the_key_works_again(
    place: Place, state: RunState
) -> None:
    e = cached("a", time.time())
    state.cache.rows.put(e.key, {"version": 1, "key": "not the key"})  # what no put writes
    assert state.cache.get(e.key, ttl_s=None) is None
    assert state.cache.put(e.key, e) is True
    assert place.open().cache.get(e.key, ttl_s=None) == e


def test_cache_the_last_runs_map_reads_back_from_every_view(place: Place, state: RunState) -> None:
    assert state.cache.read_last() == {}
    state.cache.write_last({"a": {"hash": "h" * 64}})
    assert place.open().cache.read_last() == {"a": {"hash": "h" * 64}}
    assert len(place.open().cache) == 0  # the map is no entry


# -- events ----------------------------------------------------------------------------------


def test_events_read_back_in_order_from_every_view(place: Place, state: RunState) -> None:
    log = state.event_log("run-1")
    log.write(Event("step", "a", payload={"step": "a"}))
    log.write(Event("tool_call", "ls", tool="Bash", payload={"step": "a", "input": {"c": "ls"}}))
    state.event_log("run-2").write(Event("text", "other run"))
    log.write(Event("text", "done", payload={"step": "a"}))
    other = place.open()
    assert other.has_events("run-1")
    got = events(other, "run-1")
    assert [(e["kind"], e["text"], e["tool"]) for e in got] == [
        ("step", "a", ""),
        ("tool_call", "ls", "Bash"),
        ("text", "done", ""),
    ]
    assert got[1]["payload"] == {"step": "a", "input": {"c": "ls"}}
    assert [e["text"] for e in events(other, "run-2")] == ["other run"]


# -- mailbox ---------------------------------------------------------------------------------


def test_mailboxes_are_postgresql_s_only(place: Place, state: RunState) -> None:
    """A cluster's supervisor and workers exchange messages through the database; a run_dir's
    files are one machine's, so local state refuses in one line with a hint."""
    if place.kind == "local":
        with pytest.raises(FlowerError) as raised:
            state.mailboxes  # noqa: B018
        assert "PostgreSQL" in one_line(raised.value)
        assert raised.value.hint  # type: ignore[attr-defined]
        return
    box = state.mailboxes
    box.append("attempt-1", {"to": "worker", "n": 0})
    other = place.open().mailboxes
    assert other.wait("attempt-1", 0, 5.0) is True
    got = other.read("attempt-1")
    assert [m["n"] for _, m in got] == [0]
    box.append("attempt-1", {"to": "worker", "n": 1})
    later = other.read("attempt-1", after=got[-1][0])
    assert [m["n"] for _, m in later] == [1]
    assert other.wait("attempt-1", later[-1][0], 0.2) is False


def test_events_changed_names_the_runs_that_got_one(place: Place, state: RunState) -> None:
    """What a follower of many runs (a cluster's mailbox pump) waits on: PostgreSQL names
    those of the runs it follows whose events came since the last look, and nothing else
    (another run's event does not even wake it); a run_dir's files cannot say (None: look
    at every run). A nudge ends a wait at once either way."""
    rows = place.open().events
    follow = {"run-a", "run-b"}
    if place.kind == "local":
        assert rows.changed(0.05, follow) is None
        rows.nudge()
        assert rows.changed(30.0, follow) is None  # at once
        return
    assert rows.changed(0.05, follow) is None  # just started listening: what came before?
    assert rows.changed(0.05, follow) == set()
    state.events.append("run-a", {"kind": "x"})
    state.events.append("run-b", {"kind": "x"})
    state.events.append("run-a", {"kind": "y"})
    state.events.append("run-c", {"kind": "x"})  # not followed
    seen: set[str] = set()
    deadline = time.monotonic() + 5.0
    while seen != follow and time.monotonic() < deadline:
        got = rows.changed(1.0, follow)
        assert got is not None
        seen |= got
    assert seen == follow
    # a notification of the three may still be on its way (each insert sends one): what
    # comes later names only these runs, and then nothing comes
    later: set[str] = set()
    while (got := rows.changed(0.5, follow)) != set():
        assert got is not None
        later |= got
    assert later <= follow
    # a run followed from now on is named at once (nobody listened for it), then as others
    assert rows.changed(0.05, {*follow, "run-c"}) == {"run-c"}
    assert rows.changed(0.05, {*follow, "run-c"}) == set()
    state.events.append("run-c", {"kind": "y"})
    assert rows.changed(5.0, {*follow, "run-c"}) == {"run-c"}
    # one no longer followed is not named, nor does it wake the wait
    state.events.append("run-b", {"kind": "y"})
    assert rows.changed(0.3, {"run-a"}) == set()
    rows.nudge()
    began = time.monotonic()
    assert rows.changed(30.0, {"run-a"}) == set()
    assert time.monotonic() - began < 20.0, "the nudge did not end the wait"


# -- scope -----------------------------------------------------------------------------------


def test_scope_names_the_state_as_a_person_would(place: Place, state: RunState) -> None:
    option, path = ("-r", place.run_dir) if place.kind == "local" else ("-w", place.workspace)
    assert state.scope.args() == [option, str(path.resolve() if option == "-w" else path)]
    assert state.settle(0.1) is True  # nothing is ever waiting with the database up


# =============================================================================================
# 2. the database away at each kind of write
# =============================================================================================


@pytest.fixture
def own_url(own_server: PgServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh database on the module's server; this test's spool under its tmp_path."""
    return own_database(own_server, tmp_path, monkeypatch)


def spooled(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "state").glob("flower/spool/*/*.spool"))


@pytest.mark.parametrize("kind", list(KINDS))
def test_local_writes_are_durable_the_moment_they_return(kind: str, tmp_path: Path) -> None:
    """Local files have no outage: there is no database to be away. What holds instead is
    that each write is in its file when it returns — another view reads it at once, with
    nothing waiting to be settled."""
    place = Place("local", tmp_path, None)
    try:
        state = place.open()
        for i in range(3):
            KINDS[kind].write(state, i)
            assert KINDS[kind].read(place.open()) == KINDS[kind].expect(i + 1)
        assert state.settle(0) is True
    finally:
        place.close()


@pytest.mark.parametrize("kind", DURABLE)
def test_postgres_a_write_while_the_database_is_away_is_delivered_in_order(
    kind: str, server: PgServer, own_url: str, tmp_path: Path
) -> None:
    place = Place("postgres", tmp_path, own_url)
    try:
        state = place.open()
        state.sessions  # noqa: B018 - opened (the SDK loaded) while the server is up
        KINDS[kind].write(state, 0)  # one delivered before the outage
        server.down()
        for i in (1, 2, 3):
            KINDS[kind].write(state, i)  # returns: kept on this machine
        (spool,) = spooled(tmp_path)
        assert stat.S_IMODE(spool.stat().st_mode) == 0o600
        assert stat.S_IMODE(spool.parent.stat().st_mode) == 0o700
        assert state.settle(0.3) is False  # still away: kept, not delivered
        server.up()
        assert state.settle(30.0) is True
        assert spooled(tmp_path) == []
        assert KINDS[kind].read(place.open()) == KINDS[kind].expect(4)
    finally:
        place.close()


@pytest.mark.parametrize("kind", DURABLE)
def test_postgres_a_read_once_the_database_is_back_sees_this_process_s_kept_writes(
    kind: str, server: PgServer, own_url: str, tmp_path: Path
) -> None:
    """Read-your-writes across an outage: a process that wrote while the database was away
    and reads once it is back (a wake's lineage, the manifest's rows) reads what it wrote,
    without waiting for ``settle``."""
    place = Place("postgres", tmp_path, own_url)
    try:
        state = place.open()
        state.sessions  # noqa: B018
        server.down()
        for i in (0, 1):
            KINDS[kind].write(state, i)
        server.up()
        assert KINDS[kind].read(state) == KINDS[kind].expect(2)
    finally:
        place.close()


def test_postgres_a_wake_while_the_database_is_away_waits_for_it(
    server: PgServer, own_url: str, tmp_path: Path
) -> None:
    """A wake reads which session each step continues: read as "no lineage" it would start
    every step in a new session. It waits for the database instead (one warning)."""
    place = Place("postgres", tmp_path, own_url)
    try:
        state = place.open()
        assert state.lineage().bump() == 1
        state.lineage().remember("a", "sid-1")
        server.down()
        back = threading.Timer(1.5, server.up)
        back.start()
        try:
            lineage = state.lineage()
            assert lineage.bump(["a"]) == 2
            assert lineage.steps == {"a": "sid-1"}
        finally:
            back.join()
        assert place.open().peek_lineage()["woke"] == 2
    finally:
        place.close()


def test_postgres_a_cache_put_while_the_database_is_away_is_a_miss_never_an_error(
    server: PgServer, own_url: str, tmp_path: Path
) -> None:
    """The cache's documented behaviour: it never stops a run, and is no durable record."""
    place = Place("postgres", tmp_path, own_url)
    try:
        state = place.open()
        KINDS["cache"].write(state, 0)
        server.down()
        e = cache_entry(1)
        assert state.cache.put(e.key, e) is False
        assert state.cache.get(cache_entry(0).key, ttl_s=None) is None  # a miss, no raise
        server.up()
        assert state.settle(30.0) is True
        assert KINDS["cache"].read(place.open()) == KINDS["cache"].expect(1)
    finally:
        place.close()


# =============================================================================================
# 3. kill -9 right after each kind of write
# =============================================================================================


class Child:
    """tests/state_writes.py in a process of its own, killed with SIGKILL."""

    def __init__(self, kind: str, place: Place) -> None:
        args = [sys.executable, "-m", "tests.state_writes", kind, place.url or "-"]
        args += [str(place.run_dir), str(place.workspace)]
        self.proc = subprocess.Popen(
            args,
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=os.environ.copy(),
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
        assert self.proc.wait(timeout=10) == -signal.SIGKILL

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream:
                stream.close()


@pytest.fixture
def children() -> Iterator[Callable[[str, Place], Child]]:
    made: list[Child] = []

    def make(kind: str, place: Place) -> Child:
        made.append(Child(kind, place))
        return made[-1]

    yield make
    for child in made:
        child.close()


@pytest.mark.parametrize("kind", list(KINDS))
def test_kill_9_right_after_a_write_keeps_exactly_that_write(
    kind: str, place: Place, children: Callable[[str, Place], Child]
) -> None:
    child = children(kind, place)
    assert child.ask("write 0 2") == "written 2"
    child.kill()
    assert KINDS[kind].read(place.open()) == KINDS[kind].expect(2)


@pytest.mark.parametrize("kind", DURABLE)
def test_kill_9_right_after_a_write_while_the_database_is_away_delivers_it(
    kind: str,
    server: PgServer,
    own_url: str,
    tmp_path: Path,
    children: Callable[[str, Place], Child],
) -> None:
    place = Place("postgres", tmp_path, own_url)
    try:
        child = children(kind, place)
        assert child.ask("write 0 1") == "written 1"  # one delivered before the outage
        server.down()
        assert child.ask("write 1 3") == "written 3"  # kept in its spool
        child.kill()
        assert len(spooled(tmp_path)) == 1  # the dead process's, on this machine
        server.up()
        state = place.open()  # the next flower that connects delivers it
        assert state.settle(30.0) is True
        assert spooled(tmp_path) == []
        assert KINDS[kind].read(place.open()) == KINDS[kind].expect(3)
    finally:
        place.close()
