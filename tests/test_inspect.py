"""The pieces behind ``show``, ``logs`` and status's commands, without a flower running:
the event log's file, what ``show`` makes of real CLI transcripts, what an argument names,
following a file that grows, and the commands listed per run."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import sqlite3
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from flower import FlowerError
from flower.i18n import keys, texts
from flower.state.backends import LocalState
from flower.state.eventlog import EventLog, FileEventRows, events_path
from flower.state.manifest import Manifest
from flower.state.registry import FINISHED, RUNNING, FlowerRecord, Registry, process_started
from flower.state.result import Event, StepResult
from flower.step.events import entry_is_synthetic
from supervisor.inspect import logs, show, status
from supervisor.inspect.runstate import Choice, Seen
from tests.transcripts import FIXTURES, fixture

CJK = re.compile(r"[\u2e80-\u9fff\uf900-\ufaff\uff00-\uffef]")


@pytest.fixture
def en(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWER_LANG", "en")


def local(run_dir: Path) -> LocalState:
    """The run state of ``run_dir``'s files, as ``show`` and ``logs`` are given it."""
    return LocalState(run_dir, run_dir.parent)


def seen(run_dir: Path) -> Seen:
    """What ``status`` is given for ``run_dir`` with no ``--state``."""
    return Seen(local(run_dir), Choice("", False), run_dir, run_dir.parent)


# -- the event log ---------------------------------------------------------------------


def test_event_log_appends_one_json_line_per_event_owner_only(tmp_path: Path) -> None:
    seen: list[Event] = []
    log = EventLog.open(tmp_path, "r1")
    on_event = log.tee(seen.append)
    on_event(Event("tool_call", "ls -la", "Bash", {"step": "s", "input": {"x": (1, 2)}}, raw=log))
    on_event(Event("text", "x" * 20_000, payload={"step": "s", "odd": object()}))
    log.close()
    on_event(Event("text", "after close"))  # written nowhere, still handed on

    path = events_path(tmp_path, "r1")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert [ev.text[:6] for ev in seen] == ["ls -la", "xxxxxx", "after "]
    assert len(lines) == 2
    first, second = lines
    assert set(first) == {"t", "kind", "step", "text", "tool", "payload"}
    assert (first["kind"], first["step"], first["tool"]) == ("tool_call", "s", "Bash")
    assert first["payload"]["input"] == {"x": [1, 2]} and abs(first["t"] - time.time()) < 60
    assert len(second["text"]) < 20_000 and second["payload"]["odd"].startswith("<object")

    again = EventLog.open(tmp_path, "r1")  # a second open appends, never truncates
    again.write(Event("step", "s2"))
    again.close()
    assert len(path.read_text(encoding="utf-8").splitlines()) == 3


def test_a_failing_event_log_warns_once_and_the_run_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = EventLog.open(tmp_path, "r1")
    fd = log._sink.fd  # type: ignore[union-attr]
    assert fd is not None
    os.close(fd)  # the descriptor goes bad under it: EBADF on the next write
    seen: list[Event] = []
    on_event = log.tee(seen.append)
    with caplog.at_level(logging.WARNING, logger="flower"):
        for _ in range(3):
            on_event(Event("text", "hello"))
    assert len(seen) == 3 and not log.writing
    assert len(caplog.records) == 1 and str(log.path) in caplog.records[0].getMessage()

    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "logs").write_text("a file where the directory should be")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="flower"):
        blocked = EventLog.open(tmp_path / "other", "r2")
        blocked.write(Event("text", "x"))
    assert not blocked.writing and len(caplog.records) == 1


def test_a_forked_child_does_not_keep_the_log_open(tmp_path: Path) -> None:
    log = EventLog.open(tmp_path, "r1")
    pid = os.fork()
    if pid == 0:  # the child: its inherited copy is closed at once
        os._exit(0 if not log.writing else 1)
    _, code = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(code) == 0 and log.writing
    log.close()


# -- show: real transcripts ------------------------------------------------------------


def rendered(name: str, ledger: dict[str, Any] | None = None, *, live: bool = False) -> str:
    turns = show._paired(show._turns(fixture(name)), ledger or {})
    return "\n".join(show.render_turns(turns, 100, live=live))


def test_show_folds_each_tool_call_and_result_to_one_line(en: None) -> None:
    text = rendered("d-bash-and-read.jsonl")
    assert re.search(r"^user   \[\[fx-d\]\] Look around\.$", text, re.M), text
    assert re.search(r"^       \* Bash  seq 1 700$", text, re.M)
    assert re.search(r"^         -> 1  \(700 lines\)$", text, re.M)
    assert "\n         -> notes.txt\n" in text  # a one-line result: no count
    assert "\n2\n" not in text and len(text.splitlines()) < 20


