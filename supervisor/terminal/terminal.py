"""The supervisor owns the terminal: it prints progress and talks with the person.

Children never touch the terminal (their stdio goes to per-step logs); whatever they want
shown or asked arrives as ``event`` / ``ask`` messages and is rendered here.

While a run works the terminal reads the person the whole time (:meth:`Terminal.listen`),
one line at a time, and a line goes to exactly one place:

- a prompt that waits for it (:meth:`Terminal.read_line`: the Ctrl-C sentence);
- else the oldest question waiting for an answer: Enter skips it, a number picks that
  option, other text is the answer;
- else the inbox: appended to 需求.md, seen by the worker the next time it looks;
- a line starting with ``?`` or ``？`` goes to the oracle instead, question or not.

One voice per block: a step's header (``== 干活 ===…  3/3``) opens its block, and an attempt
of another label (a judge round ``干活·判定#1``, ``干活#round2``, ``#retryN``) opens a block of
its own under its label, so a judge never speaks inside the worker's block. Every manifest
row this process writes gets its cost on a line of its own the moment it is recorded
(:meth:`Terminal.row_done`; a map step's items are summed on the step's line), so the lines
above ``总花费 $X`` add up to it.

On a terminal the last line is always the input prompt: every line printed first erases it
and then draws it again below. Model and tool text is printed without any escape sequence
or control character (:func:`flower.util.sanitize.clean`); the only escapes that reach the
terminal are flower's own SGR colours.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from flower.i18n import define, t
from flower.state.result import Event, StepResult
from flower.step.placement import DIED
from flower.step.resilience import DEFAULT_BASE_URL, LOCAL, TRANSIENT, classify
from flower.util.sanitize import clean
from supervisor.terminal.columns import cut, fit, line_width, width
from supervisor.terminal.oracle import is_question

RULE_WIDTH = 38
MAX_WIDTH = 110  # the reference: max(40, min(terminal columns, 110))
# Seconds between two status lines while one step runs (FLOWER_STATUS_EVERY overrides).
STATUS_EVERY_S = 30.0
RED, DIM, RESET = "\x1b[31m", "\x1b[2m", "\x1b[0m"

define(
    {
        "setup.offline": (
            "! 连不上 {host}:{port}({base});要用模型的步骤会等它恢复,每 {every} 秒探一次,"
            "最多等 {minutes} 分钟(Ctrl-C 停)",
            "! cannot reach {host}:{port} ({base}); a step that needs the model waits for it, "
            "probing every {every} s for up to {minutes} min (Ctrl-C to stop)",
        ),
        "setup.offline.gave_up": (
            "{host}:{port} {minutes} 分钟都没应答",
            "{host}:{port} did not answer for {minutes} min",
        ),
        "setup.offline.hint": (
            "查一下网络;用网关的话查 ANTHROPIC_BASE_URL",
            "check the network, or ANTHROPIC_BASE_URL if you use a gateway",
        ),
        "term.placed": (
            "@ 在 {host} 上跑(worker pid {pid})",
            "@ running on {host} (worker pid {pid})",
        ),
        "term.placed.fresh": (
            "@ 原来的 worker 没了,这一步的会话还没存下:{host} 从头开始它(worker pid {pid},"
            "第 {n} 次派发)",
            "@ its worker is gone before the step's session was stored: {host} starts it "
            "afresh (worker pid {pid}, dispatch try {n})",
        ),
        "term.refused": (
            "! {host}(worker pid {pid})跑不了它,还回队列,等一个能跑的 worker:{why}",
            "! {host} (worker pid {pid}) cannot run it and handed it back; waiting for a "
            "worker that can: {why}",
        ),
        "term.placed.again": (
            "@ 原来的 worker 没了,{host} 接着跑同一个会话(worker pid {pid},第 {n} 次派发)",
            "@ its worker is gone: {host} carries on the same session (worker pid {pid}, "
            "dispatch try {n})",
        ),
        "term.wake": ("<- 在 {where} 接上上次  {parts}", "<- carrying on in {where}  {parts}"),
        "term.wake.context": ("{name}上下文 {size}", "{name} context {size}"),
        "term.wake.count": ("第 {n} 次唤醒", "wake {n}"),
        "term.step.reused": (
            "+ {step}(跳过 —— 缓存:{scope};输入没变,不再发给模型)",
            "+ {step} (skipped — cache: {scope}; same input, not sent to the model again)",
        ),
        "term.step.resumed": ("<- 接上次 · 第 {n} 次唤醒", "<- carrying on · wake {n}"),
        "term.retry.died": (
            "~ 步骤子进程意外退出,{delay} 秒后换一个子进程接着同一条会话(第 {n} 次失败)",
            "~ the step's child process died; a new one carries the same session on in "
            "{delay} s (failure {n})",
        ),
        "term.retry.died.fresh": (
            "~ 步骤子进程意外退出,会话还没存下:{delay} 秒后换一个子进程从头开始这一步"
            "(第 {n} 次失败)",
            "~ the step's child process died before its session was stored; a new one starts "
            "the step afresh in {delay} s (failure {n})",
        ),
        "term.retry.api": (
            "~ API 暂时不可用:网络通了再等 {delay} 秒,在同一条会话上接着做(第 {n} 次失败)",
            "~ the API is unavailable for now: {delay} s after the network is back it carries "
            "on in the same session (failure {n})",
        ),
        "term.retry.other": (
            "~ 这次尝试失败了({error}):{delay} 秒后在同一条会话上接着做(第 {n} 次失败)",
            "~ this attempt failed ({error}); it carries on in the same session in {delay} s "
            "(failure {n})",
        ),
        "term.fresh": (
            "~ 会话 {session} 接不上了(CLI 说没有这段对话,多半是上次在提示落盘前就被杀了):"
            "这一步用自己的提示开新会话重来",
            "~ session {session} cannot be resumed (the CLI has no conversation for it, most "
            "likely killed before its prompt was stored): the step starts a fresh session with "
            "its own prompt",
        ),
        "term.step.local": (
            "x {step}  {duration} · ${cost:.4f}  Claude Code 在本机就出错了,一个请求都没发出"
            "(不是网络问题,不重试):{error}",
            "x {step}  {duration} · ${cost:.4f}  Claude Code failed on this machine before "
            "sending any request (not the network; not retried): {error}",
        ),
        "term.offline": (
            "~ 连不上 API,等网络恢复(已等 {elapsed} 秒,每 {every} 秒探一次;Ctrl-C 可以打断)",
            "~ cannot reach the API; waiting for the network (waited {elapsed} s, probing "
            "every {every} s; Ctrl-C interrupts)",
        ),
        "term.handoff.near": (
            "# 上下文 {used}/{window},快满了",
            "# context {used}/{window}: nearly full",
        ),
        "term.handoff.writing": (
            "# 上下文 {used}/{window} —— 写交接准备换代",
            "# context {used}/{window}: writing a handoff for a new session",
        ),
        "term.handoff.doing": ("现在在做", "doing now"),
        "term.handoff.decided": ("已定的事", "decided"),
        "term.handoff.deadends": ("走不通的", "dead ends"),
        "term.handoff.next": ("下一步", "next"),
        "term.handoff.degraded": (
            "交接没写成,用了降级版本 —— 接手的人会自己去现场看",
            "the handoff could not be written; a degraded one is used (the successor looks "
            "at the workspace itself)",
        ),
        "term.handoff.where": ("<- 交接写在 {path}", "<- the handoff is in {path}"),
        "term.handoff.nowhere": (
            "<- 交接没落盘(没有工作台)",
            "<- the handoff was not saved (no workbench)",
        ),
        "term.handoff.new": (
            "<- 新会话接手,上下文从 {used} 重新开始",
            "<- a new session takes over; the context starts again from {used}",
        ),
        "term.asked": ("? {question}", "? {question}"),
        "term.option": ("   {i}) {option}", "   {i}) {option}"),
        "term.remaining": ("   (还能问 {n} 次)", "   ({n} more {n|question|questions} allowed)"),
        "term.answered": ("+ {answer}", "+ {answer}"),
        "term.timeout": (
            "! 无人应答 —— 它会自己判断,把假设记进「未知与假设」",
            "! nobody answered: it decides itself and writes its assumption down",
        ),
        "term.over_budget": ("! 提问额度用完", "! the question quota is used up"),
        "term.declined": (". 已跳过", ". skipped"),
        "term.invalid": ("! 问题是空的", "! the question was empty"),
        "term.cancelled": (". 提问撤回了", ". the question was withdrawn"),
        "term.prompt.answer": (
            "你的回答 (回车=跳过,让它自己判断) > ",
            "your answer (Enter = skip, let it decide) > ",
        ),
        "term.prompt.idle": (
            "(直接说 = 加需求,下个检查点送达;? 开头 = 顺便问一句,不打扰它干活) > ",
            "(type = add to the request, delivered at its next check; start with ? = ask on "
            "the side without disturbing it) > ",
        ),
        "term.received": (
            "+ 收到 (它下次查收件箱时会看到;已追加进确认书)",
            "+ received (it sees this the next time it checks its inbox; appended to the brief)",
        ),
        "term.received.unkept": (
            "+ 收到 (它下次查收件箱时会看到;没有确认书可落盘 —— 它可能活不过下一个步骤)",
            "+ received (it sees this the next time it checks its inbox; there is no brief to "
            "keep it in, so it may not outlive the next step)",
        ),
        "term.delivered": ("+ 它看到了:{text}", "+ it has read: {text}"),
        "term.no_inbox": (
            "! 这个流程没有收件箱,这句话没人收:{text}",
            "! this flow has no inbox; nobody receives: {text}",
        ),
        "term.no_oracle": (
            "! 这里没有旁路顾问,问题没发出去",
            "! there is no oracle here; the question was not sent",
        ),
        "term.task": ("! {text}", "! {text}"),
        "term.step.ok": (
            "+ {step}  {duration} · ${cost:.4f}",
            "+ {step}  {duration} · ${cost:.4f}",
        ),
        "term.step.failed": (
            "x {step}  {duration} · ${cost:.4f}  {error}",
            "x {step}  {duration} · ${cost:.4f}  {error}",
        ),
        "term.status": (
            "- {step} · {turns} 轮 · 工具 {tools} 次 · 上下文 {context} · 累计 ${cost:.4f} · "
            "用时 {elapsed}",
            "- {step} · {turns} {turns|turn|turns} · {tools} {tools|tool call|tool calls} · "
            "context {context} · "
            "so far ${cost:.4f} · {elapsed}",
        ),
        "term.closing": (
            "总花费 ${cost:.4f} · 清单 {path}",
            "total cost ${cost:.4f} · manifest {path}",
        ),
        "term.tool": ("* {tool}  {text}", "* {tool}  {text}"),
        "term.tool_result": ("  -> {text}", "  -> {text}"),
        "term.tool_error": ("x {tool} 失败:{text}", "x {tool} failed: {text}"),
    }
)


def rule(name: str) -> str:
    """seed 000's step header ``== 干活 =====…``, RULE_WIDTH columns wide (at least ``===``)."""
    head = f"== {name} "
    return head + "=" * max(3, RULE_WIDTH - width(head))


