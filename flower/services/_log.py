"""The model server's request log: every request, in memory and optionally as JSONL."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from flower.util.fsutil import open_private

from ._script import all_texts

T = TypeVar("T")

# Header values that are credentials never reach the log.
_SECRET_HEADERS = {"x-api-key", "authorization", "proxy-authorization", "cookie"}


@dataclass
class RecordedRequest:
    """One request the server received and what it answered.

    ``answer`` is one of ``text``, ``tool_use``, ``error``, ``cut``, ``outage``,
    ``rejected`` (failed validation), ``exhausted`` (conversation has no turn left),
    ``unmatched`` (no conversation and no default), ``count_tokens``, ``models``,
    ``head``, ``not_found``. ``delay`` is the delay applied before answering.
    """

    seq: int
    time: float
    method: str
    path: str
    headers: dict[str, str] = field(default_factory=dict)
    session_id: str | None = None
    conversation: str | None = None
    turn: int | None = None
    stream: bool | None = None
    model: str | None = None
    system: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)
    answer: str = ""
    status: int = 200
    delay: float = 0.0
    detail: str = ""

    def texts(self) -> list[str]:
        """Every piece of text this request carried (system, messages, tool inputs/results)."""
        return all_texts(
            {"system": [{"type": "text", "text": self.system}], "messages": self.messages}
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def redact_headers(headers: Any) -> dict[str, str]:
    return {k: ("[redacted]" if k.lower() in _SECRET_HEADERS else v) for k, v in headers.items()}


class RequestLog:
    """Thread-safe list of :class:`RecordedRequest` with condition waits and a JSONL copy."""

    def __init__(self, path: str | Path | None = None) -> None:
        self._items: list[RecordedRequest] = []
        self._cond = threading.Condition()
        self._path = Path(path) if path is not None else None
        self._fd: int | None = None
        if self._path is not None:
            self._fd = open_private(self._path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    def add(self, rec: RecordedRequest) -> None:
        with self._cond:
            rec.seq = len(self._items)
            self._items.append(rec)
            if self._fd is not None:
                os.write(self._fd, (json.dumps(rec.to_json(), ensure_ascii=False) + "\n").encode())
            self._cond.notify_all()

    def snapshot(self) -> list[RecordedRequest]:
        with self._cond:
            return list(self._items)

    def wait_for(self, predicate: Callable[[list[RecordedRequest]], T], timeout: float = 10.0) -> T:
        """Block until ``predicate(requests)`` is truthy; return its value.

        Raises TimeoutError (naming how many requests arrived) when ``timeout`` passes.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                value = predicate(list(self._items))
                if value:
                    return value
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"model server: condition not met within {timeout:g}s "
                        f"({len(self._items)} requests received)"
                    )
                self._cond.wait(left)

    def close(self) -> None:
        with self._cond:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
