"""The oracle ("? 现在到哪了" while a run works): which lines are questions, the event window it
is shown, what the person sees (the answer block, the one failure line, the wait on exit),
and, end to end with the real CLI against the scripted model server, that it answers
beside a running step through the supervisor's own placement without touching the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest

from flower import AgentSpec, Event, Resilience, Runtime, StepResult, Workbench, read_manifest
from flower.agents.roles import ORACLE_RULES
from flower.i18n import texts
from flower.people.credentials import KEY_VARS
from flower.services.cli_env import cli_env
from flower.services.model_server import ModelServer, RecordedRequest
from flower.state.manifest import Manifest
from flower.step.call import StepCall
from flower.step.placement import Seat, Watch
from supervisor.run.placement import Forked, preload
from supervisor.terminal.oracle import (
    ASIDE_DIRNAME,
    EVENT_CHARS,
    RECENT_EVENTS,
    STEP_NAME,
    Oracle,
    RecentEvents,
    is_question,
)

# -- which lines are questions --------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "question"),
    [
        ("? 现在到哪了", "现在到哪了"),
        ("？ 现在到哪了", "现在到哪了"),  # the full-width mark of a Chinese input method
        ("?现在到哪了", "现在到哪了"),
        ("？现在到哪了", "现在到哪了"),
        ("   ? where are we  ", "where are we"),
        ("\t？ 到哪了", "到哪了"),
        ("\u3000？到哪了", "到哪了"),  # an ideographic space before it
        ("?? 两个问号", "? 两个问号"),  # one mark is taken off, the rest is the question
        ("?", ""),
        ("  ？  ", ""),
    ],
)
def test_a_line_starting_with_either_question_mark_is_for_the_oracle(line, question):
    assert is_question(line) == question
    assert Oracle.is_question(line) == question


@pytest.mark.parametrize(
    "line", ["现在到哪了?", "加一个需求:别删 README", "", "   ", "¿qué?", "﹖ small form"]
)
def test_any_other_line_is_not(line):
    assert is_question(line) is None


# -- the event window ----------------------------------------------------------------------


def ev(kind: str, text: str = "", **payload: Any) -> Event:
    return Event(kind, text, payload={"step": "干活", **payload})


def test_the_window_keeps_the_last_sixty_oldest_first():
    recent = RecentEvents()
    for i in range(RECENT_EVENTS + 10):
        recent.add(ev("text", f"第 {i} 条"))
    lines = recent.lines()
    assert len(recent) == len(lines) == 60
    assert "第 10 条" in lines[0] and "第 69 条" in lines[-1]


def test_thinking_prompts_and_the_meters_stay_out():
    recent = RecentEvents()
    recent.add(ev("thinking", "SECRET-THOUGHT"))
    recent.add(ev("prompt", "THE-PROMPT"))
    recent.add(ev("context", used=12345, final=False))
    recent.add(ev("window", window=200000))
    recent.add(ev("text", "我先跑一下测试"))
    (line,) = recent.lines()
    assert "我先跑一下测试" in line
    assert "SECRET-THOUGHT" not in recent.render() and "THE-PROMPT" not in recent.render()


def test_each_event_is_one_line_cut_to_two_hundred_characters():
    recent = RecentEvents(clock=lambda: 0.0)
    recent.add(ev("tool_result", "第一行\n" + "x" * 500))
    (line,) = recent.lines()
    assert "\n" not in line
    body = line.split(": ", 1)[1]
    assert len(body) == EVENT_CHARS and body.endswith("…")
    assert body.startswith("第一行 xxx")


def test_a_line_says_when_where_what_and_with_which_tool():
    recent = RecentEvents(clock=lambda: time.mktime((2025, 1, 2, 9, 8, 7, 0, 0, -1)))
    recent.add(Event("tool_call", "pytest -q", tool="Bash", payload={"step": "干活"}))
    recent.add(Event("text", "子任务做完了", payload={"step": "干活", "subagent": True}))
    retry = {"step": "干活", "attempt": 2, "delay": 4.0, "kind": "transient", "error": "529"}
    recent.add(Event("retry", payload=retry))
    recent.add(Event("step", "判定", payload={"index": 2, "total": 3}))
    recent.add_result(StepResult(step="干活", ok=False, error="boom", cost_usd=0.5))
    assert recent.lines() == [
        "09:08:07 [干活] tool_call Bash: pytest -q",
        "09:08:07 [干活] (subagent) text: 子任务做完了",
        "09:08:07 [干活] retry: attempt=2 delay=4.0 kind=transient error=529",
        "09:08:07 step: 判定",
        "09:08:07 [干活] step failed: 0.0s $0.5000 boom",
    ]


def test_the_block_has_a_heading_and_says_when_there_is_nothing_yet():
    recent = RecentEvents()
    empty = recent.render()
    assert empty.startswith("## 运行最近的事件") and empty.endswith("(还没有事件)")
    recent.add(ev("text", "开工"))
    block = recent.render().splitlines()
    assert len(block) == 2 and block[1].endswith("[干活] text: 开工")


# -- what the person sees (a placement that answers without a CLI) --------------------------


class Scripted:
    """A placement that returns ``result`` (after ``hold`` is set, if given) or raises."""

    def __init__(
        self,
        result: StepResult | None = None,
        *,
        hold: asyncio.Event | None = None,
        raises: BaseException | None = None,
    ) -> None:
        self.result = result or StepResult(step="", ok=True, text="答案", cost_usd=0.0123)
        self.hold, self.raises = hold, raises
        self.calls: list[tuple[StepCall, Seat]] = []

    async def attempt(self, call: StepCall, seat: Seat, watch: Watch) -> StepResult:
        self.calls.append((call, seat))
        if self.hold is not None:
            await self.hold.wait()
        if self.raises is not None:
            raise self.raises
        now = time.time()
        out = StepResult(**{**self.result.to_dict(), "step": call.label})
        out.session_id, out.started_at, out.ended_at = "sid-aside", now, now
        return out

    def prepare(self, calls: Sequence[StepCall], seat: Seat) -> None:
        return None

    async def close(self) -> None:
        return None


@pytest.fixture
def lang(monkeypatch):
    monkeypatch.setenv("FLOWER_LANG", "zh")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")


def make(tmp_path: Path, placement: Any, said: list[str], **kw: Any) -> Oracle:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    return Oracle(tmp_path / "runs", ws, Workbench(ws), say=said.append, placement=placement, **kw)


def test_the_answer_is_shown_as_the_reference_shows_it(tmp_path, lang):
    said: list[str] = []
    placement = Scripted(
        StepResult(step="", ok=True, text="第二步在跑\n测试还没过", cost_usd=0.0123)
    )
    oracle = make(tmp_path, placement, said)

    async def main() -> StepResult | None:
        try:
            return await oracle.ask("现在到哪了")
        finally:
            await oracle.drain()

    result = asyncio.run(main())
    assert result is not None and result.ok
    assert said == ["# 旁路\n  第二步在跑\n  测试还没过\n  ($0.0123,没有打扰正在跑的运行)"]
    (call, seat) = placement.calls[0]
    assert call.label == STEP_NAME and call.resume is None
    assert call.spec.allowed_tools == ["Read", "Glob", "Grep"]
    assert (call.spec.max_turns, call.spec.max_budget_usd) == (12, 0.5)
    assert call.spec.instructions.startswith(ORACLE_RULES)
    assert seat.workbench is not None and seat.workbench.root == tmp_path / "ws" / ".flower"
    assert seat.spill_threshold is None  # a long Read is never spilled into the run's workbench


def test_the_answer_in_english(tmp_path, lang, monkeypatch):
    monkeypatch.setenv("FLOWER_LANG", "en")
    said: list[str] = []
    oracle = make(tmp_path, Scripted(), said)

    async def main() -> None:
        await oracle.ask("where are we")
        await oracle.drain()

    asyncio.run(main())
    assert said == ["# aside\n  答案\n  ($0.0123, the running run was not disturbed)"]


def test_every_text_is_in_the_catalogue_in_both_languages():
    assert texts("oracle.head") == ("# 旁路", "# aside")
    assert texts("oracle.cost")[0] == "(${cost},没有打扰正在跑的运行)"
    assert texts("oracle.failed")[0] == "# 旁路问答失败:{kind}: {message}"
    assert texts("oracle.draining")[0] == "(等 {n} 条旁路问答收尾…)"
    for key in ("oracle.abandoned", "oracle.empty", "oracle.no_text", "oracle.no_answer"):
        zh, en = texts(key)
        assert zh and en and zh != en


def test_the_prompt_carries_the_window_the_paths_and_the_question(tmp_path, lang):
    said: list[str] = []
    placement = Scripted()
    oracle = make(tmp_path, placement, said, paths=[tmp_path / "ws" / "README.md"])
    oracle.recent.add(Event("tool_call", "pytest -q", tool="Bash", payload={"step": "干活"}))

    async def main() -> None:
        task = oracle.ask("测试过了吗")
        oracle.recent.add(ev("text", "LATER-EVENT"))  # after the question: not its context
        await task
        await oracle.drain()

    asyncio.run(main())
    prompt = placement.calls[0][0].prompt
    assert "[干活] tool_call Bash: pytest -q" in prompt and "LATER-EVENT" not in prompt
    assert prompt.rstrip().endswith("## 问题\n测试过了吗")
    for shown in (tmp_path / "ws", tmp_path / "ws" / ".flower" / "notes", "README.md"):
        assert str(shown) in prompt
    assert str(tmp_path / "runs" / "manifest.json") in prompt


def test_it_lives_in_aside_and_leaves_the_main_run_dir_alone(tmp_path, lang):
    runs = tmp_path / "runs"
    Manifest(runs, "20250101-000000-abcdef").record(StepResult(step="干活", ok=True))
    before = (runs / "manifest.json").read_bytes()
    names = sorted(p.name for p in runs.iterdir())
    said: list[str] = []
    oracle = make(tmp_path, Scripted(), said)

    async def main() -> None:
        await oracle.ask("现在到哪了")
        await oracle.ask("还要多久")
        await oracle.drain()

    asyncio.run(main())
    assert (runs / "manifest.json").read_bytes() == before
    assert sorted(p.name for p in runs.iterdir()) == sorted([ASIDE_DIRNAME, *names])
    aside = runs / ASIDE_DIRNAME
    rows = read_manifest(aside)
    assert [(r["step"], r["ok"], r["cost_usd"]) for r in rows] == [(STEP_NAME, True, 0.0123)] * 2
    assert len({r["run"] for r in rows}) == 1  # one aside Runtime for the whole run
    assert not (aside / "lineage.json").exists() and not (aside / "flowers").exists()
    assert not (tmp_path / "ws" / ".flower" / "INDEX.md").exists()  # read, never refreshed


def test_the_run_goes_on_while_the_oracle_thinks_and_exit_waits_for_it(tmp_path, lang):
    said: list[str] = []
    hold = asyncio.Event()
    oracle = make(tmp_path, Scripted(hold=hold), said)
    beats: list[int] = []

    async def the_run() -> None:  # stands in for the flow: it must not be held up
        for i in range(3):
            beats.append(i)
            await asyncio.sleep(0)
        hold.set()

    async def main() -> None:
        task = oracle.ask("现在到哪了")
        assert not task.done() and oracle.in_flight == 1
        run = asyncio.ensure_future(the_run())
        await oracle.drain(timeout=30)
        await run

    asyncio.run(main())
    assert beats == [0, 1, 2]
    assert said[0] == "(等 1 条旁路问答收尾…)"
    assert said[1].startswith("# 旁路\n  答案")
    assert oracle.in_flight == 0


def test_exit_gives_up_on_an_answer_that_takes_too_long(tmp_path, lang):
    said: list[str] = []
    oracle = make(tmp_path, Scripted(hold=asyncio.Event()), said)  # never set

    async def main() -> asyncio.Task[Any]:
        task = oracle.ask("现在到哪了")
        oracle.ask("还要多久")
        await oracle.drain(timeout=0.2)
        return task

    task = asyncio.run(main())
    assert task.cancelled()
    assert said == ["(等 2 条旁路问答收尾…)", "(还有 2 条旁路问答没答完,不等了)"]


def test_nothing_in_flight_means_a_silent_exit(tmp_path, lang):
    said: list[str] = []
    asyncio.run(make(tmp_path, Scripted(), said).drain())
    assert said == []
    assert not (tmp_path / "runs").exists()  # no question, no aside/


def test_a_bare_question_mark_says_how_to_ask(tmp_path, lang):
    said: list[str] = []
    placement = Scripted()
    oracle = make(tmp_path, placement, said)

    async def main() -> StepResult | None:
        return await oracle.ask(is_question("？") or "")

    assert asyncio.run(main()) is None
    assert said == ["? 后面写上要问的,比如:? 现在到哪了"] and not placement.calls


def failed_line(said: list[str]) -> str:
    (line,) = said
    assert "\n" not in line and line.startswith("# 旁路问答失败:"), said
    return line


def test_a_failed_answer_is_one_line(tmp_path, lang):
    said: list[str] = []
    error = 'API Error: 401 {"type":"error","error":{"type":"authentication_error"}}\nmore'
    oracle = make(tmp_path, Scripted(StepResult(step="", ok=False, error=error)), said)

    async def main() -> StepResult | None:
        return await oracle.ask("现在到哪了")

    assert asyncio.run(main()) is None
    line = failed_line(said)
    assert line.startswith("# 旁路问答失败:OracleFailed: API Error: 401 ")
    assert line.endswith("more")


def test_a_placement_that_blows_up_is_one_line(tmp_path, lang):
    said: list[str] = []
    oracle = make(tmp_path, Scripted(raises=RuntimeError("boom")), said)

    async def main() -> StepResult | None:
        return await oracle.ask("现在到哪了")

    assert asyncio.run(main()) is None
    assert "RuntimeError: boom" in failed_line(said)


def test_missing_credentials_are_one_line(tmp_path, lang, monkeypatch):
    for name in KEY_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(tmp_path / "nothing"))
    monkeypatch.chdir(tmp_path)
    said: list[str] = []
    oracle = make(tmp_path, Scripted(), said)

    async def main() -> StepResult | None:
        return await oracle.ask("现在到哪了")

    assert asyncio.run(main()) is None
    assert failed_line(said).startswith("# 旁路问答失败:CredentialsError: no Anthropic credentials")


# -- end to end: the real CLI beside a running step, through the supervisor's Forked --------


def conv(name: str, turns: list[Any]) -> dict[str, Any]:
    return {"name": name, "match": {"marker": f"[[{name}]]"}, "turns": turns}


def messages_of(server: ModelServer, name: str) -> list[RecordedRequest]:
    return [r for r in server.requests if r.path == "/v1/messages" and r.conversation == name]


def db_text(db: Path) -> str:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        return "\n".join(row[0] for row in conn.execute("SELECT data FROM entries"))
    finally:
        conn.close()


def live_children() -> list[psutil.Process]:
    out = []
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
    return out


def use_server(monkeypatch, tmp_path: Path, url: str) -> None:
    for key, value in cli_env(tmp_path / "home", url).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("FLOWER_LANG", "zh")


@pytest.mark.e2e
@pytest.mark.timeout(120)  # two real CLIs at once (the step and the oracle) on two cores
def test_the_oracle_answers_beside_a_running_step_and_leaves_it_alone(
    model_server, tmp_path, monkeypatch
):
    server = model_server(
        {
            "conversations": [  # the oracle's first: its prompt quotes the run's events
                conv("oracle", [{"text": "第一步还在等模型回话,测试还没跑。"}]),
                conv("main", [{"text": "主线做完了", "delay": 100}]),
            ]
        }
    )
    use_server(monkeypatch, tmp_path, server.url)
    preload()  # as the supervisor does: the SDK and what an attempt imports, before any fork
    ws, runs = tmp_path / "ws", tmp_path / "runs"
    ws.mkdir()
    Manifest(runs, "20250101-000000-abcdef").record(StepResult(step="取词", ok=True))
    before = (runs / "manifest.json").read_bytes()
    forked = Forked()  # the supervisor's one placement: the run's steps and the oracle's
    rt = Runtime(workspace=ws, run_dir=runs, workbench=Workbench(ws), placement=forked)
    recent = RecentEvents()
    said: list[str] = []
    oracle = Oracle(runs, ws, rt.workbench, say=said.append, recent=recent, placement=forked)
    worker = AgentSpec(name="干活", instructions="干活", allowed_tools=["Read"])

    async def main() -> StepResult | None:
        step = asyncio.ensure_future(rt.run(worker, "[[main]] 干活", on_event=recent.add))
        try:
            await asyncio.to_thread(server.wait_for, lambda _: messages_of(server, "main"), 30)
            recent.add(
                Event("tool_call", "pytest -q tests/", tool="Bash", payload={"step": "干活"})
            )
            recent.add(Event("text", "LONG" + "y" * 400, payload={"step": "干活"}))
            recent.add(Event("thinking", "SECRET-THOUGHT", payload={"step": "干活"}))
            task = oracle.ask(is_question("？ [[oracle]] 现在到哪了") or "")
            assert not task.done()
            result = await asyncio.wait_for(task, 60)
            assert not step.done(), "the step was held up, or ended, while the oracle answered"
            await oracle.drain()
            return result
        finally:
            step.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await step
            await forked.close()
            rt.close()

    result = asyncio.run(main())
    assert result is not None and result.ok, result
    # What the person saw: the answer, its cost, the reassurance.
    (row,) = read_manifest(runs / ASIDE_DIRNAME)
    assert row["step"] == STEP_NAME and row["ok"] and row["cost_usd"] > 0
    cost = f"${row['cost_usd']:.4f}"
    assert said == [f"# 旁路\n  第一步还在等模型回话,测试还没跑。\n  ({cost},没有打扰正在跑的运行)"]
    # What the model was sent: the recent events (cut, no thinking) and the question.
    (asked,) = messages_of(server, "oracle")
    sent = "\n".join(asked.texts())
    assert "[干活] tool_call Bash: pytest -q tests/" in sent
    assert "LONG" + "y" * 195 + "…" in sent and "y" * 196 not in sent
    assert "SECRET-THOUGHT" not in sent
    assert "## 问题\n[[oracle]] 现在到哪了" in sent
    assert ORACLE_RULES.splitlines()[0] in asked.system and "## 工作台" in asked.system
    # Its own run_dir; the main one untouched, the question in no session of the run.
    assert (runs / "manifest.json").read_bytes() == before
    assert not (runs / "lineage.json").exists() and not (runs / "flowers").exists()
    assert "现在到哪了" in db_text(runs / ASIDE_DIRNAME / "sessions.db")
    assert "[[main]]" in db_text(runs / "sessions.db")
    assert "现在到哪了" not in db_text(runs / "sessions.db")
    assert asked.session_id not in {r.session_id for r in messages_of(server, "main")}
    assert not live_children(), live_children()


def closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.e2e
@pytest.mark.timeout(90)  # a real CLI per case
@pytest.mark.parametrize("how", ["refused", "unreachable"])
def test_a_server_that_refuses_or_is_not_there_is_one_line(
    model_server, tmp_path, monkeypatch, how
):
    if how == "refused":
        url = model_server({"conversations": [conv("oracle", [{"error": "authentication"}])]}).url
    else:
        url = closed_port()
    use_server(monkeypatch, tmp_path, url)
    ws = tmp_path / "ws"
    ws.mkdir()
    said: list[str] = []
    forked = Forked()
    quick = Resilience(
        max_attempts=2, base_delay=0.01, probe_timeout=0.2, probe_interval=0.1, max_offline_wait=0.3
    )
    oracle = Oracle(
        tmp_path / "runs", ws, None, say=said.append, placement=forked, resilience=quick
    )

    async def main() -> StepResult | None:
        try:
            return await asyncio.wait_for(oracle.ask("[[oracle]] 现在到哪了"), 60)
        finally:
            await oracle.drain()
            await forked.close()

    assert asyncio.run(main()) is None
    line = failed_line(said)
    assert line.startswith("# 旁路问答失败:OracleFailed: ")
    (row,) = read_manifest(tmp_path / "runs" / ASIDE_DIRNAME)
    assert not row["ok"] and row["step"] == STEP_NAME
    assert " ".join(row["error"].split())[:40] in line
    assert not live_children(), live_children()


def test_with_a_state_in_a_database_the_answers_stay_in_aside(tmp_path, lang, monkeypatch, pg_dsn):
    """FLOWER_STATE names the run's database: the oracle's answers are not the run's state,
    so they go to aside/ as ever and never into the workspace's manifest there."""
    monkeypatch.setenv("FLOWER_STATE", pg_dsn)
    oracle = make(tmp_path, Scripted(), [])

    async def main() -> None:
        await oracle.ask("现在到哪了")
        await oracle.drain()

    asyncio.run(main())
    rows = read_manifest(tmp_path / "runs" / ASIDE_DIRNAME)
    assert [r["step"] for r in rows] == [STEP_NAME]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        shared = conn.execute("SELECT to_regclass('flower.manifest')").fetchone()
        assert shared == (None,) or conn.execute(
            "SELECT count(*) FROM flower.manifest"
        ).fetchone() == (0,)
