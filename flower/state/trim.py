"""``TrimmingSessionStore``: what a resumed session is sent, trimmed by size and by value.

The middle of the three store layers (sqlite → trimming → pruning, seed 003 会话存储). A
layer, not a backend: it wraps any session store of the seam
(:class:`~flower.state.seam.Sessions`: SQLite's, PostgreSQL's) and is one itself, every
method handed to the store it wraps but ``load``. Everything happens in
:meth:`TrimmingSessionStore.load`, which the SDK calls before it spawns the CLI to resume a
session: the SDK writes the entries ``load()`` returns into the JSONL file the CLI resumes
from, so they are exactly what the model is sent. The store below keeps every original byte
(``load_sync`` still returns them); ``load()`` returns new dicts and never mutates what the
lower layer returned.

Two rules, in this order:

1. **Expiry** (:class:`EphemeralPolicy`, on by default): the result of a one-off Bash
   command (:func:`is_ephemeral`: ``git status``, ``ls``, ``cat x | wc -l`` …) at least
   ``keep_recent`` turns old is replaced by a one-line notice; the stale output is dropped,
   not spilled (the state it showed may have changed; the notice says to run it again).
   Only results of at most ``max_chars`` characters count as such glances: a longer output
   is data the model may still need, so it is left to the trimming rule, which keeps it.
2. **Trimming** (:class:`TrimPolicy`, off unless ``Runtime(trim=...)``): a tool result at
   least ``keep_recent`` turns old and longer than ``min_chars`` is written to
   ``<workspace>/.flower/spill/<sha256[:16]>.txt`` (owner-only, written once) and replaced
   by a pointer to that file plus its first ``HEAD_CHARS`` characters. Nothing is lost.

Definitions shared by both rules:

- A **turn** is one model response on the transcript's own thread: an ``assistant`` entry
  whose ``message.model`` is not ``<synthetic>`` (API-error and "No response requested."
  entries are not responses), entries sharing a ``message.id`` counted once (the CLI writes
  one entry per content block). The own thread is the main thread (``isSidechain`` false)
  of a session transcript, and the subagent's for a subagent transcript (the ``isSidechain``
  value of its first conversation entry).
- A tool result's **age** is the number of turns that start after it in the transcript:
  a result the model has answered once is 1 turn old. "Older than the ``keep_recent`` most
  recent turns" means ``age >= keep_recent``.
- Only pure-text results are rewritten (a string, or a list of text blocks): a result
  holding an ``image`` or ``document`` block is left whole. ``isCompactSummary`` entries are
  never touched. A ``tool_result`` block always stays; only its ``content`` changes (a
  missing one is the API's "Missing Tool Result Block"). Results the CLI marked as refused
  or interrupted (``toolDenialKind``, a rejecting ``permissionDecision``) are the pruning
  layer's business and are not touched here.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from claude_agent_sdk.types import (
    SessionKey,
    SessionListSubkeysKey,
    SessionStoreEntry,
    SessionStoreListEntry,
    SessionSummaryEntry,
)

from ..i18n import define, t
from ..util.ephemeral import is_ephemeral
from ..util.fsutil import atomic_write_text, private_dir
from .seam import Sessions
from .sqlite import SqliteSessionStore

__all__ = [
    "HEAD_CHARS",
    "EphemeralPolicy",
    "TrimPolicy",
    "TrimmingSessionStore",
    "is_ephemeral",
    "trim_report",
    "turn_ages",
]

logger = logging.getLogger(__name__)

define(
    {
        "trim.spill_failed": (
            "一条工具结果没能另存出去({error}),原样保留",
            "could not spill a tool result ({error}); kept whole",
        ),
    }
)

#: Characters of a trimmed result kept in place after the pointer (as spill_guard does).
HEAD_CHARS = 400
#: ``{cmd}`` in the expiry notice is the command on one line, cut to this many characters.
CMD_CHARS = 80
_SYNTHETIC_MODEL = "<synthetic>"

Entry = dict[str, Any]


@dataclass
class TrimPolicy:
    """Resume-time trimming of large old tool results (seed 003 defaults)."""

    keep_recent: int = 20
    min_chars: int = 2000
    spill_dirname: str = ".flower/spill"
    enabled: bool = True

    def placeholder(self, path: str, n: int) -> str:
        """The pointer line that replaces a trimmed result of ``n`` characters spilled to
        ``path`` (its first :data:`HEAD_CHARS` characters follow it on the next line)."""
        return (
            f"[这段工具结果共 {n} 字符,已移到 {path},内容没丢,需要时用 Read 读取。"
            f"下面是开头 {min(n, HEAD_CHARS)} 字符]"
        )


@dataclass
class EphemeralPolicy:
    """Resume-time expiry of one-off Bash command results (seed 003 defaults).

    ``max_chars``: only results of at most this many characters are treated as one-off
    glances and expired; a longer one is left to :class:`TrimPolicy` (spilled, not lost).
    """

    enabled: bool = True
    keep_recent: int = 6
    max_chars: int = 2000
    text: str = "[{cmd} 的结果已过期(第 {age} 轮前),当前状态可能已变。需要请重新执行]"

    def placeholder(self, cmd: str, age: int) -> str:
        """``text`` filled in: what replaces the result of ``cmd``, ``age`` turns old."""
        return self.text.format(cmd=cmd, age=age)


# ======================================================================================
# transcript entries
# ======================================================================================


def _blocks(entry: Entry) -> list[Any] | None:
    msg = entry.get("message")
    content = msg.get("content") if isinstance(msg, dict) else None
    return content if isinstance(content, list) else None


def tool_results(entry: Entry) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(index, block)`` of every ``tool_result`` block of a user entry."""
    if entry.get("type") != "user":
        return
    for i, block in enumerate(_blocks(entry) or ()):
        if isinstance(block, dict) and block.get("type") == "tool_result":
            yield i, block


