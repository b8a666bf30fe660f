"""The model server's script: conversations of turns, and how a request picks its turn.

Pure logic, no I/O: parsing and validating a script dict, matching a request body to a
conversation, and choosing the turn from the request's own history (see ``select``).
The format is :data:`SCRIPT_FORMAT` (``flower-super model-server --help`` prints it); the
key sets below are what it documents, and a test holds the two together.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flower._errors import ConfigError

from . import _wire
from ._format import SCRIPT_FORMAT

__all__ = ["SCRIPT_FORMAT", "Script"]

# Our tool_use ids carry the turn that produced them, so a later request's history tells
# which turns were already answered even after the CLI was killed and resumed.
_TOOL_ID_RE = re.compile(r"^toolu_01FLWR(\d{4})(\d{2})[0-9A-Za-z]+$")
_ALNUM = string.ascii_letters + string.digits

_TOP_KEYS = {"conversations", "default"}
_CONVERSATION_KEYS = {"name", "match", "turns", "one_session"}
_DEFAULT_KEYS = {"name", "turns"}  # the object form of "default": a conversation without match
_TURN_KEYS = {
    "text",
    "tool_use",
    "usage",
    "stop_reason",
    "delay",
    "error",
    "cut",
    "outage",
    "times",
}
_MATCH_KEYS = {"marker", "prompt", "system", "session", "result"}
_USAGE_KEYS = {
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
}


@dataclass(frozen=True)
class ToolUse:
    """One ``tool_use`` block the model asks for."""

    name: str
    input: dict[str, Any]


@dataclass(frozen=True)
class Turn:
    """One scripted model response, optionally preceded by a fault or a delay."""

    text: str | None = None
    tool_uses: tuple[ToolUse, ...] = ()
    usage: dict[str, int] = field(default_factory=dict)
    stop_reason: str | None = None
    delay: float = 0.0
    error: _wire.ApiError | None = None
    cut: int | None = None
    outage: float | None = None
    times: int | None = None

    @property
    def has_content(self) -> bool:
        return self.text is not None or bool(self.tool_uses)

    @property
    def fault_kind(self) -> str | None:
        """``"error"``, ``"cut"``, ``"outage"`` or None (a delay alone is not a fault)."""
        if self.error is not None:
            return "error"
        if self.cut is not None:
            return "cut"
        if self.outage is not None:
            return "outage"
        return None

    def content_kind(self) -> str:
        return "tool_use" if self.tool_uses else "text"

    def final_stop_reason(self) -> str:
        return self.stop_reason or ("tool_use" if self.tool_uses else "end_turn")

    def tool_ids(self, index: int) -> list[str]:
        """Fresh ids for this turn's tool_use blocks, each tagged with the turn index."""
        return [
            f"toolu_01FLWR{index:04d}{k:02d}" + "".join(secrets.choice(_ALNUM) for _ in range(12))
            for k in range(len(self.tool_uses))
        ]


@dataclass(frozen=True)
class Match:
    """What a request must contain to belong to a conversation (all given keys must hold)."""

    marker: str | None = None
    prompt: str | None = None
    system: str | None = None
    session: str | None = None
    result: str | None = None

    def accepts(self, body: dict[str, Any]) -> bool:
        if self.session is not None and session_id_of(body) != self.session:
            return False
        if self.system is not None and self.system not in system_text(body):
            return False
        if self.result is not None and not any(self.result in t for t in result_texts(body)):
            return False
        said = user_texts(body)
        if self.prompt is not None and self.prompt.strip() not in (t.strip() for t in said):
            return False
        return self.marker is None or any(self.marker in t for t in said)


@dataclass(frozen=True)
class Conversation:
    name: str
    turns: tuple[Turn, ...]
    match: Match | None = None  # None: the default conversation
    one_session: bool = False  # answers the first session that reaches it, no other


@dataclass(frozen=True)
class Selection:
    """The answer a request gets: its conversation and turn (``turn`` None: script exhausted)."""

    conversation: Conversation | None
    index: int
    turn: Turn | None


