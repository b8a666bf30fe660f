"""HumanChannel: questions, quota and timeout, answers from other threads, push and pull, the
inbox and amendments, the Q&A log, the MCP tools as the SDK calls them, and the seam a step
child relays its tool calls through."""

from __future__ import annotations

import asyncio
import gc
import inspect
import os
import select
import signal
import stat
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from flower.people import human
from flower.people.human import (
    DECLINED,
    EMPTY_QUESTION,
    INBOX_NAME,
    MAIL_AMENDED,
    MAIL_HEAD,
    MAIL_NOT_KEPT,
    NO_MAIL,
    OVER_BUDGET,
    TIMEOUT,
    TOOL_NAME,
    Ask,
    HumanChannel,
    Mail,
    find_channel,
    set_relay,
)
from flower.state.result import Event

pytestmark = pytest.mark.timeout(60)

WAIT = 10.0  # the bound on waiting for something that should happen at once


def run(coro: Awaitable[Any]) -> Any:
    async def main() -> Any:
        return await asyncio.wait_for(coro, WAIT)

    return asyncio.run(main())


class Sink:
    """An on_event that records events and lets a thread wait for one."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.threads: list[int] = []
        self._cond = threading.Condition()

    def __call__(self, ev: Event) -> None:
        with self._cond:
            self.events.append(ev)
            self.threads.append(threading.get_ident())
            self._cond.notify_all()

    def states(self) -> list[str]:
        return [str(e.payload.get("state")) for e in self.events]

    def wait_for(self, pred: Callable[[Event], bool]) -> Event:
        with self._cond:
            ok = self._cond.wait_for(lambda: any(pred(e) for e in self.events), WAIT)
            assert ok, f"no such event among {self.events}"
            return next(e for e in self.events if pred(e))


def asked(ev: Event) -> bool:
    return ev.kind == "ask" and ev.payload.get("state") == "asked"


@pytest.fixture(autouse=True)
def no_relay() -> Iterator[None]:
    set_relay(None)
    yield
    set_relay(None)


# ---- the contract's names and texts -------------------------------------------------------


def test_the_fixed_texts_and_names() -> None:
    assert TIMEOUT == (
        "无人应答。按你自己的判断继续,并把这个问题和你采用的假设写进「未知与假设」那一段。"
        "不要重复提问,也不要停在这里。"
    )
    assert OVER_BUDGET == (
        "提问额度已用完。不要再问了 —— 把剩下的不确定项写进「未知与假设」那一段,"
        "按你自己的判断继续。"
    )
    assert DECLINED == "对方跳过了这个问题。按你自己的判断继续,并把假设写进「未知与假设」。"
    assert EMPTY_QUESTION == "问题是空的。把问题写清楚再问。"
    assert (TOOL_NAME, INBOX_NAME) == ("mcp__human__ask", "mcp__human__inbox")
    ch = HumanChannel()
    assert (ch.tool_name, ch.inbox_name) == (TOOL_NAME, INBOX_NAME)


def test_constructor_is_keyword_only_with_the_documented_defaults() -> None:
    params = inspect.signature(HumanChannel).parameters
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params.values())
    assert {n: p.default for n, p in params.items()} == {
        "on_event": None,
        "max_asks": None,
        "timeout_s": 1800.0,
        "log_path": None,
        "amend_path": None,
        "over_budget_text": OVER_BUDGET,
        "timeout_text": TIMEOUT,
        "declined_text": DECLINED,
    }
    amend = inspect.signature(HumanChannel.amend).parameters["label"]
    assert (amend.kind, amend.default) == (inspect.Parameter.KEYWORD_ONLY, "运行中补充")


def test_public_attributes(tmp_path: Path) -> None:
    sink = Sink()
    ch = HumanChannel(
        on_event=sink,
        max_asks=3,
        timeout_s=7.0,
        log_path=tmp_path / "log.md",
        amend_path=tmp_path / "brief.md",
        over_budget_text="O",
        timeout_text="T",
        declined_text="D",
    )
    assert ch.on_event is sink
    assert (ch.max_asks, ch.timeout_s) == (3, 7.0)
    assert (ch.log_path, ch.amend_path) == (tmp_path / "log.md", tmp_path / "brief.md")
    assert (ch.over_budget_text, ch.timeout_text, ch.declined_text) == ("O", "T", "D")
    assert (ch.asks, ch.mail, ch.ui_errors) == ([], [], [])
    assert HumanChannel().log_path is None


def test_ask_and_mail_records() -> None:
    a = Ask(id="q1", question="why?")
    assert (a.options, a.state, a.answer) == ([], "asked", "")
    a.asked_at -= 2.0
    assert 1.9 <= a.waited_s <= 3.0
    ev = a.event(4)
    assert (ev.kind, ev.text, ev.raw) == ("ask", "why?", a)
    assert ev.payload == {
        "id": "q1",
        "options": [],
        "state": "asked",
        "answer": "",
        "remaining": 4,
        "asked_at": a.asked_at,
    }
    assert a.event().payload["remaining"] == 0
    m = Mail(id="m1", text="hi")
    assert m.taken is False
    assert m.sent_at > 0


# ---- the three 0 / None semantics -----------------------------------------------------------


def test_max_asks_none_is_unlimited_and_remaining_is_minus_one() -> None:
    ch = HumanChannel(timeout_s=0)
    assert ch.remaining == -1

    async def go() -> list[str]:
        return [(await ch.ask(f"q{i}?")).state for i in range(20)]

    assert run(go()) == ["timeout"] * 20
    assert ch.remaining == -1


def test_max_asks_zero_refuses_at_once_without_blocking() -> None:
    sink = Sink()
    ch = HumanChannel(on_event=sink, max_asks=0, timeout_s=None)  # would wait forever
    a = run(ch.ask("may I?"))
    assert (a.state, a.answer) == ("over_budget", OVER_BUDGET)
    assert ch.pending() == []
    assert sink.states() == ["over_budget"]  # no "asked": it was never put to anyone
    assert ch.remaining == 0


def test_a_quota_counts_the_questions_put_and_refuses_the_next() -> None:
    ch = HumanChannel(max_asks=2, timeout_s=0, over_budget_text="enough")

    async def go() -> list[tuple[str, str, int]]:
        out = []
        for q in ("a?", "", "b?", "c?"):
            a = await ch.ask(q)
            out.append((a.state, a.answer, ch.remaining))
        return out

    assert run(go()) == [
        ("timeout", TIMEOUT, 1),
        ("invalid", EMPTY_QUESTION, 1),  # an empty question does not use the quota
        ("timeout", TIMEOUT, 0),
        ("over_budget", "enough", 0),
    ]


def test_over_quota_is_refused_while_earlier_questions_still_wait() -> None:
    ch = HumanChannel(max_asks=1, timeout_s=None)

    async def go() -> tuple[str, str]:
        first = asyncio.create_task(ch.ask("first?"))
        waiting = await ch.next_ask()
        assert waiting is not None
        second = await ch.ask("second?")  # returns at once although first still waits
        assert not first.done()
        ch.answer(waiting.id, "ok")
        return (await first).state, second.state

    assert run(go()) == ("answered", "over_budget")


@pytest.mark.parametrize("timeout_s", [0, 0.0, -5])
def test_timeout_zero_or_less_fails_at_once(timeout_s: float) -> None:
    sink = Sink()
    ch = HumanChannel(on_event=sink, timeout_s=timeout_s)

    async def go() -> tuple[Ask, Ask | None]:
        a = await ch.ask("anyone?")
        return a, await ch.next_ask(timeout=0)

    a, pulled = run(go())
    assert (a.state, a.answer) == ("timeout", TIMEOUT)
    assert pulled is None  # never queued
    assert sink.states() == ["timeout"]  # never announced as waiting
    assert ch.pending() == []


def test_a_finite_timeout_waits_then_gives_the_timeout_text() -> None:
    sink = Sink()
    ch = HumanChannel(on_event=sink, timeout_s=0.05, timeout_text="gone")
    a = run(ch.ask("still there?"))
    assert (a.state, a.answer) == ("timeout", "gone")
    assert sink.states() == ["asked", "timeout"]
    assert ch.pending() == []
    assert ch.answer(a.id, "late") is False


def test_timeout_none_waits_until_answered() -> None:
    ch = HumanChannel(timeout_s=None)

    async def go() -> Ask:
        task = asyncio.create_task(ch.ask("take your time?"))
        done, _ = await asyncio.wait({task}, timeout=0.3)
        assert not done  # a timeout of None never fires
        ch.answer(ch.pending()[0].id, "done")
        return await task

    a = run(go())
    assert (a.state, a.answer) == ("answered", "done")


# ---- answering ------------------------------------------------------------------------------


def answer_from_thread(
    ch: HumanChannel, sink: Sink, act: Callable[[str], bool]
) -> tuple[threading.Thread, list[Any]]:
    """A thread that waits for the question to be announced, then settles it."""
    out: list[Any] = []

    def work() -> None:
        ev = sink.wait_for(asked)
        out.append(threading.get_ident())
        out.append(act(str(ev.payload["id"])))

    t = threading.Thread(target=work)
    t.start()
    return t, out


def test_answer_from_another_thread_while_ask_waits() -> None:
    sink = Sink()
    ch = HumanChannel(on_event=sink, timeout_s=WAIT)
    t, out = answer_from_thread(ch, sink, lambda i: ch.answer(i, "用 Postgres"))
    a = run(ch.ask("哪个数据库?", ["Postgres", "SQLite"]))
    t.join(WAIT)
    assert out[1] is True
    assert out[0] != threading.get_ident()
    assert (a.state, a.answer, a.options) == ("answered", "用 Postgres", ["Postgres", "SQLite"])
    assert sink.states() == ["asked", "answered"]
    assert ch.answer(a.id, "again") is False
    assert ch.decline(a.id) is False
    assert ch.answer("q999", "x") is False


@pytest.mark.parametrize(
    ("reason", "text"), [("", DECLINED), ("  先跳过 ", f"{DECLINED}(对方说:先跳过)")]
)
def test_decline_from_another_thread(reason: str, text: str) -> None:
    sink = Sink()
    ch = HumanChannel(on_event=sink, timeout_s=WAIT)
    t, out = answer_from_thread(ch, sink, lambda i: ch.decline(i, reason))
    a = run(ch.ask("要不要加缓存?"))
    t.join(WAIT)
    assert out[1] is True
    assert (a.state, a.answer) == ("declined", text)


def test_declined_text_is_the_channels() -> None:
    ch = HumanChannel(timeout_s=WAIT, declined_text="skip")

    async def go() -> Ask:
        task = asyncio.create_task(ch.ask("x?"))
        waiting = await ch.next_ask()
        assert waiting is not None
        assert ch.decline(waiting.id, "busy")
        return await task

    assert run(go()).answer == "skip(对方说:busy)"


def test_options_and_question_are_cleaned() -> None:
    ch = HumanChannel(timeout_s=0)
    a = run(ch.ask("  q?  ", ["", " a ", "b", None]))  # type: ignore[list-item]
    assert (a.question, a.options) == ("q?", ["a", "b"])
    assert run(ch.ask("q?", "only")).options == ["only"]  # type: ignore[arg-type]
    assert run(ch.ask("   ")).state == "invalid"


def test_a_cancelled_ask_stops_waiting_and_says_so() -> None:
    sink = Sink()
    ch = HumanChannel(on_event=sink, timeout_s=None)

    async def go() -> Ask:
        task = asyncio.create_task(ch.ask("x?"))
        assert await ch.next_ask() is not None
        assert len(ch.pending()) == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return ch.asks[0]

    a = run(go())
    assert a.state == "cancelled"
    assert ch.pending() == []
    assert sink.states() == ["asked", "cancelled"]
    assert ch.answer(a.id, "late") is False


# ---- push and pull ---------------------------------------------------------------------------


def test_push_mode_events_carry_the_question() -> None:
    sink = Sink()
    ch = HumanChannel(on_event=sink, max_asks=5, timeout_s=WAIT)
    t, _ = answer_from_thread(ch, sink, lambda i: ch.answer(i, "yes"))
    a = run(ch.ask("ok?", ["yes", "no"]))
    t.join(WAIT)
    first, last = sink.events
    assert (first.kind, first.text, first.raw) == ("ask", "ok?", a)
    assert first.payload["state"] == "asked"
    assert first.payload["options"] == ["yes", "no"]
    assert first.payload["remaining"] == 4
    assert set(first.payload) == {"id", "options", "state", "answer", "remaining", "asked_at"}
    assert (last.payload["state"], last.payload["answer"]) == ("answered", "yes")
    assert "kind" not in first.payload


def test_pull_mode_gets_each_waiting_question_once() -> None:
    ch = HumanChannel(timeout_s=WAIT)

    async def go() -> list[str]:
        puller = asyncio.create_task(ch.next_ask())  # waiting before anything is asked
        t1 = asyncio.create_task(ch.ask("one?"))
        got = await puller
        assert got is not None
        t2 = asyncio.create_task(ch.ask("two?"))
        got2 = await ch.next_ask(timeout=WAIT)
        assert got2 is not None
        assert await ch.next_ask(timeout=0.01) is None  # both were handed out already
        ch.answer(got.id, "1")
        ch.answer(got2.id, "2")
        return [got.question, got2.question, (await t1).answer, (await t2).answer]

    assert run(go()) == ["one?", "two?", "1", "2"]


def test_pull_mode_skips_questions_no_longer_waiting() -> None:
    ch = HumanChannel(timeout_s=0.01)

    async def go() -> Ask | None:
        await ch.ask("timed out before anyone pulled?")
        return await ch.next_ask(timeout=0.01)

    assert run(go()) is None


def test_next_ask_returns_none_on_timeout_and_raises_when_cancelled() -> None:
    ch = HumanChannel()

    async def go() -> None:
        assert await ch.next_ask(timeout=0.01) is None
        task = asyncio.create_task(ch.next_ask())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert ch._pullers == []

    run(go())


def test_ui_errors_are_collected_and_do_not_stop_the_question() -> None:
    def broken(ev: Event) -> None:
        raise RuntimeError("boom")

    ch = HumanChannel(on_event=broken, timeout_s=0)
    a = run(ch.ask("still works?"))
    assert a.state == "timeout"
    assert ch.ui_errors == ["RuntimeError: boom"]
    assert ch.send("hello") is not None
    assert ch.ui_errors == ["RuntimeError: boom", "RuntimeError: boom"]


# ---- the inbox and amendments -------------------------------------------------------------


def test_send_queues_mail_and_announces_it(tmp_path: Path) -> None:
    sink = Sink()
    brief = tmp_path / "需求.md"
    ch = HumanChannel(on_event=sink, amend_path=brief)
    assert ch.send("   ") is None
    m = ch.send("  顺便报告总字节数 ")
    assert m is not None
    assert (m.id, m.text, m.taken) == ("m1", "顺便报告总字节数", False)
    assert ch.pending_mail() == [m]
    assert ch.mail == [m]
    (ev,) = sink.events
    assert (ev.kind, ev.text) == ("ask", "顺便报告总字节数")
    assert ev.payload == {"kind": "mail", "state": "queued", "id": "m1", "amended": str(brief)}
    assert "顺便报告总字节数" in brief.read_text(encoding="utf-8")


def test_the_inbox_delivers_each_message_once(tmp_path: Path) -> None:
    sink = Sink()
    log = tmp_path / "notes" / "问答记录.md"
    ch = HumanChannel(on_event=sink, amend_path=tmp_path / "brief.md", log_path=log)

    async def go() -> tuple[str, str]:
        ch.send("加一个 --json 开关")
        ch.send("别动 Makefile")
        return await ch.serve("inbox", {}), await ch.serve("inbox", {})

    first, second = run(go())
    assert first == "\n".join(
        [MAIL_HEAD, "", "1. 加一个 --json 开关", "2. 别动 Makefile", "", MAIL_AMENDED]
    )
    assert second == NO_MAIL
    assert ch.pending_mail() == []
    assert all(m.taken for m in ch.mail)
    assert sink.states() == ["queued", "queued", "delivered", "delivered"]
    text = log.read_text(encoding="utf-8")
    assert "\n- **人主动说**(m1) 加一个 --json 开关\n" in text
    assert "\n- **人主动说**(m2) 别动 Makefile\n" in text


def test_the_inbox_warns_when_the_mail_was_not_kept() -> None:
    ch = HumanChannel()
    ch.send("no amend_path")
    text = run(ch.serve("inbox", {}))
    assert text.endswith(MAIL_NOT_KEPT)


def test_send_from_another_thread_is_announced_on_the_loop() -> None:
    seen: list[tuple[Event, int]] = []

    async def go() -> tuple[int, Mail | None]:
        mailed = asyncio.Event()

        def sink(ev: Event) -> None:  # called on the loop's thread, as on_event must be
            seen.append((ev, threading.get_ident()))
            if ev.payload.get("kind") == "mail":
                mailed.set()

        ch.on_event = sink
        await ch.ask("bind the loop?")
        box: list[Mail | None] = []
        t = threading.Thread(target=lambda: box.append(ch.send("from the UI thread")))
        t.start()
        await asyncio.to_thread(t.join, WAIT)
        await mailed.wait()
        return threading.get_ident(), box[0]

    ch = HumanChannel(timeout_s=0)
    loop_thread, m = run(go())
    assert m is not None and m.text == "from the UI thread"
    (ev, thread) = seen[1]
    assert ev.payload["kind"] == "mail"
    assert thread == loop_thread


def test_amend_appends_under_a_heading(tmp_path: Path) -> None:
    brief = tmp_path / "sub" / "需求.md"
    ch = HumanChannel(amend_path=brief)
    assert ch.amend("要支持中文文件名") is True
    assert ch.amend("醒来时说的", label="唤醒时追加") is True
    text = brief.read_text(encoding="utf-8")
    assert text.startswith("# 运行中的补充\n\n## 运行中补充(")
    assert "\n要支持中文文件名\n" in text
    assert "\n## 唤醒时追加(" in text
    assert text.endswith("\n醒来时说的\n")
    assert stat.S_IMODE(brief.stat().st_mode) == 0o600
    assert stat.S_IMODE(brief.parent.stat().st_mode) == 0o700


def test_amend_keeps_an_existing_file_and_its_mode(tmp_path: Path) -> None:
    brief = tmp_path / "需求.md"
    brief.write_text("# 需求确认书\n\n## 目标\n做一个 X\n", encoding="utf-8")
    brief.chmod(0o644)
    ch = HumanChannel(amend_path=brief)
    assert ch.amend("再加一个 Y")
    text = brief.read_text(encoding="utf-8")
    assert text.startswith("# 需求确认书\n\n## 目标\n做一个 X\n\n## 运行中补充(")
    assert "# 运行中的补充" not in text
    assert stat.S_IMODE(brief.stat().st_mode) == 0o644


def test_amend_says_false_when_it_wrote_nothing(tmp_path: Path) -> None:
    assert HumanChannel().amend("no path") is False
    ch = HumanChannel(amend_path=tmp_path / "b.md")
    assert ch.amend("   ") is False
    assert ch.amend("once") is True
    assert ch.amend("once", label="again") is False  # already appended
    assert (tmp_path / "b.md").read_text(encoding="utf-8").count("once") == 1
    (tmp_path / "dir.md").mkdir()
    assert HumanChannel(amend_path=tmp_path / "dir.md").amend("an OSError") is False


# ---- the Q&A log and the transcript --------------------------------------------------------


def test_the_log_is_appended_owner_only(tmp_path: Path) -> None:
    log = tmp_path / "wb" / "notes" / "问答记录.md"
    ch = HumanChannel(log_path=log, max_asks=2, timeout_s=0)

    async def go() -> None:
        await ch.ask("要支持 Windows 吗?", ["要", "不要"])
        await ch.ask("")
        await ch.ask("日志写哪?")
        await ch.ask("还有吗?")

    run(go())
    assert log.read_text(encoding="utf-8") == (
        "# 需求问答记录\n\n> 自动追加。这一份不进上下文,只作留档。\n\n"
        "- **Q**(q1) 要支持 Windows 吗?\n"
        "  - 选项:要 / 不要\n"
        f"  - **A**[timeout] {TIMEOUT}\n"
        "- **Q**(q2) \n"
        f"  - **A**[invalid] {EMPTY_QUESTION}\n"
        "- **Q**(q3) 日志写哪?\n"
        f"  - **A**[timeout] {TIMEOUT}\n"
        "- **Q**(q4) 还有吗?\n"
        f"  - **A**[over_budget] {OVER_BUDGET}\n"
    )
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    for d in (log.parent, log.parent.parent):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
    # A second channel on the same log appends, without a second header.
    run(HumanChannel(log_path=log, timeout_s=0).ask("again?"))
    text = log.read_text(encoding="utf-8")
    assert text.count("# 需求问答记录") == 1
    assert text.endswith(f"- **Q**(q1) again?\n  - **A**[timeout] {TIMEOUT}\n")


def test_an_unwritable_log_does_not_break_the_question(tmp_path: Path) -> None:
    (tmp_path / "log.md").mkdir()
    ch = HumanChannel(log_path=tmp_path / "log.md", timeout_s=0)
    assert run(ch.ask("fine?")).state == "timeout"


def test_transcript() -> None:
    ch = HumanChannel(timeout_s=0)
    run(ch.ask("a?", ["x", "y"]))
    run(ch.ask("b?"))
    assert ch.transcript() == (
        f"- Q: a?\n  选项: x / y\n  A: [timeout] {TIMEOUT}\n- Q: b?\n  A: [timeout] {TIMEOUT}"
    )
    assert HumanChannel().transcript() == ""


# ---- the MCP tools, called as the SDK calls them ------------------------------------------


class Server:
    """The channel's SDK MCP server driven the way the SDK's query drives it: raw JSON-RPC
    through the SDK's bridge (what a CLI's ``mcp_message`` control request reaches)."""

    def __init__(self, ch: HumanChannel) -> None:
        from claude_agent_sdk._internal.sdk_mcp_bridge import SdkMcpBridge

        servers = ch.mcp_servers()
        assert list(servers) == ["human"]
        config = servers["human"]
        assert (config["type"], config["name"]) == ("sdk", "human")
        self.bridge = SdkMcpBridge("human", config["instance"])
        self.ids = iter(range(1, 1000))

    async def request(self, method: str, params: dict[str, Any] | None = None) -> Any:
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": next(self.ids), "method": method}
        if params is not None:
            msg["params"] = params
        reply = await self.bridge.handle(msg)
        assert reply is not None and "result" in reply, reply
        return reply["result"]

    async def start(self) -> list[dict[str, Any]]:
        await self.request(
            "initialize",
            {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "test", "version": "0"},
            },
        )
        await self.bridge.handle({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return list((await self.request("tools/list"))["tools"])

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        result = await self.request("tools/call", {"name": name, "arguments": arguments})
        assert result["isError"] is False, result
        (content,) = result["content"]
        assert content["type"] == "text"
        return str(content["text"])


def with_server(ch: HumanChannel, body: Callable[[Server], Awaitable[Any]]) -> Any:
    async def go() -> Any:
        server = Server(ch)
        try:
            return await body(server)
        finally:
            await server.bridge.aclose()

    return run(go())


def test_the_server_lists_two_tools_with_their_schemas() -> None:
    async def body(s: Server) -> list[dict[str, Any]]:
        return await s.start()

    tools = {t["name"]: t for t in with_server(HumanChannel(), body)}
    assert set(tools) == {"ask", "inbox"}
    schema = tools["ask"]["inputSchema"]
    assert schema["required"] == ["question"]
    assert schema["properties"]["question"]["type"] == "string"
    assert schema["properties"]["options"] == {
        "type": "array",
        "items": {"type": "string"},
        "description": schema["properties"]["options"]["description"],
    }
    assert tools["inbox"]["inputSchema"] == {"type": "object", "properties": {}}


def test_the_server_is_marked_for_the_cli_to_offer_its_tools_directly() -> None:
    """Without alwaysLoad the CLI defers both tools behind ToolSearch (what the requests
    then carry: tests/test_e2e_tools.py)."""
    from flower.agents.agent import ALWAYS_LOAD

    (config,) = HumanChannel().mcp_servers().values()
    assert config[ALWAYS_LOAD] is True


def test_the_ask_tool_returns_the_answer() -> None:
    sink = Sink()
    ch = HumanChannel(on_event=sink, timeout_s=WAIT)
    t, _ = answer_from_thread(ch, sink, lambda i: ch.answer(i, "二号方案"))

    async def body(s: Server) -> str:
        await s.start()
        return await s.call("ask", {"question": "选哪个?", "options": ["一号", "二号"]})

    assert with_server(ch, body) == "二号方案"
    t.join(WAIT)
    assert ch.asks[0].options == ["一号", "二号"]


def test_the_ask_tool_never_raises() -> None:
    ch = HumanChannel(max_asks=1, timeout_s=0.01, timeout_text="T")
    declining = HumanChannel(timeout_s=WAIT)

    async def body(s: Server) -> list[str]:
        await s.start()
        return [
            await s.call("ask", {"question": "  "}),
            await s.call("ask", {"question": "first?"}),
            await s.call("ask", {"question": "over?"}),
        ]

    assert with_server(ch, body) == [EMPTY_QUESTION, "T", OVER_BUDGET]

    async def declined(s: Server) -> str:
        await s.start()
        task = asyncio.create_task(s.call("ask", {"question": "skip me?"}))
        waiting = await declining.next_ask()
        assert waiting is not None
        declining.decline(waiting.id, "不知道")
        return await task

    assert with_server(declining, declined) == f"{DECLINED}(对方说:不知道)"


def test_the_inbox_tool(tmp_path: Path) -> None:
    ch = HumanChannel(amend_path=tmp_path / "b.md")

    async def body(s: Server) -> list[str]:
        await s.start()
        empty = await s.call("inbox", {})
        ch.send("hello")
        return [empty, await s.call("inbox", {})]

    empty, full = with_server(ch, body)
    assert empty == NO_MAIL
    assert full == f"{MAIL_HEAD}\n\n1. hello\n\n{MAIL_AMENDED}"


# ---- serve, the relay seam, find_channel -----------------------------------------------------


def test_serve_is_the_whole_local_handling() -> None:
    ch = HumanChannel(timeout_s=0)
    assert run(ch.serve("ask", {"question": "x?", "options": ["a"]})) == TIMEOUT
    assert ch.asks[0].options == ["a"]
    assert run(ch.serve("ask", {})) == EMPTY_QUESTION
    assert run(ch.serve("inbox", {})) == NO_MAIL
    with pytest.raises(ValueError, match="unknown"):
        run(ch.serve("shout", {}))


def test_a_relay_takes_the_tool_calls_instead_of_serve() -> None:
    calls: list[tuple[HumanChannel, str, dict[str, Any]]] = []

    async def relay(channel: HumanChannel, op: str, args: dict[str, Any]) -> str:
        calls.append((channel, op, args))
        return f"relayed {op}"

    ch = HumanChannel(timeout_s=0)
    set_relay(relay)

    async def body(s: Server) -> list[str]:
        await s.start()
        return [
            await s.call("ask", {"question": "q?", "options": ["a", "b"]}),
            await s.call("ask", {"question": "no options?"}),
            await s.call("inbox", {}),
        ]

    assert with_server(ch, body) == ["relayed ask", "relayed ask", "relayed inbox"]
    assert calls == [
        (ch, "ask", {"question": "q?", "options": ["a", "b"]}),
        (ch, "ask", {"question": "no options?", "options": []}),
        (ch, "inbox", {}),
    ]
    assert ch.asks == []  # this copy talked to nobody

    set_relay(None)

    async def local(s: Server) -> str:
        await s.start()
        return await s.call("ask", {"question": "here?"})

    assert with_server(ch, local) == TIMEOUT
    assert len(ch.asks) == 1


def test_a_failing_relay_leaves_the_model_a_text() -> None:
    async def broken(channel: HumanChannel, op: str, args: dict[str, Any]) -> str:
        raise ConnectionError("pipe closed")

    set_relay(broken)
    ch = HumanChannel(timeout_text="nobody")

    async def body(s: Server) -> list[str]:
        await s.start()
        return [await s.call("ask", {"question": "q?"}), await s.call("inbox", {})]

    assert with_server(ch, body) == ["nobody", NO_MAIL]


def test_a_relay_serving_the_supervisors_copy() -> None:
    """The intended use: the child's handler relays, the supervisor finds its own copy by
    key and serves it (here both copies are one object; the key is what travels)."""
    sink = Sink()
    ch = HumanChannel(on_event=sink, timeout_s=WAIT)

    async def relay(channel: HumanChannel, op: str, args: dict[str, Any]) -> str:
        target = find_channel(channel.key)
        assert target is not None
        return await target.serve(op, args)

    set_relay(relay)
    t, _ = answer_from_thread(ch, sink, lambda i: ch.answer(i, "relayed answer"))

    async def body(s: Server) -> str:
        await s.start()
        return await s.call("ask", {"question": "through the pipe?"})

    assert with_server(ch, body) == "relayed answer"
    t.join(WAIT)


def test_find_channel_by_key() -> None:
    a, b = HumanChannel(), HumanChannel()
    assert a.key != b.key
    assert a.key.startswith(f"hc-{os.getpid()}-")
    assert find_channel(a.key) is a
    assert find_channel(b.key) is b
    assert find_channel("hc-nope") is None
    key = a.key
    del a
    gc.collect()
    assert find_channel(key) is None  # a weak registry: it keeps nothing alive


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_keeps_the_key() -> None:
    ch = HumanChannel(timeout_s=0)
    ch._lock.acquire()  # held at fork time, as by another thread: the child must not hang
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        try:
            ok = find_channel(ch.key) is ch and ch.pending() == []
            os.write(write, f"{ch.key} {ok}".encode())
        finally:
            os._exit(0)
    ch._lock.release()
    os.close(write)
    said = ""
    try:
        # Bounded: a child stuck on the inherited lock is killed, never left behind.
        ready, _, _ = select.select([read], [], [], WAIT)
        said = os.read(read, 1000).decode() if ready else ""
    finally:
        os.close(read)
        if not said:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    assert said, "the child did not answer: it hung on the lock it inherited"
    assert os.waitstatus_to_exitcode(status) == 0
    assert said == f"{ch.key} True"


def test_module_level_relay_is_reset_by_none() -> None:
    async def relay(channel: HumanChannel, op: str, args: dict[str, Any]) -> str:
        return ""

    set_relay(relay)
    assert human._relay is relay
    set_relay(None)
    assert human._relay is None
