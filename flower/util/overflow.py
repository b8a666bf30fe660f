"""``is_overflow``: does an error text say the context no longer fits?

Shared by the resilience policy (an overflow is not worth retrying as it is) and the step
loop (it hands off to a fresh session instead).
"""

from __future__ import annotations

import re

__all__ = ["is_overflow"]

_OVERFLOW = re.compile(
    r"prompt is too long|context[ _]length[ _]exceeded|maximum context length"
    r"|too many total text bytes|input length and `?max_tokens`? exceed",
    re.IGNORECASE,
)


def is_overflow(*texts: str | None) -> bool:
    """True if any text says the context overflowed ("prompt is too long" and kin).

    Turns the API's hard error into "hand off now" instead of a retry that cannot succeed.
    """
    return any(t and _OVERFLOW.search(t) for t in texts)
