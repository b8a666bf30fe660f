"""The Anthropic Messages API on the wire: error bodies, messages, SSE events, validation.

Shapes follow the real API (``{"type": "error", "error": {"type", "message"}, "request_id"}``,
the SSE event sequence of a streamed message) so the real CLI cannot tell the difference.
"""

from __future__ import annotations

import json
import secrets
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from flower._errors import ConfigError


class _Tool(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def input(self) -> dict[str, Any]: ...


class Turn(Protocol):
    """What of a scripted turn (``_script.Turn``) goes on the wire: a Protocol, so the wire
    format needs no import of the script's module (which imports this one)."""

    @property
    def text(self) -> str | None: ...
    @property
    def tool_uses(self) -> Sequence[_Tool]: ...
    @property
    def usage(self) -> dict[str, int]: ...

    def final_stop_reason(self) -> str: ...


_ALNUM = string.ascii_letters + string.digits

# status -> (error type, default message), as the real API names them.
ERROR_TYPES: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "Invalid request"),
    401: ("authentication_error", "invalid x-api-key"),
    403: (
        "permission_error",
        "Your API key does not have permission to use the specified resource.",
    ),
    404: ("not_found_error", "Not found"),
    413: ("request_too_large", "Request exceeds the maximum allowed number of bytes."),
    429: ("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit"),
    500: ("api_error", "Internal server error"),
    529: ("overloaded_error", "Overloaded"),
}

PROMPT_TOO_LONG = "prompt is too long: 210000 tokens > 200000 maximum"

# Names a script may use instead of a status number.
ERROR_PRESETS: dict[str, tuple[int, str | None]] = {
    "invalid_request": (400, None),
    "prompt_too_long": (400, PROMPT_TOO_LONG),
    "authentication": (401, None),
    "permission": (403, None),
    "rate_limit": (429, None),
    "api_error": (500, None),
    "overloaded": (529, None),
}


# The keys of an error given as an object.
ERROR_KEYS = {"status", "message", "type", "retry_after"}


@dataclass(frozen=True)
class ApiError:
    """An HTTP error answer in the real API's JSON shape."""

    status: int
    message: str
    type: str
    retry_after: float | None = None

    @classmethod
    def of(
        cls, status: int, message: str | None = None, retry_after: float | None = None
    ) -> ApiError:
        etype, default = ERROR_TYPES.get(status, ("api_error", "Internal server error"))
        return cls(status=status, message=message or default, type=etype, retry_after=retry_after)

    @classmethod
    def parse(cls, data: Any, where: str) -> ApiError:
        """``529`` | ``"overloaded"`` | ``{"status", "message"?, "type"?, "retry_after"?}``."""
        if isinstance(data, str):
            if data not in ERROR_PRESETS:
                raise _bad(f"{where}: error name {data!r} is not one of {sorted(ERROR_PRESETS)}")
            status, message = ERROR_PRESETS[data]
            return cls.of(status, message)
        if isinstance(data, int) and not isinstance(data, bool):
            return cls.of(_status(data, where))
        if isinstance(data, dict) and set(data) <= ERROR_KEYS:
            err = cls.of(
                _status(data.get("status"), where), data.get("message"), data.get("retry_after")
            )
            if data.get("type"):
                err = cls(err.status, err.message, str(data["type"]), err.retry_after)
            return err
        raise _bad(f"{where}: 'error' is a status, a preset name or {{'status', 'message', ...}}")

    def body(self) -> dict[str, Any]:
        return error_body(self.type, self.message)

    def headers(self) -> dict[str, str]:
        if self.retry_after is None:
            return {}
        return {"retry-after": f"{self.retry_after:g}"}


