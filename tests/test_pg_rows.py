"""The PostgreSQL row stores behind the seam (lineage, manifest, registry, cache, events)
against a real database, and the ``--state``/``FLOWER_STATE`` URL parser."""

from __future__ import annotations

import importlib
import re
import string
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flower.i18n import keys, texts
from flower.state.postgres import PostgresState, StateURLError, mask, parse_state_url
from flower.state.seam import LineageDoc, RunState


@pytest.fixture
def state(pg_dsn: str) -> Iterator[PostgresState]:
    s = PostgresState(pg_dsn)
    yield s
    s.close()


def test_it_is_a_run_state(state: PostgresState, pg_dsn: str) -> None:
    assert state.kind == "postgres"
    assert state.where == pg_dsn  # no password to mask here
    seam: RunState = state  # the protocol, checked by mypy
    assert seam.sessions is state.sessions
    assert state.ledger is state.ledger
    with_password = PostgresState(pg_dsn.replace("postgres@", "postgres:hunter2@"))  # trust
    try:
        assert with_password.where == pg_dsn.replace("postgres@", "postgres:***@")
        assert "hunter2" not in repr(with_password)
    finally:
        with_password.close()


# ---- lineage -------------------------------------------------------------------------------


def test_lineage_update_read_and_archive(state: PostgresState) -> None:
    assert state.lineage.read("ws1") is None
    with state.lineage.update("ws1") as box:
        assert box == [None]
        box[0] = LineageDoc("/a/ws", 1, {"取词": "s1"})
    with state.lineage.update("ws1") as box:
        doc = box[0]
        assert doc == LineageDoc("/a/ws", 1, {"取词": "s1"})
        box[0] = LineageDoc(doc.workspace, 2, {**doc.steps, "干活": "s2"})
    with state.lineage.update("ws2") as box:
        box[0] = None  # nothing is written
    assert state.lineage.read("ws2") is None
    assert state.lineage.read("ws1") == LineageDoc("/a/ws", 2, {"取词": "s1", "干活": "s2"})
    assert state.lineage.archive("ws1", Path("archive/20260101-000000"))
    assert state.lineage.read("ws1") is None
    assert not state.lineage.archive("ws1", Path("archive/20260101-000001"))


def test_concurrent_lineage_updates_never_lose_each_other(pg_dsn: str) -> None:
    """Two processes' flowers (two connections here) merge their steps under the lock."""
    states = [PostgresState(pg_dsn), PostgresState(f"{pg_dsn}?application_name=other")]
    errors: list[BaseException] = []

    def add(state: PostgresState, who: str) -> None:
        try:
            for n in range(20):
                with state.lineage.update("ws") as box:
                    doc = box[0] or LineageDoc("/ws", 0, {})
                    box[0] = LineageDoc(doc.workspace, doc.woke, {**doc.steps, f"{who}{n}": "s"})
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=add, args=(s, w)) for s, w in zip(states, "ab", strict=True)]
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=50)
        assert errors == []
        doc = states[0].lineage.read("ws")
        assert doc is not None and len(doc.steps) == 40
    finally:
        for s in states:
            s.close()


# ---- manifest, registry ---------------------------------------------------------------------


def test_manifest_rows_in_the_order_written_per_workspace(state: PostgresState) -> None:
    state.manifest.append("ws1", {"step": "a", "run": "r1", "text": "nul \u0000 kept"})
    state.manifest.append("ws2", {"step": "b", "run": "r2"})
    state.manifest.append("ws1", {"step": "c", "run": "r1"})
    assert [r["step"] for r in state.manifest.rows("ws1")] == ["a", "c"]
    assert [r["step"] for r in state.manifest.rows()] == ["a", "b", "c"]
    assert state.manifest.rows("ws1")[0]["text"] == "nul \u0000 kept"


def test_registry_records_hosts_and_heartbeats(state: PostgresState) -> None:
    record = {"run": "r1", "workspace_id": "ws1", "started_at": 2.0, "pid": 7, "state": "running"}
    with state.registry.locked("ws1"):
        assert state.registry.records("ws1") == []
        state.registry.write(record)
    state.registry.write({"run": "r0", "workspace": "/other", "started_at": 1.0})
    got = state.registry.get("r1")
    assert got is not None and got["pid"] == 7 and got["host"] and got["heartbeat_at"] > 0
    before = got["heartbeat_at"]
    time.sleep(0.01)
    state.registry.heartbeat("r1")
    after = state.registry.get("r1")
    assert after is not None and after["heartbeat_at"] > before
    assert [r["run"] for r in state.registry.records()] == ["r0", "r1"]  # oldest start first
    assert [r["run"] for r in state.registry.records("ws1")] == ["r1"]
    assert [r["run"] for r in state.registry.records("/other")] == ["r0"]
    state.registry.remove("r1")
    assert state.registry.get("r1") is None


def test_registry_locked_makes_check_then_register_one_step(pg_dsn: str) -> None:
    """Two starts in one workspace at once: the second sees the first's record."""
    states = [PostgresState(pg_dsn), PostgresState(f"{pg_dsn}?application_name=other")]
    seen: dict[str, int] = {}
    inside = threading.Event()

    def start(state: PostgresState, run: str) -> None:
        with state.registry.locked("ws"):
            seen[run] = len(state.registry.records("ws"))
            inside.set()
            time.sleep(0.2)  # a slow check: the other start must wait, not interleave
            state.registry.write({"run": run, "workspace_id": "ws", "started_at": time.time()})

    first = threading.Thread(target=start, args=(states[0], "r1"))
    try:
        first.start()
        assert inside.wait(10)
        start(states[1], "r2")
        first.join(timeout=10)
        assert seen == {"r1": 0, "r2": 1}
    finally:
        for s in states:
            s.close()


