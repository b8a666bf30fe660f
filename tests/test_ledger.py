"""The tool ledger: rows written by its hooks, results supplied at load (pure, and on both
backends: SQLite's sessions.db and PostgreSQL).

The end-to-end proof (kill -9 right after a Bash call, through flower-super) is in
tests/test_e2e_ledger.py; here each rule is checked on transcripts shaped like the CLI's.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import stat
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from flower.state.ledger import (
    MAX_CONTENT_CHARS,
    NOT_FINISHED_TEXT,
    Call,
    capped,
    fill,
    render,
)
from flower.state.prune import PruningSessionStore, is_interrupted
from flower.state.records import LedgerRow
from flower.state.sqlite import SessionStoreBusy, SqliteLedgerRows, SqliteSessionStore
from tests.backends import Backend

pytestmark = pytest.mark.timeout(30)

SID = "0b9e1c5a-1111-4222-8333-944445555666"
PK = "-tmp-ws"


def prompt(uuid: str) -> dict[str, Any]:
    return {
        "type": "user",
        "uuid": uuid,
        "parentUuid": None,
        "sessionId": SID,
        "message": {"role": "user", "content": "go"},
    }


def use(uuid: str, parent: str, *ids: str, msg_id: str = "msg_1") -> dict[str, Any]:
    return {
        "type": "assistant",
        "uuid": uuid,
        "parentUuid": parent,
        "sessionId": SID,
        "cwd": "/tmp/ws",
        "version": "2.1.332",
        "isSidechain": False,
        "message": {
            "id": msg_id,
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": i, "name": "Bash", "input": {"command": "ls"}}
                for i in ids
            ],
        },
    }


def result(uuid: str, parent: str, tid: str, text: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": "user",
        "uuid": uuid,
        "parentUuid": parent,
        "sessionId": SID,
        "message": {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": tid, "content": text}],
        },
        **extra,
    }


def done(tid: str, content: Any = "OUTPUT-42", state: str = "done") -> Call:
    return Call(tid, SID, "Bash", state, content, False, {"stdout": "OUTPUT-42"}, 1.7e9)


class calls_of:
    """A fake ledger holding ``rows``."""

    def __init__(self, *rows: Call) -> None:
        self.table = {c.tool_use_id: c for c in rows}
        self.asked: list[list[str]] = []

    def calls(self, ids):
        self.asked.append(sorted(ids))
        return {i: self.table[i] for i in ids if i in self.table}

    def in_session(self, session_id, since):
        rows = [c for c in self.table.values() if c.session_id == session_id]
        return [c for c in rows if c.started_at >= since and c.agent_id is None]


def chain(entries: list[dict[str, Any]]) -> list[str]:
    """The uuids from the leaf back to the root, as the CLI walks them."""
    by = {e["uuid"]: e for e in entries if e.get("uuid")}
    leaf = [e for e in entries if e.get("uuid")][-1]
    out, cur = [], leaf
    while cur is not None:
        out.append(cur["uuid"])
        cur = by.get(cur.get("parentUuid"))
    return out[::-1]


def test_a_result_the_transcript_lacks_is_supplied_as_the_entry_the_cli_would_write() -> None:
    entries = [prompt("p"), use("a", "p", "t1"), {"type": "last-prompt"}]
    assert fill(entries, calls_of(done("t1")), is_interrupted) == 1
    made = entries[2]
    assert made["type"] == "user" and made["parentUuid"] == "a"
    assert made["sourceToolAssistantUUID"] == "a"
    assert made["sessionId"] == SID and made["cwd"] == "/tmp/ws" and made["version"] == "2.1.332"
    block = made["message"]["content"][0]
    assert block == {
        "tool_use_id": "t1",
        "type": "tool_result",
        "content": "OUTPUT-42",
        "is_error": False,
    }
    assert made["toolUseResult"] == {"stdout": "OUTPUT-42"}
    assert chain(entries) == ["p", "a", made["uuid"]]
    again = [prompt("p"), use("a", "p", "t1")]
    fill(again, calls_of(done("t1")), is_interrupted)
    assert again[2]["uuid"] == made["uuid"], "the same uuid on every load"


def test_a_call_that_started_and_never_finished_is_told_so_neutrally() -> None:
    entries = [prompt("p"), use("a", "p", "t1")]
    fill(entries, calls_of(done("t1", content=None, state="started")), is_interrupted)
    block = entries[2]["message"]["content"][0]
    assert block["content"] == NOT_FINISHED_TEXT and block["is_error"] is True
    assert "效果未知" in NOT_FINISHED_TEXT and "检查" in NOT_FINISHED_TEXT


def test_the_clis_interrupted_filler_gives_way_to_the_recorded_result() -> None:
    filler = "[Tool call interrupted: the session ended before this call's result was recorded]"
    entries = [
        prompt("p"),
        use("a", "p", "t1"),
        result("r", "a", "t1", filler, toolDenialKind="interrupted", toolUseResult=filler),
    ]
    assert fill(entries, calls_of(done("t1")), is_interrupted) == 1
    r = entries[2]
    assert r["uuid"] == "r" and r["parentUuid"] == "a"
    assert "toolDenialKind" not in r
    assert r["message"]["content"][0]["content"] == "OUTPUT-42"


def test_without_a_ledger_row_nothing_changes_and_complete_transcripts_are_not_queried() -> None:
    entries = [prompt("p"), use("a", "p", "t1")]
    before = json.dumps(entries)
    assert fill(entries, calls_of(), is_interrupted) == 0
    assert json.dumps(entries) == before
    complete = [prompt("p"), use("a", "p", "t1"), result("r", "a", "t1", "x")]
    ledger = calls_of(done("t1"))
    assert fill(complete, ledger, is_interrupted) == 0
    assert ledger.asked == []


def test_parallel_calls_get_one_result_each_in_one_chain() -> None:
    # The CLI writes one assistant entry per tool_use block of a response.
    entries = [
        prompt("p"),
        use("a1", "p", "t1"),
        use("a2", "a1", "t2"),
        {"type": "attachment", "uuid": "x", "parentUuid": "a2"},
    ]
    assert fill(entries, calls_of(done("t1"), done("t2", content="SECOND")), is_interrupted) == 2
    kinds = [e["type"] for e in entries]
    assert kinds == ["user", "assistant", "assistant", "user", "user", "attachment"]
    assert [e["message"]["content"][0]["tool_use_id"] for e in entries[3:5]] == ["t1", "t2"]
    assert chain(entries) == ["p", "a1", "a2", entries[3]["uuid"], entries[4]["uuid"], "x"]


def test_render_shows_a_bash_and_a_read_result_as_the_cli_does() -> None:
    assert render({"stdout": "out\n", "stderr": "err", "interrupted": False}) == "out\nerr"
    read = {"type": "text", "file": {"content": "a\nb", "startLine": 3}}
    assert render(read) == "3\ta\n4\tb"
    assert render("plain") == "plain"
    assert json.loads(render({"k": 1})) == {"k": 1}


def test_what_is_stored_is_capped_and_says_so() -> None:
    big = "x" * (MAX_CONTENT_CHARS + 10)
    cut = capped(big)
    assert cut.startswith("x" * MAX_CONTENT_CHARS) and "工具账本" in cut
    small = {"type": "image", "source": {"data": "AAAA"}}
    assert capped([{"type": "text", "text": "x"}, small]) == [{"type": "text", "text": "x"}, small]
    blocks = capped([{"type": "text", "text": big}, small])
    assert "工具账本" in blocks[0]["text"] and blocks[1]["type"] == "text", "past the cap"
    huge = {"type": "image", "source": {"data": "A" * (MAX_CONTENT_CHARS + 1)}}
    (note,) = capped([huge])
    assert note["type"] == "text" and "image" in note["text"]
    binary = "\x01" * (MAX_CONTENT_CHARS // 2)  # 6 characters each in JSON
    assert capped(binary) == binary
    assert capped(None) == "" and isinstance(capped({"a": 1}), str)


def test_a_recorded_result_is_always_something_a_tool_result_can_hold() -> None:
    odd = Call("t1", SID, "Bash", "done", {"cut": "x"}, False, None, 1.0)
    entries = [prompt("p"), use("a", "p", "t1")]
    fill(entries, calls_of(odd), is_interrupted)
    assert entries[-1]["message"]["content"][0]["content"] == NOT_FINISHED_TEXT


# -- on a real store ----------------------------------------------------------------------


def _store(tmp_path: Path) -> PruningSessionStore:
    return PruningSessionStore(tmp_path / "sessions.db", workspace=tmp_path / "ws")


def _sent(store: PruningSessionStore, tid: str, response: dict[str, Any]) -> None:
    """An attempt's call of Bash through the ledger's hooks: PreToolUse, then PostToolUse."""
    hooks = store.ledger.hooks()
    pre, post = hooks["PreToolUse"][0].hooks[0], hooks["PostToolUse"][0].hooks[0]

    async def go() -> None:
        assert await pre(_hook_input("PreToolUse", tid), tid, None) == {}
        out = await post(_hook_input("PostToolUse", tid, tool_response=response), tid, None)
        assert out == {}

    asyncio.run(go())


def _hook_input(event: str, tid: str, **more: Any) -> dict[str, Any]:
    return {
        "hook_event_name": event,
        "session_id": SID,
        "tool_name": "Bash",
        "tool_input": {"command": "echo OUTPUT-42"},
        "tool_use_id": tid,
        **more,
    }


def test_the_hooks_write_rows_that_a_resumed_load_uses(backend: Backend) -> None:
    store = backend.pruning()
    key = {"project_key": PK, "session_id": SID}
    asyncio.run(store.append(key, [prompt("p"), use("a", "p", "t1")]))  # the tool_use is durable
    _sent(store, "t1", {"stdout": "OUTPUT-42\n", "stderr": ""})
    loaded = asyncio.run(store.load(key))
    assert loaded is not None and len(loaded) == 3
    assert loaded[2]["message"]["content"][0]["content"] == "OUTPUT-42"
    store.ledger.seen("t1", [{"type": "text", "text": "OUTPUT-42 exactly"}], False)
    loaded = asyncio.run(store.load(key))
    assert loaded is not None
    assert loaded[2]["message"]["content"][0]["content"] == [
        {"type": "text", "text": "OUTPUT-42 exactly"}
    ]
    raw = store.load_sync(key)
    assert raw is not None and len(raw) == 2, "the transcript tables are never written"
    if backend.kind == "sqlite":
        assert stat.S_IMODE(os.stat(backend.tmp_path / "runs" / "sessions.db").st_mode) == 0o600


def test_an_attempt_killed_after_a_call_finds_its_result_on_resume(backend: Backend) -> None:
    """The ledger's promise on each backend: the attempt that ran the call is gone (killed
    before the CLI wrote the result); the next attempt, with stores of its own, loads the
    session with the call answered by what really came out, not "interrupted"."""
    key = {"project_key": PK, "session_id": SID}
    killed = backend.pruning()
    killed.begin_attempt()
    killed.claim(SID)
    asyncio.run(killed.append(key, [prompt("p"), use("a", "p", "t1")]))
    _sent(killed, "t1", {"stdout": "OUTPUT-42\n", "stderr": ""})
    killed.close()
    resumed = backend.pruning()  # the same data, opened again
    resumed.begin_attempt()
    resumed.claim(SID)
    loaded = asyncio.run(resumed.load(key)) or []
    assert [e["type"] for e in loaded] == ["user", "assistant", "user"]
    block = loaded[2]["message"]["content"][0]
    assert block == {
        "tool_use_id": "t1",
        "type": "tool_result",
        "content": "OUTPUT-42",
        "is_error": False,
    }
    assert loaded[2]["parentUuid"] == "a" and resumed.last_report["ledger"] == 1
    assert len(resumed.load_sync(key) or []) == 2  # supplied at load, never written


def test_a_failed_call_is_recorded_as_an_error_and_an_interrupted_one_is_not_used(
    backend: Backend,
) -> None:
    store = backend.pruning()
    post = store.ledger.hooks()["PostToolUseFailure"][0].hooks[0]

    async def go() -> None:
        await post(_hook_input("PostToolUseFailure", "f1", error="Exit code 2\nboom"), "f1", None)
        await post(
            _hook_input("PostToolUseFailure", "f2", error="stop", is_interrupt=True), "f2", None
        )

    asyncio.run(go())
    rows = store.ledger.calls(["f1", "f2"])
    assert rows["f1"].state == "failed" and rows["f1"].is_error
    assert rows["f1"].content == "Exit code 2\nboom"
    entries = [prompt("p"), use("a", "p", "f2")]
    fill(entries, store.ledger, is_interrupted)
    assert entries[-1]["message"]["content"][0]["content"] == NOT_FINISHED_TEXT


def test_a_ledger_that_cannot_be_written_warns_once_and_never_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOWER_LANG", "en")  # the English texts are asserted
    store = _store(tmp_path)
    store.ledger.rows = None  # type: ignore[assignment]  # every write now fails
    post = store.ledger.hooks()["PostToolUse"][0].hooks[0]

    async def go() -> None:
        for tid in ("a", "b"):
            assert await post(_hook_input("PostToolUse", tid, tool_response="x"), tid, None) == {}

    with caplog.at_level("WARNING", logger="flower"):
        asyncio.run(go())
    assert len([r for r in caplog.records if "ledger" in r.getMessage()]) == 1


def test_a_new_sessions_first_call_waits_until_its_session_is_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step child's ledger is told when the supervisor has the session on record: until
    then the session's first call does not start (a kill would leave nothing to resume it
    by); later calls never wait; a record that never comes costs KEPT_WAIT_S, said once."""
    monkeypatch.setenv("FLOWER_LANG", "en")  # the English texts are asserted
    store = _store(tmp_path)
    pre = store.ledger.hooks()["PreToolUse"][0].hooks[0]
    released = asyncio.Event()
    asked: list[str] = []

    async def kept(sid: str) -> None:
        asked.append(sid)
        await released.wait()

    store.ledger.kept = kept

    async def go() -> None:
        await store.append({"project_key": PK, "session_id": SID}, [prompt("p")])
        first = asyncio.create_task(pre(_hook_input("PreToolUse", "t1"), "t1", None))
        for _ in range(50):  # the store part is met at once; the record is not
            await asyncio.sleep(0.002)
        assert not first.done() and store.ledger.calls(["t1"]) == {}
        released.set()
        assert await asyncio.wait_for(first, 5) == {}
        assert store.ledger.calls(["t1"])["t1"].state == "started"
        released.clear()  # the session's later calls do not wait
        await asyncio.wait_for(pre(_hook_input("PreToolUse", "t2"), "t2", None), 5)

    asyncio.run(go())
    assert asked == [SID]

    monkeypatch.setattr("flower.state.ledger.KEPT_WAIT_S", 0.05)
    other = _store(tmp_path / "other")

    async def never(sid: str) -> None:
        await asyncio.Event().wait()

    other.ledger.kept = never  # the call goes on, with one warning
    pre = other.ledger.hooks()["PreToolUse"][0].hooks[0]

    async def late() -> None:
        await other.append({"project_key": PK, "session_id": SID}, [prompt("p")])
        await asyncio.wait_for(pre(_hook_input("PreToolUse", "t3"), "t3", None), 5)

    with caplog.at_level("WARNING", logger="flower"):
        asyncio.run(late())
    assert other.ledger.calls(["t3"])["t3"].state == "started"
    assert [r.getMessage() for r in caplog.records] == [
        f"session {SID} was not recorded for resuming in time;"
        " a kill before the CLI records the call may repeat it"
    ]
    store.close()
    other.close()


