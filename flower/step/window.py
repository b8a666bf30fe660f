"""How big the context window is, and when to hand off before it fills (seed 003, HandoffPolicy).

Seed 003's table for :func:`default_window` did not survive its copy; its prose survives:
guess the window from the model name in ``ANTHROPIC_MODEL`` or ``ANTHROPIC_DEFAULT_OPUS_MODEL``,
and guess *aggressively*. Guessing too big is not a hard error: the API answers "prompt is too
long", the runtime recognises it (``is_overflow``) and hands off on the spot — only that
generation's handoff is the degraded, mechanical one. Guessing too small hands off early for
nothing on every long step, which costs more.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

ONE_MILLION = 1_000_000
TWO_HUNDRED_K = 200_000

# Explicit 1M markers: Claude Code's "[1m]" suffix (e.g. "claude-sonnet-4-5[1m]", "opus[1m]")
# and names spelling the window out ("…-1m", "… 1M context").
_ONE_MILLION = re.compile(r"\[1m\]|(?<![0-9a-z])1m(?![0-9a-z])", re.IGNORECASE)

# Families that only ever had a 200K window (or less): every Haiku, the Claude 2/3 generation
# (claude-3-5-sonnet, claude-3-opus …) and "claude-instant".
_TWO_HUNDRED_K = re.compile(r"haiku|claude-instant|claude-[23](?![0-9])", re.IGNORECASE)

# Opus 4, 4.1 and 4.5 had 200K; later Opus models (and every Sonnet 4.x) offer 1M. The minor
# version is one or two digits; a longer number after "opus-4-" is a date ("claude-opus-4-20250514"
# is Opus 4.0).
_OPUS = re.compile(r"opus-(\d+)(?:[-.](\d{1,2})(?!\d))?", re.IGNORECASE)
_OPUS_200K = {(4, 0), (4, 1), (4, 5)}


def _only_200k(name: str) -> bool:
    if _TWO_HUNDRED_K.search(name):
        return True
    m = _OPUS.search(name)
    return m is not None and (int(m[1]), int(m[2] or 0)) in _OPUS_200K


class GuessedWindow(int):
    """A window that :func:`default_window` guessed (an ``int`` in every other respect).

    A policy whose window is a guess hands off at the lower of its threshold and what the
    CLI's real window allows, which each attempt learns from the CLI; a window a person
    wrote (``HandoffPolicy(window=200_000)``) is a plain int and always wins.
    """


def is_guess(window: int) -> bool:
    return isinstance(window, GuessedWindow)


def default_window() -> int:
    """Guess the context window in tokens from the model name in the environment.

    ``ANTHROPIC_MODEL`` is read first, then ``ANTHROPIC_DEFAULT_OPUS_MODEL``:

    - a name with ``[1m]`` or a standalone ``1m`` → 1,000,000;
    - Haiku and the other 200K-only families above → 200,000;
    - anything else, including unset, an alias ("opus", "sonnet") and names we do not know
      → 1,000,000. Chosen because the seed says to guess aggressively (overflow is caught as
      "prompt is too long" and handed off anyway) and because seed 000's measured long run
      (HT001) ran on a 1M window.

    The value is a :class:`GuessedWindow`: attempts check it against the CLI's real window.
    """
    name = (os.environ.get("ANTHROPIC_MODEL") or "").strip()
    name = name or (os.environ.get("ANTHROPIC_DEFAULT_OPUS_MODEL") or "").strip()
    if _ONE_MILLION.search(name):
        return GuessedWindow(ONE_MILLION)
    if _only_200k(name):
        return GuessedWindow(TWO_HUNDRED_K)
    return GuessedWindow(ONE_MILLION)


@dataclass
class HandoffPolicy:
    """Write a handoff and start a fresh session when the context nears the window.

    This is not compaction: the handoff is a document a person can read and edit, so what was
    dropped is visible. ``max_generations`` bounds how many successors one step may have.
    """

    enabled: bool = True
    window: int = field(default_factory=default_window)
    headroom: int = 50_000
    max_generations: int = 8

    @property
    def at(self) -> int:
        """Context size (tokens) at which to hand off: ``max(10_000, window - headroom)``."""
        return max(10_000, self.window - self.headroom)

    @property
    def warn_at(self) -> int:
        """Context size at which to announce the handoff is near: ``max(1_000, at - 20_000)``."""
        return max(1_000, self.at - 20_000)