def kilo(n: int) -> str:
    return f"{n / 1000:.1f}K" if n >= 1000 else str(n)


def kilo_window(n: int) -> str:
    """A window size as the reference writes it: ``1000K``, ``200K``."""
    return f"{n // 1000}K" if n >= 1000 and n % 1000 == 0 else kilo(n)


def clock(seconds: float) -> str:
    """``m:ss`` (``h:mm:ss`` past an hour)."""
    s = max(0, int(seconds))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def wrap(text: str, cols: int, indent: str = "  ") -> list[str]:
    """``text`` cut into lines of at most ``cols`` columns (wide characters count two),
    each prefixed with ``indent``; breaks at spaces when it can."""
    out: list[str] = []
    room = max(10, cols - width(indent))
    for para in text.split("\n"):
        line, used = "", 0
        for word in _words(para):
            w = width(word)
            if used + w > room and line:
                out.append(indent + line.rstrip())
                line, used = "", 0
                word = word.lstrip()
                w = width(word)
            while w > room:  # one word wider than the line: cut it
                head, rest = cut(word, room)
                out.append(indent + head)
                word, w = rest, width(rest)
            line += word
            used += w
        out.append(indent + line.rstrip())
    return out


def _words(text: str) -> list[str]:
    """Words with their leading space; each wide character is a word of its own."""
    words: list[str] = []
    cur = ""
    for c in text:
        if c == " " or width(c) == 2:
            if cur:
                words.append(cur)
            cur = c
            if c != " ":
                words.append(cur)
                cur = ""
        else:
            cur += c
    if cur:
        words.append(cur)
    return words