def tool_uses(entry: Entry) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(index, block)`` of every ``tool_use`` block of an assistant entry."""
    if entry.get("type") != "assistant":
        return
    for i, block in enumerate(_blocks(entry) or ()):
        if isinstance(block, dict) and block.get("type") == "tool_use":
            yield i, block


def result_text(block: dict[str, Any]) -> str | None:
    """The text of a pure-text tool result; None if it holds anything else (images…)."""
    content = block.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    parts = []
    for item in content:
        if not isinstance(item, dict) or item.get("type") != "text":
            return None  # image / document / anything unknown: never rewritten
        parts.append(str(item.get("text", "")))
    return "\n".join(parts)


def with_result_text(entry: Entry, index: int, text: str) -> Entry:
    """A copy of ``entry`` whose content block ``index`` has ``content`` = ``text``.

    Copy on write: the entry, its message, its content list and that block are new
    objects; everything else is shared with the original, which is left as it was.
    """
    msg = dict(entry["message"])
    content = list(msg["content"])
    content[index] = {**content[index], "content": text}
    msg["content"] = content
    return {**entry, "message": msg}


def is_refused_or_interrupted(entry: Entry) -> bool:
    """Did the CLI mark this tool-result entry as refused, cancelled or interrupted?"""
    decision = entry.get("permissionDecision")
    rejected = isinstance(decision, dict) and decision.get("decision") == "reject"
    return bool(entry.get("toolDenialKind")) or rejected


def is_response(entry: Entry) -> bool:
    """An assistant entry written from a real model response (not a synthetic one)."""
    if entry.get("type") != "assistant":
        return False
    msg = entry.get("message")
    return not (isinstance(msg, dict) and msg.get("model") == _SYNTHETIC_MODEL)


def turn_ages(entries: list[Entry]) -> list[int]:
    """For each entry, how many turns of the transcript's own thread start after it."""
    own = next((bool(e.get("isSidechain")) for e in entries if e.get("uuid")), False)
    ages = [0] * len(entries)
    seen: set[str] = set()
    for i in range(len(entries) - 1, -1, -1):
        ages[i] = len(seen)
        entry = entries[i]
        if is_response(entry) and bool(entry.get("isSidechain")) == own:
            msg = entry.get("message")
            msg_id = msg.get("id") if isinstance(msg, dict) else None
            # counted at its last block: a tool result follows every block of its response
            seen.add(f"m:{msg_id}" if msg_id else f"u:{entry.get('uuid', i)}")
    return ages


def tool_use_index(entries: list[Entry]) -> dict[str, dict[str, Any]]:
    """``tool_use`` id → its block, over the whole transcript."""
    found: dict[str, dict[str, Any]] = {}
    for entry in entries:
        for _, block in tool_uses(entry):
            if isinstance(block.get("id"), str):
                found[block["id"]] = block
    return found


# ======================================================================================
# the store
# ======================================================================================


