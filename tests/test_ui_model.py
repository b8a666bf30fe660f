"""The web view's model (supervisor/ui/model.py) over run_dirs written by flower's own
writers (registry records, manifest rows, event logs): what each attempt bar says.

The end-to-end tests (tests/test_e2e_ui.py) drive real runs in a browser; these cover the
shapes a test run seldom makes: a map's items, a retry, a worker's later try, a chain of
three runs, the heartbeat.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from flower.state.backends import LocalState
from flower.state.eventlog import FileEventRows, line
from flower.state.manifest import Manifest
from flower.state.registry import FINISHED, KILLED, FlowerRecord, Registry
from flower.state.result import Event, StepResult
from supervisor.ui import model

T0 = time.time() - 3600


def rec(
    run: str, ws: Path, started: float, state: str, steps: list[str], woke: int = 0
) -> FlowerRecord:
    return FlowerRecord(
        run=run,
        flow="f",
        pid=0,
        pid_started=None,
        workspace=str(ws),
        started_at=started,
        steps=steps,
        state=state,
        woke=woke,
        ended_at=started + 50,
    )


def events(run_dir: Path, run: str, evs: list[tuple[float, Event]]) -> None:
    """The run's event log, each event stamped ``at`` (as the supervisor writes it then)."""
    rows = FileEventRows(run_dir)
    for at, ev in evs:
        rows.append(run, json.loads(line(ev, now=at)))


def row(step: str, start: float, end: float, ok: bool = True, **kw: object) -> StepResult:
    return StepResult(
        step, kw.pop("sid", f"s-{step}"), ok, 0.01, 1, "", kw.pop("error", None), start, end
    )  # type: ignore[arg-type]


def test_a_maps_items_are_their_own_bars_from_their_first_sign_to_their_row(tmp_path: Path) -> None:
    rd, ws = tmp_path / "runs", tmp_path
    Registry(rd).write(rec("r1", ws, T0, FINISHED, ["read"]))
    events(
        rd,
        "r1",
        [
            (
                T0 + 1,
                Event("step", "read", payload={"step": "read", "index": 0, "total": 1, "items": 2}),
            ),
            (
                T0 + 2,
                Event(
                    "tool_call", "ls", tool="Bash", payload={"step": "read[0]", "session_id": "a"}
                ),
            ),
            (
                T0 + 3,
                Event(
                    "tool_call", "ls", tool="Bash", payload={"step": "read[1]", "session_id": "b"}
                ),
            ),
            (
                T0 + 9,
                Event(
                    "step", "read[0]", payload={"step": "read[0]", "map": "read", "item_done": True}
                ),
            ),
        ],
    )
    m = Manifest(rd, "r1")
    m.record(row("read[0]", T0 + 1.5, T0 + 8, sid="a"))
    m.record(row("read[1]", T0 + 2.5, T0 + 12, sid="b"))
    tl = model.timeline(LocalState(rd, ws), "r1")
    bars = {a["label"]: a for a in tl["attempts"]}
    assert set(bars) == {"read[0]", "read[1]"}  # the map's own line is no attempt
    assert (bars["read[0]"]["start"], bars["read[0]"]["end"]) == (T0 + 1.5, T0 + 8)
    assert bars["read[0]"]["outcome"] == "ok" and bars["read[0]"]["tools"] == 1
    assert tl["steps"] == [{"step": "read", "children": ["read[0]", "read[1]"]}]


def test_a_retry_and_a_later_try_on_a_worker_each_start_a_bar(tmp_path: Path) -> None:
    rd, ws = tmp_path / "runs", tmp_path
    Registry(rd).write(rec("r1", ws, T0, FINISHED, ["a", "b"]))
    placed = {"step": "b", "host": "h1", "worker": "w1", "try": 1}
    events(
        rd,
        "r1",
        [
            (T0 + 1, Event("step", "a", payload={"step": "a"})),
            (T0 + 2, Event("retry", "529", payload={"step": "a", "attempt": 2})),
            (T0 + 5, Event("step", "b", payload={"step": "b"})),
            (T0 + 6, Event("placed", payload=placed)),
            # the same worker name restarted: a later try is a takeover all the same
            (T0 + 9, Event("placed", payload={**placed, "try": 2, "took_over": True})),
        ],
    )
    m = Manifest(rd, "r1")
    m.record(row("a", T0 + 1, T0 + 4))
    m.record(row("b", T0 + 5, T0 + 12))
    tl = model.timeline(LocalState(rd, ws), "r1")
    got = [(a["label"], a["outcome"], a["try"]) for a in tl["attempts"]]
    assert got == [("a", "retried", 0), ("a", "ok", 0), ("b", "taken-over", 1), ("b", "ok", 2)]
    assert [m["kind"] for m in tl["marks"]].count("takeover") == 1


