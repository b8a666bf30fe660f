"""The handoff (交接书): what a session writes when its context is nearly full (seed 003, 文书).

When the context nears the window the runtime asks the *same* session (only it holds that
context) to write a handoff with :data:`HANDOFF_PROMPT`, parses the reply with
:meth:`Handoff.parse`, and starts a fresh session whose first message is
:meth:`Handoff.prompt_block`. Five sections; only 在做什么 (doing) and 下一步 (next) are
required — demanding 走不通的路 would push the model to invent dead ends. When the session
cannot write one (the API already said "prompt is too long"), :func:`degraded` builds a
mechanical one.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from flower.util.fsutil import atomic_write_text, private_dir
from flower.util.overflow import is_overflow

# field name -> the heading written by to_markdown(), then accepted aliases.
SECTIONS: dict[str, tuple[str, ...]] = {
    "doing": ("在做什么", "正在做什么", "在做的事", "当前任务", "doing"),
    "decided": ("已经定下的", "已定下的", "已经决定的", "已决定的", "定下的", "决定", "decided"),
    "deadends": ("走不通的路", "走不通的", "死路", "踩过的坑", "dead ends", "deadends"),
    "next": ("下一步", "下一步做什么", "接下来", "next steps", "next"),
    "scene": ("现场", "现场状态", "现状", "scene"),
}
HEADINGS: dict[str, str] = {name: aliases[0] for name, aliases in SECTIONS.items()}
REQUIRED = ("doing", "next")

# to_markdown() writes this for an empty section; a person editing the file who leaves it in
# place has still not filled the section. Files written before it was "(空)" hold "(未填)".
PLACEHOLDER = "(空)"
_PLACEHOLDERS = (PLACEHOLDER, "(未填)")
DEGRADED_SCENE_CHARS = 1200

_ALIAS_TO_FIELD = {a.lower(): name for name, aliases in SECTIONS.items() for a in aliases}
# Longest first, or "下一步" would claim the start of "下一步做什么" and "现场" of "现场状态".
_ALIASES = "|".join(re.escape(a) for a in sorted(_ALIAS_TO_FIELD, key=len, reverse=True))
_HEADING = re.compile(
    r"^\s{0,3}(?:(?P<hash>#{1,6})\s*|(?P<num>(?:\d+|[一二三四五])\s*[.、)）])\s*)?"
    r"(?P<open>\*\*|__|【)?\s*(?P<title>" + _ALIASES + r")(?=[\s:：(（*_】]|$)\s*"
    r"(?:[(（][^)）\n]*[)）])?\s*(?P<close>\*\*|__|】)?\s*"
    r"(?P<colon>[:：])?\s*(?P<close2>\*\*|__)?(?P<rest>.*)$",
    re.IGNORECASE,
)
_TITLE = re.compile(r"^\s{0,3}#\s*交接书?\s*(?:[·:：\-—]\s*(?P<step>.*\S))?\s*$")
_FENCE = re.compile(r"^\s{0,3}(?P<mark>`{3,}|~{3,})(?P<info>.*)$")
_MARKDOWN_INFO = {"markdown", "md"}

HANDOFF_PROMPT = """\
你的上下文已经用了 {used} / {window} tokens,快满了。这一步接下来会换一条全新的会话接手,它看不到你现在的上下文,只能读到你现在写的交接书。

先停下手上的活,不要再调用工具,直接在回话里写一份交接书,恰好五段,用下面这五个标题,顺序不变:

## 在做什么
这一步的任务是什么,做到哪了(必填)。

## 已经定下的
已经做出的决定和理由,接手的人不该再推翻或重新讨论的。

## 走不通的路
试过但行不通的做法,以及为什么行不通,免得接手的人再走一遍。没有就写"无",不要编。

## 下一步
接手的人第一件该做的事,越具体越好(必填)。

## 现场
接手的人要知道的现场:改过哪些文件、产出和笔记在哪、跑到一半的命令、还没提交的改动。

