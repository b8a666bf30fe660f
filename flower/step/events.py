"""The SDK's message stream flattened into :class:`~flower.state.result.Event` values.

An interaction layer (terminal, web page, HTTP service, nothing at all) consumes ``Event``
and never an SDK type: :func:`normalize` is the only place that knows the SDK's message and
block classes, so an SDK upgrade changes this module and no UI.

Besides the plain translation, :func:`normalize` settles four things every consumer would
otherwise get wrong:

* a subagent's messages are marked (``payload["subagent"]``, ``payload["parent_tool_use_id"]``)
  so its chatter and the task brief it was given never pass for main-thread prose;
* the CLI's synthetic ``API Error: ...`` turn (written as an assistant message when the API
  gives up) becomes a single ``error`` event, not text that would end up in
  ``StepResult.text`` and be handed to the next step;
* a compaction boundary (and a conversation reset) is reported as ``reset``: after it the
  model remembers only a summary and the prompt cache starts over;
* every assistant message carries the context it was given (``payload["context"]``), the
  number a long-horizon run most needs to see.

A tool result's text is the result without the CLI's wrapping (:func:`readable_result`): a
subagent's report rather than the frame around it. The same vocabulary of the CLI's own
words in a conversation (fillers, cut-off markers, system reminders, tags) is here for a
reader of whole transcripts (``flower-super show``).

``retry``, ``step``, ``handoff`` and ``ask`` share the same :data:`EventKind` but are emitted
elsewhere (the Runtime, ``Workflow.run``, :class:`~flower.people.human.HumanChannel`), so a UI
knows one type for everything. UIs should keep an ``else`` branch: kinds may be added.
"""

from __future__ import annotations

import re
from typing import Any, Literal, get_args

from ..state.result import Event

__all__ = [
    "CUT_MARKERS",
    "EVENT_KINDS",
    "NO_RESPONSE",
    "RESULT_CHARS",
    "SUMMARY_CHARS",
    "SUMMARY_KEYS",
    "Event",
    "EventKind",
    "cut_kind",
    "entry_is_synthetic",
    "is_synthetic",
    "normalize",
    "readable_result",
    "reminders",
    "subagent_report",
    "tagged",
]

EventKind = Literal[
    # from normalize()
    "text",
    "thinking",
    "tool_call",
    "tool_result",
    "task",
    "system",
    "reset",
    "result",
    "error",
    "prompt",
    "unknown",
    # from the Runtime
    "retry",
    "handoff",
    # from Workflow.run
    "step",
    # from HumanChannel: a question (no payload["kind"]) or what the person said unprompted
    # (payload["kind"] == "mail")
    "ask",
]

#: Every kind, in the order above (15).
EVENT_KINDS: tuple[str, ...] = get_args(EventKind)

#: A ``tool_call`` event's text: the first of these input fields the call has, cut.
SUMMARY_KEYS = (
    "file_path",
    "notebook_path",
    "command",
    "pattern",
    "path",
    "url",
    "query",
    "question",
    "description",
)
SUMMARY_CHARS = 200
#: A ``tool_result`` event's text is the result's first characters.
RESULT_CHARS = 500

_SYNTHETIC_MODEL = "<synthetic>"


def is_synthetic(message: Any) -> bool:
    """Is ``message`` the CLI's synthetic assistant turn for an API failure?

    The SDK keeps the CLI's ``error`` field on such a turn (what
    :class:`~flower.step.attempt.AttemptState` goes by); its model is ``<synthetic>``; a
    transcript entry says ``isApiErrorMessage``. Any of the three is enough.
    """
    if getattr(message, "error", None):
        return True
    if getattr(message, "isApiErrorMessage", None) is True:
        return True
    return getattr(message, "model", None) == _SYNTHETIC_MODEL


