"""One message <-> one line: ``{"v": 1, "type": "<name>", ...fields}`` + ``\\n``, UTF-8."""

from __future__ import annotations

import json
from typing import Any

from ipc.errors import EXCERPT_BYTES, ProtocolError
from ipc.messages import MESSAGE_TYPES, Message, json_type

PROTOCOL_VERSION = 1

#: Default bound on one line's bytes, its newline excluded. A step's final text rides in one
#: ``result`` line, so the bound is generous; it exists so a runaway child cannot make the
#: supervisor buffer without limit.
MAX_LINE_BYTES = 8 * 1024 * 1024

_ENVELOPE = ("v", "type")


def encode(msg: Message, max_line_bytes: int = MAX_LINE_BYTES) -> bytes:
    """One ``\\n``-terminated line for ``msg``; ProtocolError if invalid or over the bound."""
    if not isinstance(msg, Message) or type(msg) not in MESSAGE_TYPES.values():
        raise ProtocolError(f"not a protocol message: {type(msg).__name__}")
    problem = msg._problem()  # again: a dict field may have been mutated since construction
    if problem:
        raise ProtocolError(f"{msg.TYPE}: {problem}")
    obj = {"v": PROTOCOL_VERSION, "type": msg.TYPE, **msg.to_fields()}
    try:
        data = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        line = data.encode("utf-8")
    except (TypeError, ValueError) as exc:  # e.g. an int with more digits than Python prints
        raise ProtocolError(f"{msg.TYPE}: cannot encode: {exc}") from None
    if len(line) > max_line_bytes:
        raise ProtocolError(
            f"{msg.TYPE}: encoded line of {len(line)} bytes exceeds the bound of {max_line_bytes}",
            line,
        )
    return line + b"\n"


def decode(
    line: bytes | bytearray | memoryview | str, max_line_bytes: int = MAX_LINE_BYTES
) -> Message:
    """The message in one line (a trailing ``\\n`` is optional); ProtocolError if malformed."""
    raw = _line_bytes(line)
    if len(raw) > max_line_bytes:
        raise ProtocolError(f"line of {len(raw)} bytes exceeds the bound of {max_line_bytes}", raw)
    if b"\n" in raw:
        raise ProtocolError("more than one line", raw)
    if not raw.strip():
        raise ProtocolError("empty line", raw)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"invalid UTF-8 at byte {exc.start}", _around(raw, exc.start)) from None
    try:
        return _build(_parse(text))
    except ProtocolError as exc:
        raise ProtocolError(exc.reason, exc.excerpt or raw) from None


def _line_bytes(line: bytes | bytearray | memoryview | str) -> bytes:
    if isinstance(line, str):
        try:
            raw = line.encode("utf-8")
        except UnicodeEncodeError:
            raise ProtocolError("line holds a lone surrogate (not UTF-8)", line) from None
    elif isinstance(line, (bytes, bytearray, memoryview)):
        raw = bytes(line)
    else:
        raise ProtocolError(f"a line must be bytes or str, got {type(line).__name__}")
    return raw[:-1] if raw.endswith(b"\n") else raw


def _around(data: bytes | str, pos: int) -> bytes | str:
    start = max(0, pos - EXCERPT_BYTES // 2)
    return data[start : start + EXCERPT_BYTES]


def _parse(text: str) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_object, parse_constant=_no_constant)
    except ProtocolError:
        raise
    except json.JSONDecodeError as exc:
        reason = f"bad JSON: {exc.msg} at char {exc.pos}"
        raise ProtocolError(reason, _around(text, exc.pos)) from None
    except ValueError:  # an integer longer than Python's int-parsing limit (4300 digits)
        raise ProtocolError("bad JSON: a number too long to parse", text) from None
    except RecursionError:
        raise ProtocolError("bad JSON: nested too deeply", text) from None


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):  # json.loads would silently keep the last value
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ProtocolError(f"duplicate key {key!r}")
            seen.add(key)
    return obj


def _no_constant(name: str) -> Any:
    raise ProtocolError(f"bad JSON: {name} is not a JSON number")


def _build(obj: Any) -> Message:
    if not isinstance(obj, dict):
        raise ProtocolError(f"not a JSON object: {json_type(obj)}")
    if "v" not in obj:
        raise ProtocolError("missing protocol version 'v'")
    version = obj["v"]
    if type(version) is not int or version != PROTOCOL_VERSION:  # neither true nor 1.0
        raise ProtocolError(
            f"unsupported protocol version {version!r} (this side speaks {PROTOCOL_VERSION})"
        )
    if "type" not in obj:
        raise ProtocolError("missing message 'type'")
    name = obj["type"]
    if not isinstance(name, str):
        raise ProtocolError(f"message 'type' must be a string, got {json_type(name)}")
    cls = MESSAGE_TYPES.get(name)
    if cls is None:
        raise ProtocolError(f"unknown message type {name!r}")
    return cls.from_fields({k: v for k, v in obj.items() if k not in _ENVELOPE})