def _status(v: Any, where: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not 400 <= v <= 599:
        raise _bad(f"{where}: error status must be an integer 400..599")
    return v


def _bad(what: str) -> ConfigError:
    return ConfigError(
        f"bad model-server script: {what}",
        hint="the format: `flower-super model-server --help` (flower.testing.SCRIPT_FORMAT)",
    )


def new_id(prefix: str, n: int = 24) -> str:
    return prefix + "".join(secrets.choice(_ALNUM) for _ in range(n))


def error_body(etype: str, message: str) -> dict[str, Any]:
    return {
        "type": "error",
        "error": {"type": etype, "message": message},
        "request_id": new_id("req_011C"),
    }


# --- validation ------------------------------------------------------------------------


def tool_pairing_error(messages: list[dict[str, Any]]) -> str | None:
    """The real API's 400 message when tool_use/tool_result do not pair up, else None.

    Messages with role ``system`` (the CLI sends mid-conversation system turns) are skipped
    when looking for "the next message".
    """
    convo = [(i, m) for i, m in enumerate(messages) if m.get("role") != "system"]
    for pos, (i, msg) in enumerate(convo):
        nxt = convo[pos + 1] if pos + 1 < len(convo) else None
        if msg.get("role") == "assistant":
            err = _missing_results(i, msg, nxt[1] if nxt else None)
        else:
            prev = convo[pos - 1][1] if pos > 0 else None
            err = _orphan_results(i, msg, prev)
        if err:
            return err
    return None


def _missing_results(i: int, msg: dict[str, Any], nxt: dict[str, Any] | None) -> str | None:
    ids = [b.get("id") for b in _content(msg) if b.get("type") == "tool_use"]
    if not ids:
        return None
    answered = set()
    if nxt is not None and nxt.get("role") == "user":
        answered = {b.get("tool_use_id") for b in _content(nxt) if b.get("type") == "tool_result"}
    missing = [str(x) for x in ids if x not in answered]
    if not missing:
        return None
    return (
        f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after: "
        f"{', '.join(missing)}. Each `tool_use` block must have a corresponding `tool_result` "
        "block in the next message."
    )


def _orphan_results(i: int, msg: dict[str, Any], prev: dict[str, Any] | None) -> str | None:
    known = set()
    if prev is not None and prev.get("role") == "assistant":
        known = {b.get("id") for b in _content(prev) if b.get("type") == "tool_use"}
    for k, b in enumerate(_content(msg)):
        if b.get("type") == "tool_result" and b.get("tool_use_id") not in known:
            return (
                f"messages.{i}.content.{k}: unexpected `tool_use_id` found in `tool_result` "
                f"blocks: {b.get('tool_use_id')}. Each `tool_result` block must have a "
                "corresponding `tool_use` block in the previous message."
            )
    return None


def _content(msg: dict[str, Any]) -> list[dict[str, Any]]:
    c = msg.get("content")
    return [b for b in c if isinstance(b, dict)] if isinstance(c, list) else []


# --- answers ---------------------------------------------------------------------------


def estimate_tokens(raw_len: int) -> int:
    """A rough input-token count for a request body of ``raw_len`` bytes (about 4 per token)."""
    return max(1, raw_len // 4)


def usage_for(turn: Turn, input_estimate: int) -> dict[str, int]:
    usage = {
        "input_tokens": input_estimate,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": max(1, _output_len(turn) // 4),
    }
    usage.update(turn.usage)
    return usage


def _output_len(turn: Turn) -> int:
    n = len(turn.text or "")
    return n + sum(len(json.dumps(t.input)) for t in turn.tool_uses)


def content_blocks(turn: Turn, tool_ids: list[str]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if turn.text is not None:
        blocks.append({"type": "text", "text": turn.text})
    for tool, tid in zip(turn.tool_uses, tool_ids, strict=True):
        blocks.append({"type": "tool_use", "id": tid, "name": tool.name, "input": tool.input})
    return blocks


def message(turn: Turn, model: str, tool_ids: list[str], usage: dict[str, int]) -> dict[str, Any]:
    """The complete non-streaming response body."""
    return {
        "id": new_id("msg_01"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content_blocks(turn, tool_ids),
        "stop_reason": turn.final_stop_reason(),
        "stop_sequence": None,
        "usage": usage,
    }


def sse_events(turn: Turn, model: str, tool_ids: list[str], usage: dict[str, int]) -> list[bytes]:
    """The streamed form of :func:`message`, one encoded SSE event per item."""
    start_usage = {**usage, "output_tokens": 1}
    head = {**message(turn, model, tool_ids, start_usage), "content": [], "stop_reason": None}
    events = [
        _sse("message_start", {"type": "message_start", "message": head}),
        _sse("ping", {"type": "ping"}),
    ]
    for index, block in enumerate(content_blocks(turn, tool_ids)):
        events.extend(_block_events(index, block))
    delta = {"stop_reason": turn.final_stop_reason(), "stop_sequence": None}
    events.append(_sse("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}))
    events.append(_sse("message_stop", {"type": "message_stop"}))
    return events


def _block_events(index: int, block: dict[str, Any]) -> list[bytes]:
    start: dict[str, Any]
    if block["type"] == "text":
        start = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": c} for c in _chunks(block["text"], 40)]
    else:
        start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        raw = json.dumps(block["input"], ensure_ascii=False)
        deltas = [{"type": "input_json_delta", "partial_json": c} for c in ["", *_chunks(raw, 64)]]
    out = [
        _sse(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": start},
        )
    ]
    out += [
        _sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
        for d in deltas
    ]
    out.append(_sse("content_block_stop", {"type": "content_block_stop", "index": index}))
    return out


def _chunks(s: str, size: int) -> list[str]:
    return [s[i : i + size] for i in range(0, len(s), size)] or [""]


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()
