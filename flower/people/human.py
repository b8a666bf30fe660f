"""Asking a person: the one place a long-horizon run stops and waits for someone.

A wrong understanding of the goal is the one mistake the context-cleaning machinery makes
worse (the scene is dropped, the decision built on the wrong premise stays), so an agent
must be able to ask. :class:`HumanChannel` is that channel: an in-process MCP server with two
tools for the model, ``mcp__human__ask`` (blocks until answered) and ``mcp__human__inbox``
(never blocks), and a set of methods for whatever UI answers.

* **No UI is assumed.** A question surfaces as ``Event("ask")`` (pushed to ``on_event``, or
  pulled with :meth:`HumanChannel.next_ask`); an answer may come 3 ms or 3 hours later,
  from any thread (:meth:`~HumanChannel.answer` / :meth:`~HumanChannel.decline` /
  :meth:`~HumanChannel.send` go through ``loop.call_soon_threadsafe``).
* **Nobody there is an answer too.** A question that times out returns :data:`TIMEOUT` to
  the model, which goes on by its own judgement; nothing raises. ``timeout_s <= 0`` is
  unattended mode: every question falls through at once.
* **Unlimited by default.** A question costs next to nothing; ``max_asks`` is for CI
  (``0`` = no questions), and a question over the quota is refused at once, never queued.

The three "0 / None" values differ: ``max_asks=None`` unlimited, ``max_asks=0`` no
questions; ``timeout_s=None`` waits forever, ``timeout_s <= 0`` never waits; ``remaining``
is ``-1`` when ``max_asks`` is None.

Every settled question is appended to ``log_path`` (the Q&A log, ``问答记录.md`` in a
workflow's notes), which costs no context and survives the session::

    # 需求问答记录

    > 自动追加。这一份不进上下文,只作留档。

    - **Q**(q1) 要支持 Windows 吗?
      - 选项:要 / 不要
      - **A**[answered] 不要

and a message the agent took from the inbox as ``\\n- **人主动说**(m1) <text>\\n``. What a
person says unprompted is also appended to ``amend_path`` (usually the brief), so the next
step, a new session, can read it: ``\\n## 运行中补充(<YYYY-mm-dd HH:MM:SS>)\\n<text>\\n``.

**The step-child seam** (flower's own, not part of seed 003's surface). A step may run in a
forked child process, whose copy of the channel must not talk to a person itself: the person
is at the supervisor. So:

* every channel gets a ``key`` at construction (``"hc-<pid>-<n>"``, from a module-level
  counter); a forked child's copy keeps it, and :func:`find_channel` finds a live channel
  by it (a weak registry);
* :meth:`HumanChannel.serve` is the whole local handling of one tool call (``"ask"`` with
  ``{"question", "options"}``, ``"inbox"`` with ``{}``) and returns exactly the text the
  model gets;
* the MCP tool handlers call ``serve`` unless a relay is installed with :func:`set_relay`;
  then they call ``await relay(channel, op, args)`` instead. The child installs a relay that
  sends the call over its pipe; the supervisor calls ``serve`` on its own copy,
  ``find_channel(key)``. A relay that fails leaves the model with :data:`TIMEOUT` (ask) or
  :data:`NO_MAIL` (inbox): the tools never raise.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import re
import threading
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..agents.agent import ALWAYS_LOAD
from ..i18n import define, t
from ..state.result import Event
from ..util.fsutil import open_private, private_dir
from ..util.loops import call_on

log = logging.getLogger("flower")

define(
    {
        "human.call_failed": (
            "问人的通道 {key}:{op} 调用失败({error!r})",
            "human channel {key}: the {op} call failed ({error!r})",
        ),
        "human.amend_unwritten": (
            "追加不到 {path}:{error}",
            "could not append to {path}: {error}",
        ),
        "human.log_unwritten": (
            "问答记录 {path} 追加不进去:{error}",
            "could not append to the Q&A log {path}: {error}",
        ),
    }
)

SERVER = "human"
TOOL = "ask"
INBOX = "inbox"
TOOL_NAME = f"mcp__{SERVER}__{TOOL}"
INBOX_NAME = f"mcp__{SERVER}__{INBOX}"

#: What the model gets when the quota is used up (``state="over_budget"``).
OVER_BUDGET = (
    "提问额度已用完。不要再问了 —— 把剩下的不确定项写进「未知与假设」那一段,按你自己的判断继续。"
)
#: What the model gets when nobody answered in time (``state="timeout"``).
TIMEOUT = (
    "无人应答。按你自己的判断继续,并把这个问题和你采用的假设写进「未知与假设」那一段。"
    "不要重复提问,也不要停在这里。"
)
#: What the model gets when the person skipped the question (``state="declined"``); a reason
#: given to :meth:`HumanChannel.decline` follows as ``(对方说:<reason>)``.
DECLINED = "对方跳过了这个问题。按你自己的判断继续,并把假设写进「未知与假设」。"
#: What the model gets for an empty question (``state="invalid"``).
EMPTY_QUESTION = "问题是空的。把问题写清楚再问。"
#: The inbox tool's answer when nobody said anything.
NO_MAIL = "收件箱是空的。继续干活,不用理会。"
#: The inbox tool's answer when there is mail: this line, a blank line, the numbered
#: messages, a blank line, then one of the two notes below.
MAIL_HEAD = "人在运行途中说了这些(按时间先后):"
MAIL_AMENDED = "这些话**已经追加进需求确认书**了,后面的步骤读得到。"
MAIL_NOT_KEPT = (
    "**注意:这些话没有落盘。** 如果它改变了需求或边界,你得想办法让它活过这一步 —— "
    "否则下一步是全新 session,看不到它。"
)

AMEND_LABEL = "运行中补充"
LOG_HEADER = "# 需求问答记录\n\n> 自动追加。这一份不进上下文,只作留档。\n\n"
AMEND_HEADER = "# 运行中的补充\n"

#: Outcomes of a question (``Ask.state``), after ``asked``. ``cancelled`` is flower's: the
#: task waiting for the answer was cancelled (the step was stopped) before one came.
OUTCOMES = ("answered", "timeout", "declined", "over_budget", "invalid", "cancelled")

_ASK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "question": {
            "type": "string",
            "description": "问人的一个问题,写具体。",
        },
        "options": {
            "type": "array",
            "items": {"type": "string"},
            "description": "候选答案(能给就给:人挑一个比打字快)。人也可以不选,自己写。",
        },
    },
    "required": ["question"],
}
# A complete JSON Schema even without parameters: the SDK sends a dict as it is only when it
# has both "type" and "properties".
_INBOX_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}
_ASK_DESCRIPTION = (
    "向人提一个问题并等待回答,答案就是这个工具的结果。一次只问一个。"
    "人可能不在:那时会返回一句说明,照它说的自己判断着继续,不要卡住。"
)
_INBOX_DESCRIPTION = (
    "看看人有没有主动说什么(补充需求、纠正方向)。不阻塞:没有新消息就立刻返回一句说明。"
    "每做完一个阶段性的动作查一次。"
)


@dataclass
class Mail:
    """Something the person said unprompted (the reverse of :class:`Ask`)."""

    id: str
    text: str
    sent_at: float = field(default_factory=time.time)
    taken: bool = False  # has the agent taken it from the inbox yet


@dataclass
class Ask:
    """One question put to the person, and how it ended.

    ``state`` goes from ``asked`` to one of :data:`OUTCOMES`; ``answer`` is then the text the
    model was given (the person's answer, or the fixed text of the outcome).
    """

    id: str
    question: str
    options: list[str] = field(default_factory=list)
    asked_at: float = field(default_factory=time.time)
    state: str = "asked"
    answer: str = ""

    @property
    def waited_s(self) -> float:
        """Seconds since it was asked, to a tenth."""
        return round(time.time() - self.asked_at, 1)

    def event(self, remaining: int = 0) -> Event:
        """This question as an ``ask`` event (``raw`` is the Ask itself)."""
        payload = {
            "id": self.id,
            "options": list(self.options),
            "state": self.state,
            "answer": self.answer,
            "remaining": remaining,
            "asked_at": self.asked_at,
        }
        return Event("ask", text=self.question, payload=payload, raw=self)


Relay = Callable[["HumanChannel", str, dict[str, Any]], Awaitable[str]]

_keys = itertools.count(1)
_channels: weakref.WeakValueDictionary[str, HumanChannel] = weakref.WeakValueDictionary()
_relay: Relay | None = None


def set_relay(fn: Relay | None) -> None:
    """Route every channel's tool calls through ``fn`` (None: handle them here again).

    With a relay, the MCP tool handlers call ``await fn(channel, op, args)`` instead of
    ``channel.serve(op, args)`` and give the model the text it returns.
    """
    global _relay
    _relay = fn


def find_channel(key: str) -> HumanChannel | None:
    """The live channel whose :attr:`HumanChannel.key` is ``key``, if any."""
    return _channels.get(key)


@dataclass
class _Waiting:
    """A question a person may still answer: ``outcome`` is set (under the channel's lock)
    by whoever settles it first, then ``wake`` is resolved on its loop."""

    ask: Ask
    wake: asyncio.Future[None]
    outcome: tuple[str, str] | None = None


class HumanChannel:
    """An in-process MCP server (``ask`` and ``inbox``) plus the methods a UI answers with.

    Hand :meth:`mcp_servers` to ``AgentSpec.mcp_servers`` and list :attr:`tool_name` /
    :attr:`inbox_name` among its tools. Take questions either pushed (``on_event``) or pulled
    (:meth:`next_ask`); settle them with :meth:`answer` or :meth:`decline`, from any thread.
    Exceptions raised by ``on_event`` are collected in :attr:`ui_errors`, never propagated.
    """

    def __init__(
        self,
        *,
        on_event: Callable[[Event], None] | None = None,
        max_asks: int | None = None,
        timeout_s: float | None = 1800.0,
        log_path: str | Path | None = None,
        amend_path: str | Path | None = None,
        over_budget_text: str = OVER_BUDGET,
        timeout_text: str = TIMEOUT,
        declined_text: str = DECLINED,
    ) -> None:
        self.on_event = on_event
        self.max_asks = max_asks
        self.timeout_s = timeout_s
        self.log_path = Path(log_path).resolve() if log_path else None
        self.amend_path = Path(amend_path).resolve() if amend_path else None
        self.over_budget_text = over_budget_text
        self.timeout_text = timeout_text
        self.declined_text = declined_text

        self.asks: list[Ask] = []
        self.mail: list[Mail] = []
        self.ui_errors: list[str] = []
        self.key = f"hc-{os.getpid()}-{next(_keys)}"

        self._lock = threading.Lock()
        self._files = threading.Lock()
        self._ask_ids = itertools.count(1)
        self._mail_ids = itertools.count(1)
        self._used = 0  # questions that passed the quota (put to the person, or timed out)
        self._waiting: dict[str, _Waiting] = {}
        self._fresh: deque[str] = deque()  # ids of waiting questions next_ask has not given
        self._pullers: list[asyncio.Future[None]] = []  # next_ask calls waiting for one
        self._amended: dict[str, str] = {}  # mail id -> the file it was appended to
        self._loop: asyncio.AbstractEventLoop | None = None
        with contextlib.suppress(RuntimeError):
            self._loop = asyncio.get_running_loop()
        _channels[self.key] = self

    def __repr__(self) -> str:
        return f"<HumanChannel {self.key} asks={len(self.asks)} mail={len(self.mail)}>"

    # ---- for the spec ------------------------------------------------------------------

    @property
    def tool_name(self) -> str:
        return TOOL_NAME

    @property
    def inbox_name(self) -> str:
        return INBOX_NAME

    def mcp_servers(self) -> dict[str, Any]:
        """``{"human": <sdk server>}`` for ``AgentSpec.mcp_servers``: the key must be the
        server's name (it makes the tool names), so both come from here.

        The server is marked ``alwaysLoad``: Claude Code 2.x defers MCP tools behind its
        ``ToolSearch`` tool, so without the mark an agent's first request offers neither
        tool and a model spends a turn searching for the one it exists to use. The mark
        exempts these two tools only; the CLI's other deferred tools stay deferred.
        """
        from claude_agent_sdk import create_sdk_mcp_server, tool

        tools = [
            tool(TOOL, _ASK_DESCRIPTION, _ASK_SCHEMA)(self._ask_tool),
            tool(INBOX, _INBOX_DESCRIPTION, _INBOX_SCHEMA)(self._inbox_tool),
        ]
        # The SDK hands every key but "instance" to the CLI's --mcp-config.
        server: dict[str, Any] = {**create_sdk_mcp_server(SERVER, tools=tools)}
        server[ALWAYS_LOAD] = True
        return {SERVER: server}

    async def _ask_tool(self, args: dict[str, Any]) -> dict[str, Any]:
        call = {"question": args.get("question", ""), "options": args.get("options") or []}
        return _text(await self._call("ask", call))

    async def _inbox_tool(self, args: dict[str, Any]) -> dict[str, Any]:
        return _text(await self._call("inbox", {}))

    async def _call(self, op: str, args: dict[str, Any]) -> str:
        relay = _relay
        try:
            if relay is not None:
                return str(await relay(self, op, args))
            return await self.serve(op, args)
        except Exception as exc:  # noqa: BLE001 - a tool call must never fail the model's turn
            log.warning("%s", t("human.call_failed", key=self.key, op=op, error=exc))
            return self.timeout_text if op == "ask" else NO_MAIL

    async def serve(self, op: str, args: dict[str, Any]) -> str:
        """Handle one tool call here and return the text the model gets.

        ``op`` is ``"ask"`` (``args``: ``question``, ``options``) or ``"inbox"`` (no args).
        """
        if op == "ask":
            asked = await self.ask(args.get("question", ""), args.get("options"))
            return asked.answer
        if op == "inbox":
            self._bind()
            return self._deliver()
        raise ValueError(f"unknown human channel operation {op!r}")

    # ---- asking ------------------------------------------------------------------------

    async def ask(self, question: str, options: list[str] | None = None) -> Ask:
        """Put ``question`` to the person and wait; the Ask says how it ended.

        The model's tool and flower itself (a goal judged unreachable, say) ask through
        here, so logging, events, quota and timeout behave the same. Never raises but
        ``CancelledError``: nobody answering is an answer too (``ask.state``).
        """
        self._bind()
        text = str(question or "").strip()
        a = Ask(id=f"q{next(self._ask_ids)}", question=text, options=_options(options))
        with self._lock:
            self.asks.append(a)
            over = self.max_asks is not None and self._used >= self.max_asks
            if text and not over:
                self._used += 1
        if not text:
            return self._settle(a, "invalid", EMPTY_QUESTION)
        if over:
            return self._settle(a, "over_budget", self.over_budget_text)
        if self.timeout_s is not None and self.timeout_s <= 0:
            return self._settle(a, "timeout", self.timeout_text)

        waiting = _Waiting(a, asyncio.get_running_loop().create_future())
        with self._lock:
            self._waiting[a.id] = waiting
            self._fresh.append(a.id)
        self._emit(a.event(self.remaining))
        self._wake_pullers()
        try:
            await asyncio.wait({waiting.wake}, timeout=self.timeout_s)
        except asyncio.CancelledError:
            with self._lock:
                self._waiting.pop(a.id, None)
                outcome = waiting.outcome or ("cancelled", "")
            self._settle(a, *outcome)
            raise
        with self._lock:
            if waiting.outcome is None:
                self._waiting.pop(a.id, None)
                waiting.outcome = ("timeout", self.timeout_text)
            outcome = waiting.outcome
        return self._settle(a, *outcome)

    def answer(self, ask_id: str, text: str) -> bool:
        """Answer a waiting question (any thread). False: it is no longer waiting."""
        return self._resolve(ask_id, "answered", str(text))

    def decline(self, ask_id: str, reason: str = "") -> bool:
        """Skip a waiting question: the model decides itself (any thread)."""
        why = str(reason or "").strip()
        text = f"{self.declined_text}(对方说:{why})" if why else self.declined_text
        return self._resolve(ask_id, "declined", text)

    def _resolve(self, ask_id: str, state: str, text: str) -> bool:
        with self._lock:
            waiting = self._waiting.pop(ask_id, None)
            if waiting is None:
                return False
            waiting.outcome = (state, text)
        _wake_soon(waiting.wake)
        return True

    def _settle(self, a: Ask, state: str, text: str) -> Ask:
        a.state, a.answer = state, text
        self._emit(a.event(self.remaining))
        lines = [f"- **Q**({a.id}) {a.question}\n"]
        if a.options:
            lines.append(f"  - 选项:{' / '.join(a.options)}\n")
        lines.append(f"  - **A**[{a.state}] {a.answer}\n")
        self._log("".join(lines))
        return a

    @property
    def remaining(self) -> int:
        """Questions still allowed: -1 when unlimited (``max_asks=None``)."""
        if self.max_asks is None:
            return -1
        return max(0, self.max_asks - self._used)

    def pending(self) -> list[Ask]:
        """The questions waiting for an answer now, oldest first."""
        with self._lock:
            return [w.ask for w in self._waiting.values()]

    async def next_ask(self, timeout: float | None = None) -> Ask | None:  # noqa: ASYNC109 - seed API
        """The next waiting question no earlier call returned (pull mode); None when none
        came within ``timeout`` seconds (None: wait as long as it takes). Cancellation
        propagates, so the caller's loop can be stopped."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            wake: asyncio.Future[None] = loop.create_future()
            with self._lock:
                while self._fresh:
                    ask_id = self._fresh.popleft()
                    if ask_id in self._waiting:
                        return self._waiting[ask_id].ask
                self._pullers.append(wake)
            left = None if deadline is None else deadline - loop.time()
            try:
                if left is not None and left <= 0:
                    return None
                await asyncio.wait({wake}, timeout=left)
            finally:
                with self._lock, contextlib.suppress(ValueError):
                    self._pullers.remove(wake)

    def _wake_pullers(self) -> None:
        with self._lock:
            pullers, self._pullers = self._pullers, []
        for wake in pullers:
            _wake_soon(wake)

    # ---- the person speaking unprompted --------------------------------------------------

    def send(self, text: str) -> Mail | None:
        """The person says something (any thread): into the inbox, appended to
        ``amend_path``; the agent is not interrupted. None for empty text."""
        said = str(text or "").strip()
        if not said:
            return None
        with self._lock:
            m = Mail(id=f"m{next(self._mail_ids)}", text=said)
            self.mail.append(m)
        kept = self._amend(said, AMEND_LABEL)
        with self._lock:
            self._amended[m.id] = kept
        self._on_loop(lambda: self._emit_mail(m, "queued"))
        return m

    def amend(self, text: str, *, label: str = AMEND_LABEL) -> bool:
        """Append ``text`` to ``amend_path`` under a ``## <label>(<time>)`` heading. False
        when nothing was written: no path, empty text, an OSError, or the same text was
        already appended there."""
        said = str(text or "").strip()
        if not said or self.amend_path is None:
            return False
        return self._amend(said, label, report_present=False) != ""

    def _amend(self, text: str, label: str, *, report_present: bool = True) -> str:
        """Append to ``amend_path``: the path when the text is there afterwards (written now,
        or already there if ``report_present``), else ""."""
        path = self.amend_path
        if path is None:
            return ""
        with self._files:
            try:
                if _already_amended(path, text):
                    return str(path) if report_present else ""
                stamp = time.strftime("%Y-%m-%d %H:%M:%S")
                _append(path, f"\n## {label}({stamp})\n{text}\n", AMEND_HEADER)
            except (OSError, ValueError) as exc:  # ValueError: a file that is not UTF-8
                log.warning("%s", t("human.amend_unwritten", path=path, error=exc))
                return ""
        return str(path)

    def pending_mail(self) -> list[Mail]:
        """What the person said that the agent has not taken yet."""
        with self._lock:
            return [m for m in self.mail if not m.taken]

    def _deliver(self) -> str:
        """The inbox tool's text: takes every message not taken yet."""
        with self._lock:
            fresh = [m for m in self.mail if not m.taken]
            for m in fresh:
                m.taken = True
            kept = all(self._amended.get(m.id) for m in fresh)
        if not fresh:
            return NO_MAIL
        for m in fresh:
            self._emit_mail(m, "delivered")
            self._log(f"\n- **人主动说**({m.id}) {m.text}\n")
        lines = [MAIL_HEAD, ""]
        lines += [f"{i}. {m.text}" for i, m in enumerate(fresh, 1)]
        lines += ["", MAIL_AMENDED if kept else MAIL_NOT_KEPT]
        return "\n".join(lines)

    def _emit_mail(self, m: Mail, state: str) -> None:
        with self._lock:
            amended = self._amended.get(m.id, "")
        payload = {"kind": "mail", "state": state, "id": m.id, "amended": amended}
        self._emit(Event("ask", text=m.text, payload=payload, raw=m))

    # ---- records -----------------------------------------------------------------------

    def transcript(self) -> str:
        """Every question and how it ended, as markdown (to merge into a brief)."""
        lines = []
        for a in list(self.asks):
            lines.append(f"- Q: {a.question}")
            if a.options:
                lines.append(f"  选项: {' / '.join(a.options)}")
            lines.append(f"  A: [{a.state}] {a.answer}")
        return "\n".join(lines)

    def _log(self, entry: str) -> None:
        if self.log_path is None:
            return
        with self._files:
            try:
                _append(self.log_path, entry, LOG_HEADER)
            except OSError as exc:
                log.warning("%s", t("human.log_unwritten", path=self.log_path, error=exc))

    def _emit(self, event: Event) -> None:
        sink = self.on_event
        if sink is None:
            return
        try:
            sink(event)
        except Exception as exc:  # noqa: BLE001 - a broken UI must not take the run with it
            self.ui_errors.append(f"{type(exc).__name__}: {exc}")

    # ---- threads and loops ---------------------------------------------------------------

    def _bind(self) -> None:
        """Remember the running loop: events of calls from other threads are emitted there."""
        with contextlib.suppress(RuntimeError):
            self._loop = asyncio.get_running_loop()

    def _on_loop(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the channel's loop (now, when called there or when there is none)."""
        call_on(self._loop, fn)

    def _after_fork(self) -> None:
        # A lock held by another thread at fork() stays held forever in the child, and the
        # parent's waiters cannot be answered from here.
        self._lock = threading.Lock()
        self._files = threading.Lock()
        self._waiting = {}
        self._fresh = deque()
        self._pullers = []


def _after_fork_in_child() -> None:
    for channel in list(_channels.values()):
        channel._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _text(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}]}


def _options(options: Any) -> list[str]:
    """Non-empty options as stripped strings (anything but a list or tuple is one option)."""
    if options is None:
        return []
    items = list(options) if isinstance(options, (list, tuple)) else [options]
    return [s for s in (str(o).strip() for o in items if o is not None) if s]


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _wake_soon(fut: asyncio.Future[None]) -> None:
    """Resolve ``fut`` on its own loop, from whatever thread this is."""
    with contextlib.suppress(RuntimeError):  # its loop is closed: nobody is waiting
        fut.get_loop().call_soon_threadsafe(_wake, fut)


_AMENDED_BLOCK = re.compile(
    r"^## [^\n]*\(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\)\n.*?(?=^## |\Z)", re.MULTILINE | re.DOTALL
)


def amendments(path: str | Path) -> str:
    """The sections :meth:`HumanChannel.amend` appended to ``path`` (``## <label>(<time>)``
    and their text), in order; "" when there are none or the file cannot be read. A frozen
    document rewritten over them keeps them by appending this."""
    try:
        content = Path(path).read_text(encoding="utf-8")
    except (OSError, ValueError):
        return ""
    return "".join("\n" + m.group(0).strip("\n") + "\n" for m in _AMENDED_BLOCK.finditer(content))


def _already_amended(path: Path, text: str) -> bool:
    """Is ``text`` already the body of a section appended to ``path``?"""
    try:
        content = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return False
    pattern = r"^## [^\n]*\n" + re.escape(text) + r"\n"
    return re.search(pattern, content, flags=re.MULTILINE) is not None


def _append(path: Path, body: str, header: str) -> None:
    """Append ``body`` to ``path`` in one write, ``header`` first if the file is empty.

    A new file is created owner-only (0600), in owner-only directories; an existing one
    keeps the mode it has.
    """
    private_dir(path.parent)
    try:
        fd = open_private(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        data = ((header if os.fstat(fd).st_size == 0 else "") + body).encode("utf-8")
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
