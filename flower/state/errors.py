"""The run state's errors, light to import (``status`` catches them without the SDK).

:mod:`flower.state.seam` re-exports them with the protocols.
"""

from __future__ import annotations

from .._errors import FlowerError

__all__ = ["StateUnavailable", "Superseded"]


class StateUnavailable(FlowerError):
    """The backend cannot be reached right now (PostgreSQL down, a disk that refuses).

    Callers on the continuity path wait and retry (like an API outage) or, where the write
    is best-effort, warn once and go on; never a traceback for a person."""


class Superseded(FlowerError):
    """A write from an attempt whose epoch is lower than the session's: a newer attempt
    owns the session now. The write did not happen."""
