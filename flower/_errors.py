"""The root of flower's error hierarchy.

Every error a person can cause (a bad flow path, a missing key, a corrupt file) is a
``FlowerError`` with a one-line message and a ``hint``; the command-line front ends print
``message`` and ``hint`` and never a traceback.
"""

from __future__ import annotations

from typing import Any


class FlowerError(Exception):
    """Root of every error flower raises on purpose."""

    def __init__(self, message: str, *, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __reduce__(self) -> tuple[Any, ...]:  # survive pickling across a process boundary
        return (_rebuild, (type(self), self.message, self.hint))

    def one_line(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


def _rebuild(cls: type[FlowerError], message: str, hint: str) -> FlowerError:
    err = cls.__new__(cls)
    FlowerError.__init__(err, message, hint=hint)
    return err


class RunDirBusy(FlowerError):
    """The run_dir is held by a live flower in a way that forbids this start."""


class ConfigError(FlowerError, ValueError):
    """Bad input from a person: a flow path, an option, a file that is not what it claims."""


class AttemptCrash(FlowerError):
    """An attempt failed in a way retrying cannot fix: a bug in flower, a spec the SDK
    rejects, an import that fails where the attempt runs.

    The step stops at once: no retry, no network probe. ``kind`` is the exception's type
    name, ``detail`` its traceback (kept in the step's log file, named by ``log``).
    """

    def __init__(self, kind: str, message: str, *, detail: str = "", log: str = "") -> None:
        super().__init__(f"{kind}: {message}" if message else kind, hint="")
        self.kind = kind
        self.text = message
        self.detail = detail
        self.log = log

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_crash, (self.kind, self.text, self.detail, self.log))

    def one_line(self) -> str:
        where = f"; traceback in {self.log}" if self.log else ""
        return f"flower bug or bad setup, not retried: {self.message}{where}"


def _rebuild_crash(kind: str, message: str, detail: str, log: str) -> AttemptCrash:
    return AttemptCrash(kind, message, detail=detail, log=log)