def _inner_store(store: str | os.PathLike[str] | Sessions) -> Sessions:
    """``store`` itself, or a :class:`SqliteSessionStore` on the database file it names."""
    if isinstance(store, (str, os.PathLike)):
        return SqliteSessionStore(os.fspath(store))
    return store


class TrimmingSessionStore(Sessions):
    """A session store whose ``load()`` expires one-off results and trims big ones.

    ``path`` is the store it wraps (any :class:`~flower.state.seam.Sessions`, kept as
    :attr:`inner`), or a database file: then it wraps a :class:`SqliteSessionStore` on it,
    as before the layers took any store. Every method but ``load`` is the inner store's.
    ``workspace`` is where spill files go (``<workspace>/<policy.spill_dirname>``).
    ``policy`` defaults to ``TrimPolicy()``, ``ephemeral`` to ``EphemeralPolicy()``; a
    policy with ``enabled=False`` skips its rule entirely. ``last_report`` counts what the
    most recent ``load()`` did, per rule (``expired``, ``trimmed``; ``trim_failed`` when a
    spill file could not be written, in which case that result is left whole). The SDK
    loads a session's subagent transcripts after its main one, so after a resume it
    describes the last transcript loaded. ``last_trim`` adds the trimming rule's detail
    when it ran: ``cleared`` (results trimmed), ``kept`` (text results left whole because
    they are recent) and ``chars_saved``; :func:`trim_report` says both in one line.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | Sessions,
        workspace: str | Path,
        policy: TrimPolicy | None = None,
        ephemeral: EphemeralPolicy | None = None,
    ) -> None:
        self.inner: Sessions = _inner_store(path)
        self.workspace = Path(workspace).absolute()  # spill pointers must work from any cwd
        self.policy = policy if policy is not None else TrimPolicy()
        self.ephemeral = ephemeral if ephemeral is not None else EphemeralPolicy()
        self.last_report: dict[str, int] = {}
        self.last_trim: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r}, workspace={str(self.workspace)!r})"

    async def load(self, key: SessionKey) -> list[SessionStoreEntry] | None:
        """The stored entries of ``key`` as the model should see them on resume."""
        entries = await self.inner.load(key)
        self.last_report, self.last_trim = {}, {}
        if entries is None:
            return None
        # Spill files are written here: keep the file I/O off the event loop.
        # SessionStoreEntry is a TypedDict: at run time the very dicts reshape() works on.
        shaped = await asyncio.to_thread(self.reshape, cast("list[Entry]", entries))
        return cast("list[SessionStoreEntry]", shaped)

    # ---- the rest is the inner store's --------------------------------------------------

    async def append(self, key: SessionKey, entries: list[SessionStoreEntry]) -> None:
        await self.inner.append(key, entries)

    async def list_sessions(self, project_key: str) -> list[SessionStoreListEntry]:
        return await self.inner.list_sessions(project_key)

    async def list_session_summaries(self, project_key: str) -> list[SessionSummaryEntry]:
        return await self.inner.list_session_summaries(project_key)

    async def delete(self, key: SessionKey) -> None:
        await self.inner.delete(key)

    async def list_subkeys(self, key: SessionListSubkeysKey) -> list[str]:
        return await self.inner.list_subkeys(key)

    def has_session(self, project_key: str | None, session_id: str) -> bool:
        return self.inner.has_session(project_key, session_id)

    def load_sync(self, key: SessionKey) -> list[SessionStoreEntry] | None:
        """The entries as stored (what the CLI wrote; ``load`` reshapes them)."""
        return self.inner.load_sync(key)

    def last_context(self, project_key: str, session_id: str, *, scan: int = 60) -> int:
        return self.inner.last_context(project_key, session_id, scan=scan)

    def projects(self) -> list[str]:
        return self.inner.projects()

    def close(self) -> None:
        self.inner.close()

    def begin_attempt(self) -> int:
        return self.inner.begin_attempt()

    def claim(self, session_id: str) -> None:
        self.inner.claim(session_id)

    # ---- the rules ------------------------------------------------------------------------

    def reshape(self, entries: list[Entry]) -> list[Entry]:
        """Apply this layer's rules to raw entries (what ``load()`` does after reading).

        Returns a new list; changed entries are new dicts, ``entries`` is not modified.
        """
        self.last_report, self.last_trim = {}, {}
        out = list(entries)
        if self.ephemeral.enabled:
            out = self.expire(out)
        if self.policy.enabled:
            out = self.trim(out)
        return out

    def expire(self, entries: list[Entry]) -> list[Entry]:
        """Replace old one-off Bash results with the ephemeral policy's notice."""
        pol, uses, ages = self.ephemeral, tool_use_index(entries), turn_ages(entries)
        out, count = list(entries), 0
        for n, entry in enumerate(entries):
            if entry.get("isCompactSummary") or is_refused_or_interrupted(entry):
                continue
            for i, block in tool_results(entry):
                cmd = _ephemeral_command(uses.get(block.get("tool_use_id", "")))
                text = result_text(block)
                if cmd is None or text is None or ages[n] < pol.keep_recent:
                    continue
                if len(text) > pol.max_chars:
                    continue  # not a glance: the trimming rule keeps its content
                notice = pol.placeholder(_short(cmd), ages[n])
                out[n] = with_result_text(out[n], i, notice)
                count += 1
        self.last_report["expired"] = count
        return out

    def trim(self, entries: list[Entry]) -> list[Entry]:
        """Spill old large text results to files, leaving a pointer and a head."""
        pol, ages = self.policy, turn_ages(entries)
        out, trimmed, failed, kept, saved = list(entries), 0, 0, 0, 0
        for n, entry in enumerate(entries):
            if entry.get("isCompactSummary") or is_refused_or_interrupted(entry):
                continue
            if ages[n] < pol.keep_recent:
                kept += sum(result_text(b) is not None for _, b in tool_results(entry))
                continue
            for i, block in tool_results(entry):
                text = result_text(block)
                if text is None or len(text) <= pol.min_chars:
                    continue
                pointer = _pointer(pol, text, self.spill_path(text))
                if len(pointer) >= len(text):  # a small min_chars: nothing to gain
                    continue
                try:
                    self.spill(text)
                except (OSError, UnicodeError) as exc:  # lone surrogates cannot be written
                    logger.warning("%s", t("trim.spill_failed", error=exc))
                    failed += 1
                    continue
                out[n] = with_result_text(out[n], i, pointer)
                trimmed += 1
                saved += len(text) - len(pointer)
        self.last_report["trimmed"] = trimmed
        if failed:
            self.last_report["trim_failed"] = failed
        self.last_trim = {"cleared": trimmed, "kept": kept, "chars_saved": saved}
        return out

    def spill_path(self, text: str) -> Path:
        """Where ``text`` is spilled: named by its content hash, so written once."""
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        return self.workspace / self.policy.spill_dirname / f"{digest}.txt"

    def spill(self, text: str) -> Path:
        """Write ``text`` to its spill file (owner-only) unless it is there; return the path."""
        path = self.spill_path(text)
        private_dir(path.parent)
        if not path.exists():
            atomic_write_text(path, text)
        return path


