"""Text measured in terminal columns: East Asian wide and full-width characters take two.

One place for what the terminal, ``show`` and ``logs`` all need; standard library only, so
the light commands can import it.
"""

from __future__ import annotations

import unicodedata

MIN_WIDTH = 40


def width(text: str) -> int:
    """Terminal columns of ``text``."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def cut(text: str, room: int) -> tuple[str, str]:
    """``text`` split where it first exceeds ``room`` columns: (what fits, the rest)."""
    used = 0
    for i, c in enumerate(text):
        used += width(c)
        if used > room:
            return text[:i], text[i:]
    return text, ""


def fit(text: str, room: int) -> str:
    """``text`` if it fits in ``room`` columns, else cut to ``room - 1`` and ``…``."""
    return text if width(text) <= room else cut(text, room - 1)[0] + "…"


def line_width(most: int) -> int:
    """The width to write at: ``max(40, min(terminal columns, most))``."""
    return max(MIN_WIDTH, min(terminal_columns(), most))


def terminal_columns(fallback: int = 80) -> int:
    """The terminal's columns as ``shutil.get_terminal_size`` tells them (``$COLUMNS``, else
    stdout's terminal, else ``fallback``), without importing shutil (and with it zlib, bz2
    and lzma): the light commands ask this on every run."""
    import os
    import sys

    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns if columns > 0 else fallback
