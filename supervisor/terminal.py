"""The supervisor owns the terminal: it prints progress and asks the person things.

Children never touch the terminal (their stdio goes to per-step logs); whatever they want
shown or asked arrives as ``event`` / ``ask`` messages and is rendered here.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import sys
import unicodedata
from typing import Any, TextIO

from flower.core.result import Event, StepResult
from flower.util.sanitize import clean

from .placement import DIED

RULE_WIDTH = 38


def width(text: str) -> int:
    """Terminal columns: East Asian wide and full-width characters take two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def rule(name: str) -> str:
    """seed 000's step header ``== 干活 =====…``, RULE_WIDTH columns wide (at least ``===``)."""
    head = f"== {name} "
    return head + "=" * max(3, RULE_WIDTH - width(head))


def kilo(n: int) -> str:
    return f"{n / 1000:.1f}K" if n >= 1000 else str(n)


class Terminal:
    """Renders events; reads a line from the person without blocking the event loop."""

    def __init__(self, out: TextIO | None = None, *, stdin_fd: int = 0) -> None:
        self.out = out or sys.stdout
        self.stdin_fd = stdin_fd
        self.woke = 1
        self._reused: set[str] = set()
        self.channel: Any = None  # the flow's HumanChannel: its questions are answered here
        self._asking: dict[str, asyncio.Task[None]] = {}
        self._waiters: collections.deque[asyncio.Future[str | None]] = collections.deque()
        self._buf = bytearray()
        self._reading = False
        self._eof = False

    def say(self, text: str = "") -> None:
        """One line for the person. Model and tool text reaches here too: every escape
        sequence and control character is removed first (flower.util.sanitize)."""
        print(clean(text), file=self.out, flush=True)

    # -- banners ----------------------------------------------------------------------

    def _ev_wake(self, ev: Event) -> None:
        """seed 000: report the wake, or "does it remember?" is invisible."""
        p = ev.payload
        self.woke = int(p.get("woke", 1))
        parts = [str(x) for x in p.get("lead") or []]
        parts += [f"{name}上下文 {kilo(n)}" for name, n in (p.get("contexts") or {}).items() if n]
        parts.append(f"第 {self.woke} 次唤醒")
        self.say(f"<- 在 {_home(str(p.get('workspace', '')))} 接上上次  " + " · ".join(parts))

    def on_event(self, ev: Event) -> None:
        handler = getattr(self, f"_ev_{ev.kind}", None)
        if handler is not None:
            handler(ev)

    def _ev_step(self, ev: Event) -> None:
        p = ev.payload
        pos = f"{p.get('index', 0) + 1}/{p.get('total', 1)}"
        name = ev.text or ev.step  # Event("step"): the text is the step's name
        head = rule(name) + f"  {pos}"
        if p.get("reused"):
            self._reused.add(name)
            self.say(f"{head}  ✓ 上次已完成,输入没变,直接复用(不再发给模型)")
        elif p.get("resumed"):
            self.say(f"{head}  <- 接上次 · 第 {p.get('woke', self.woke)} 次唤醒")
        else:
            self.say(head)

    def _ev_text(self, ev: Event) -> None:
        if ev.payload.get("subagent"):
            return  # a worker's prose stays in its own transcript; its report reaches the main
        text = ev.text.strip()
        if text:
            self.say("  " + text.replace("\n", "\n  "))

    def _ev_retry(self, ev: Event) -> None:
        p = ev.payload
        if DIED in str(p.get("error", "")):
            self.say(
                f"  … 步骤子进程意外退出,{p.get('delay', 0)} 秒后换一个子进程接着同一条会话"
                f"(第 {p.get('attempt')} 次失败)"
            )
        else:
            self.say(
                f"  … API 暂时不可用:网络通了再等 {p.get('delay', 0)} 秒,在同一条会话上接着做"
                f"(第 {p.get('attempt')} 次失败)"
            )

    def _ev_offline(self, ev: Event) -> None:
        p = ev.payload
        self.say(
            f"  … 连不上 API,等网络恢复(已等 {p.get('elapsed', 0)} 秒,"
            f"每 {p.get('interval', 0):g} 秒探一次;Ctrl-C 可以打断)"
        )

    def _ev_handoff(self, ev: Event) -> None:
        p = ev.payload
        phase = p.get("phase")
        if phase == "near":
            self.say(
                f"  … 上下文 {kilo(int(p.get('used', 0)))} / {kilo(int(p.get('window', 0)))},快满了"
            )
        elif phase == "writing":
            self.say("  … 上下文满了,正在写交接书,换一条新会话接手")
        elif phase == "done":
            where = p.get("path") or "(没有工作台,未落盘)"
            kind = "降级交接书" if p.get("degraded") else "交接书"
            self.say(f"  … {kind}已写好:{where},新会话接手")

    def _ev_ask(self, ev: Event) -> None:
        """A question from the flow's HumanChannel (or something the person said)."""
        p = ev.payload
        if p.get("kind") == "mail":
            self.say(f"  ~ 你说:{ev.text}")
            return
        qid = str(p.get("id", ""))
        if p.get("state") != "asked":  # settled: at once (unattended, quota …) or meanwhile
            waiting = self._asking.pop(qid, None)
            if waiting is None:
                self.say(f"? {ev.text}  ({p.get('state')})")
            elif not waiting.done():
                waiting.cancel()  # nobody answered in time: its prompt gives its place up
                self.say(f"  ({p.get('state')}: {ev.text})")
            return
        task = asyncio.get_running_loop().create_task(self._answer(ev))
        self._asking[qid] = task
        task.add_done_callback(lambda _t: self._asking.pop(qid, None))

    async def _answer(self, ev: Event) -> None:
        options = [str(o) for o in ev.payload.get("options") or []]
        self._show_question(ev.text, options)
        line = pick(await self.read_line("> (回车 = 跳过,让它自己判断) "), options)
        ch, qid = self.channel, str(ev.payload.get("id", ""))
        if ch is None:
            return
        if line:
            ch.answer(qid, line)
        else:
            ch.decline(qid)

    def _ev_task(self, ev: Event) -> None:
        """goal_step's warning: checks that cannot be verified here fail every verdict."""
        doomed = ev.payload.get("unverifiable")
        if doomed:
            self.say(f"! {ev.text}")
            for item in doomed:
                self.say(f"    - {item}")

    def step_done(self, result: StepResult) -> None:
        if result.step in self._reused:
            return  # the step line already said so; its old cost was not spent again
        mark = "✓" if result.ok else "✗"
        extra = f"  {result.error}" if result.error else ""
        self.say(
            f"   {mark} {result.step}  {result.duration_s:.1f}s · ${result.cost_usd:.4f}{extra}"
        )

    # -- asking -----------------------------------------------------------------------

    async def read_line(self, prompt: str) -> str | None:
        """One line typed by the person; None when stdin is closed or not readable.

        One reader serves every prompt (a question and the Ctrl-C sentence may wait at the
        same time): lines go to the waiting prompts oldest first, a line typed before any
        prompt waits for the next one, and a cancelled prompt gives its place up."""
        self.out.write(prompt)
        self.out.flush()
        line = self._take_line()
        if line is not None or self._eof:
            return line
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[str | None] = loop.create_future()
        self._waiters.append(fut)
        if not self._reading:
            try:
                loop.add_reader(self.stdin_fd, self._on_readable)
            except (OSError, ValueError, PermissionError):
                self._waiters.remove(fut)
                return None
            self._reading = True
        try:
            return await fut
        finally:
            if fut in self._waiters:
                self._waiters.remove(fut)
            if not self._waiters and self._reading:
                self._stop_reading()

    def _take_line(self) -> str | None:
        if b"\n" not in self._buf:
            return None
        raw, _, rest = bytes(self._buf).partition(b"\n")
        self._buf[:] = rest
        return raw.decode("utf-8", "replace").strip()

    def _on_readable(self) -> None:
        try:
            data = os.read(self.stdin_fd, 4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._eof = True
            last = bytes(self._buf).decode("utf-8", "replace").strip() or None
            self._buf.clear()
            self._stop_reading()
            for fut in list(self._waiters):
                if not fut.done():
                    fut.set_result(last)
                    last = None
            return
        self._buf.extend(data)
        while self._waiters and b"\n" in self._buf:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(self._take_line())

    def _stop_reading(self) -> None:
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            asyncio.get_running_loop().remove_reader(self.stdin_fd)
        self._reading = False

    async def ask(self, msg: Any) -> str | None:
        options = [str(o) for o in getattr(msg, "options", []) or []]
        self._show_question(str(msg.question), options)
        return pick(await self.read_line("> "), options)

    def _show_question(self, question: str, options: list[str]) -> None:
        self.say(f"? {question}")
        for i, opt in enumerate(options, 1):
            self.say(f"  {i}. {opt}")


def pick(line: str | None, options: list[str]) -> str | None:
    """What the person chose: an option's number means that option, else what they typed."""
    if line and options and line.isdigit() and 1 <= int(line) <= len(options):
        return options[int(line) - 1]
    return line


class WarningLines(logging.Handler):
    """flower's warnings (a damaged file set aside, a lineage write that failed, …) as one
    ``! …`` line each on the terminal: failures on the continuity path are never silent."""

    def __init__(self, term: Terminal) -> None:
        super().__init__(logging.WARNING)
        self.term = term

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string must not take the run down
            text = str(record.msg)
        self.term.say("! " + " ".join(text.split("\n")))


def show_warnings(term: Terminal) -> WarningLines:
    """Route the ``flower`` logger's warnings to ``term`` (returns the handler)."""
    handler = WarningLines(term)
    logger = logging.getLogger("flower")
    logger.addHandler(handler)
    return handler


def _home(path: str) -> str:
    home = os.path.expanduser("~")
    return "~" + path[len(home) :] if home != "/" and path.startswith(home) else path
