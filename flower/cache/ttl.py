"""A cache entry's time to live: ``Cache(ttl="7d")`` (seed 004).

A ttl is a number and a unit — ``ms``, ``s``, ``m``, ``h`` or ``d`` (``"500ms"``, ``"90m"``,
``"1.5h"``, ``"7d"``) — or a plain number of seconds (``3600``, ``0.5``); ``None`` means no
ttl (the store's 90-day limit still holds). Units are lower case only, so ``m`` (minutes)
can never be misread as months; ``0`` is allowed and means "never reuse across runs".
"""

from __future__ import annotations

import math
import re

from .._errors import ConfigError

UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

_TTL = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h|d)")
_HINT = "expected a number and a unit ms|s|m|h|d, e.g. '7d', '90m', '500ms'"


def parse_ttl(text: str | int | float | None) -> float | None:
    """Seconds of ``text``, or None for no ttl; ``ConfigError`` (a ``ValueError``) with one
    line naming the value on anything else."""
    if text is None:
        return None
    if isinstance(text, bool) or not isinstance(text, int | float | str):
        raise ConfigError(f"bad ttl {text!r}: {_HINT}")
    if isinstance(text, str):
        m = _TTL.fullmatch(text.strip())
        if m is None:
            raise ConfigError(f"bad ttl {text!r}: {_HINT}")
        seconds = float(m.group(1)) * UNITS[m.group(2)]
    else:
        seconds = float(text)
    if math.isnan(seconds):
        raise ConfigError(f"bad ttl {text!r}: {_HINT}")
    if seconds < 0:
        raise ConfigError(f"bad ttl {text!r}: it must not be negative")
    if math.isinf(seconds):
        raise ConfigError(f"bad ttl {text!r}: it must be finite (None means no ttl)")
    return seconds


def check_ttl(value: object) -> str | None:
    """The one-line problem with ``value`` as a ttl, or None when it is valid."""
    try:
        parse_ttl(value)  # type: ignore[arg-type]  # checking any value is the point
    except ValueError as e:
        return str(e)
    return None
