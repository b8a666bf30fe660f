"""The JSON-lines protocol between the flower supervisor and its step children.

One JSON object per line, ``{"v": 1, "type": "<name>", ...fields}``, UTF-8, on dedicated pipes.
Parent -> child: start, interrupt, answer, shutdown, kept. Child -> parent: hello, session,
event, ask, result, failure. Anything malformed is a ``ProtocolError``. Depends on the standard
library only.
"""

from ipc.codec import MAX_LINE_BYTES, PROTOCOL_VERSION, decode, encode
from ipc.errors import EXCERPT_BYTES, ProtocolError
from ipc.messages import (
    ANSWER_STATES,
    CHILD_TO_PARENT,
    MESSAGE_TYPES,
    PARENT_TO_CHILD,
    Answer,
    Ask,
    EventMsg,
    Failure,
    Hello,
    Interrupt,
    Kept,
    Message,
    Result,
    Session,
    Shutdown,
    Start,
)
from ipc.stream import LineReader, LineWriter, read_messages

__all__ = [
    "ANSWER_STATES",
    "CHILD_TO_PARENT",
    "EXCERPT_BYTES",
    "MAX_LINE_BYTES",
    "MESSAGE_TYPES",
    "PARENT_TO_CHILD",
    "PROTOCOL_VERSION",
    "Answer",
    "Ask",
    "EventMsg",
    "Failure",
    "Hello",
    "Interrupt",
    "Kept",
    "LineReader",
    "LineWriter",
    "Message",
    "ProtocolError",
    "Result",
    "Session",
    "Shutdown",
    "Start",
    "decode",
    "encode",
    "read_messages",
]
