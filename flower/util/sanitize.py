"""Text from a model or a tool, made safe to print on a person's terminal.

A model's reply, a file it read or a command's output may hold terminal control sequences:
cursor moves and screen clears that overwrite what flower printed, OSC sequences that set
the window title or a clipboard, or a bare carriage return that hides a line. :func:`clean`
removes every escape sequence and control character except newline and tab; printable text,
Chinese included, is untouched. flower prints no colours of its own yet; when it does, they
are added after cleaning, so only flower's own SGR codes reach the terminal.
"""

from __future__ import annotations

import re

# ESC [ … final byte (CSI), ESC ] … BEL or ESC \ (OSC), ESC P/X/^/_ … ESC \ (DCS, SOS, PM,
# APC), then any other two-byte ESC sequence; the C1 forms of CSI/OSC (0x9b, 0x9d) too.
_SEQUENCES = re.compile(
    r"""
    (?:\x1b\[|\x9b)[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]?   # CSI
    | (?:\x1b\]|\x9d)[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?  # OSC
    | \x1b[PX^_][^\x1b\x9c]*(?:\x1b\\|\x9c)?               # DCS, SOS, PM, APC
    | \x1b[\x20-\x7e]?                                     # any other ESC sequence
    """,
    re.VERBOSE,
)
# C0 controls but tab and newline, DEL, and the C1 range.
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean(text: str) -> str:
    """``text`` without terminal escape sequences and control characters (tab and newline
    are kept; a carriage return is dropped, so a line cannot be overwritten)."""
    return _CONTROLS.sub("", _SEQUENCES.sub("", text))
