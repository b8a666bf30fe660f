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
from dataclasses import dataclass, field
from pathlib import Path

from flower.docs.brief import SectionReader, document_lines
from flower.util.fsutil import atomic_write_text, private_dir
from flower.util.overflow import is_overflow

# field name -> the heading written by to_markdown(), then accepted aliases (the reference's
# own headings among them: 现在在做什么, 当前进度, 已定的事, 试过不行的, 排除的路 …).
SECTIONS: dict[str, tuple[str, ...]] = {
    "doing": (
        "在做什么",
        "现在在做什么",
        "现在在做",
        "正在做什么",
        "在做的事",
        "当前任务",
        "当前进度",
        "进度",
        "doing",
    ),
    "decided": (
        "已经定下的",
        "已定下的",
        "已定的事",
        "已经决定的",
        "已决定的",
        "定下的",
        "决定",
        "决策",
        "decided",
    ),
    "deadends": (
        "走不通的路",
        "走不通的",
        "试过不行的",
        "排除的路",
        "死路",
        "踩过的坑",
        "dead ends",
        "deadends",
    ),
    "next": ("下一步", "下一步做什么", "接下来", "next steps", "next"),
    "scene": ("现场", "现场状态", "现状", "scene"),
}
HEADINGS: dict[str, str] = {name: aliases[0] for name, aliases in SECTIONS.items()}
REQUIRED = ("doing", "next")

# to_markdown() writes this for an empty section; a person editing the file who leaves it in
# place has still not filled the section (the brief's "(未填)" reads as empty too).
PLACEHOLDER = "(空)"
DEGRADED_SCENE_CHARS = 1200

# The brief's section reader: one set of heading rules, one fence rule for every document.
_READER = SectionReader(SECTIONS)
_TITLE = re.compile(r"^[ \t]{0,3}#[ \t]*交接书?[ \t]*(?:[·:：\-—][ \t]*(?P<step>.*\S))?[ \t]*$")
_BARE_FENCE = re.compile(r"^[ \t]{0,3}(?P<mark>`{3,}|~{3,})[ \t]*$")

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

只写这五段,段外不要加别的内容。命令和路径直接写成正文,不要放进代码块:代码块里的东西不会交给接手的人。"""  # noqa: E501 - the model-facing text, sent as written


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
        is the one a ``# 交接书 · <step>`` title before the first section names, if any.

        The sections are read by the brief's reader (:class:`~flower.docs.brief.SectionReader`):
        headings ``## 下一步``, ``**下一步**``, ``下一步:``, ``1. 下一步`` or an alias, with text
        on the same line or not; a section given twice keeps its first copy with content;
        fenced code blocks are stripped first (a heading inside one starts nothing, and its
        lines are no part of any section), a ```` ```markdown ```` fence is unwrapped, and an
        unclosed fence drops everything from it on (a truncated reply parses as incomplete).
        A reply wrapped whole in one bare fence is read as if it were not.
        """
        reading = _READER.read(_unwrap_whole(text or ""))
        titles = (_TITLE.match(line) for line in reading.preamble.splitlines())
        titled = next((m["step"] or "" for m in titles if m), "")
        return cls(
            doing=reading.first("doing"),
            decided=reading.first("decided"),
            deadends=reading.first("deadends"),
            next=reading.first("next"),
            scene=reading.first("scene"),
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


def _unwrap_whole(text: str) -> str:
    """A reply wrapped whole in one bare fence (models sometimes send it so), unwrapped.

    Only when the fence holds all of it: read with its fences stripped the reply would be
    empty, and its first and last lines are a bare fence of the same kind."""
    lines = text.strip().splitlines()
    if len(lines) < 3 or any(line.strip() for line in document_lines(text)):
        return text
    first, last = _BARE_FENCE.match(lines[0]), _BARE_FENCE.match(lines[-1])
    closes = bool(first and last and last["mark"].startswith(first["mark"]))
    return "\n".join(lines[1:-1]) if closes else text


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