def test_show_marks_errors_and_puts_parallel_results_under_their_calls(en: None) -> None:
    text = rendered("f-parallel-denials.jsonl").splitlines()
    calls = [i for i, line in enumerate(text) if "* Bash" in line]
    assert len(calls) == 5
    for i in calls:
        assert re.match(r"^ +(->|x) ", text[i + 1]), text  # each result right under its call
    assert text[text.index("       * Bash  echo pushing") + 1].lstrip().startswith("x PreToolUse")


def test_show_api_errors_synthetic_turns_and_images(en: None) -> None:
    refused = rendered("a-refused-then-resumed.jsonl")
    assert "CLI    ! API Error: Connection refused" in refused and "model  !" not in refused
    killed = rendered("b-killed-mid-tool-resumed.jsonl").splitlines()
    call = next(i for i, line in enumerate(killed) if "* Bash  python3" in line)
    assert killed[call + 1] == "         ? no result (the session stopped before it ended)"
    assert killed[call + 2] == (
        "CLI    (a placeholder the CLI wrote for a turn that got no answer; not the model's)"
    )
    assert "-> [image]" in rendered("e-read-png.jsonl")


#: What the CLI writes into a transcript in its own words: never shown as they are.
CLI_WORDS = (
    "No response requested.",
    "[Tool call interrupted",
    "[Request interrupted",
    "Correction to the text above",
    "[Subagent hand-back]",
    "internal metadata",
    "<system-reminder>",
    "<tools-used-before-summary>",
    "<task-notification>",
    "<tool_use_error>",
)


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.jsonl")))
def test_show_never_gives_the_clis_own_words_as_conversation(en: None, name: str) -> None:
    """Every recorded transcript: the CLI's markers and fillers are never printed as they
    are, and what stands under "model" is only what the model wrote."""
    entries = fixture(name)
    text = rendered(name)
    assert not [w for w in CLI_WORDS if w in text], text
    said = [
        str(b.get("text")).strip()
        for e in entries
        if e.get("type") == "assistant" and not entry_is_synthetic(e)
        for b in (e["message"]["content"] if isinstance(e["message"]["content"], list) else [])
        if b.get("type") == "text"
    ]
    turns = show._turns(entries)
    model = [x["text"].strip() for x in turns if x["role"] == "assistant" and x["kind"] == "text"]
    assert model == said
    assert all(x["role"] == "cli" for x in turns if x["kind"] in CLI_KINDS), turns


CLI_KINDS = ("error", "synthetic", "meta", "compact", "cut", "notice", "output")


def test_show_names_what_the_cli_wrote_for_what_it_is(en: None) -> None:
    stopped = rendered("g-sdk-interrupt-resumed.jsonl").splitlines()
    call = next(i for i, line in enumerate(stopped) if "* Bash  python3" in line)
    assert stopped[call + 1 : call + 4] == [
        "         x stopped while it ran (it may have taken effect in part or in full)",
        "CLI    (this turn was interrupted)",
        "       (a placeholder the CLI wrote for a turn that got no answer; not the model's)",
    ]
    helper = rendered("h-subagent.jsonl")
    assert "-> Async agent launched successfully.\n" in helper
    assert "CLI    (system note) tools used before: Bash\n" in helper
    assert '       (background task) Agent "list the files" finished\n' in helper
    assert "CLI    (compaction summary, 11 lines)" in rendered("i-compacted.jsonl")
    denied = rendered("c-denied-tools.jsonl")
    assert "x Error: No such tool available: Write." in denied


def test_a_call_without_its_result_yet_takes_the_ledgers_or_is_pending(en: None) -> None:
    entries = [e for e in fixture("d-bash-and-read.jsonl") if e.get("type") != "user"]
    turns = show._turns(entries)  # every result missing, as while the CLI still works
    ids = [x["id"] for x in turns if x["kind"] == "tool_call"]
    ledger = {ids[0]: {"state": "done", "content": "from the ledger", "is_error": False}}
    text = "\n".join(show.render_turns(show._paired(turns, ledger), 100, live=True))
    assert "-> from the ledger  (result from the tool ledger)" in text
    assert text.count("… still running") == len(ids) - 1
    done = "\n".join(show.render_turns(show._paired(turns, {}), 100, live=False))
    assert "still running" not in done and "? no result" in done


def test_show_cleans_escapes_and_cuts_on_columns() -> None:
    assert show.one_line("a\x1b[2Jb\x1b]0;title\x07c\nsecond", 80) == "abc"
    assert show.one_line("汉字" * 30, 10) == "汉字汉字…"
    assert show.summary({"command": "ls", "description": "list"}) == "ls"
    assert show.summary({"todos": [1]}) == '{"todos": [1]}'