@dataclass
class _Question:
    """A question waiting for the person: how to give it the line they type."""

    qid: str
    options: list[str]
    settle: Callable[[str | None], None]  # the chosen text; None = skip


class Terminal:
    """Renders events; reads the person without blocking the event loop."""

    def __init__(
        self,
        out: TextIO | None = None,
        *,
        stdin_fd: int = 0,
        verbose: bool = False,
        err: TextIO | None = None,
    ) -> None:
        self.out = out or sys.stdout
        self.errout = err or (sys.stderr if out is None else self.out)
        self.stdin_fd = stdin_fd
        self.verbose = verbose
        self.woke = 1
        self.channel: Any = None  # the flow's HumanChannel: its questions are answered here
        self.oracle: Any = None  # supervisor.terminal.oracle.Oracle: where ``?`` lines go
        self.rt: Any = None  # the Runtime, for the cost so far
        self.cols = line_width(MAX_WIDTH)
        self.stdin_tty = _isatty_fd(stdin_fd)
        self.interactive = _isatty(self.out) and self.stdin_tty
        self.colour = _isatty(self.out) and not os.environ.get("NO_COLOR")
        self.status_every = _float_env("FLOWER_STATUS_EVERY", STATUS_EVERY_S)
        self._reused: set[str] = set()
        self._refusals: set[tuple[Any, ...]] = set()  # (label, host, pid, why) said once
        self._block = ""  # the label whose block is on the screen now ("" before any step)
        self._map = ""  # the map step running now: its items' rows are summed on its line
        self._map_spent = 0.0
        self._questions: dict[str, _Question] = {}
        self._handed: set[str] = set()  # questions given a line, their outcome not shown yet
        self._waiters: collections.deque[tuple[asyncio.Future[str | None], str]] = (
            collections.deque()
        )
        self._buf = bytearray()
        self._reading = False
        self._listening = False
        self._eof = False
        self._shown = ""  # the prompt on the last line now (interactive only)
        self._step: dict[str, Any] = {}
        self._status: asyncio.Task[None] | None = None
        self._handoff_used = 0
        self.stop_reason = ""  # why the run stopped, when a step stopped it
        self._map_total = self._map_done = 0  # the items of the map step running now

    # -- output -------------------------------------------------------------------------

    def say(self, text: str = "", *, colour: str = "") -> None:
        """One line for the person. Model and tool text reaches here too: every escape
        sequence and control character is removed first (flower.util.sanitize)."""
        body = clean(text)
        if colour and self.colour:
            body = colour + body + RESET
        self._emit(self.out, body + "\n")

    def err(self, text: str) -> None:
        """One line on stderr (a stop's reason)."""
        self._emit(self.errout, clean(text) + "\n")

    def _emit(self, stream: TextIO, text: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            if self._shown:
                self.out.write("\r" + " " * width(self._shown) + "\r")
                if stream is not self.out:
                    self.out.flush()
            stream.write(text)
            stream.flush()
            if self._shown:
                self.out.write(self._shown)
                self.out.flush()

    def _redraw(self) -> None:
        """Put the right prompt on the last line (interactive only)."""
        want = self._prompt() if self.interactive else ""
        if want == self._shown:
            return
        with contextlib.suppress(OSError, ValueError):
            if self._shown:
                self.out.write("\r" + " " * width(self._shown) + "\r")
            self._shown = want
            self.out.write(want)
            self.out.flush()

    def _prompt(self) -> str:
        if self._eof:
            return ""
        if self._waiters:
            text = self._waiters[0][1]
        elif self._questions:
            text = t("term.prompt.answer")
        elif self._listening:
            text = t("term.prompt.idle")
        else:
            return ""
        # Redrawn with a carriage return, so it must fit on one row.
        return text if width(text) < self.cols else "> "

    def closing(self, rt: Any) -> None:
        """The last line: what this process spent, and where the manifest is."""
        self.say(t("term.closing", cost=rt.total_cost(), path=rt.manifest_path))

    # -- banners ------------------------------------------------------------------------

    def _ev_wake(self, ev: Event) -> None:
        """seed 000: report the wake, or "does it remember?" is invisible."""
        p = ev.payload
        self.woke = int(p.get("woke", 1))
        parts = [str(x) for x in p.get("lead") or []]
        parts += [
            t("term.wake.context", name=name, size=kilo(n))
            for name, n in (p.get("contexts") or {}).items()
            if n
        ]
        parts.append(t("term.wake.count", n=self.woke))
        where = _home(str(p.get("workspace", "")))
        self.say(t("term.wake", where=where, parts=" · ".join(parts)))

    def on_event(self, ev: Event) -> None:
        if self.oracle is not None:
            self.oracle.recent.add(ev)  # the oracle's window of recent events
        self._follow(ev)
        self._count(ev)
        handler = getattr(self, f"_ev_{ev.kind}", None)
        if handler is not None:
            handler(ev)

    def _ev_step(self, ev: Event) -> None:
        p = ev.payload
        if p.get("item_done"):  # one item of a map step finished (or was reused)
            self._map_done += 1
            mark = "+" if p.get("ok", True) else "x"
            self.say(f"  {mark} {ev.text}  {self._map_done}/{self._map_total}")
            return
        name = ev.text or ev.step  # Event("step"): the text is the step's name
        self._map = name if "items" in p else ""
        if "items" in p:
            self._map_total, self._map_done, self._map_spent = int(p["items"]), 0, 0.0
        pos = f"{p.get('index', 0) + 1}/{p.get('total', 1)}"
        self._block = name
        head = rule(name) + f"  {pos}"
        if p.get("reused"):
            self._reused.add(name)
            scope = p.get("cache") or "run-only"
            self.say(f"{head}  {t('term.step.reused', step=name, scope=scope)}")
        elif p.get("resumed"):
            self.say(f"{head}  {t('term.step.resumed', n=p.get('woke', self.woke))}")
        else:
            self.say(head)
        self._began(name)

    def _follow(self, ev: Event) -> None:
        """An attempt of another label than the block on the screen (a judge round, the
        next round, a retry) opens a block of its own: ``== 干活·判定#1 ====…``. Questions
        and what the person said belong to no attempt; a map's items share their step's
        block; before the first step (``flower once``) there are no blocks."""
        if ev.kind not in ("step", "ask"):
            self._open(ev.step)

    def _open(self, label: str) -> None:
        if not label or label == self._block or not self._block or self._map:
            return
        self._block = label
        self.say(rule(label))
        self._began(label)

    def _ev_placed(self, ev: Event) -> None:
        """Where an attempt on a cluster runs (its worker's machine and pid; a takeover says
        so: an earlier try's worker died or froze, and this one continues its session)."""
        p = ev.payload
        takeover = bool(p["resumes"]) if "resumes" in p else int(p.get("try") or 1) > 1
        if takeover:
            key = "term.placed.again"
        elif p.get("took_over"):  # its worker died before anything of it was stored
            key = "term.placed.fresh"
        else:
            key = "term.placed"
        self.say("  " + t(key, host=p.get("host", "?"), pid=p.get("pid", "?"), n=p.get("try", 1)))

    def _ev_refused(self, ev: Event) -> None:
        """A worker that cannot run the attempt (the workspace or the flow is not there) has
        handed it back to the queue: said once per worker and reason, since it may try
        again every few seconds until a worker that can takes it."""
        p = ev.payload
        key = (ev.step, p.get("host"), p.get("pid"), ev.text)
        if key in self._refusals:
            return
        self._refusals.add(key)
        line = t("term.refused", host=p.get("host", "?"), pid=p.get("pid", "?"), why=ev.text)
        self.say("  " + line)

    def _ev_text(self, ev: Event) -> None:
        if ev.payload.get("subagent") and not self.verbose:
            return  # a worker's prose stays in its own transcript; its report reaches the main
        text = ev.text.strip()
        if text:
            bar = "| " if ev.payload.get("subagent") else ""
            for line in wrap(clean(text), self.cols, "  " + bar):
                self.say(line)

    def _ev_tool_call(self, ev: Event) -> None:
        if ev.tool.startswith("mcp__human__"):
            return  # questions and the inbox have their own lines
        bar = "| " if ev.payload.get("subagent") else ""
        text = fit(" ".join(clean(ev.text).split()), max(10, self.cols - width(ev.tool) - 8))
        self.say("  " + bar + t("term.tool", tool=ev.tool, text=text))

    def _ev_tool_result(self, ev: Event) -> None:
        is_error = bool(ev.payload.get("is_error"))
        if not (is_error or self.verbose):
            return  # by default only a failing tool result is shown
        first = next((x for x in clean(ev.text).splitlines() if x.strip()), "")
        first = cut(first, max(10, self.cols - 16))[0]
        if is_error:
            tool = str(ev.payload.get("tool") or ev.tool or "tool")
            self.say("  " + t("term.tool_error", tool=tool, text=first), colour=RED)
        else:
            self.say("  " + t("term.tool_result", text=first), colour=DIM)

    def _ev_retry(self, ev: Event) -> None:
        """A failed attempt about to be retried: a dead child, the API (a transient error),
        or something else, said as what it is (only the API's line talks of the network)."""
        p = ev.payload
        error = str(p.get("error", ""))
        if DIED in error:
            key = "term.retry.died.fresh" if p.get("fresh") else "term.retry.died"
        elif p.get("kind") == TRANSIENT:
            key = "term.retry.api"
        else:
            key = "term.retry.other"
        line = t(key, delay=p.get("delay", 0), n=p.get("attempt"), error=fit(clean(error), 80))
        self.say("  " + line)

    def _ev_fresh(self, ev: Event) -> None:
        """The CLI refused to resume a session: the step starts a fresh one (one line)."""
        self.say("  " + t("term.fresh", session=str(ev.payload.get("session", "?"))[:8]))

    def _ev_offline(self, ev: Event) -> None:
        p = ev.payload
        self.say(
            "  " + t("term.offline", elapsed=p.get("elapsed", 0), every=f"{p.get('interval', 0):g}")
        )

    def _ev_context(self, ev: Event) -> None:
        used = int(ev.payload.get("used") or 0)
        if used:
            self._step["context"] = used

    def _ev_handoff(self, ev: Event) -> None:
        p = ev.payload
        phase = p.get("phase")
        window = int(p.get("window") or self._step.get("window") or 0)
        if phase == "near":
            used = kilo(int(p.get("used", 0)))
            self.say(t("term.handoff.near", used=used, window=kilo_window(window)))
        elif phase == "writing":
            self._handoff_used = int(p.get("used") or self._step.get("context") or 0)
            self.say(
                t("term.handoff.writing", used=kilo(self._handoff_used), window=kilo_window(window))
            )
        elif phase == "done":
            summary = p.get("summary") or {}
            for key in ("doing", "decided", "deadends", "next"):
                label = t(f"term.handoff.{key}")
                text = " ".join(clean(str(summary.get(key) or "—")).split())
                room = max(10, self.cols - 6 - max(width(label), 10))
                text = fit(text, room)
                self.say(f"  - {label}{' ' * max(1, 12 - width(label))}{text}")
            if p.get("degraded"):
                self.say(t("term.handoff.degraded"), colour=RED)
            path = p.get("path")
            self.say(
                t("term.handoff.where", path=_home(str(path)))
                if path
                else t("term.handoff.nowhere")
            )
            self.say(t("term.handoff.new", used=kilo(self._handoff_used)))

    def _ev_window(self, ev: Event) -> None:
        window = int(ev.payload.get("window") or 0)
        if window:
            self._step["window"] = window

    def _ev_task(self, ev: Event) -> None:
        """goal_step's warning: checks that cannot be verified here fail every verdict."""
        doomed = ev.payload.get("unverifiable")
        if doomed:
            self.say(t("term.task", text=ev.text))
            for item in doomed:
                self.say(f"    - {item}")

    # -- questions and the inbox ----------------------------------------------------------

    def _ev_ask(self, ev: Event) -> None:
        """A question from the flow's HumanChannel, or something the person said."""
        p = ev.payload
        if p.get("kind") == "mail":
            self._mail(ev)
            return
        qid = str(p.get("id", ""))
        state = str(p.get("state") or "")
        if state == "asked":
            options = [str(o) for o in p.get("options") or []]
            self._show_question(ev.text, options, int(p.get("remaining", -1)))
            if self._eof:  # nobody can type any more: it decides itself, now
                self._handed.add(qid)
                self._channel_settle(qid)(None)
                return
            self._questions[qid] = _Question(qid, options, self._channel_settle(qid))
            self._want_input()
            return
        was_waiting = self._questions.pop(qid, None) is not None or qid in self._handed
        self._handed.discard(qid)
        if not was_waiting:  # settled at once (unattended, quota, …): show what was asked
            self._show_question(ev.text, [str(o) for o in p.get("options") or []], -1)
        self._show_outcome(state, str(p.get("answer") or ""))
        self._redraw()

    def _mail(self, ev: Event) -> None:
        p = ev.payload
        if p.get("state") == "queued":
            self.say(t("term.received" if p.get("amended") else "term.received.unkept"))
        elif p.get("state") == "delivered" and self.verbose:
            self.say("  " + t("term.delivered", text=ev.text))

    def _show_question(self, question: str, options: list[str], remaining: int) -> None:
        self.say("  " + t("term.asked", question=question))
        for i, opt in enumerate(options, 1):
            self.say("  " + t("term.option", i=i, option=opt))
        if remaining >= 0:
            self.say("  " + t("term.remaining", n=remaining))

    def _show_outcome(self, state: str, answer: str) -> None:
        if state == "answered":
            self.say("  " + t("term.answered", answer=answer))
        elif state in ("timeout", "over_budget", "declined", "invalid", "cancelled"):
            self.say("  " + t(f"term.{state}"))

    def _channel_settle(self, qid: str) -> Callable[[str | None], None]:
        def settle(line: str | None) -> None:
            ch = self.channel
            if ch is None:
                return
            if line:
                ch.answer(qid, line)
            else:
                ch.decline(qid)

        return settle

    def questions_waiting(self) -> int:
        return len(self._questions)

    async def ask(self, msg: Any) -> str | None:
        """A question that came over the pipe without a channel: the answer, None = skip."""
        options = [str(o) for o in getattr(msg, "options", []) or []]
        self._show_question(str(msg.question), options, -1)
        fut: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        qid = f"pipe-{id(fut)}"

        def settle(line: str | None) -> None:
            if not fut.done():
                fut.set_result(line)

        self._questions[qid] = _Question(qid, options, settle)
        self._want_input()
        try:
            answer = await fut
        finally:
            self._questions.pop(qid, None)
            self._redraw()
        self._show_outcome("answered" if answer else "declined", answer or "")
        return answer

    # -- the status line ----------------------------------------------------------------------

    def _began(self, step: str) -> None:
        self._step = {"name": step, "began": time.monotonic(), "turns": 0, "tools": 0}
        if self._status is None and self.status_every > 0:
            with contextlib.suppress(RuntimeError):
                self._status = asyncio.get_running_loop().create_task(self._status_loop())

    def _count(self, ev: Event) -> None:
        if not self._step or ev.payload.get("subagent"):
            return
        if ev.kind == "context" and not ev.payload.get("final"):
            self._step["turns"] = int(self._step.get("turns", 0)) + 1
        elif ev.kind == "tool_call":
            self._step["tools"] = int(self._step.get("tools", 0)) + 1

    async def _status_loop(self) -> None:
        """A status line every ``status_every`` seconds while a step runs."""
        with contextlib.suppress(asyncio.CancelledError):
            while True:
                await asyncio.sleep(self.status_every)
                if self._step and "ended" not in self._step:
                    self.say(self.status_line())

    def status_line(self) -> str:
        s = self._step
        cost = self.rt.total_cost() if self.rt is not None else 0.0
        return t(
            "term.status",
            step=s.get("name", ""),
            turns=s.get("turns", 0),
            tools=s.get("tools", 0),
            context=kilo(int(s.get("context", 0))),
            cost=cost,
            elapsed=clock(time.monotonic() - float(s.get("began", time.monotonic()))),
        )

    def row_done(self, result: StepResult) -> None:
        """A manifest row this process just wrote (``Runtime.on_result``): its cost on a
        line of its own, at the end of its block. A map step's items are summed on the
        step's own line instead (:meth:`step_done`)."""
        if self._map:
            self._map_spent += result.cost_usd
            return
        self._open(result.step)  # an attempt that ended before it said anything
        self._cost_line(result, result.cost_usd)

    def step_done(self, result: StepResult) -> None:
        """A step is over (``Workflow.run``'s ``on_step``). Its attempts' rows have had
        their lines already (:meth:`row_done`); a map step gets its line now, with what its
        items cost in this process (a reused item's old cost was not spent again)."""
        if self.oracle is not None:
            self.oracle.recent.add_result(result)
        if self._step:
            self._step["ended"] = True
        if result.step in self._reused:
            return  # the step line already said so; its old cost was not spent again
        if self._map and result.step == self._map:
            self._map = ""
            self._cost_line(result, self._map_spent)

    def _cost_line(self, result: StepResult, cost: float) -> None:
        fields = {
            "step": result.step,
            "duration": clock(result.duration_s),
            "cost": cost,
            "error": result.error or "",
        }
        if result.ok:
            self.say("  " + t("term.step.ok", **fields))
        elif classify(result.error) == LOCAL:
            fields["error"] = str(result.error).split("): ", 1)[-1]
            self.say("  " + t("term.step.local", **fields), colour=RED)
        else:
            self.say("  " + t("term.step.failed", **fields), colour=RED)

    def stop(self) -> None:
        """The run is over: no status line, no prompt, no reading."""
        if self._status is not None:
            self._status.cancel()
            self._status = None
        self._listening = False
        if not self._waiters and not self._questions:
            self._stop_reading()
        self._redraw()

    # -- reading --------------------------------------------------------------------------

    def listen(self) -> None:
        """From now on read the person all the time (the run has started): a person at a
        terminal only. A piped stdin is a script's: its lines wait for the prompts that
        ask (answers to questions, the sentence after a Ctrl-C), in order."""
        if not self.stdin_tty:
            return
        self._listening = True
        self._want_input()

    @property
    def closed(self) -> bool:
        """stdin is at its end: nobody can type anything any more."""
        return self._eof

    async def read_line(self, prompt: str) -> str | None:
        """One line typed by the person; None when stdin is closed or not readable.

        One reader serves every prompt: lines go to the waiting prompts oldest first, a
        line typed before any prompt (and not taken as an answer or for the inbox) waits
        for the next one, and a cancelled prompt gives its place up."""
        line = self._take_line()
        if line is not None or self._eof:
            if not self.interactive:
                self._emit(self.out, prompt)
            return line
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[str | None] = loop.create_future()
        shown = prompt.rsplit("\n", 1)
        if len(shown) == 2:
            self.say(shown[0])
        self._waiters.append((fut, shown[-1]))
        if self.interactive:
            self._redraw()
        else:
            self._emit(self.out, shown[-1])
        if not self._start_reading():
            self._waiters.remove((fut, shown[-1]))
            return None
        try:
            return await fut
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove((fut, shown[-1]))
            if not self._waiters and not self._questions and not self._listening:
                self._stop_reading()
            self._redraw()

    def _want_input(self) -> None:
        self._drain_buffer()
        if self._listening or self._questions or self._waiters:
            self._start_reading()
        self._redraw()

    def _start_reading(self) -> bool:
        if self._reading or self._eof:
            return not self._eof
        try:
            asyncio.get_running_loop().add_reader(self.stdin_fd, self._on_readable)
        except (OSError, ValueError, PermissionError, RuntimeError):
            return False
        self._reading = True
        return True

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
            self._on_eof()
            return
        self._buf.extend(data)
        if self._shown and b"\n" in data:
            self._shown = ""  # the person's Enter moved the cursor below the prompt
        self._drain_buffer()
        self._redraw()

    def _drain_buffer(self) -> None:
        """Give every complete line typed so far to where it belongs."""
        while b"\n" in self._buf:
            if self._waiters:
                fut, _ = self._waiters.popleft()
                if not fut.done():
                    fut.set_result(self._take_line())
                continue
            if not (self._questions or self._listening):
                return  # kept for the next prompt
            line = self._take_line()
            self._dispatch(line or "")

    def _dispatch(self, line: str) -> None:
        question = is_question(line)
        if question is not None:
            self._to_oracle(question)
            return
        if self._questions:
            q = self._questions.pop(next(iter(self._questions)))
            self._handed.add(q.qid)  # its settled event must not show the question again
            q.settle(pick(line, q.options) or None)
            return
        if not line:
            return
        ch = self.channel
        if ch is None:
            self.say(t("term.no_inbox", text=line))
            return
        ch.send(line)

    def _to_oracle(self, question: str) -> None:
        if self.oracle is None:
            self.say(t("term.no_oracle"))
            return
        self.oracle.ask(question)

    def _on_eof(self) -> None:
        """Ctrl-D or the pipe closed: pending prompts get None, questions are skipped."""
        self._eof = True
        last = bytes(self._buf).decode("utf-8", "replace").strip() or None
        self._buf.clear()
        self._stop_reading()
        for fut, _ in list(self._waiters):
            if not fut.done():
                fut.set_result(last)
                last = None
        for qid in list(self._questions):
            q = self._questions.pop(qid)
            self._handed.add(qid)
            q.settle(None)
        self._redraw()

    def _stop_reading(self) -> None:
        if self._reading:
            with contextlib.suppress(OSError, ValueError, RuntimeError):
                asyncio.get_running_loop().remove_reader(self.stdin_fd)
        self._reading = False


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


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def _isatty_fd(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def _float_env(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


def unreachable(resilience: Any, say: Callable[[str], None]) -> str:
    """Say so in one line when the endpoint the CLI will talk to cannot be reached now (DNS
    and one TCP handshake, synchronously: no thread is left behind for a fork), and return
    the gave-up line for a caller that waits; "" when it is reachable (or resilience is off).
    Nothing waits here: a run starts anyway, and a step that needs the model waits for the
    network in its own loop (a run whose steps need none finishes without it)."""
    if not resilience.enabled or resilience.reachable():
        return ""
    host, port = resilience.endpoint()
    minutes = f"{resilience.max_offline_wait / 60:g}"
    say(
        t(
            "setup.offline",
            host=host,
            port=port,
            base=os.environ.get("ANTHROPIC_BASE_URL") or DEFAULT_BASE_URL,
            every=f"{resilience.probe_interval:g}",
            minutes=minutes,
        )
    )
    return t("setup.offline.gave_up", host=host, port=port, minutes=minutes)