def normalize(message: Any) -> list[Event]:
    """One SDK message as zero or more events (``raw`` is the SDK object each came from)."""
    from claude_agent_sdk import (
        AssistantMessage,
        ConversationResetMessage,
        ResultMessage,
        SystemMessage,
        TaskNotificationMessage,
        TaskProgressMessage,
        TaskStartedMessage,
        TaskUpdatedMessage,
        TextBlock,
        UserMessage,
    )

    if isinstance(message, AssistantMessage) and is_synthetic(message):
        texts = [b.text for b in message.content if isinstance(b, TextBlock) and b.text]
        text = "\n".join(texts) or str(message.error or "")
        return [Event("error", text=text, payload={"synthetic": True}, raw=message)]

    if isinstance(message, (AssistantMessage, UserMessage)):
        return _turn(message, "prompt" if isinstance(message, UserMessage) else "text")

    if isinstance(message, ResultMessage):
        payload = {
            "session_id": message.session_id,
            "cost_usd": message.total_cost_usd,
            "num_turns": message.num_turns,
            "is_error": message.is_error,
        }
        usage = getattr(message, "usage", None)
        if isinstance(usage, dict):  # the tokens of the query, for a person (the web view)
            payload["tokens"] = sum(
                int(usage.get(k) or 0)
                for k in (
                    "input_tokens",
                    "output_tokens",
                    "cache_read_input_tokens",
                    "cache_creation_input_tokens",
                )
                if isinstance(usage.get(k), int)
            )
        return [Event("result", text=str(message.subtype), payload=payload, raw=message)]

    tasks = (TaskStartedMessage, TaskProgressMessage, TaskUpdatedMessage, TaskNotificationMessage)
    if isinstance(message, tasks):
        # The class name would be noise on a screen (and looks like an error among prose).
        return [Event("task", payload={"kind": type(message).__name__}, raw=message)]

    if isinstance(message, ConversationResetMessage):
        payload = {
            "trigger": "",
            "pre_tokens": None,
            "post_tokens": None,
            "micro": False,
            "subtype": "",
        }
        return [Event("reset", text="conversation reset", payload=payload, raw=message)]

    if isinstance(message, SystemMessage):
        subtype = str(message.subtype or "")
        data = message.data if isinstance(message.data, dict) else {}
        if subtype in ("compact_boundary", "microcompact_boundary"):
            return [_boundary(message, subtype, data)]
        return [Event("system", text=subtype, payload=dict(data), raw=message)]

    return [Event("unknown", text=type(message).__name__, raw=message)]


def _turn(message: Any, kind: str) -> list[Event]:
    """The events of an assistant (``text``) or user (``prompt``) message's content."""
    meta: dict[str, Any] = {"subagent": bool(message.parent_tool_use_id)}
    if message.parent_tool_use_id:
        meta["parent_tool_use_id"] = message.parent_tool_use_id
    usage = getattr(message, "usage", None)
    if isinstance(usage, dict) and usage:
        meta["context"] = context_of(usage)
    content = message.content
    if isinstance(content, str):
        return [Event(kind, text=content, payload=dict(meta), raw=message)]
    out = []
    for block in content:
        event = _block(block, kind)
        if event is not None:
            event.payload.update(meta)
            out.append(event)
    return out


def _block(block: Any, kind: str) -> Event | None:
    from claude_agent_sdk import (
        ServerToolResultBlock,
        ServerToolUseBlock,
        TextBlock,
        ThinkingBlock,
        ToolResultBlock,
        ToolUseBlock,
    )

    if isinstance(block, TextBlock):
        return Event(kind, text=block.text, raw=block)
    if isinstance(block, ThinkingBlock):
        return Event("thinking", text=block.thinking, raw=block)
    payload: dict[str, Any]
    if isinstance(block, (ToolUseBlock, ServerToolUseBlock)):
        args = block.input if isinstance(block.input, dict) else {}
        payload = {"id": block.id, "input": args}
        return Event("tool_call", text=_summary(args), tool=block.name, payload=payload, raw=block)
    if isinstance(block, ToolResultBlock):
        payload = {"tool_use_id": block.tool_use_id, "is_error": bool(block.is_error)}
        text = readable_result(_result_text(block.content))[:RESULT_CHARS]
        return Event("tool_result", text=text, payload=payload, raw=block)
    if isinstance(block, ServerToolResultBlock):
        # A server tool's result is a dict of its own schema; "<tool>_error" types are failures.
        kind_of = str(block.content.get("type", "")) if isinstance(block.content, dict) else ""
        payload = {"tool_use_id": block.tool_use_id, "is_error": kind_of.endswith("_error")}
        return Event("tool_result", payload=payload, raw=block)
    return None


def _summary(args: dict[str, Any]) -> str:
    """What a UI shows of a call: the path, command, pattern ... it is about."""
    for key in SUMMARY_KEYS:
        value = args.get(key)
        if value:
            return str(value)[:SUMMARY_CHARS]
    return ""


