"""Workbench: the directory a flow's agents keep things in, and the index that says what is there.

A session forgets; the disk does not. Scripts worth running again, long output that would
otherwise sit in the context, and decisions the next step must not re-litigate each get a
directory, and a short index of all three goes into every system prompt, so an agent knows
what it already has before it starts redoing it.

Everything here is read by a model: a file whose name or bytes are odd is shown escaped or
described as nothing, never allowed to break the index. The directories are owner-only, as
everything flower writes.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from ..i18n import define, t
from ..util.fsutil import atomic_write_text, private_dir

__all__ = ["Workbench"]

log = logging.getLogger("flower")

define(
    {
        "workbench.index_unwritten": (
            "工作台索引 {path} 没写成:{error}",
            "workbench index {path} not written: {error}",
        ),
    }
)

#: A self-description is looked for in this many first lines of a file.
DESC_LINES = 8
#: A description is cut to this many characters.
DESC_CHARS = 100
#: Bytes read from a file to describe it (eight lines of anything sane fit).
_HEAD_BYTES = 8192

_DESC = re.compile(r"(?:#|//|--)\s*desc\s*:\s*(.*)", re.IGNORECASE)
_COMMENT = re.compile(r"(?:#+|//+|--+)\s*(.*)")
_CODING = re.compile(r"coding[:=]")
_DOCSTRING = re.compile(r"[rRuU]?(\"\"\"|''')(.*)")


@dataclass
class Workbench:
    """The workbench of one workspace: ``scripts/``, ``artifacts/``, ``notes/`` and ``INDEX.md``.

    ``root`` is ``home`` when given (``dirname`` is then ignored), else ``workspace/dirname``.
    A root outside the workspace (``external``) is what isolated subagents need: their
    worktree is not the shared checkout, so a workbench inside it would not be shared.
    ``max_index_entries`` caps each category of :meth:`prompt_block` only; ``INDEX.md`` lists
    everything.
    """

    workspace: Path
    dirname: str = ".flower"
    max_index_entries: int = 40
    home: Path | None = None

    def __post_init__(self) -> None:
        self.workspace = Path(self.workspace).resolve()
        if self.home is not None:
            self.home = Path(self.home).resolve()

    @property
    def root(self) -> Path:
        return self.home if self.home is not None else (self.workspace / self.dirname).resolve()

    @property
    def external(self) -> bool:
        """Is the root outside the workspace (then reached by absolute paths only)?"""
        return not self.root.is_relative_to(self.workspace)

    @property
    def scripts(self) -> Path:
        """Scripts meant to be run again."""
        return self.root / "scripts"

    @property
    def artifacts(self) -> Path:
        """Long output, kept out of the conversation."""
        return self.root / "artifacts"

    @property
    def notes(self) -> Path:
        """Key decisions, one file each."""
        return self.root / "notes"

    @property
    def index_path(self) -> Path:
        return self.root / "INDEX.md"

    def show(self, p: Path) -> str:
        """``p`` as the model is told it: relative inside the workspace, absolute outside."""
        p = Path(p)
        if p.is_absolute() and p.is_relative_to(self.workspace):
            return str(p.relative_to(self.workspace)) or "."
        return str(p)

    def ensure(self) -> Workbench:
        """Create the three directories (owner-only); return ``self``."""
        for d in (self.scripts, self.artifacts, self.notes):
            private_dir(d)
        return self

    def scan(self, d: Path) -> list[tuple[str, str, int]]:
        """``(shown path, description, bytes)`` of every file under ``d``, sorted by path.

        Names starting with ``.`` are skipped at any depth (dot-directories are not entered,
        so neither temp files nor a ``.git`` show up); symlinked directories are not
        followed. A file that cannot be read is listed without a description; one that
        vanishes meanwhile is left out. A missing ``d`` is an empty list.
        """
        return [(self.show(p), desc, size) for p, desc, size in _entries(Path(d))]

    def refresh(self) -> str:
        """Rewrite ``INDEX.md`` (creating the directories first) and return its text.

        The index is derived from the directories, so a failed write costs nothing but a
        warning: the text is returned either way.
        """
        text = self._index_text()
        try:
            self.ensure()
            atomic_write_text(self.index_path, text, durable=False)
        except OSError as exc:
            log.warning("%s", t("workbench.index_unwritten", path=self.index_path, error=exc))
        return text

    def prompt_block(self) -> str:
        """The workbench section of the system prompt: where, the three rules, what is there.

        It is in every turn's prompt, so it stays short: at most ``max_index_entries``
        entries per directory, the rest counted in one line.
        """
        lines = [
            "## 工作台",
            "",
            f"工作台目录是 `{self._shown(self.root)}/`,里面的文件跨步骤保留。",
        ]
        if self.external:
            lines.append("它不在工作区里面:读写都用绝对路径,不要用相对路径。")
        lines += [
            "",
            f"1. 以后还要再跑的脚本放进 `{self._shown(self.scripts)}/`,"
            "第一行写 `# desc: 一句话说明它做什么`。",
            f"2. 超过 2000 字符的输出写进 `{self._shown(self.artifacts)}/`,"
            "对话里只留文件路径和结论。",
            f"3. 关键决定写进 `{self._shown(self.notes)}/`,一个决定一个文件。",
            "",
            f"现有文件(完整清单见 `{self._shown(self.index_path)}`):",
        ]
        for d in (self.scripts, self.artifacts, self.notes):
            found = _entries(d)
            lines.append(f"- `{d.name}/`:" + ("" if found else " 空"))
            for p, desc, _ in found[: max(0, self.max_index_entries)]:
                lines.append(_entry_line(_oneline(str(p.relative_to(d))), desc, indent="  "))
            hidden = len(found) - max(0, self.max_index_entries)
            if hidden > 0:
                lines.append(f"  … 还有 {hidden} 个")
        return "\n".join(lines)

    def _shown(self, p: Path) -> str:
        return _oneline(self.show(p))

    def _index_text(self) -> str:
        lines = [
            "# 工作台索引",
            "",
            "由 flower 生成,工作台里每次 Write/Edit 之后自动重写;手改会被覆盖。",
        ]
        sections = (
            (self.scripts, "以后还要再跑的脚本"),
            (self.artifacts, "长输出"),
            (self.notes, "关键决定,一个决定一个文件"),
        )
        for d, what in sections:
            lines += ["", f"## `{self._shown(d)}/` — {what}", ""]
            found = _entries(d)
            lines += [_entry_line(self._shown(p), desc, size=size) for p, desc, size in found]
            if not found:
                lines.append("(空)")
        return "\n".join(lines) + "\n"


def _entries(d: Path) -> list[tuple[Path, str, int]]:
    """``(path, description, bytes)`` of the regular files under ``d``, as :meth:`scan` says."""
    found: list[tuple[Path, str, int]] = []
    for dirpath, dirnames, filenames in os.walk(d):  # errors (unreadable dirs) are skipped
        dirnames[:] = [n for n in dirnames if not n.startswith(".")]
        for name in filenames:
            if name.startswith("."):
                continue
            p = Path(dirpath, name)
            try:
                st = p.stat()
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                found.append((p, _describe(p), st.st_size))
    return sorted(found, key=lambda e: str(e[0]))


def _describe(path: Path) -> str:
    """A file's one-line self-description, or "" (unreadable or binary files included).

    A ``# desc: …`` line (or ``// desc:``, ``-- desc:``) within the first
    :data:`DESC_LINES` lines wins; otherwise the first non-empty comment line there (not a
    ``#!`` line or a coding cookie) or the first line of a docstring, whichever comes first.
    Cut to :data:`DESC_CHARS` characters.
    """
    try:
        with path.open("rb") as f:
            raw = f.read(_HEAD_BYTES)
    except OSError:
        return ""
    if b"\0" in raw:
        return ""
    lines = [line.strip() for line in raw.decode("utf-8", "replace").splitlines()[:DESC_LINES]]
    for line in lines:
        m = _DESC.match(line)
        if m and m.group(1).strip():
            return _cut(m.group(1))
    for i, line in enumerate(lines):
        doc = _DOCSTRING.match(line)
        if doc:
            quote = doc.group(1)
            rest = [doc.group(2), *lines[i + 1 :]]
            first = next((s for s in (r.split(quote)[0].strip() for r in rest) if s), "")
            if first:
                return _cut(first)
            continue
        if line.startswith("#!") or _CODING.search(line) or _DESC.match(line):
            continue
        m = _COMMENT.match(line)
        if m and m.group(1).strip():
            return _cut(m.group(1))
    return ""


def _cut(text: str) -> str:
    text = _oneline(text.strip())
    return text if len(text) <= DESC_CHARS else text[: DESC_CHARS - 1] + "…"


def _oneline(text: str) -> str:
    """``text`` as one line of valid UTF-8: control characters escaped, and a file name's
    undecodable bytes (surrogate escapes) shown as ``\\xNN``."""
    out = []
    for c in text:
        if c.isprintable():
            out.append(c)
        elif "\udc80" <= c <= "\udcff":
            out.append(f"\\x{ord(c) - 0xDC00:02x}")
        else:
            out.append(c.encode("unicode_escape").decode("ascii"))
    return "".join(out)


def _entry_line(shown: str, desc: str, *, size: int | None = None, indent: str = "") -> str:
    line = f"{indent}- `{shown}`"
    if desc:
        line += f" — {desc}"
    if size is not None:
        line += f" ({size} 字节)"
    return line