# -- show: what the argument names -----------------------------------------------------


def record(run: str, *, live: bool, step: str | None = None, sid: str | None = None) -> Any:
    pid = os.getpid() if live else 0
    return FlowerRecord(
        run=run,
        flow="two",
        pid=pid,
        pid_started=process_started(pid) if live else None,
        workspace="/w",
        started_at=time.time(),
        state=RUNNING if live else FINISHED,
        step=step,
        session_id=sid,
    )


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """Two runs: an old finished one (first, judged rounds of work) and a live one whose
    `work` is in flight in session s-live."""
    reg = Registry(tmp_path)
    reg.write(record("20260101-000000-aaaaaa", live=False, sid="s-work"))
    time.sleep(0.01)  # records sort by start time
    reg.write(record("20260102-000000-bbbbbb", live=True, step="work", sid="s-live"))
    m = Manifest(tmp_path, "20260101-000000-aaaaaa")
    for label, sid in [("first", "s-first"), ("work", "s-work"), ("work#round2", "s-work")]:
        m.record(StepResult(label, sid, ok=True, num_turns=2, cost_usd=0.5))
    m2 = Manifest(tmp_path, "20260102-000000-bbbbbb")
    m2.record(StepResult("first", "s-first", ok=True))
    m2.record(StepResult("work·判定#1", "s-judge", ok=True))
    (tmp_path / "lineage.json").write_text(
        json.dumps({"workspace": "/w", "woke": 2, "steps": {"first": "s-first"}})
    )
    return tmp_path


def test_what_show_shows_for_each_kind_of_argument(run_dir: Path) -> None:
    def pick(what: str | None) -> list[tuple[str, str]]:
        return [(x.step, x.session_id) for x in show.resolve(local(run_dir), what).targets]

    assert pick(None) == [("work", "s-live")]  # the live run's step in flight
    assert pick("work") == [("work", "s-live")]  # a live flower's step wins
    assert pick("first") == [("first", "s-first")]  # lineage
    assert pick("work#round2") == [("work#round2", "s-work")]  # a manifest label
    assert pick("work·判定#1") == [("work·判定#1", "s-judge")]
    old = show.resolve(local(run_dir), "20260101-000000-aaaaaa")
    assert old.run is not None and old.run.run == "20260101-000000-aaaaaa"
    assert [(x.step, x.session_id) for x in old.targets] == [
        ("first", "s-first"),
        ("work, work#round2", "s-work"),
    ]
    assert pick("20260102") == [
        ("first", "s-first"),
        ("work·判定#1", "s-judge"),
        ("work", "s-live"),
    ]
    target = show.resolve(local(run_dir), "first").targets[0]
    assert [r["run"] for r in target.rows] == ["20260101-000000-aaaaaa", "20260102-000000-bbbbbb"]
    assert show.resolve(local(run_dir), "work").targets[0].live is not None


def test_an_unknown_or_ambiguous_argument_is_a_flower_error(run_dir: Path, en: None) -> None:
    with pytest.raises(FlowerError, match="no run or step 'nosuch'"):
        show.resolve(local(run_dir), "nosuch")
    with pytest.raises(FlowerError, match="names 2 runs"):
        show.resolve(local(run_dir), "2026")
    with pytest.raises(FlowerError, match="nothing has run"):
        show.resolve(local(run_dir / "empty"), None)


def test_show_reads_sessions_db_read_only(run_dir: Path, en: None) -> None:
    from flower.state.sqlite import SqliteSessionStore

    store = SqliteSessionStore(run_dir / "sessions.db")
    entries = fixture("d-bash-and-read.jsonl")
    asyncio.run(store.append({"project_key": "p", "session_id": "s-first"}, entries))
    # s-live: the model's calls are in, their results not yet; the ledger has the first one
    calls = [e for e in entries if e.get("type") == "assistant"]
    asyncio.run(store.append({"project_key": "p", "session_id": "s-live"}, calls))
    store.close()
    tid = next(
        b["id"] for e in calls for b in e["message"]["content"] if b.get("type") == "tool_use"
    )
    with sqlite3.connect(run_dir / "sessions.db") as conn:
        conn.execute(
            "INSERT INTO tool_calls(tool_use_id, session_id, name, input, state, content,"
            " started_at) VALUES (?, 's-live', 'Bash', '{}', 'done', ?, 0)",
            (tid, json.dumps("stdout of the first call")),
        )
    conn.close()
    db = run_dir / "sessions.db"
    before = db.stat().st_mtime_ns
    text = show.render(local(run_dir), show.resolve(local(run_dir), "first"), 100)
    assert text.startswith("== first  · session s-first\n   + first  run 20260101-000000-aaaaaa")
    assert "* Bash  seq 1 700" in text and db.stat().st_mtime_ns == before
    doc = show.document(local(run_dir), show.resolve(local(run_dir), "first"))
    assert json.loads(json.dumps(doc))["turns"][0]["kind"] == "prompt"
    live = show.render(local(run_dir), show.resolve(local(run_dir), "work"), 100)
    assert "running now: run 20260102-000000-bbbbbb" in live
    assert "-> stdout of the first call  (result from the tool ledger)" in live
    assert live.count("… still running") == 4, live


