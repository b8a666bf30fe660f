"""Model and tool text on the terminal: escape sequences and control characters removed."""

from __future__ import annotations

import io

import pytest

from flower import Event
from flower.util.sanitize import clean
from supervisor.terminal.terminal import Terminal

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        (
            "plain 中文 text\twith a tab\nand a newline",
            "plain 中文 text\twith a tab\nand a newline",
        ),
        ("\x1b[31mred\x1b[0m", "red"),  # SGR from a model: not flower's, so not shown
        ("before\x1b[2J\x1b[Hafter", "beforeafter"),  # clear screen, cursor home
        ("a\x1b[10;20Hb\x1b[1Ac", "abc"),  # cursor moves
        ("\x1b]0;pwned title\x07x", "x"),  # OSC window title, BEL-terminated
        ("\x1b]52;c;ZXZpbA==\x1b\\y", "y"),  # OSC 52 clipboard write, ST-terminated
        ("\x1bP1$tx\x1b\\z", "z"),  # DCS
        ("fake\rreal", "fakereal"),  # a carriage return cannot hide a line
        ("\x9b31mc1\x9d0;t\x9c", "c1"),  # C1 forms of CSI and OSC
        ("bell\x07 nul\x00 del\x7f", "bell nul del"),
        ("\x1b7saved\x1b8", "saved"),  # two-byte ESC sequences
        ("trailing \x1b", "trailing "),
    ],
)
def test_clean(raw: str, shown: str) -> None:
    assert clean(raw) == shown


def test_the_terminal_never_prints_a_models_escapes():
    out = io.StringIO()
    term = Terminal(out)
    term.on_event(Event("text", "看这里\x1b[2J\x1b]0;title\x07完了", payload={"step": "a"}))
    term.on_event(Event("ask", "问\x1b[1A题", payload={"id": "q1", "state": "timeout"}))
    printed = out.getvalue()
    assert "\x1b" not in printed and "\x07" not in printed
    assert "看这里完了" in printed and "问题" in printed