# ---- cache, events --------------------------------------------------------------------------


def test_cache_get_put_evict(state: PostgresState) -> None:
    for n in range(5):
        state.cache.put(f"k{n}", {"created_at": 100.0 + n, "result": {"text": f"t{n}"}})
    state.cache.put("k4", {"created_at": 104.0, "result": {"text": "again"}})
    assert len(state.cache) == 5
    assert state.cache.get("k4") == {"created_at": 104.0, "result": {"text": "again"}}
    assert state.cache.get("nope") is None
    assert state.cache.evict(max_entries=3, max_age_s=3.5, now=104.0) == 2  # k0 too old, k1
    assert sorted(k for k in ("k0", "k1", "k2", "k3", "k4") if state.cache.get(k)) == [
        "k2",
        "k3",
        "k4",
    ]
    assert state.cache.evict(max_entries=1, max_age_s=1e9, now=104.0) == 2
    assert len(state.cache) == 1 and state.cache.get("k4") is not None


def test_the_last_run_s_report_is_no_entry_the_cache_evicts_or_counts(state: PostgresState) -> None:
    """``last/<workspace>`` (what the last run reused: flower.cache.store writes it without a
    created_at) outlives every eviction and is not counted as an entry."""
    state.cache.put("last/ws1", {"reused": ["a"]})
    state.cache.put("k0", {"created_at": 100.0, "result": {"text": "t"}})
    assert len(state.cache) == 1
    assert state.cache.evict(max_entries=0, max_age_s=1.0, now=1e9) == 1
    assert state.cache.get("last/ws1") == {"reused": ["a"]} and len(state.cache) == 0


def test_events_append_read_and_wait(pg_dsn: str) -> None:
    reader, writer = PostgresState(pg_dsn), PostgresState(f"{pg_dsn}?application_name=w")
    try:
        writer.events.append("r1", {"kind": "text", "text": "one"})
        writer.events.append("r2", {"kind": "text", "text": "other run"})
        ((pos, event),) = reader.events.read("r1")
        assert event == {"kind": "text", "text": "one"}
        assert reader.events.wait("r1", 0, timeout=5)  # one is there already
        started = time.monotonic()
        assert not reader.events.wait("r1", pos, timeout=0.3)
        assert time.monotonic() - started >= 0.3

        later = threading.Timer(0.3, writer.events.append, ("r1", {"kind": "text", "text": "2"}))
        later.start()
        try:
            started = time.monotonic()
            assert reader.events.wait("r1", pos, timeout=20)
            assert time.monotonic() - started < 10  # woken by the notification, not a timeout
        finally:
            later.join()
        assert [e["text"] for _, e in reader.events.read("r1", pos)] == ["2"]
    finally:
        reader.close()
        writer.close()


# ---- the URL ---------------------------------------------------------------------------------


def test_state_urls() -> None:
    url = parse_state_url("postgres://bob:pw%40x@db.example:6543/flows?sslmode=require")
    assert url.url == "postgresql://bob:pw%40x@db.example:6543/flows?sslmode=require"
    assert url.schema == "flower"
    assert url.masked() == "postgresql://bob:***@db.example:6543/flows?sslmode=require"
    team = parse_state_url("postgresql://h/db?schema=team_a&application_name=x")
    assert (team.url, team.schema) == ("postgresql://h/db?application_name=x", "team_a")
    assert team.masked() == "postgresql://h/db?application_name=x&schema=team_a"
    assert parse_state_url("postgresql://h/db", schema="s2").schema == "s2"
    assert mask("postgresql://h/db?password=hunter2&x=1") == "postgresql://h/db?password=***&x=1"
    # the spool's directory is the database's, whoever connects to it
    same = {
        parse_state_url(u).database_key for u in ("postgresql://a:1@H:5/d", "postgres://b@h:5/d")
    }
    assert len(same) == 1
    assert parse_state_url("postgresql://h/d?schema=x").database_key not in same


@pytest.mark.parametrize(
    "bad",
    [
        "mysql://root:hunter2@db/flower",
        "/var/lib/flower/state.db",
        "postgresql://root:hunter2@db:port/flower",
        "postgresql://root:hunter2@db/flower?schema=Bad-Name",
        "",
    ],
)
def test_a_bad_state_url_is_one_line_with_a_hint(bad: str) -> None:
    with pytest.raises(StateURLError) as caught:
        parse_state_url(bad)
    line = caught.value.one_line()
    assert "\n" not in line and caught.value.hint and "hunter2" not in line
    assert isinstance(caught.value, ValueError)  # a ConfigError: a person's mistake


def test_the_backend_s_texts_have_both_languages_and_the_same_fields() -> None:
    for name in ("db", "fenced", "schema", "url"):
        importlib.import_module(f"flower.state.postgres.{name}")
    importlib.import_module("flower.services.postgres")
    mine = [k for k in keys() if k.startswith(("state.", "pg."))]
    assert len(mine) >= 25

    def fields(text: str) -> set[str]:
        return {name for _, name, _, _ in string.Formatter().parse(text) if name}

    for key in mine:
        zh, en = texts(key)
        assert re.search(r"[\u4e00-\u9fff]", zh) and not re.search(r"[\u4e00-\u9fff]", en), key
        assert fields(zh) == fields(en), key