def lost_call(tid: str, parts: list[dict[str, Any]], *, started: float) -> Call:
    return Call(
        tid,
        SID,
        "Bash",
        "done",
        "OUTPUT-42",
        False,
        {"stdout": "OUTPUT-42"},
        started,
        started,
        None,
        parts,
    )


def test_a_call_whose_tool_use_never_reached_the_transcript_is_restored_whole() -> None:
    leaf = {**prompt("p"), "timestamp": "2026-12-01T10:00:00.000Z", "cwd": "/tmp/ws"}
    when = datetime(2026, 12, 1, 10, 0, 1, tzinfo=UTC).timestamp()
    parts = [
        {"uuid": "u-text", "id": "msg_9", "model": "m", "block": {"type": "text", "text": "看看"}},
        {
            "uuid": "u-use",
            "id": "msg_9",
            "model": "m",
            "block": {"type": "tool_use", "id": "t7", "name": "Bash", "input": {"command": "ls"}},
        },
    ]
    old = lost_call("t0", parts[:1], started=when - 3600)  # before the leaf: not this turn's
    entries = [leaf, {"type": "last-prompt"}]
    assert fill(entries, calls_of(lost_call("t7", parts, started=when), old), is_interrupted) == 1
    made = [e for e in entries if e.get("uuid")][1:]
    assert [e["type"] for e in made] == ["assistant", "assistant", "user"]
    assert [e["uuid"] for e in made[:2]] == ["u-text", "u-use"], "the CLI's own uuids"
    assert made[1]["message"]["content"][0]["id"] == "t7"
    result = made[2]["message"]["content"][0]
    assert result["tool_use_id"] == "t7" and result["content"] == "OUTPUT-42"
    assert made[2]["sourceToolAssistantUUID"] == "u-use"
    assert chain(entries) == ["p", "u-text", "u-use", made[2]["uuid"]]
    present = [prompt("p"), use("a", "p", "t7")]  # the CLI did write it: nothing restored
    fill(present, calls_of(lost_call("t7", parts, started=when)), is_interrupted)
    assert [e["type"] for e in present] == ["user", "assistant", "user"]


