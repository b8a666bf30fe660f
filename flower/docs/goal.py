"""The goal (目标): a statement plus the checklist the judge verdicts against (seed 003, 文书).

The judge derives it from the brief before work starts; ``goal_step`` freezes it
(``notes/目标.md`` in the starter flow) and every round of the goal guard is judged item by item
against :attr:`Goal.checks`. The file form is two sections, ``# 目标`` and ``# 判定清单``, one
check a line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from flower.docs.brief import (
    PLACEHOLDERS,
    SECTION_NAMES,
    SectionReader,
    read_document,
    write_document,
)
from flower.i18n import define

# field name -> the heading to_markdown() writes, then the other headings accepted for it.
SECTIONS: dict[str, tuple[str, ...]] = {
    "statement": ("目标", "目标陈述", "目标描述", "goal", "statement"),
    "checks": (
        "判定清单",
        "判定项",
        "检查清单",
        "检查项",
        "验收清单",
        "清单",
        "checklist",
        "checks",
    ),
}
HEADINGS: dict[str, str] = {name: aliases[0] for name, aliases in SECTIONS.items()}

# The statement's heading is the brief's 目标, named there ("goal (目标)").
define({"section.checks": ("判定清单", "checklist (判定清单)")})
SECTION_NAMES[HEADINGS["checks"]] = "section.checks"

#: What to_markdown() writes for an empty statement or an empty checklist.
EMPTY = "(空)"
#: amend() puts this between the original statement and what was added to it.
AMENDED = "(已修改)"
#: The judge marks a check it cannot verify here with ``[此环境无法验证:原因]`` at its end.
UNVERIFIABLE_MARK = "此环境无法验证"

_UNVERIFIABLE = re.compile(r"[\[【]\s*" + UNVERIFIABLE_MARK + r"\s*[:：]")
# One list marker: "-", "*", "+", "•" or "1." / "1)" followed by a space, or "1、" / "1）".
_MARKER = re.compile(r"^(?:[-*+•·][ \t]+|\d{1,3}(?:[.)][ \t]+|[、）][ \t]*))")
_READER = SectionReader(SECTIONS)


def list_items(body: str) -> list[str]:
    """The items of a list section: one a line, one leading list marker removed, blank and
    placeholder lines skipped."""
    items = (_MARKER.sub("", line.strip(), count=1).strip() for line in body.splitlines())
    return [item for item in items if item and item not in PLACEHOLDERS]


@dataclass
class Goal:
    """A goal: ``statement`` (目标) and ``checks`` (判定清单), both required (seed 003, 文书).

    ``path`` is where it was written or loaded from. Unlike the brief's, the reference makes
    it part of equality: a goal read back from its file equals one whose ``path`` is set.
    """

    statement: str = ""
    checks: list[str] = field(default_factory=list)
    path: Path | None = None

    @property
    def unverifiable(self) -> list[str]:
        """The checks marked ``[此环境无法验证:…]``: they cannot pass a verdict, whatever the
        work does, so they are worth raising when the goal is set."""
        return [check for check in self.checks if _UNVERIFIABLE.search(check)]

    @classmethod
    def parse(cls, text: str) -> Goal:
        """Read the statement and the checklist out of a judge's reply (or a file).

        Headings are tolerated as for the brief; a checklist line loses one ``-`` / ``*`` /
        ``1.`` marker. Fenced code is removed and an unclosed fence drops the rest of the text.
        """
        reading = _READER.read(text)
        bodies = (list_items(body) for body in reading.copies.get("checks", []))
        return cls(
            statement=reading.first("statement"),
            checks=next((items for items in bodies if items), []),
        )

    def missing(self) -> list[str]:
        """Chinese names of the empty parts: 目标 without a statement, 判定清单 without checks."""
        out = [] if self.statement.strip() else [HEADINGS["statement"]]
        if not any(check.strip() for check in self.checks):
            out.append(HEADINGS["checks"])
        return out

    def complete(self) -> bool:
        """True when there is a statement and at least one check."""
        return not self.missing()

    def to_markdown(self) -> str:
        """The file form: ``# 目标`` then ``# 判定清单`` as a ``-`` list; ``(空)`` for an empty
        part."""
        checks = "\n".join(f"- {c.strip()}" for c in self.checks if c.strip()) or EMPTY
        statement = self.statement.strip() or EMPTY
        return f"# {HEADINGS['statement']}\n{statement}\n\n# {HEADINGS['checks']}\n{checks}\n"

    def prompt_block(self) -> str:
        """The compact form for a model: the parts with content only."""
        parts = []
        if self.statement.strip():
            parts.append(f"## {HEADINGS['statement']}\n{self.statement.strip()}")
        checks = [c.strip() for c in self.checks if c.strip()]
        if checks:
            parts.append(f"## {HEADINGS['checks']}\n" + "\n".join(f"- {c}" for c in checks))
        return "\n\n".join(parts)

    def amend(self, extra: str) -> Goal:
        """Append ``extra`` to the statement after ``"\\n\\n(已修改)"`` — the original stays
        visible above it — and return this goal."""
        self.statement = self.statement + "\n\n" + AMENDED + extra
        return self

    def write(self, path: str | Path) -> Path:
        """Write the goal at ``path`` atomically and owner-only (0600 file, 0700 parents).
        Sets ``self.path`` to the resolved path and returns it."""
        self.path = write_document(path, self.to_markdown())
        return self.path

    @classmethod
    def load(cls, path: str | Path) -> Goal | None:
        """Parse the goal at ``path``; None when the file is missing or cannot be read."""
        loaded = read_document(path)
        if loaded is None:
            return None
        target, text = loaded
        goal = cls.parse(text)
        goal.path = target
        return goal


__all__ = ["AMENDED", "EMPTY", "HEADINGS", "SECTIONS", "UNVERIFIABLE_MARK", "Goal"]