只写这五段,段外不要加别的内容。"""  # noqa: E501 - the model-facing text, sent as written


@dataclass
class Handoff:
    """A handoff: five sections plus the step it belongs to (seed 003, 文书).

    ``doing`` 在做什么, ``decided`` 已经定下的, ``deadends`` 走不通的路, ``next`` 下一步,
    ``scene`` 现场. Only ``doing`` and ``next`` are required. ``path`` is where it was written
    or loaded from and takes no part in equality.
    """

    doing: str = ""
    decided: str = ""
    deadends: str = ""
    next: str = ""
    scene: str = ""
    step: str = ""
    path: Path | None = field(default=None, compare=False)

    @classmethod
    def parse(cls, text: str, *, step: str = "") -> Handoff:
        """Read a handoff out of a model's reply (or a file), tolerating the usual mess.

        ``step`` names the step it belongs to (only the title uses it); without it, the step
        is the one a ``# 交接书 · <step>`` title names, if any.

        Headings may be ``## 下一步``, ``**下一步**``, ``下一步:`` / ``下一步：``, ``1. 下一步``
        or an alias, and may carry text on the same line. A section given twice keeps the first
        copy with content. A ```` ```markdown ```` fence is unwrapped; other closed fences stay
        as text and nothing inside them counts as a heading; an unclosed fence drops everything
        from it on (a truncated reply then parses as incomplete).
        """
        chunks: dict[str, list[list[str]]] = {}
        current: list[str] | None = None
        current_name = ""
        titled = ""
        for line, literal in _lines(_unwrap_whole(text or "")):
            m = None if literal else _HEADING.match(line)
            name = _ALIAS_TO_FIELD[m["title"].lower()] if m else ""
            if m and _is_heading(m, name, current_name, chunks.get(name, [])):
                current, current_name = [], name
                chunks.setdefault(name, []).append(current)
                if m["rest"].strip():
                    current.append(m["rest"].strip())
            elif current is not None:
                current.append(line)
            elif not literal and (t := _TITLE.match(line)):
                titled = t["step"] or ""
        found = {name: _first_filled(copies) for name, copies in chunks.items()}
        return cls(
            doing=found.get("doing", ""),
            decided=found.get("decided", ""),
            deadends=found.get("deadends", ""),
            next=found.get("next", ""),
            scene=found.get("scene", ""),
            step=step or titled,
        )

    def missing(self) -> list[str]:
        """Headings (Chinese) of the required sections that are empty."""
        return [HEADINGS[name] for name in REQUIRED if not getattr(self, name).strip()]

    def complete(self) -> bool:
        """True when every required section (在做什么, 下一步) has content."""
        return not self.missing()

    def sections(self) -> list[str]:
        """Headings of the sections that have content, in document order."""
        return [HEADINGS[name] for name in SECTIONS if getattr(self, name).strip()]

    def to_markdown(self) -> str:
        """The file form: a ``# 交接书 · <step>`` title, then all five sections in order."""
        title = f"# 交接书 · {self.step}" if self.step else "# 交接书"
        parts = [title]
        for name, heading in HEADINGS.items():
            parts.append(f"## {heading}\n\n{getattr(self, name).strip() or PLACEHOLDER}")
        return "\n\n".join(parts) + "\n"

    def prompt_block(self) -> str:
        """The first message of the fresh session taking over."""
        what = f"「{self.step}」这一步" if self.step else "这一步"
        lead = (
            f"你在接手{what}。上一条会话做到一半,上下文快满了,退场前写下了下面这份交接书;"
            "它之前的对话你看不到,交接书就是全部。先核对现场(工作区、工作台里已经落盘的东西),"
            "再从「下一步」接着做,不要重头来过;「已经定下的」不要推翻,「走不通的路」不要再走。"
        )
        filled = [(HEADINGS[n], getattr(self, n).strip()) for n in SECTIONS]
        return "\n\n".join([lead, *(f"## {h}\n{body}" for h, body in filled if body)])

    @property
    def degraded(self) -> bool:
        """Was this handoff made mechanically (:func:`degraded`), not by the session?"""
        return any(DEGRADED_MARK in getattr(self, k) for k in SECTIONS)

    def write(self, path: str | Path, *, archive_dir: str | Path | None = None) -> Path:
        """Write the handoff to ``path`` atomically, owner-only (0600 file, 0700 directories).

        An existing file with other content is first moved to
        ``<archive_dir>/<stem>-<YYYYmmdd-HHMMSS>.md``; ``archive_dir`` defaults to
        ``<path's dir>/archive/交接`` (so ``notes/交接-干活.md`` goes to
        ``notes/archive/交接/交接-干活-<时间戳>.md``). Sets and returns ``self.path``.
        """
        target = Path(path)
        private_dir(target.parent)
        text = self.to_markdown()
        if target.exists() and _read(target) != text:
            archive = Path(archive_dir) if archive_dir else target.parent / "archive" / "交接"
            _archive(target, private_dir(archive))
        atomic_write_text(target, text)
        self.path = target
        return target

    @classmethod
    def load(cls, path: str | Path) -> Handoff | None:
        """Parse the handoff at ``path``; None if it is missing or unreadable."""
        text = _read(Path(path))
        if text is None:
            return None
        handoff = cls.parse(text)
        handoff.path = Path(path)
        return handoff


#: What marks a handoff made by :func:`degraded` (seed 003: ``Handoff.degraded``).
DEGRADED_MARK = "[降级:交接没写成]"


def degraded(step: str, prompt: str, *, why: str = "") -> Handoff:
    """A mechanical handoff for when the session cannot write its own.

    在做什么 and 下一步 are generic but filled (so it is complete); 现场 holds the first
    1200 characters of the step's original task and, if given, why no real handoff exists.
    """
    task = (prompt or "")[:DEGRADED_SCENE_CHARS]
    scene = f"这一步的原始任务(前 {DEGRADED_SCENE_CHARS} 字):\n{task}"
    if why:
        scene += f"\n\n没有正式交接书的原因:{why}"
    return Handoff(
        doing=(
            f"{DEGRADED_MARK} 接着做上一条会话没做完的这一步。它的上下文满了,没能写出交接书,"
            "这是按原始任务机械拼出的降级版本,不知道它做到了哪里。"
        ),
        next=(
            "先查看工作区和工作台(notes/、artifacts/、INDEX.md)里已经落盘的东西,"
            "弄清做到哪了,再从中断处接着做,不要重头来过。"
        ),
        scene=scene,
        step=step,
    )


def _lines(text: str) -> Iterator[tuple[str, bool]]:
    """Yield ``(line, literal)``: literal lines sit inside a closed non-markdown fence.

    A markdown fence is unwrapped (its lines are parsed); an unclosed fence ends the text.
    """
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            yield lines[i], False
            i += 1
            continue
        end = _closing(lines, i + 1, opening["mark"])
        if end is None:
            return
        unwrap = opening["info"].strip().lower() in _MARKDOWN_INFO
        if not unwrap:
            yield lines[i], True
        for inner in lines[i + 1 : end]:
            yield inner, not unwrap
        if not unwrap:
            yield lines[end], True
        i = end + 1


def _closing(lines: list[str], start: int, mark: str) -> int | None:
    """Index of the line closing a fence opened with ``mark`` (same char, at least as long)."""
    closer = re.compile(r"^\s{0,3}" + re.escape(mark[0]) + "{" + str(len(mark)) + r",}\s*$")
    return next((j for j in range(start, len(lines)) if closer.match(lines[j])), None)


def _is_heading(m: re.Match[str], name: str, current: str, copies: list[list[str]]) -> bool:
    """Tell a heading from a body line that merely starts with a section word.

    Strong headings (``#``, bold, 【】, ``1.``) always count, with or without text after them
    (a numbered one needs a colon before such text, or "1. 下一步 …" in a list would split
    the section). Weak ones (``下一步:`` or the word alone on its line) count only for a
    section that is neither the current one nor already filled: inside 已经定下的 a line
    "决定:用 SQLite" is content, not a second copy of the section.
    """
    if m["open"] and not (m["close"] or m["close2"]):
        return False  # "**决定 …" without its closing "**"
    rest = m["rest"].strip()
    if m["hash"] or m["open"]:
        return True
    if m["num"]:
        return bool(m["colon"] or not rest)
    if not (m["colon"] or not rest):
        return False
    return name != current and not _first_filled(copies)


def _unwrap_whole(text: str) -> str:
    """Drop a bare fence wrapped around the whole reply (models sometimes send it so)."""
    lines = text.strip().splitlines()
    opening = _FENCE.match(lines[0]) if lines else None
    if (
        opening
        and len(lines) >= 2
        and not opening["info"].strip()
        and _closing(lines, 1, opening["mark"]) == len(lines) - 1
    ):
        return "\n".join(lines[1:-1])
    return text


def _first_filled(copies: list[list[str]]) -> str:
    for lines in copies:
        body = "\n".join(lines).strip()
        if body and body not in _PLACEHOLDERS:
            return body
    return ""


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _archive(path: Path, archive: Path) -> Path:
    """Move ``path`` into ``archive`` as ``<stem>-<YYYYmmdd-HHMMSS>[-N].md``; never overwrite."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = archive / f"{path.stem}-{stamp}.md"
    n = 1
    while target.exists():
        n += 1
        target = archive / f"{path.stem}-{stamp}-{n}.md"
    os.replace(path, target)
    return target


__all__ = [
    "HANDOFF_PROMPT",
    "HEADINGS",
    "REQUIRED",
    "SECTIONS",
    "Handoff",
    "degraded",
    "is_overflow",
]