def test_the_ledger_keeps_the_message_that_asked_for_a_call(backend: Backend) -> None:
    from claude_agent_sdk import AssistantMessage, TextBlock, ToolUseBlock

    store = backend.pruning()
    # the session is in the store already: the call does not wait for it (SESSION_WAIT_S)
    asyncio.run(store.append({"project_key": PK, "session_id": SID}, [prompt("p")]))
    text = AssistantMessage([TextBlock("先看")], "m", message_id="msg_1", uuid="u1")
    call = AssistantMessage(
        [ToolUseBlock("t5", "Bash", {"command": "ls"})], "m", message_id="msg_1", uuid="u2"
    )
    store.ledger.saw(text)
    store.ledger.saw(call)
    pre = store.ledger.hooks()["PreToolUse"][0].hooks[0]
    asyncio.run(pre(_hook_input("PreToolUse", "t5"), "t5", None))
    (row,) = store.ledger.in_session(SID, 0)
    assert [p["uuid"] for p in row.message] == ["u1", "u2"]
    assert row.message[1]["block"] == {
        "type": "tool_use",
        "id": "t5",
        "name": "Bash",
        "input": {"command": "ls"},
    }


def part(uuid_: str, msg: str, block: dict[str, Any]) -> dict[str, Any]:
    return {"uuid": uuid_, "id": msg, "model": "m", "block": block}