def _result_text(content: Any) -> str:
    """A tool result's text: the string itself, or the text parts of a list of blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            str(part.get("text") or "")
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        ]
        return "\n".join(p for p in parts if p)
    return ""


def _boundary(message: Any, subtype: str, data: dict[str, Any]) -> Event:
    """A compaction boundary: what the CLI says of the tokens before and after."""
    meta: Any = {}
    for key in (
        "compact_metadata",
        "compactMetadata",
        "microcompact_metadata",
        "microcompactMetadata",
    ):
        if isinstance(data.get(key), dict):
            meta = data[key]
            break
    pre = _first(meta, "pre_tokens", "preTokens")
    post = _first(meta, "post_tokens", "postTokens")
    trigger = str(meta.get("trigger") or "")
    micro = subtype.startswith("micro")
    label = "微压缩" if micro else "压缩"

    def shown(n: Any) -> str:
        return "?" if n is None else str(n)

    text = f"{label}({trigger or '?'}) {shown(pre)} → {shown(post)} tokens"
    payload = {
        "trigger": trigger,
        "pre_tokens": pre,
        "post_tokens": post,
        "micro": micro,
        "subtype": subtype,
    }
    return Event("reset", text=text, payload=payload, raw=message)


def _first(meta: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if meta.get(key) is not None:
            return meta[key]
    return None


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


# -- the CLI's own words in a conversation --------------------------------------------------
#
# Besides what the person and the model said, Claude Code (2.1.332) writes words of its own
# into a session: a filler assistant turn, markers for a turn or a tool call that was cut
# off, system reminders, tags around command and background-task notices, a frame around a
# subagent's report. A reader shows them as what they are, never as the model's words.

#: The assistant turn the CLI writes itself (model ``<synthetic>``, not an API error) before
#: a new prompt when the last turn never got an answer.
NO_RESPONSE = "No response requested."

#: How the CLI marks a turn or a tool call cut off before it finished (its own list, matched
#: by prefix), each with what happened: ``user`` the person interrupted it; ``ended`` the
#: session (or the process running it) ended first; ``skipped`` the call never ran;
#: ``copied`` its result never reached this copy of a forked session.
CUT_MARKERS: tuple[tuple[str, str], ...] = (
    ("[Request interrupted by user", "user"),
    ("The user doesn't want to take this action right now.", "user"),
    ("[Request interrupted: the session ended before", "ended"),
    ("[This turn ended before it finished.]", "ended"),
    ("[Agent call interrupted:", "ended"),
    ("[Tool call interrupted:", "ended"),
    ("[Tool call did not complete:", "skipped"),
    ("[Tool call skipped:", "skipped"),
    ("[Tool call result not in this copy:", "copied"),
)
#: The CLI's refusal text, and what it appends when the call was stopped while it ran (an
#: SDK interrupt) rather than refused before it ran.
_REFUSED = "The user doesn't want to proceed with this tool use."
_STOPPED = "Correction to the text above: this call was stopped while running"

_HANDBACK = "[Subagent hand-back]"
_ASYNC_LAUNCH = "Async agent launched successfully."
_REMINDER = re.compile(r"<system-reminder>\n?(.*?)\n?</system-reminder>\n?", re.S)
_ERROR_TAG = re.compile(r"</?tool_use_error>")


def cut_kind(text: str) -> str | None:
    """What the CLI's cut-off marker ``text`` says happened (see :data:`CUT_MARKERS`):
    ``"user"``, ``"ended"``, ``"skipped"``, ``"copied"``, ``"stopped"`` (a running call
    stopped by an interrupt), or None when ``text`` is not such a marker."""
    text = text.lstrip()
    if text.startswith(_REFUSED) and _STOPPED in text:
        return "stopped"
    return next((kind for mark, kind in CUT_MARKERS if text.startswith(mark)), None)


def entry_is_synthetic(entry: dict[str, Any]) -> bool:
    """Is this transcript entry an assistant turn the CLI wrote itself (an API error, or
    the :data:`NO_RESPONSE` filler)? :func:`is_synthetic` for a transcript line."""
    message = entry.get("message")
    model = message.get("model") if isinstance(message, dict) else None
    return entry.get("isApiErrorMessage") is True or model == _SYNTHETIC_MODEL


def reminders(text: str) -> tuple[str, list[str]]:
    """``text`` without the CLI's ``<system-reminder>`` blocks, and what those held."""
    held = [m.group(1).strip() for m in _REMINDER.finditer(text)]
    return _REMINDER.sub("", text), held


def tagged(text: str, tag: str) -> str | None:
    """What the first ``<tag>…</tag>`` in ``text`` holds, stripped; None without one."""
    m = re.search(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", text, re.S)
    return m.group(1).strip() if m else None


def subagent_report(text: str) -> str | None:
    """A subagent's report out of the frame the CLI hands it back in (notes above the
    frame line, the report indented under it, the agent id and usage after it); None when
    ``text`` has no such frame."""
    lines = text.split("\n")
    head = next((i for i, line in enumerate(lines) if line.startswith(_HANDBACK)), None)
    if head is None:
        return None
    report = []
    for line in lines[head + 1 :]:
        if line and not line.startswith("  "):
            break  # the agent id and usage the CLI adds below the report
        report.append(line[2:])
    return "\n".join(report).strip("\n")


def readable_result(text: str) -> str:
    """A tool result's text without the CLI's wrapping: a subagent's report for its
    hand-back frame, the first sentence of an async launch notice (the rest is metadata
    the CLI asks never to quote), no system reminders, no ``<tool_use_error>`` tags."""
    report = subagent_report(text)
    if report is not None:
        return report
    if text.startswith(_ASYNC_LAUNCH):
        return _ASYNC_LAUNCH
    text, _ = reminders(text)
    return _ERROR_TAG.sub("", text)
