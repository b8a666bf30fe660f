"""The eleven messages between the supervisor and a step child, validated on construction.

Each message is a frozen dataclass whose annotations are its wire schema: ``_TYPE_CHECKS`` maps
every annotation used below to the check a decoded value must pass, so the table of classes is the
protocol's only definition. Every field is required on the wire (``null`` for an absent optional);
the Python defaults only spare the sender some typing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from ipc.errors import ProtocolError

#: Nesting bound for the free JSON fields (``options``, ``payload``, ``fields``), which in practice
#: are two levels deep; it keeps validation far away from the interpreter's recursion limit.
MAX_JSON_DEPTH = 64

#: ``Answer.state`` values.
ANSWER_STATES = frozenset({"answered", "timeout", "closed"})

# A Python str can hold lone surrogates (json.loads makes them from "\ud800"), which no UTF-8
# writer downstream (a log, the manifest) can encode.
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # True is an int in Python only


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


_TYPE_CHECKS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "str": ("a string", lambda v: isinstance(v, str)),
    "str | None": ("a string or null", lambda v: v is None or isinstance(v, str)),
    "int": ("an integer", _is_int),
    "int | None": ("an integer or null", lambda v: v is None or _is_int(v)),
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "list[str]": ("a list of strings", _is_str_list),
    "dict[str, Any]": ("a JSON object", lambda v: isinstance(v, dict)),
}


def json_type(value: Any) -> str:
    """The JSON name of a value's type, for error reasons."""
    names = {
        type(None): "null",
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "array",
        dict: "object",
    }
    return names.get(type(value), type(value).__name__)


def json_problem(value: Any, depth: int = 0) -> str | None:
    """Why ``value`` is not a JSON value that survives a UTF-8 round trip, or None."""
    if value is None or isinstance(value, (bool, int)):
        return None
    if isinstance(value, str):
        # isascii() is O(1) in CPython: the common case skips the scan of a large text.
        ok = value.isascii() or not _SURROGATE.search(value)
        return None if ok else "a string holds a lone surrogate (not UTF-8)"
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value} is not a JSON number"
    if depth >= MAX_JSON_DEPTH:
        return f"nested deeper than {MAX_JSON_DEPTH} levels"
    if isinstance(value, list):
        return next(filter(None, (json_problem(item, depth + 1) for item in value)), None)
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"object key {key!r} is not a string"
            problem = json_problem(key) or json_problem(item, depth + 1)
            if problem:
                return problem
        return None
    return f"a {type(value).__name__} is not a JSON value"


class Message:
    """Base of every message; ``TYPE`` is its ``"type"`` on the wire."""

    __slots__ = ()
    TYPE: ClassVar[str] = ""

    def __post_init__(self) -> None:
        problem = self._problem()
        if problem:
            raise ProtocolError(f"{self.TYPE}: {problem}")

    def to_fields(self) -> dict[str, Any]:
        """The message's fields by name (without ``v`` and ``type``)."""
        return {name: getattr(self, name) for name, _ in _SCHEMA[type(self)]}

    @classmethod
    def from_fields(cls, data: dict[str, Any]) -> Message:
        """Build from decoded fields, which must be exactly this message's fields."""
        names = [name for name, _ in _SCHEMA[cls]]
        missing = [name for name in names if name not in data]
        if missing:
            raise ProtocolError(f"{cls.TYPE}: missing field {', '.join(map(repr, missing))}")
        extra = sorted(set(data) - set(names))
        if extra:
            raise ProtocolError(f"{cls.TYPE}: unexpected field {', '.join(map(repr, extra))}")
        return cls(**data)

    def _problem(self) -> str | None:
        for name, (expected, check) in _SCHEMA[type(self)]:
            value = getattr(self, name)
            if not check(value):
                return f"field {name!r} must be {expected}, got {json_type(value)}"
            problem = json_problem(value)
            if problem:
                return f"field {name!r}: {problem}"
        return self._rule()

    def _rule(self) -> str | None:
        """A message-specific constraint beyond field types; None when satisfied."""
        return None


# --- parent -> child ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Start(Message):
    """Run one step attempt; the one ``start`` a child receives.

    The fields of one attempt (flower's ``StepCall.wire()``): ``spec`` is the agent spec's
    name (the spec itself crosses by fork), ``resume``/``fork``/``resume_at`` the session the
    CLI continues, ``attempt`` the attempt's number (for the step's log), ``stop_at`` the
    context size at which the attempt stops itself for a handoff (null: never), lowered to
    the real window minus ``headroom`` when that is given (the window was a guess).
    """

    TYPE: ClassVar[str] = "start"
    label: str
    step: str
    prompt: str
    spec: str
    resume: str | None = None
    fork: bool = False
    resume_at: str | None = None
    attempt: int = 1
    stop_at: int | None = None
    headroom: int | None = None


