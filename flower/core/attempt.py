"""One attempt: a single SDK client session run to its ResultMessage.

The loop around attempts (retries, interrupts, handoffs) lives in ``loop.py``; this
module only turns the SDK's message stream into a StepResult and keeps the running context
size, telling its owner the instant the session id is known, and makes sure nothing of an
attempt outlives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import psutil

from .result import Event, StepResult


def context_of(usage: dict[str, Any] | None) -> int:
    """Tokens in play for one model turn: everything sent plus what came back."""
    if not usage:
        return 0
    keys = (
        "input_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
        "output_tokens",
    )
    return sum(int(usage.get(k) or 0) for k in keys)


@dataclass
class AttemptWatch:
    """What an attempt reports upward while it runs."""

    on_session: Callable[[str], None]
    on_event: Callable[[Event], None] | None = None
    # Called with the context size after each main-thread turn; returning True asks the
    # attempt to stop at this message boundary (a handoff is due).
    on_context: Callable[[int, bool], bool] | None = None
    texts: list[str] = field(default_factory=list)


class AttemptState:
    """Folds SDK messages into a StepResult."""

    def __init__(self, label: str, watch: AttemptWatch) -> None:
        self.result = StepResult(step=label, started_at=time.time(), attempts=1)
        self.watch = watch
        self.stop_requested = False
        self.last_text = ""
        self.api_error: str | None = None

    def see(self, msg: Any) -> None:
        from claude_agent_sdk import AssistantMessage, ResultMessage

        self._see_session(getattr(msg, "session_id", None))
        if isinstance(msg, AssistantMessage):
            self._see_assistant(msg)
        elif isinstance(msg, ResultMessage):
            self._see_result(msg)

    def _see_session(self, sid: str | None) -> None:
        if sid and sid != "default" and sid != self.result.session_id:
            self.result.session_id = sid
            self.watch.on_session(sid)

    def _see_assistant(self, msg: Any) -> None:
        from claude_agent_sdk import TextBlock

        if msg.parent_tool_use_id is not None:
            return  # a subagent's turn: not the main thread's context
        texts = [b.text for b in msg.content if isinstance(b, TextBlock) and b.text]
        if msg.error:
            # The CLI's synthetic "API Error: ..." turns: remember the text for classify(),
            # never show it as the model's answer.
            self.api_error = "\n".join(texts) or str(msg.error)
            return
        if texts:
            self.last_text = "\n".join(texts)
            if self.watch.on_event:
                self.watch.on_event(Event("text", self.result.step, {"text": self.last_text}))
        used = context_of(msg.usage)
        if used and self.watch.on_context:
            final = msg.stop_reason == "end_turn"
            if self.watch.on_context(used, final):
                self.stop_requested = True
        if used:
            self.result.context = used

    def _see_result(self, msg: Any) -> None:
        r = self.result
        r.cost_usd += float(msg.total_cost_usd or 0.0)
        r.num_turns += int(msg.num_turns or 0)
        if msg.session_id:
            self._see_session(msg.session_id)
        if msg.is_error:
            r.ok = False
            r.error = _error_text(msg, self.api_error)
        else:
            r.ok = True
            r.error = None
            r.text = msg.result if msg.result is not None else self.last_text


def _error_text(msg: Any, api_error: str | None) -> str:
    """One line describing a failed ResultMessage, preferring the CLI's own words."""
    parts = [p for p in (msg.result, api_error) if p]
    if msg.errors:
        parts.extend(str(e) for e in msg.errors)
    text = parts[0] if parts else f"{msg.subtype}"
    status = getattr(msg, "api_error_status", None)
    if status and str(status) not in text:
        text = f"API Error: {status} {text}"
    return text


Closer = Callable[[], Awaitable[None]]


async def run_attempt(
    options: Any,
    prompt: str,
    state: AttemptState,
    *,
    on_client: Callable[[Any], None],
    defer_close: list[Closer] | None = None,
) -> StepResult:
    """Run one SDK client session to its result; exceptions become the attempt's error.

    ``on_client`` receives the connected client (and None when done) so an interrupt can
    reach it from another task. Whatever the CLI leaves running when it is gone (a tool
    still working when the CLI was killed) is ended before this returns.

    With ``defer_close``, a successful attempt does not wait for the CLI to shut down
    (about 40 ms: it flushes the transcript and exits); its closer is appended there for
    the caller to await after it has reported the result.
    """
    from claude_agent_sdk import ClaudeSDKClient

    tag = secrets.token_hex(8)
    client = ClaudeSDKClient(replace(options, env={**options.env, ATTEMPT_TAG: tag}))
    try:
        await client.connect()
        on_client(client)
        await client.query(prompt)
        async for msg in client.receive_response():
            state.see(msg)
            if state.stop_requested:
                state.stop_requested = False
                await client.interrupt()
    except Exception as exc:  # noqa: BLE001 - a broken attempt is a result, not a crash
        state.result.ok = False
        state.result.error = state.result.error or f"{type(exc).__name__}: {exc}"
    finally:
        on_client(None)
        if defer_close is not None and state.result.ok:
            defer_close.append(lambda: _close(client, tag, sweep=False))
        else:
            await _close(client, tag, sweep=True)
    r = state.result
    if not r.ok and not r.error:
        r.error = state.api_error or "the CLI ended without a result"
    r.ended_at = time.time()
    return r


async def _close(client: Any, tag: str, *, sweep: bool) -> None:
    """Shut the CLI down; after a failed attempt also end what it left running.

    A CLI that answered and exits normally takes its tool shells with it, so the scan of
    the process table (several ms) is only paid when something went wrong.
    """
    with contextlib.suppress(Exception):  # the CLI may already be gone
        await client.disconnect()
    if sweep:
        await asyncio.to_thread(end_leftovers, tag)


# Every process of one attempt (the CLI and the tool shells it starts) inherits this variable
# with a value unique to the attempt. Measured: SIGKILL of the CLI mid-tool leaves the tool's
# shell running, re-parented away from us, where a process-tree walk no longer finds it.
ATTEMPT_TAG = "FLOWER_ATTEMPT"


def leftovers(tag: str) -> list[psutil.Process]:
    """Live processes (other than this one) carrying ``ATTEMPT_TAG=tag`` in their environment."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get(ATTEMPT_TAG) == tag and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, OSError):
            continue  # gone meanwhile, or not ours to read
    return found


def end_leftovers(tag: str, timeout: float = 3.0) -> int:
    """SIGKILL what an attempt left running once its CLI is gone; returns how many.

    A tool that outlived its CLI would otherwise go on writing files while the resumed
    session works on them.
    """
    victims = leftovers(tag)
    for proc in victims:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(victims, timeout=timeout)
    return len(victims)
