"""The one error of the pipe protocol."""

from __future__ import annotations

#: How many bytes of an offending line a ProtocolError keeps: enough to recognise the line in a
#: log, never the whole thing (a step's final text can be megabytes).
EXCERPT_BYTES = 120


class ProtocolError(ValueError):
    """Anything malformed on the pipe.

    Bad JSON, not an object, missing/unknown ``type``, wrong version, a missing, extra or wrongly
    typed field, an oversized line, a truncated last line at EOF, invalid UTF-8: all of them raise
    (or, from ``LineReader.feed``, are returned as) this one type.

    ``reason`` is a short sentence for a log or a failed StepResult's ``error``; ``excerpt`` holds
    at most ``EXCERPT_BYTES`` bytes of the offending input.
    """

    def __init__(self, reason: str, excerpt: bytes | bytearray | str = b"") -> None:
        if isinstance(excerpt, str):
            excerpt = excerpt[:EXCERPT_BYTES].encode("utf-8", "backslashreplace")
        self.reason = reason
        self.excerpt = bytes(excerpt[:EXCERPT_BYTES])
        super().__init__(f"{reason}: {self.excerpt!r}" if self.excerpt else reason)

    def __reduce__(self) -> tuple[type[ProtocolError], tuple[str, bytes]]:
        # The default reduce would call __init__ with the formatted message as ``reason``.
        return (type(self), (self.reason, self.excerpt))
