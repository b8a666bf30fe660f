"""The verdict (判定): one round of the judge's judgement (seed 003, 文书).

Exactly three sections — 结论 (the state), 理由 (reason), 未通过 (the checks that failed). Three
conclusions, not two: ``achieved`` moves on, ``not_yet`` sends the work back with what is
missing, ``unreachable`` ("another round will not help": a missing outside condition, a
contradictory requirement, a check this environment cannot verify) stops to ask a person. A
conclusion that cannot be read is none of them: ``state == ""``, ``ok`` is False, and the
caller treats it as not achieved — a vague "looks fine" must never close the work.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from flower.docs.brief import SectionReader
from flower.docs.goal import list_items
from flower.i18n import define, t

ACHIEVED = "achieved"
NOT_YET = "not_yet"
UNREACHABLE = "unreachable"
STATES = (ACHIEVED, NOT_YET, UNREACHABLE)

# field name -> the heading to_markdown() writes, then the other headings accepted for it.
SECTIONS: dict[str, tuple[str, ...]] = {
    "state": ("结论", "判定", "判定结论", "判定结果", "conclusion", "verdict"),
    "reason": ("理由", "原因", "依据", "reason", "reasons"),
    "failed": (
        "未通过",
        "没通过",
        "未通过项",
        "未通过的条目",
        "没通过的条目",
        "failed",
        "failures",
    ),
}
HEADINGS: dict[str, str] = {name: aliases[0] for name, aliases in SECTIONS.items()}

#: The word to_markdown() writes for each state (the words the judge is told to use).
LABELS: dict[str, str] = {ACHIEVED: "达成", NOT_YET: "未达成", UNREACHABLE: "无法达成"}

# A state as a person reads it (the Chinese is the judge's own word).
define(
    {
        f"verdict.{ACHIEVED}": (LABELS[ACHIEVED], "achieved"),
        f"verdict.{NOT_YET}": (LABELS[NOT_YET], "not achieved"),
        f"verdict.{UNREACHABLE}": (LABELS[UNREACHABLE], "cannot be reached or verified here"),
    }
)

# The words a conclusion is read by. Tried longest first, so "未达成" is found before "达成"
# and "无法达成" before both; on equal length the more cautious state wins. Everything that
# says "cannot be verified here" is unreachable: read as achieved it closes the work on a
# "should work" (a macOS target judged inside a Linux container once passed on a source
# branch), read as not_yet it makes the worker redo, round after round, what no round can fix.
STATE_WORDS: dict[str, tuple[str, ...]] = {
    UNREACHABLE: (
        "无法达成",
        "不可能达成",
        "达不到",
        "做不到",
        "无法验证",
        "没法验证",
        "验证不了",
        "验不了",
        "无法判定",
        "没法判定",
        "unverifiable",
        "unreachable",
        "cannot verify",
        "can't verify",
        "impossible",
    ),
    NOT_YET: (
        "未达成",
        "没达成",
        "没有达成",
        "尚未达成",
        "还没达成",
        "部分达成",
        "基本达成",
        "未完成",
        "没完成",
        "没做完",
        "未通过",
        "没通过",
        "不通过",
        "没到",
        "not yet",
        "not_yet",
        "not achieved",
        "not met",
        "not done",
        "failed",
        "fail",
    ),
    ACHIEVED: ("达成", "已达成", "全部通过", "achieved"),
}

#: The reason a caller gives a verdict it could not read (``ok`` False).
VAGUE_REASON = "判定者没给出明确结论,按未达成处理"

_CAUTION = {UNREACHABLE: 0, NOT_YET: 1, ACHIEVED: 2}
_WORDS: list[tuple[re.Pattern[str], str]] = [
    (
        re.compile(
            r"(?<![a-z])" + re.escape(word) + r"(?![a-z])" if word.isascii() else re.escape(word),
            re.IGNORECASE,
        ),
        state,
    )
    for word, state in sorted(
        ((w, s) for s, words in STATE_WORDS.items() for w in words),
        key=lambda ws: (-len(ws[0]), _CAUTION[ws[1]]),
    )
]
# "无" is how the judge says "nothing failed"; it is not an item.
_NOTHING = frozenset({"无", "无。", "没有", "none", "n/a"})
_READER = SectionReader(SECTIONS)


@dataclass
class Verdict:
    """A verdict: ``state`` (结论), ``reason`` (理由), ``failed`` (未通过) (seed 003, 文书).

    ``state`` is one of :data:`ACHIEVED`, :data:`NOT_YET`, :data:`UNREACHABLE`, or "" when no
    conclusion could be read.
    """

    state: str = ""
    reason: str = ""
    failed: list[str] = field(default_factory=list)

    @property
    def achieved(self) -> bool:
        """The goal is met: move on."""
        return self.state == ACHIEVED

    @property
    def unreachable(self) -> bool:
        """Another round will not help: stop and ask a person (never a pass)."""
        return self.state == UNREACHABLE

    @property
    def ok(self) -> bool:
        """A conclusion was read at all. False must be handled as "not achieved"."""
        return self.state in STATES

    @classmethod
    def parse(cls, text: str) -> Verdict:
        """Read a verdict out of the judge's reply, in this order:

        1. the 结论 / 判定 section by its heading;
        2. with no such section, the whole stripped reply being ``1`` / ``true`` is achieved,
           ``0`` / ``false`` not yet;
        3. otherwise the first word of :data:`STATE_WORDS` (longest first) found in the
           conclusion — the section, or the text before any heading;
        4. still nothing: a lone ``1`` is achieved, a lone ``0`` not yet;
        5. nothing at all: ``state == ""`` (``ok`` False).

        A reply with no headings at all is its own reason.
        """
        text = text or ""
        reading = _READER.read(text)
        failed = (_failed_items(body) for body in reading.copies.get("failed", []))
        verdict = cls(reason=reading.first("reason"), failed=next((f for f in failed if f), []))
        if "state" in reading.copies:
            verdict.state = _state_of(reading.first("state"))
            return verdict
        bare = text.strip().lower()
        if re.fullmatch(r"1|true", bare):
            verdict.state = ACHIEVED
        elif re.fullmatch(r"0|false", bare):
            verdict.state = NOT_YET
        else:
            verdict.state = _state_of(reading.preamble)
            if not reading.copies:
                verdict.reason = reading.preamble
        return verdict

    def to_markdown(self) -> str:
        """The three sections; the state as its Chinese word, ``(空)`` for what is empty,
        ``无`` when nothing failed."""
        failed = "\n".join(f"- {f.strip()}" for f in self.failed if f.strip()) or "无"
        return (
            f"## {HEADINGS['state']}\n\n{LABELS.get(self.state, '(空)')}\n\n"
            f"## {HEADINGS['reason']}\n\n{self.reason.strip() or '(空)'}\n\n"
            f"## {HEADINGS['failed']}\n\n{failed}\n"
        )

    def feedback(self) -> str:
        """What goes back to the worker: what is still missing, never how to do it."""
        lead = "判定者看过这一轮的结果:还没达成目标。在已有的基础上接着做,把差的补上,不要重头来过。"
        lines = [lead]
        failed = [f.strip() for f in self.failed if f.strip()]
        if failed:
            lines += ["", "没通过的条目:", *(f"- {f}" for f in failed)]
        if self.reason.strip():
            lines += ["", "判定理由:", self.reason.strip()]
        return "\n".join(lines)


def state_name(state: str) -> str:
    """A verdict's ``state`` in the reader's language (one of :data:`STATES`)."""
    return t(f"verdict.{state}")


def _state_of(conclusion: str) -> str:
    """Steps 3 and 4 of :meth:`Verdict.parse` on one conclusion text.

    A first line that is nothing but one state word (what VERIFY_PROMPT asks the judge for:
    ``达成`` then the details below) is that state; only otherwise is the whole text searched,
    longest word first, so a note under a clear ``达成`` cannot turn it into another state."""
    first = re.sub(r"[\s。.!!::*`]+", "", conclusion.strip().split("\n", 1)[0])
    for state, words in STATE_WORDS.items():
        if first and first.lower() in {w.lower() for w in words}:
            return state
    for pattern, state in _WORDS:
        if pattern.search(conclusion):
            return state
    if re.search(r"\b1\b", conclusion):
        return ACHIEVED
    if re.search(r"\b0\b", conclusion):
        return NOT_YET
    return ""


def _failed_items(body: str) -> list[str]:
    return [item for item in list_items(body) if item.lower() not in _NOTHING]


__all__ = [
    "ACHIEVED",
    "HEADINGS",
    "LABELS",
    "NOT_YET",
    "SECTIONS",
    "STATES",
    "STATE_WORDS",
    "UNREACHABLE",
    "VAGUE_REASON",
    "Verdict",
    "state_name",
]