@dataclass(frozen=True, slots=True)
class Interrupt(Message):
    """Stop the attempt at the next message boundary (the person pressed Ctrl-C).

    What they say next goes to the supervisor's step loop, never to this child: the loop
    sends it with the next attempt.
    """

    TYPE: ClassVar[str] = "interrupt"


@dataclass(frozen=True, slots=True)
class Answer(Message):
    """Reply to the ``Ask`` with the same ``id``; ``state`` is answered, timeout or closed."""

    TYPE: ClassVar[str] = "answer"
    id: str
    state: str
    text: str | None = None

    def _rule(self) -> str | None:
        if self.state in ANSWER_STATES:
            return None
        states = ", ".join(sorted(ANSWER_STATES))
        return f"field 'state' must be one of {states}, got {self.state!r}"


@dataclass(frozen=True, slots=True)
class Shutdown(Message):
    """Exit without running anything more: a prepared child whose step will not run.

    The child ends its CLI (which has sent no request) and exits; it sends nothing back."""

    TYPE: ClassVar[str] = "shutdown"
    reason: str


@dataclass(frozen=True, slots=True)
class Kept(Message):
    """The supervisor has recorded the session the child reported (lineage holds it): a
    kill from now on resumes it. A new session's first tool call waits for this, so a call
    never takes effect in a session nobody could resume after a kill."""

    TYPE: ClassVar[str] = "kept"
    session_id: str


# --- child -> parent ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello(Message):
    """The first line a child sends."""

    TYPE: ClassVar[str] = "hello"
    pid: int


@dataclass(frozen=True, slots=True)
class Session(Message):
    """The step's session id, sent the moment it is known (lineage is written from it)."""

    TYPE: ClassVar[str] = "session"
    label: str
    step: str
    session_id: str


@dataclass(frozen=True, slots=True)
class EventMsg(Message):
    """Progress (an ``Event``): retry / handoff near|writing|done / context size / text ..."""

    TYPE: ClassVar[str] = "event"
    kind: str
    step: str
    payload: dict[str, Any]
    text: str = ""
    tool: str = ""


@dataclass(frozen=True, slots=True)
class Ask(Message):
    """A question for the person (only the supervisor owns the terminal).

    ``channel`` names the flow's ``HumanChannel`` (its ``key``) when the question comes from
    one of its tools; ``kind`` is then the tool (``ask`` or ``inbox``) and the ``Answer``'s
    text is exactly what the model gets back."""

    TYPE: ClassVar[str] = "ask"
    id: str
    question: str
    options: list[str]
    kind: str
    channel: str = ""


@dataclass(frozen=True, slots=True)
class Result(Message):
    """The step's outcome: every StepResult field, as ``StepResult.to_dict()`` gives them."""

    TYPE: ClassVar[str] = "result"
    fields: dict[str, Any]

    def _rule(self) -> str | None:
        step = self.fields.get("step")
        return None if isinstance(step, str) else "fields must hold a string 'step'"


@dataclass(frozen=True, slots=True)
class Failure(Message):
    """An error that crossed the pipe as a frame (never a pickle)."""

    TYPE: ClassVar[str] = "failure"
    kind: str
    message: str
    retryable: bool
    cause: str | None = None


PARENT_TO_CHILD: tuple[type[Message], ...] = (Start, Interrupt, Answer, Shutdown, Kept)
CHILD_TO_PARENT: tuple[type[Message], ...] = (Hello, Session, EventMsg, Ask, Result, Failure)

#: Wire name -> message class.
MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.TYPE: cls for cls in PARENT_TO_CHILD + CHILD_TO_PARENT
}

# Field name -> (expected, check), in declaration order. An annotation missing from _TYPE_CHECKS
# fails here, at import, rather than on the first message.
_SCHEMA: dict[type[Message], tuple[tuple[str, tuple[str, Callable[[Any], bool]]], ...]] = {
    cls: tuple((f.name, _TYPE_CHECKS[str(f.type)]) for f in fields(cls))  # type: ignore[arg-type]
    for cls in MESSAGE_TYPES.values()
}