def bash_use(tid: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": tid, "name": "Bash", "input": {"command": "ls"}}


LEAF_AT = datetime(2026, 12, 1, 10, 0, 0, tzinfo=UTC).timestamp()


def leaf_entry() -> dict[str, Any]:
    return {**prompt("p"), "timestamp": "2026-12-01T10:00:00.000Z"}


def test_a_restored_call_is_restored_again_where_the_cli_went_on_from_it() -> None:
    lost = lost_call("t7", [part("u-use", "m1", bash_use("t7"))], started=LEAF_AT + 1)
    first = [leaf_entry()]
    fill(first, calls_of(lost), is_interrupted)
    tail = first[-1]["uuid"]
    # The CLI resumed on top of the restored entries (which it never writes back) and went
    # on: its next entries hang off the restored result.
    later = [
        leaf_entry(),
        {
            "type": "assistant",
            "uuid": "n1",
            "parentUuid": tail,
            "sessionId": SID,
            "timestamp": "2026-12-01T10:05:00.000Z",
            "message": {
                "id": "m2",
                "role": "assistant",
                "content": [{"type": "text", "text": "ok"}],
            },
        },
    ]
    fill(later, calls_of(lost), is_interrupted)
    assert chain(later) == ["p", "u-use", tail, "n1"], "the history before n1 was cut off"


def test_lost_calls_of_two_responses_come_back_each_with_its_result_first() -> None:
    c1 = lost_call("t1", [part("a1", "m1", bash_use("t1"))], started=LEAF_AT + 1)
    c2 = lost_call("t2", [part("a2", "m2", bash_use("t2"))], started=LEAF_AT + 2)
    entries = [leaf_entry()]
    assert fill(entries, calls_of(c1, c2), is_interrupted) == 2
    kinds = [
        (
            e["type"],
            e["message"]["content"][0].get("id") or e["message"]["content"][0].get("tool_use_id"),
        )
        for e in entries[1:]
    ]
    assert kinds == [("assistant", "t1"), ("user", "t1"), ("assistant", "t2"), ("user", "t2")]
    assert chain(entries)[1:] == [e["uuid"] for e in entries[1:]]


def test_a_sibling_call_in_a_restored_message_gets_its_own_recorded_result() -> None:
    parts = [part("a1", "m1", bash_use("t1")), part("a2", "m1", bash_use("t2"))]
    with_msg = lost_call("t2", parts, started=LEAF_AT + 1)
    no_msg = Call("t1", SID, "Bash", "done", "FIRST", False, None, LEAF_AT + 1, LEAF_AT + 1)
    entries = [leaf_entry()]
    assert fill(entries, calls_of(with_msg, no_msg), is_interrupted) == 2
    results = {
        e["message"]["content"][0]["tool_use_id"]: e["message"]["content"][0]["content"]
        for e in entries
        if e["type"] == "user" and isinstance(e["message"]["content"], list)
    }
    assert results == {"t1": "FIRST", "t2": "OUTPUT-42"}


# -- the rows, as the seam's LedgerRows promises them on each backend -----------------------


def test_the_ledger_rows_keep_a_call_as_the_seam_says(backend: Backend) -> None:
    _, rows = backend.open()
    asked = LedgerRow("t1", SID, None, "Bash", '{"command":"ls"}', "started", 10.0, '["m"]')
    asyncio.run(rows.started(asked))
    asyncio.run(rows.started(replace(asked, name="Other", started_at=99.0)))  # left as it is
    rows.exact("t1", '"too early"', True)  # a call that has not finished keeps no content
    assert rows.by_ids(["t1"]) == [asked]
    done = replace(
        asked,
        state="done",
        started_at=20.0,  # the hook's clock: the started row's time stays
        message=None,
        response='{"stdout":"x"}',
        content='"x"',
        ended_at=21.0,
    )
    asyncio.run(rows.finished(done))
    finished = replace(done, started_at=10.0, message='["m"]')
    assert rows.by_ids(["t1", "t1", "nope"]) == [finished]
    rows.exact("t1", '"x exactly"', False)
    assert rows.by_ids(["t1"]) == [replace(finished, content='"x exactly"')]
    failed = LedgerRow("t2", SID, None, "Bash", "{}", "failed", 30.0, None, '"boom"', '"boom"')
    asyncio.run(rows.finished(replace(failed, is_error=True, ended_at=30.5)))  # never started
    asyncio.run(rows.started(LedgerRow("t3", SID, "agent-1", "Read", "{}", "started", 40.0)))
    asyncio.run(rows.started(LedgerRow("t4", "other", None, "Read", "{}", "started", 50.0)))
    assert [r.tool_use_id for r in rows.in_session(SID, 0.0)] == ["t1", "t2"]  # main thread
    assert [r.tool_use_id for r in rows.in_session(SID, 25.0)] == ["t2"]
    (row,) = rows.by_ids(["t2"])
    assert row.is_error is True and row.ended_at == 30.5 and rows.by_ids([]) == []


def test_sqlite_ledger_rows_wait_out_a_busy_file_but_exact_tries_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """exact() is called on the loop that answers the CLI's hooks: it must never wait for
    a busy sessions.db (the rendered result stays); started/finished wait like appends."""
    import flower.state.sqlite as sqlite_store

    store = SqliteSessionStore(tmp_path / "sessions.db")
    rows = SqliteLedgerRows(store)
    done = LedgerRow("t1", SID, None, "Bash", "{}", "done", 1.0, None, "{}", '"x"', False, 2.0)
    asyncio.run(rows.finished(done))
    monkeypatch.setattr(sqlite_store, "BUSY_DEADLINE_S", 0.5)
    holder = sqlite3.connect(store.path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):  # not SessionStoreBusy:
            rows.exact("t1", '"exact"', False)  # SQLite's own error, from the one try
        began = time.monotonic()
        with pytest.raises(SessionStoreBusy):
            asyncio.run(rows.finished(replace(done, content='"later"')))
        assert time.monotonic() - began >= 0.5, "finished() gave up before the deadline"
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    rows.exact("t1", '"exact"', False)
    assert rows.by_ids(["t1"]) == [replace(done, content='"exact"')]
    store.close()