def _ephemeral_command(use: dict[str, Any] | None) -> str | None:
    """The command of a foreground Bash call that :func:`is_ephemeral` accepts."""
    if use is None or use.get("name") != "Bash":
        return None
    args = use.get("input")
    if not isinstance(args, dict) or args.get("run_in_background"):
        return None
    cmd = args.get("command")
    return cmd if isinstance(cmd, str) and is_ephemeral(cmd) else None


def _short(cmd: str) -> str:
    one_line = " ".join(cmd.split())
    return one_line if len(one_line) <= CMD_CHARS else one_line[: CMD_CHARS - 1] + "…"


def _pointer(policy: TrimPolicy, text: str, path: Path) -> str:
    return f"{policy.placeholder(str(path), len(text))}\n{text[:HEAD_CHARS]}"


def trim_report(store: TrimmingSessionStore) -> str:
    """What the store's last ``load()`` did to the transcript, in one line for a log.

    Nothing → ``未裁剪``; only expiry → ``N 个时效性结果标记为过期``; otherwise
    ``裁掉 N 个工具结果(保留最近 M 个),省下 ~X tokens`` (X = characters saved // 4).
    A :class:`~flower.state.prune.PruningSessionStore` is a trimming store too.
    """
    report, detail = store.last_report, store.last_trim
    expired = report.get("expired", 0)
    cleared = detail.get("cleared", report.get("trimmed", 0))
    if not cleared:
        return f"{expired} 个时效性结果标记为过期" if expired else "未裁剪"
    kept, saved = detail.get("kept", 0), detail.get("chars_saved", 0)
    return f"裁掉 {cleared} 个工具结果(保留最近 {kept} 个),省下 ~{saved // 4} tokens"