@dataclass(frozen=True)
class Script:
    """A parsed, validated script. Build with :meth:`from_dict`, :meth:`load` or :meth:`coerce`."""

    conversations: tuple[Conversation, ...]
    default: Conversation | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Script:
        if not isinstance(data, dict):
            raise _bad("the script must be a JSON object")
        unknown = set(data) - _TOP_KEYS
        if unknown:
            raise _bad(f"unknown top-level keys {sorted(unknown)}")
        convs = tuple(
            _parse_conversation(c, i) for i, c in enumerate(data.get("conversations") or [])
        )
        names = [c.name for c in convs]
        if len(set(names)) != len(names):
            raise _bad(f"conversation names must be unique, got {names}")
        default = None
        if data.get("default") is not None:
            default = _parse_default(data["default"])
        return cls(conversations=convs, default=default)

    @classmethod
    def load(cls, path: str | Path) -> Script:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"cannot read model-server script {path}: {exc}",
                hint="give a JSON file in the format `flower-super model-server --help` shows",
            ) from exc
        return cls.from_dict(data)

    @classmethod
    def coerce(cls, script: Script | dict[str, Any] | str | Path) -> Script:
        """Accept a Script, a dict, or the path of a JSON file."""
        if isinstance(script, Script):
            return script
        if isinstance(script, dict):
            return cls.from_dict(script)
        return cls.load(script)

    def conversation_for(
        self, body: dict[str, Any], owners: dict[str, str] | None = None
    ) -> Conversation | None:
        """The first conversation whose ``match`` accepts ``body``, else the default.

        A ``one_session`` conversation is passed by when ``owners`` (conversation name ->
        the session that took it) gives it to another session, or when ``body`` names no
        session; the first session it accepts takes it (``owners`` is updated). Without
        ``owners`` (None) every session may take it.
        """
        sid = session_id_of(body)
        for conv in self.conversations:
            if conv.match is None or not conv.match.accepts(body):
                continue
            if conv.one_session:
                owner = (owners or {}).get(conv.name)
                if sid is None or owner not in (None, sid):
                    continue
                if owners is not None:
                    owners[conv.name] = sid
            return conv
        return self.default

    def select(self, body: dict[str, Any], owners: dict[str, str] | None = None) -> Selection:
        """Choose the conversation and turn that answer ``body`` (``owners``: see
        :meth:`conversation_for`).

        The turn is one past the last of this conversation's turns found in the request's
        own assistant history (our tool_use ids name their turn; text turns match by text),
        so the choice survives CLI kills, resumes and server restarts alike.
        """
        conv = self.conversation_for(body, owners)
        if conv is None:
            return Selection(None, 0, None)
        index = answered_turns(conv, body.get("messages") or [])
        turn = conv.turns[index] if index < len(conv.turns) else None
        return Selection(conv, index, turn)


def answered_turns(conv: Conversation, messages: list[dict[str, Any]]) -> int:
    """How many of ``conv``'s turns the history already shows answered (the next index)."""
    nxt = 0
    for block in _assistant_blocks(messages):
        kind = block.get("type")
        if kind == "tool_use":
            m = _TOOL_ID_RE.match(str(block.get("id", "")))
            if m:
                nxt = max(nxt, int(m.group(1)) + 1)
        elif kind == "text":
            nxt = _advance_by_text(conv, nxt, str(block.get("text", "")))
    return nxt


def _advance_by_text(conv: Conversation, nxt: int, text: str) -> int:
    wanted = text.strip()
    if not wanted:
        return nxt
    for j in range(nxt, len(conv.turns)):
        t = conv.turns[j].text
        if t is not None and t.strip() == wanted:
            return j + 1
    return nxt


