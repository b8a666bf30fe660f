"""What the supervisor's terminal prints (pure logic: events in, lines out)."""

from __future__ import annotations

import asyncio
import io
import os

import pytest

from flower import Event, HumanChannel, StepResult
from flower.step.placement import DIED
from supervisor.terminal.terminal import Terminal, rule, width

pytestmark = pytest.mark.timeout(30)


def lines(*events: Event) -> list[str]:
    out = io.StringIO()
    term = Terminal(out)
    for ev in events:
        term.on_event(ev)
    return out.getvalue().splitlines()


def test_the_step_header_is_seed_000s_to_the_column():
    step = Event("step", "干活", payload={"index": 2, "total": 3, "resumed": True, "woke": 3})
    assert lines(step) == ["== 干活 ==============================  3/3  <- 接上次 · 第 3 次唤醒"]
    assert rule("build") == "== build " + "=" * 29 and rule("x" * 60).endswith(" ===")


def test_the_wake_line_is_seed_000s():
    wake = Event(
        "wake",
        payload={
            "woke": 3,
            "workspace": "/nonexistent/explore/test-ide",
            "contexts": {"干活": 80_200},
            "lead": ["需求已确认", "目标 15 条"],
        },
    )
    (line,) = lines(wake)
    assert line == (
        "<- 在 /nonexistent/explore/test-ide 接上上次  需求已确认 · 目标 15 条 · 干活上下文 80.2K"
        " · 第 3 次唤醒"
    )


def test_the_five_states_of_a_question_are_the_references_lines():
    def ask(state: str, **extra: object) -> Event:
        payload = {"id": "q1", "state": state, "options": ["CLI", "库"], **extra}
        return Event("ask", "这个工具要做成 CLI 还是库?", payload=payload)

    asked = ask("asked", remaining=5)
    head = ["  ? 这个工具要做成 CLI 还是库?", "     1) CLI", "     2) 库"]
    term_out = io.StringIO()
    term = Terminal(term_out)

    async def main() -> None:
        term.on_event(asked)
        term.on_event(ask("answered", answer="库"))

    asyncio.run(main())
    assert term_out.getvalue().splitlines() == [*head, "     (还能问 5 次)", "  + 库"]
    # settled at once (unattended, quota): what was asked, then how it ended
    assert lines(ask("timeout")) == [*head, "  ! 无人应答 —— 它会自己判断,把假设记进「未知与假设」"]
    assert lines(ask("over_budget")) == [*head, "  ! 提问额度用完"]
    assert lines(ask("declined")) == [*head, "  . 已跳过"]


def test_what_the_person_said_gets_a_receipt():
    kept = Event("ask", "先写测试", payload={"kind": "mail", "state": "queued", "amended": "/x"})
    unkept = Event("ask", "先写测试", payload={"kind": "mail", "state": "queued", "amended": ""})
    assert lines(kept, unkept) == [
        "+ 收到 (它下次查收件箱时会看到;已追加进确认书)",
        "+ 收到 (它下次查收件箱时会看到;没有确认书可落盘 —— 它可能活不过下一个步骤)",
    ]


