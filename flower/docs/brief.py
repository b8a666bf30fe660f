"""The brief (需求确认书): what the clarifier freezes before any work starts (seed 003, 文书).

Exactly four sections in a fixed order — 目标 (goal), 验收标准 (accept), 边界 (bounds),
未知与假设 (unknowns). :meth:`Brief.parse` reads them out of the clarifier's reply,
:meth:`Brief.write` freezes them to disk (``notes/需求.md`` in the starter flow) and every
later step starts from :meth:`Brief.prompt_block` instead of guessing the requirement again.

The section reader here (:class:`SectionReader`) is shared with the goal and the verdict: one
set of heading rules, one fence rule, one placeholder rule for every document.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from flower.i18n import define, t
from flower.util.fsutil import atomic_write_text, private_dir

# field name -> the heading to_markdown() writes, then the other headings accepted for it.
SECTIONS: dict[str, tuple[str, ...]] = {
    "goal": ("目标", "需求目标", "任务目标", "goal", "objective"),
    "accept": (
        "验收标准",
        "验收条件",
        "验收",
        "完成标准",
        "acceptance criteria",
        "acceptance",
        "accept",
    ),
    "bounds": (
        "边界",
        "不做什么",
        "范围与边界",
        "边界与范围",
        "非目标",
        "bounds",
        "scope",
        "non-goals",
    ),
    "unknowns": (
        "未知与假设",
        "未知项与假设",
        "未知和假设",
        "未知项",
        "未知",
        "假设",
        "unknowns and assumptions",
        "unknowns",
        "assumptions",
    ),
}
HEADINGS: dict[str, str] = {name: aliases[0] for name, aliases in SECTIONS.items()}

# How a person reading English is told a section: its English name, the heading beside it.
define(
    {
        "section.goal": ("目标", "goal (目标)"),
        "section.accept": ("验收标准", "acceptance criteria (验收标准)"),
        "section.bounds": ("边界", "bounds (边界)"),
        "section.unknowns": ("未知与假设", "unknowns and assumptions (未知与假设)"),
        "section.and": ("、", ", "),
    }
)
#: A section heading -> the catalogue key of its name for a person (goal.py adds its own).
SECTION_NAMES: dict[str, str] = {HEADINGS[name]: f"section.{name}" for name in SECTIONS}


def named(headings: Iterable[str]) -> str:
    """Section headings (as ``missing()`` gives them) as the reader names them, joined:
    ``目标、边界`` in Chinese, ``goal (目标), bounds (边界)`` in English. A heading with no
    name of its own is shown as it is."""
    shown = (t(SECTION_NAMES[h]) if h in SECTION_NAMES else h for h in headings)
    return t("section.and").join(shown)


#: What to_markdown() writes for an empty section. Left in place by a person editing the file,
#: the section still counts as missing.
PLACEHOLDER = "(未填)"
#: Every body that means "nothing here" (the brief's and the goal's placeholders, either width).
PLACEHOLDERS = frozenset({PLACEHOLDER, "（未填）", "(空)", "（空）"})

TITLE = "需求确认书"
_NOTE = (
    "> 前置确认问完之后冻结的四段:目标、验收标准、边界、未知与假设。"
    "后面每一步都照这份文件做;要改需求就直接改这个文件。"
)

# --- the shared section reader -----------------------------------------------------------------

_FENCE = re.compile(r"^[ \t]{0,3}(?P<mark>`{3,}|~{3,})(?P<info>.*)$")
_MARKDOWN_INFO = frozenset({"markdown", "md"})
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_PAIRS = {"**": "**", "__": "__", "【": "】"}


def document_lines(text: str) -> list[str]:
    """The lines of ``text`` that can hold sections: fenced code blocks removed.

    A closed fence is dropped whole, heading-looking lines inside it included (the clarifier
    has been seen pasting whole source files into its reply). A fence marked ``markdown`` /
    ``md`` is the document itself and is unwrapped. An unclosed fence drops everything from it
    on, so a truncated reply parses as incomplete instead of as code.
    """
    out: list[str] = []
    _unfence(_LINE_BREAK.split(text), out)
    return out


def _unfence(lines: Sequence[str], out: list[str]) -> bool:
    """Append the unfenced lines to ``out``; False when an unclosed fence cut the text."""
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None or (opening["mark"][0] == "`" and "`" in opening["info"]):
            out.append(lines[i])  # not a fence: ```x``` on one line is inline code
            i += 1
            continue
        end = _closing(lines, i + 1, opening["mark"])
        if end is None:
            return False
        if opening["info"].strip().lower() in _MARKDOWN_INFO and not _unfence(
            lines[i + 1 : end], out
        ):
            return False
        i = end + 1
    return True


def _closing(lines: Sequence[str], start: int, mark: str) -> int | None:
    """Index of the line that closes a fence opened with ``mark`` (same char, as long or more)."""
    closer = re.compile(r"^[ \t]{0,3}" + re.escape(mark[0]) + "{" + str(len(mark)) + r",}[ \t]*$")
    return next((j for j in range(start, len(lines)) if closer.match(lines[j])), None)


def _body(lines: Sequence[str]) -> str:
    text = "\n".join(lines).strip()
    return "" if text in PLACEHOLDERS else text


@dataclass
class Reading:
    """What :meth:`SectionReader.read` found.

    ``copies`` maps a field to the bodies of every section given for it, in document order
    (stripped; a placeholder body reads as ``""``). ``preamble`` is the text before the first
    heading.
    """

    copies: dict[str, list[str]]
    preamble: str

    def first(self, name: str) -> str:
        """The first copy of section ``name`` with content ("" when there is none)."""
        return next((body for body in self.copies.get(name, []) if body), "")


class SectionReader:
    """Split a document into named sections by their headings.

    Headings are tolerated in the shapes models actually write: ``## 目标``, ``**目标**``,
    ``【目标】``, ``目标:`` / ``目标：``, ``3. 边界`` / ``三、边界``, with a trailing colon or a
    parenthetical note, and with body text on the same line. Aliases are tried longest first
    ("未知" must not claim "未知与假设"); a heading word must end where the heading does, so
    "边界条件" is body text, not the 边界 section.
    """

    def __init__(self, sections: Mapping[str, Iterable[str]]) -> None:
        self._field = {a.lower(): name for name, aliases in sections.items() for a in aliases}
        words = sorted(self._field, key=len, reverse=True)
        self._heading = re.compile(
            r"^[ \t]{0,3}(?P<hash>#{1,6})?[ \t]*"
            r"(?P<num>(?:\d{1,2}|[一二三四五六七八九十])[ \t]*[.．、)）])?[ \t]*"
            r"(?P<open>\*\*|__|【)?[ \t]*"
            r"(?P<title>" + "|".join(re.escape(w) for w in words) + r")(?=$|[\s:：(（*_】])"
            r"[ \t]*(?:[(（][^)）]*[)）])?[ \t]*(?P<close>\*\*|__|】)?"
            r"[ \t]*(?P<colon>[:：])?[ \t]*(?P<close2>\*\*|__)?(?P<rest>.*)$",
            re.IGNORECASE,
        )

    def read(self, text: str) -> Reading:
        """Read ``text`` (fences removed first, see :func:`document_lines`) into sections."""
        chunks: dict[str, list[list[str]]] = {}
        preamble: list[str] = []
        current: list[str] = preamble
        current_name = ""
        for line in document_lines(text or ""):
            m = self._heading.match(line)
            name = self._field[m["title"].lower()] if m else ""
            if m and self._is_heading(m, name, current_name, current, chunks.get(name, [])):
                current, current_name = [], name
                chunks.setdefault(name, []).append(current)
                rest = m["rest"].strip()
                if rest and not (m["hash"] and re.fullmatch(r"#+", rest)):
                    current.append(rest)
            else:
                current.append(line)
        copies = {name: [_body(c) for c in cs] for name, cs in chunks.items()}
        return Reading(copies=copies, preamble="\n".join(preamble).strip())

    @staticmethod
    def _is_heading(
        m: re.Match[str], name: str, current: str, body: list[str], copies: list[list[str]]
    ) -> bool:
        """Tell a heading from a body line that merely starts with a section word.

        Strong headings (``#``, bold, 【】) always count. A numbered one needs a colon before
        any text on its line, or "1. 目标 …" in a list would split the section. A weak one
        (``目标:`` or the word alone) counts only for a section that is neither the current one
        nor already filled: inside 验收标准 the line "目标: 跑通" stays content. The word alone
        right under a heading is that section's content ("## 结论" then "未通过"), not the
        next heading.
        """
        if m["open"] and _PAIRS[m["open"]] not in (m["close"], m["close2"]):
            return False  # "**目标 …" without its closing "**"
        rest = m["rest"].strip()
        if m["hash"] or m["open"]:
            return True
        if not (m["colon"] or not rest):
            return False
        if m["num"]:
            return True
        if current and not m["colon"] and not _body(body):
            return False
        return name != current and not any(_body(c) for c in copies)


_READER = SectionReader(SECTIONS)


@dataclass
class Brief:
    """A brief: the four sections of a clarified requirement (seed 003, 文书).

    ``goal`` 目标, ``accept`` 验收标准, ``bounds`` 边界, ``unknowns`` 未知与假设 — all four are
    required. ``path`` is where it was written or loaded from and takes no part in equality.
    """

    goal: str = ""
    accept: str = ""
    bounds: str = ""
    unknowns: str = ""
    path: Path | None = field(default=None, compare=False)

    @classmethod
    def parse(cls, text: str) -> Brief:
        """Read the four sections out of a model's reply (or a file); what is absent stays "".

        Fenced code blocks are removed first and an unclosed fence drops the rest of the text
        (:func:`document_lines`). A section given twice keeps its first copy with content; the
        ``"(未填)"`` placeholder is no content.
        """
        reading = _READER.read(text)
        return cls(
            goal=reading.first("goal"),
            accept=reading.first("accept"),
            bounds=reading.first("bounds"),
            unknowns=reading.first("unknowns"),
        )

    def missing(self) -> list[str]:
        """Chinese names of the empty sections, in order, ready to show a person."""
        return [HEADINGS[name] for name in SECTIONS if not getattr(self, name).strip()]

    def complete(self) -> bool:
        """True when all four sections have content."""
        return not self.missing()

    def to_markdown(self) -> str:
        """The file form: a title and a note, then the four sections; an empty one reads
        ``(未填)``."""
        parts = [f"# {TITLE}", _NOTE]
        for name, heading in HEADINGS.items():
            parts.append(f"## {heading}\n\n{getattr(self, name).strip() or PLACEHOLDER}")
        return "\n\n".join(parts) + "\n"

    def prompt_block(self) -> str:
        """The compact form for the next model: the sections with content only, no title."""
        filled = [(HEADINGS[n], getattr(self, n).strip()) for n in SECTIONS]
        return "\n\n".join(f"## {heading}\n{body}" for heading, body in filled if body)

    def write(self, path: str | Path) -> Path:
        """Freeze the brief at ``path``: parents created owner-only (0700), the file written
        atomically and owner-only (0600). Sets ``self.path`` to the resolved path and returns
        it."""
        self.path = write_document(path, self.to_markdown())
        return self.path

    @classmethod
    def load(cls, path: str | Path) -> Brief | None:
        """Parse the brief at ``path``; None when the file is missing or cannot be read.

        The ``"(未填)"`` placeholder reads back as an empty section.
        """
        loaded = read_document(path)
        if loaded is None:
            return None
        target, text = loaded
        brief = cls.parse(text)
        brief.path = target
        return brief


def read_document(path: str | Path) -> tuple[Path, str] | None:
    """``(resolved path, text)`` of a document file; None if missing or unreadable."""
    try:
        target = Path(path).resolve()
        return target, target.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, RuntimeError):  # RuntimeError: a symlink loop
        return None


def write_document(path: str | Path, text: str) -> Path:
    """Write ``text`` at ``path`` atomically and owner-only; return the resolved path."""
    target = Path(path).resolve()
    private_dir(target.parent)
    atomic_write_text(target, text)
    return target


__all__ = ["HEADINGS", "PLACEHOLDER", "SECTIONS", "SECTION_NAMES", "Brief", "named"]
