"""What the supervisor's terminal prints (pure logic: events in, lines out)."""

from __future__ import annotations

import asyncio
import io
import os

import pytest

from flower import Event, HumanChannel
from supervisor.terminal import Terminal, rule

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


def test_a_question_already_settled_is_shown_with_its_state_and_mail_as_said():
    settled = Event("ask", "要哪个?", payload={"id": "q1", "state": "timeout", "options": []})
    mail = Event("ask", "先写测试", payload={"kind": "mail"})
    assert lines(settled, mail) == ["? 要哪个?  (timeout)", "  ~ 你说:先写测试"]


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