def test_english_has_no_chinese_in_flowers_own_lines(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FLOWER_LANG", "en")
    wake = Event("wake", payload={"woke": 2, "workspace": "/w", "contexts": {"work": 1500}})
    said = Event("ask", "tests first", payload={"kind": "mail", "state": "queued", "amended": "/x"})
    out = lines(wake, said)
    assert out == [
        "<- carrying on in /w  work context 1.5K · wake 2",
        "+ received (it sees this the next time it checks its inbox; appended to the brief)",
    ]


def test_the_language_follows_flower_lang_then_the_locale(monkeypatch: pytest.MonkeyPatch):
    from flower.i18n import lang

    for name in ("FLOWER_LANG", "LC_ALL", "LC_MESSAGES", "LANG"):
        monkeypatch.delenv(name, raising=False)
    assert lang() == "en"
    monkeypatch.setenv("LANG", "zh_CN.UTF-8")
    assert lang() == "zh"
    monkeypatch.setenv("LC_MESSAGES", "en_US.UTF-8")  # more specific than LANG
    assert lang() == "en"
    monkeypatch.setenv("LC_ALL", "zh_TW.UTF-8")  # wins over both
    assert lang() == "zh"
    monkeypatch.setenv("FLOWER_LANG", "en")  # wins over the locale
    assert lang() == "en"
    monkeypatch.setenv("FLOWER_LANG", "fr")  # not a language flower has: the locale decides
    assert lang() == "zh"


def test_one_reader_serves_every_prompt_oldest_first():
    read, write = os.pipe()
    term = Terminal(io.StringIO(), stdin_fd=read)

    async def main() -> list[str | None]:
        os.write(write, "早打的\n".encode())  # typed before any prompt: kept for the first
        first = await term.read_line("> ")
        a = asyncio.ensure_future(term.read_line("question> "))
        b = asyncio.ensure_future(term.read_line("sentence> "))
        c = asyncio.ensure_future(term.read_line("gone> "))
        await asyncio.sleep(0)
        c.cancel()  # a prompt whose question timed out gives its place up
        os.write(write, b"1\nsecond\nthird\n")
        got = [await a, await b]
        later = await term.read_line("> ")
        os.close(write)
        return [first, *got, later, await term.read_line("> ")]

    try:
        assert asyncio.run(main()) == ["早打的", "1", "second", "third", None]
    finally:
        os.close(read)


def test_a_question_from_the_channel_is_answered_with_the_chosen_option():
    read, write = os.pipe()
    term = Terminal(io.StringIO(), stdin_fd=read)
    ch = HumanChannel(timeout_s=10)
    term.channel = ch
    ch.on_event = term.on_event

    async def main() -> tuple[str, str]:
        os.write(write, b"2\n")
        asked = await ch.ask("要哪个?", ["甲", "乙"])
        return asked.state, asked.answer

    try:
        assert asyncio.run(main()) == ("answered", "乙")
    finally:
        os.close(read)
        os.close(write)


def test_the_handoff_block_is_the_references():
    out = lines(
        Event("window", payload={"window": 1_000_000}),
        Event("handoff", payload={"phase": "writing", "used": 950_000}),
        Event(
            "handoff",
            payload={
                "phase": "done",
                "degraded": True,
                "path": "/p/.flower/notes/交接-干活.md",
                "summary": {"doing": "写解析器", "decided": "只用标准库", "next": "补测试"},
            },
        ),
    )
    assert out == [
        "# 上下文 950.0K/1000K —— 写交接准备换代",
        "  - 现在在做    写解析器",
        "  - 已定的事    只用标准库",
        "  - 走不通的    —",
        "  - 下一步      补测试",
        "交接没写成,用了降级版本 —— 接手的人会自己去现场看",
        "<- 交接写在 /p/.flower/notes/交接-干活.md",
        "<- 新会话接手,上下文从 950.0K 重新开始",
    ]


def test_the_status_line_counts_turns_tools_context_and_cost():
    class Rt:
        def total_cost(self) -> float:
            return 0.25

    out = io.StringIO()
    term = Terminal(out)
    term.rt = Rt()

    async def main() -> str:
        term.status_every = 0  # no periodic task in this test: the line is asked for
        term.on_event(Event("step", "干活", payload={"index": 2, "total": 3}))
        for _ in range(3):
            term.on_event(Event("context", payload={"used": 71_400, "step": "干活"}))
        term.on_event(Event("tool_call", "ls", tool="Bash"))
        term.on_event(Event("tool_call", "x", tool="Bash", payload={"subagent": True}))
        return term.status_line()

    line = asyncio.run(main())
    assert line == "- 干活 · 3 轮 · 工具 1 次 · 上下文 71.4K · 累计 $0.2500 · 用时 0:00"


def test_a_model_text_is_wrapped_to_the_width_and_keeps_no_escape():
    term_out = io.StringIO()
    term = Terminal(term_out)
    term.cols = 40
    term.on_event(Event("text", "甲" * 30 + " \x1b[2Jend\x1b]0;x\x07\x1b[31mred"))
    got = term_out.getvalue()
    assert "\x1b" not in got and "\x07" not in got
    assert all(width(x) <= 40 for x in got.splitlines())  # CJK is two columns: <= 19 of them
    assert got.splitlines() == ["  " + "甲" * 19, "  " + "甲" * 11 + " endred"]


def test_a_bare_question_mark_goes_to_the_oracle_which_answers_with_a_hint():
    asked: list[str] = []

    class Oracle:
        def ask(self, question: str) -> None:
            asked.append(question)

    term = Terminal(io.StringIO())
    term.oracle = Oracle()
    for line in ("？", "? 现在到哪了", "  ？ 用了哪些文件", "?"):
        term._dispatch(line)
    assert asked == ["", "现在到哪了", "用了哪些文件", ""]


def test_after_the_end_of_input_a_new_question_is_skipped_at_once():
    read, write = os.pipe()
    term = Terminal(io.StringIO(), stdin_fd=read)
    ch = HumanChannel(timeout_s=30)
    term.channel = ch
    ch.on_event = term.on_event

    async def main() -> str:
        os.close(write)
        first = await term.read_line("> ")  # reads the end of input
        assert first is None and term.closed
        asked = await asyncio.wait_for(ch.ask("还要吗?", ["要", "不要"]), 5)
        return asked.state

    try:
        assert asyncio.run(main()) == "declined"
    finally:
        os.close(read)


def row(label: str, cost: float, *, ok: bool = True, error: str | None = None) -> StepResult:
    return StepResult(label, "s", ok=ok, cost_usd=cost, error=error, started_at=0, ended_at=3)


def test_a_judge_round_is_its_own_block_and_every_row_has_its_cost_line():
    out = io.StringIO()
    term = Terminal(out)

    def said(text: str, label: str) -> None:
        term.on_event(Event("text", text, payload={"step": label}))

    term.on_event(Event("step", "干活", payload={"index": 2, "total": 3, "step": "干活"}))
    said("第一轮做完了。", "干活")
    term.row_done(row("干活", 0.1335))
    term.on_event(Event("tool_call", "/w/out.txt", "Read", payload={"step": "干活·判定#1"}))
    said("## 结论\n未达成", "干活·判定#1")
    term.on_event(Event("ask", "要哪个?", payload={"id": "q", "state": "declined"}))
    term.row_done(row("干活·判定#1", 0.111))
    said("第二轮做完了。", "干活#round2")
    term.row_done(row("干活#round2", 0.1362))
    # A judge round that ended before it said anything still gets its block.
    term.row_done(row("干活·判定#2", 0.002, ok=False, error="boom"))
    term.step_done(row("干活#round2", 0.1362))  # the step's rows were all shown already
    assert out.getvalue().splitlines() == [
        "== 干活 ==============================  3/3",
        "  第一轮做完了。",
        "  + 干活  0:03 · $0.1335",
        "== 干活·判定#1 =======================",
        "  * Read  /w/out.txt",
        "  ## 结论",
        "  未达成",
        "  ? 要哪个?",
        "  . 已跳过",
        "  + 干活·判定#1  0:03 · $0.1110",
        "== 干活#round2 =======================",
        "  第二轮做完了。",
        "  + 干活#round2  0:03 · $0.1362",
        "== 干活·判定#2 =======================",
        "  x 干活·判定#2  0:03 · $0.0020  boom",
    ]


def test_a_map_steps_items_share_its_block_and_its_line_sums_what_they_spent():
    out = io.StringIO()
    term = Terminal(out)
    term.on_event(Event("step", "各章", payload={"index": 0, "total": 1, "items": 3}))
    for i, cost in ((1, 0.25), (0, 0.5)):  # items run side by side, end in any order
        label = f"各章[{i}]"
        term.on_event(Event("text", f"第 {i} 章", payload={"step": label}))
        term.row_done(row(label, cost))
        term.on_event(Event("step", label, payload={"step": label, "item_done": True}))
    # Item 2 was reused: no row, and its old cost (in the summary) was not spent again.
    term.on_event(Event("step", "各章[2]", payload={"step": "各章[2]", "item_done": True}))
    term.step_done(row("各章", 0.75 + 9.0))
    assert out.getvalue().splitlines() == [
        "== 各章 ==============================  1/1",
        "  第 1 章",
        "  + 各章[1]  1/3",
        "  第 0 章",
        "  + 各章[0]  2/3",
        "  + 各章[2]  3/3",
        "  + 各章  0:03 · $0.7500",
    ]


def test_a_retry_talks_of_the_api_only_when_the_api_failed():
    """Issue 23: a failure of the CLI itself was shown as an API outage, for ever."""
    api = Event("retry", payload={"attempt": 1, "delay": 4.2, "kind": "transient", "error": "529"})
    other = Event(
        "retry", payload={"attempt": 2, "delay": 8.0, "kind": "unknown", "error": "Control timeout"}
    )
    died = Event(
        "retry",
        payload={
            "attempt": 1,
            "delay": 4.0,
            "kind": "unknown",
            "error": f"step child {DIED} (x)",
        },
    )
    fresh = Event("retry", payload={**died.payload, "fresh": True})
    assert lines(api, other, died, fresh) == [
        "  ~ API 暂时不可用:网络通了再等 4.2 秒,在同一条会话上接着做(第 1 次失败)",
        "  ~ 这次尝试失败了(Control timeout):8.0 秒后在同一条会话上接着做(第 2 次失败)",
        "  ~ 步骤子进程意外退出,4.0 秒后换一个子进程接着同一条会话(第 1 次失败)",
        "  ~ 步骤子进程意外退出,会话还没存下:4.0 秒后换一个子进程从头开始这一步(第 1 次失败)",
    ]


def test_a_refused_session_and_a_local_failure_are_one_line_each():
    gone = Event("fresh", payload={"session": "3d985b2b-b2fc-4699", "step": "second"})
    assert lines(gone) == [
        "  ~ 会话 3d985b2b 接不上了(CLI 说没有这段对话,多半是上次在提示落盘前就被杀了):"
        "这一步用自己的提示开新会话重来"
    ]
    out = io.StringIO()
    Terminal(out).row_done(
        row(
            "second",
            0.0,
            ok=False,
            error="the CLI failed before any request (error_during_execution): No message found",
        )
    )
    assert out.getvalue().splitlines() == [
        "  x second  0:03 · $0.0000  Claude Code 在本机就出错了,一个请求都没发出"
        "(不是网络问题,不重试):No message found"
    ]