def _assistant_blocks(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for msg in messages:
        if msg.get("role") == "assistant":
            out.extend(_blocks(msg.get("content")))
    return out


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [b for b in content if isinstance(b, dict)]
    return []


# --- reading a request body -------------------------------------------------------------


def session_id_of(body: dict[str, Any]) -> str | None:
    """The session id inside ``metadata.user_id`` (a JSON string the CLI sends)."""
    raw = (body.get("metadata") or {}).get("user_id")
    if not isinstance(raw, str):
        return None
    try:
        parsed = json.loads(raw)
    except ValueError:
        return None
    sid = parsed.get("session_id") if isinstance(parsed, dict) else None
    return sid if isinstance(sid, str) and sid else None


def system_text(body: dict[str, Any]) -> str:
    """The ``system`` field as one string (it may be a string or a list of text blocks)."""
    return "\n".join(b.get("text", "") for b in _blocks(body.get("system")) if "text" in b)


def user_texts(body: dict[str, Any]) -> list[str]:
    """Text blocks of user messages (tool results excluded), in order."""
    return [
        str(b.get("text", ""))
        for msg in body.get("messages") or []
        if msg.get("role") == "user"
        for b in _blocks(msg.get("content"))
        if b.get("type") == "text"
    ]


def result_texts(body: dict[str, Any]) -> list[str]:
    """The text of every tool result the request carries, in order."""
    out: list[str] = []
    for msg in body.get("messages") or []:
        for b in _blocks(msg.get("content")):
            if b.get("type") == "tool_result":
                out.extend(_block_texts(b))
    return out


def all_texts(body: dict[str, Any]) -> list[str]:
    """Every piece of text a request carries: system, message text, tool inputs and results."""
    out = [system_text(body)]
    for msg in body.get("messages") or []:
        for b in _blocks(msg.get("content")):
            out.extend(_block_texts(b))
    return [t for t in out if t]


def _block_texts(block: dict[str, Any]) -> list[str]:
    kind = block.get("type")
    if kind == "text":
        return [str(block.get("text", ""))]
    if kind == "tool_use":
        return [json.dumps(block.get("input"), ensure_ascii=False)]
    if kind == "tool_result":
        inner = block.get("content")
        if isinstance(inner, str):
            return [inner]
        return [t for b in _blocks(inner) for t in _block_texts(b)]
    return []


# --- parsing ---------------------------------------------------------------------------


def _bad(what: str) -> ConfigError:
    return ConfigError(
        f"bad model-server script: {what}",
        hint="the format: `flower-super model-server --help` (flower.testing.SCRIPT_FORMAT)",
    )


def _parse_default(data: Any) -> Conversation:
    if isinstance(data, list):
        data = {"turns": data}
    if not isinstance(data, dict) or set(data) - _DEFAULT_KEYS:
        raise _bad("'default' is a list of turns or {'name'?, 'turns': [...]} (no 'match')")
    return Conversation(name=str(data.get("name", "default")), turns=_parse_turns(data, "default"))


def _parse_conversation(data: Any, i: int) -> Conversation:
    if not isinstance(data, dict):
        raise _bad(f"conversation {i} is not an object")
    name = str(data.get("name", f"conversation-{i}"))
    unknown = set(data) - _CONVERSATION_KEYS
    if unknown:
        raise _bad(f"conversation {name!r}: unknown keys {sorted(unknown)}")
    match = data.get("match")
    if not isinstance(match, dict) or not match or set(match) - _MATCH_KEYS:
        raise _bad(f"conversation {name!r}: 'match' needs one or more of {sorted(_MATCH_KEYS)}")
    if not all(isinstance(v, str) and v for v in match.values()):
        raise _bad(f"conversation {name!r}: match values must be non-empty strings")
    one_session = data.get("one_session", False)
    if not isinstance(one_session, bool):
        raise _bad(f"conversation {name!r}: 'one_session' must be true or false")
    return Conversation(
        name=name, turns=_parse_turns(data, name), match=Match(**match), one_session=one_session
    )


def _parse_turns(data: dict[str, Any], name: str) -> tuple[Turn, ...]:
    turns = data.get("turns")
    if not isinstance(turns, list) or not turns or len(turns) > 9999:
        # tool_use ids carry the turn index in four digits
        raise _bad(f"conversation {name!r}: 'turns' must be a list of 1..9999 turns")
    return tuple(_parse_turn(t, f"{name!r} turn {j}") for j, t in enumerate(turns))


def _parse_turn(data: Any, where: str) -> Turn:
    if isinstance(data, str):
        data = {"text": data}
    if not isinstance(data, dict):
        raise _bad(f"{where} is not an object")
    unknown = set(data) - _TURN_KEYS
    if unknown:
        raise _bad(f"{where}: unknown keys {sorted(unknown)}")
    turn = Turn(
        text=_opt_str(data, "text", where),
        tool_uses=_parse_tool_uses(data.get("tool_use"), where),
        usage=_parse_usage(data.get("usage"), where),
        stop_reason=_opt_str(data, "stop_reason", where),
        delay=_num(data.get("delay", 0), where, "delay"),
        error=_wire.ApiError.parse(data["error"], where) if "error" in data else None,
        cut=_opt_int(data, "cut", where),
        outage=_num(data["outage"], where, "outage") if "outage" in data else None,
        times=_opt_int(data, "times", where),
    )
    _check_turn(turn, data, where)
    return turn


def _check_turn(turn: Turn, data: dict[str, Any], where: str) -> None:
    faults = [k for k in ("error", "cut", "outage") if k in data]
    if len(faults) > 1:
        raise _bad(f"{where}: at most one of error/cut/outage per turn, got {faults}")
    if turn.times is not None and turn.times < 1:
        raise _bad(f"{where}: 'times' must be >= 1")
    limited = turn.times is not None or not faults
    if limited and not turn.has_content:
        raise _bad(f"{where}: needs 'text' or 'tool_use' (what it answers once faults are done)")


def _parse_tool_uses(data: Any, where: str) -> tuple[ToolUse, ...]:
    if data is None:
        return ()
    items = data if isinstance(data, list) else [data]
    out = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise _bad(f"{where}: each tool_use needs a 'name' and an 'input' object")
        tool_input = item.get("input", {})
        if not isinstance(tool_input, dict):
            raise _bad(f"{where}: tool_use 'input' must be an object")
        out.append(ToolUse(name=item["name"], input=tool_input))
    if len(out) > 99:
        raise _bad(f"{where}: at most 99 tool_use blocks per turn")
    return tuple(out)


def _parse_usage(data: Any, where: str) -> dict[str, int]:
    if data is None:
        return {}
    if not isinstance(data, dict) or set(data) - _USAGE_KEYS:
        raise _bad(f"{where}: 'usage' keys are {sorted(_USAGE_KEYS)}")
    if not all(isinstance(v, int) and v >= 0 for v in data.values()):
        raise _bad(f"{where}: usage values must be non-negative integers")
    return dict(data)


def _opt_str(data: dict[str, Any], key: str, where: str) -> str | None:
    v = data.get(key)
    if v is not None and not isinstance(v, str):
        raise _bad(f"{where}: {key!r} must be a string")
    return v


def _opt_int(data: dict[str, Any], key: str, where: str) -> int | None:
    v = data.get(key)
    if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
        raise _bad(f"{where}: {key!r} must be a non-negative integer")
    return v


def _num(v: Any, where: str, key: str) -> float:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
        raise _bad(f"{where}: {key!r} must be a non-negative number of seconds")
    return float(v)