# -- logs ------------------------------------------------------------------------------


def test_a_run_dirs_events_read_as_rows_give_whole_lines_as_they_come(tmp_path: Path) -> None:
    rows = FileEventRows(tmp_path)
    assert rows.read("r") == [] and rows.wait("r", 0, 0.0) is False  # no file yet
    path = events_path(tmp_path, "r")
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{"a":1}\n{"b":')  # the second line is still being written
    first = rows.read("r")
    assert [ev for _, ev in first] == [{"a": 1}]
    after = first[-1][0]
    assert rows.wait("r", after, 0.0) is False  # half a line: nothing to read yet
    assert rows.read("r", after) == []
    with open(path, "ab") as f:
        f.write(b"2}\nnot json\n\n[1]\n")
    assert rows.wait("r", after, 0.0) is True
    rest = rows.read("r", after)
    assert [ev for _, ev in rest] == [{"b": 2}, {"unreadable": "not json"}, {"unreadable": "[1]"}]
    assert rest[-1][0] == path.stat().st_size and rows.read("r", rest[-1][0]) == []
    rows.append("r", {"c": 3})
    assert [ev for _, ev in rows.read("r", rest[-1][0])] == [{"c": 3}]
    with open(path, "ab") as f:  # a damaged line with a bare CR in it is still one line
        f.write(b"bro\rken\n")
    assert [ev for _, ev in rows.read("r", path.stat().st_size - 8)] == [{"unreadable": "bro\rken"}]


def test_an_event_is_one_clean_line_and_the_date_shows_when_it_changes(en: None) -> None:
    lines = logs.Lines(width=None).event
    day = time.mktime((2026, 1, 2, 10, 0, 0, 0, 0, -1))
    ev = {"t": day, "kind": "text", "step": "s", "text": "a\x1b[31m\nb", "payload": {}}
    assert lines(ev) == ["-- 2026-01-02", "10:00:00  s  text  a ⏎ b"]
    call = {**ev, "kind": "tool_call", "tool": "Bash", "text": "ls"}
    assert lines(call) == ["10:00:00  s  tool_call  Bash  ls"]
    step = {**ev, "kind": "step", "text": "s", "payload": {"index": 0, "total": 2}}
    assert lines(step) == ["10:00:00  s  step  s 1/2"]
    retry = {**ev, "kind": "retry", "text": "", "payload": {"attempt": 2, "delay": 4.0}}
    assert lines(retry) == ["10:00:00  s  retry  attempt=2 delay=4"]
    assert lines({"unreadable": "not json"})[0].startswith("? unreadable line")


# -- status ----------------------------------------------------------------------------


def test_status_lists_the_commands_that_apply(run_dir: Path) -> None:
    old, new = Registry(run_dir).records()
    events_path(run_dir, old.run).parent.mkdir(parents=True)
    assert status.commands(new, True, seen(run_dir)) == [
        f"flower-super show {new.run} -r {run_dir}",
        f"flower-super logs -f {new.run} -r {run_dir}",
        f"flower-super cancel {new.run} -r {run_dir}",
    ]
    assert status.commands(old, False, seen(run_dir)) == [
        f"flower-super show {old.run} -r {run_dir}"
    ]
    events_path(run_dir, old.run).write_text("")
    assert (
        status.commands(old, False, seen(run_dir))[-1]
        == f"flower-super logs {old.run} -r {run_dir}"
    )
    report = status.collect(seen(run_dir))
    assert [f.to_json()["commands"] for f in report.flowers] == [
        status.commands(old, False, seen(run_dir)),
        status.commands(new, True, seen(run_dir)),
    ]


def test_english_is_free_of_chinese_and_every_text_has_both(en: None, run_dir: Path) -> None:
    mine = [k for k in keys() if k.split(".")[0] in ("show", "logs", "status")]
    assert len(mine) > 40
    for key in mine:
        zh, en_text = texts(key)
        assert zh and en_text and not CJK.search(en_text), key
    text = status.render_text(status.collect(seen(run_dir)))
    assert not CJK.search(text.replace("work·判定#1", "")), text