def test_a_kill_is_woken_by_a_later_run_of_the_chain_whatever_the_clocks(tmp_path: Path) -> None:
    rd, ws = tmp_path / "runs", tmp_path
    Registry(rd).write(rec("r1", ws, T0, KILLED, ["a"]))
    Registry(rd).write(rec("r2", ws, T0 + 100, FINISHED, ["a"], woke=1))
    events(rd, "r1", [(T0 + 1, Event("step", "a", payload={"step": "a", "session_id": "s"}))])
    # the second run's machine has a clock an hour behind: its row starts "before" the kill
    Manifest(rd, "r2").record(row("a", T0 - 3000, T0 - 2990, sid="s"))
    tl = model.timeline(LocalState(rd, ws), "r2")
    assert [a["outcome"] for a in tl["attempts"]] == ["killed-woken", "ok"]
    assert [m["kind"] for m in tl["marks"] if m["kind"] == "wake"] == ["wake"]


def test_the_heartbeat_alone_changes_nothing_a_page_shows(tmp_path: Path) -> None:
    rd, ws = tmp_path / "runs", tmp_path
    r = rec("r1", ws, T0, FINISHED, ["a"])
    Registry(rd).write(r)
    state = LocalState(rd, ws)
    before = model.signature(state, {})
    Registry(rd).write(r)  # what a heartbeat does: the same record, a new updated_at
    assert model.signature(state, {}) == before
    r.step = "a"
    Registry(rd).write(r)
    assert model.signature(state, {}) != before


def test_every_text_the_page_uses_is_in_the_catalogue_in_both_languages() -> None:
    import re

    from flower.i18n import keys, texts
    from supervisor.ui import texts as _defined  # noqa: F401 - the ui.* texts
    from supervisor.ui.server import STATIC

    ui_keys = {k for k in keys() if k.startswith("ui.")}
    script = (STATIC / "app.js").read_text(encoding="utf-8")
    page = (STATIC / "index.html").read_text(encoding="utf-8")
    # T("ui.x") with a literal key; a key ending in "." is a prefix, completed below
    used = {k for k in re.findall(r'T\("(ui\.[a-z_.-]+)"', script) if not k.endswith(".")}
    used |= set(re.findall(r'data-t="(ui\.[a-z_.-]+)"', page))
    used |= {
        f"ui.outcome.{o}"
        for o in re.findall(r'"([a-z-]+)"', script.split("OUTCOMES = [")[1].split("]")[0])
    }
    used |= {
        f"ui.mark.{k}" for k in ("wake", "handoff", "reset", "retry", "ask", "end", "takeover")
    }
    used |= {f"ui.ledger.{s}" for s in ("done", "started", "failed", "interrupted")}
    used |= {f"ui.kind.{k}" for k in ("cli", "prompt", "thinking", "text")}
    assert used - ui_keys == set()
    cjk = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")
    fields = re.compile(r"\{(\w+)")
    for key in ui_keys:
        zh, en = texts(key)
        assert zh and en, key
        assert set(fields.findall(zh)) == set(fields.findall(en)), key
        if key != "ui.lang":  # the switch names the other language, in that language
            assert not cjk.search(en), key


def test_a_dead_run_with_work_left_carries_the_command_status_prints(tmp_path: Path) -> None:
    rd, ws = tmp_path / "runs", tmp_path
    dead = rec("r1", ws, T0, KILLED, ["a", "b"])
    dead.command = ["flower-super", "start", "--flow", "f.py:flow", "-r", str(rd), "two words"]
    Registry(rd).write(dead)
    (shown,) = model.runs(LocalState(rd, ws))["runs"]
    assert shown["resume"] == f"flower-super start --flow f.py:flow -r {rd} 'two words'"
    assert shown["resume_export"] is None
    Registry(rd).write(rec("r2", ws, T0 + 100, FINISHED, ["a", "b"], woke=1))
    assert [r["resume"] for r in model.runs(LocalState(rd, ws))["runs"]] == [None, None]
