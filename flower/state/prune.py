"""``PruningSessionStore``: errors never reach a resumed session (seed 000 韧性, point 三).

The outermost of the three store layers (sqlite → trimming → pruning); a Runtime always
uses it, over the session store of its run state (SQLite's or PostgreSQL's: like the
trimming layer it extends, it wraps any :class:`flower.state.seam.Sessions`). At
:meth:`load` (the SDK calls it before spawning the CLI to resume; what it returns is what
the model is sent), before the trimming layer's rules, three rules and a repair run on the
transcript; the store below keeps every original byte:

1. **API errors dropped.** An ``assistant`` entry with ``isApiErrorMessage: true`` — the
   synthetic message the CLI appends when it gives up on the API (``message.model`` is
   ``<synthetic>``, text ``API Error: …``) — is removed. Left in, it is the session's leaf
   and gets fed back as if the model had said it. (Measured with CLI 2.1.332: it already
   skips such rows when it builds a request; but when the error followed a tool result,
   the CLI, no longer seeing the row, takes the turn for an interrupted one and appends
   its synthetic "No response requested." before the new prompt, as after a kill.)
2. **Interrupted results neutralised.** The text of an interrupted tool result becomes
   :data:`INTERRUPTED_TEXT`; the entry and its ``tool_result`` block stay. Interrupted =
   the entry's ``toolDenialKind`` is ``"interrupted"`` (the CLI's own filler on resume,
   ``[Tool call interrupted: …]``) or ``"cancelled"`` (aborted before it ran), or it has
   ``interruptedByShutdown: true``, or its text holds the CLI's "this call was stopped
   while running" correction (flower's own Ctrl-C: ``client.interrupt()`` mid-tool writes a
   ``user-rejected`` result with that text), or starts with ``[Tool call interrupted``.
3. **Denials kept to the latest ``keep_denials``.** A denied call = a ``tool_use`` whose
   result entry the CLI marked as refused and which is not an interruption: a
   ``toolDenialKind`` (``user-rejected``: permission mode/rules; ``permission-rule``: a
   ``PreToolUse`` hook's deny) or ``permissionDecision.decision == "reject"``. A call to a
   tool that does not exist (``No such tool available``) is not a denial: the CLI's own
   ``permission_denials`` leaves it out too. Dropping a denied call drops both halves: the
   ``tool_use`` block and its ``tool_result`` block, each with its entry when that entry
   holds nothing else, so no ``tool_use`` is ever left without its result or vice versa.
   Seed 000 keeps 1, not 0: a refused call never ran and its result carries no
   information (273 characters measured: 93 of refusal, 180 of dead command), and many of
   them teach helplessness (a coordinator that read a few refusals stopped trying even the
   ``git status`` it was allowed); but the latest one stops the model from retrying the
   same refused call straight away.
4. **Orphans healed.** A ``tool_use`` with no ``tool_result`` anywhere (and none the tool
   ledger recorded) gets one, :attr:`PrunePolicy.orphan_text`, in a ``user`` entry right
   after its response; what hung off that response hangs off the new entry. The API wants
   every call answered, so such a hole in the middle of a history bounces every resume.
   The calls of the transcript's *last* response are left alone: resuming, the CLI answers
   those itself (``[Tool call interrupted: …]``, rule 2 then neutralises it; measured,
   fixture b), and a killed session that was never resumed is exactly that case.
5. **Relinking.** The transcript is a ``parentUuid`` chain (a tree with parallel tool
   calls: each result hangs off its own ``tool_use`` entry). Every reference of a surviving
   entry to a removed one — ``parentUuid``, ``logicalParentUuid``, ``leafUuid``, a compact
   boundary's preserved segment — moves to the removed entry's nearest surviving ancestor;
   otherwise the CLI's walk from the leaf stops there and all history before it is lost.

Why before trimming: the trimming layer counts turns and sizes on what the model will
actually see, so entries about to be dropped must not count; and a denied or interrupted
result must not be spilled or expired before this layer decides what it becomes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import InitVar, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..i18n import define, t
from .ledger import DONE, Call, ToolLedger, fill, insert_after_response, timestamp_epoch
from .sqlite import SqliteLedgerRows, SqliteSessionStore
from .trim import (
    EphemeralPolicy,
    TrimmingSessionStore,
    TrimPolicy,
    result_text,
    tool_results,
    tool_uses,
    with_result_text,
)

if TYPE_CHECKING:
    from .seam import LedgerRows, Sessions

__all__ = [
    "INTERRUPTED_TEXT",
    "ORPHAN_TEXT",
    "PrunePolicy",
    "PruningSessionStore",
    "is_api_error",
    "is_denied",
    "is_interrupted",
    "relink",
]

log = logging.getLogger("flower")

define(
    {
        "prune.ledger_unreadable": (
            "工具台账读不了({error}),不靠它接着做",
            "the tool ledger could not be read ({error}); resuming without it",
        ),
    }
)

INTERRUPTED_TEXT = "[上一轮在此处被中断,该工具结果未产生]"
ORPHAN_TEXT = "[这一步被打断了,没有结果。需要的话重做。]"
_STOPPED_WHILE_RUNNING = "Correction to the text above: this call was stopped while running"
_INTERRUPTED_KINDS = ("interrupted", "cancelled")

Entry = dict[str, Any]


@dataclass
class PrunePolicy:
    """What the pruning layer does at load (seed 000: keep_denials=1).

    Each switch turns one rule of the module docstring on or off: ``drop_api_errors`` (1),
    ``neutralize_interrupts`` (2, with ``interrupt_text``), ``keep_denials`` (3; < 1 drops
    every denied call), ``heal_orphans`` (4, with ``orphan_text``). ``enabled=False``
    skips the whole layer. ``interrupted_text`` is the earlier name of ``interrupt_text``,
    still accepted by the constructor.
    """

    drop_api_errors: bool = True
    neutralize_interrupts: bool = True
    interrupt_text: str = INTERRUPTED_TEXT
    heal_orphans: bool = True
    orphan_text: str = ORPHAN_TEXT
    keep_denials: int = 1
    enabled: bool = True
    interrupted_text: InitVar[str | None] = None

    def __post_init__(self, interrupted_text: str | None) -> None:
        if interrupted_text is not None:
            self.interrupt_text = interrupted_text


def is_api_error(entry: Entry) -> bool:
    """The CLI's synthetic assistant entry for an API failure."""
    return entry.get("type") == "assistant" and entry.get("isApiErrorMessage") is True


def is_interrupted(entry: Entry, block: dict[str, Any]) -> bool:
    """Is this tool result an interruption's placeholder rather than the tool's output?"""
    if entry.get("toolDenialKind") in _INTERRUPTED_KINDS or entry.get("interruptedByShutdown"):
        return True
    text = result_text(block) or ""
    return _STOPPED_WHILE_RUNNING in text or text.startswith("[Tool call interrupted")


def is_denied(entry: Entry, block: dict[str, Any]) -> bool:
    """Was this tool call refused before it ran (and not interrupted)?"""
    if is_interrupted(entry, block):
        return False
    decision = entry.get("permissionDecision")
    rejected = isinstance(decision, dict) and decision.get("decision") == "reject"
    return bool(entry.get("toolDenialKind")) or rejected


class PruningSessionStore(TrimmingSessionStore):
    """The store a Runtime uses: pruning, then trimming, on top of any session store.

    ``path`` is the store it wraps, or a database file for a :class:`SqliteSessionStore`
    (see :class:`~flower.state.trim.TrimmingSessionStore`). ``ledger`` holds the tool
    ledger's rows, the backend's :class:`~flower.state.seam.LedgerRows` (a run state's
    ``ledger``); for a SQLite store it may be left out (the ``tool_calls`` table of the
    same file), any other store needs it.

    ``prune`` defaults to ``PrunePolicy()`` and is kept as ``prune_policy``. Unlike the
    trimming layer's, the fourth positional parameter is ``prune``; a call written for the
    other order (``…, policy, ephemeral, prune``) is recognised by the policies' types and
    still works, and a value of neither type is a ``TypeError``, not a silent mix-up.

    ``last_report`` adds ``api_errors``, ``interrupted``, ``denials`` (calls dropped) and
    ``relinked`` (references moved) to the trimming layer's counts, ``ledger`` (results the
    tool ledger supplied) and ``healed`` (orphan calls answered) when any were. ``pruned``
    is how many entries the last load dropped, ``denials_dropped`` how many denied calls.
    ``ledger`` is this store's :class:`~flower.state.ledger.ToolLedger` (over the rows
    given, asking the inner store whether a session is there yet).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | Sessions,
        workspace: str | Path,
        policy: TrimPolicy | None = None,
        prune: PrunePolicy | None = None,
        ephemeral: EphemeralPolicy | None = None,
        *,
        ledger: LedgerRows | None = None,
    ) -> None:
        prune, ephemeral = _prune_and_ephemeral(prune, ephemeral)
        super().__init__(path, workspace, policy, ephemeral)
        self.prune_policy = prune if prune is not None else PrunePolicy()
        self.pruned = 0
        self.denials_dropped = 0
        self.ledger = ToolLedger(_ledger_rows(self.inner, ledger), self.inner)

    def reshape(self, entries: list[Entry]) -> list[Entry]:
        """The tool ledger's results first (:func:`flower.state.ledger.fill`), then
        pruning, then the trimming layer's expiry and trimming."""
        report: dict[str, int] = {}
        entries = list(entries)
        self.pruned = self.denials_dropped = 0
        try:
            supplied = fill(entries, self.ledger, is_interrupted)
            if supplied:
                report["ledger"] = supplied
        except Exception as exc:  # noqa: BLE001 - the transcript as it is, said once
            log.warning("%s", t("prune.ledger_unreadable", error=exc))
        if self.prune_policy.enabled:
            entries = self.prune(entries, report)
        out = super().reshape(entries)
        self.last_report = {**report, **self.last_report}
        return out

    def prune(self, entries: list[Entry], report: dict[str, int] | None = None) -> list[Entry]:
        """Apply the pruning rules to raw entries; counts go to ``report`` if given.

        Returns a new list; ``entries`` is not modified.
        """
        pol = self.prune_policy
        report = report if report is not None else {}
        entries = list(entries)
        if pol.heal_orphans:
            healed = _heal_orphans(entries, pol.orphan_text)
            if healed:
                report["healed"] = healed
        out: list[Entry | None] = list(entries)
        report["api_errors"] = _drop_api_errors(out) if pol.drop_api_errors else 0
        # Denials are told apart from interruptions by the original text, so before it is
        # neutralised (flower's own interrupt is written as a "user-rejected" result).
        report["denials"] = _drop_denials(out, pol.keep_denials)
        report["interrupted"] = (
            _neutralise_interrupted(out, pol.interrupt_text) if pol.neutralize_interrupts else 0
        )
        survivors = [e for e in out if e is not None]
        self.pruned = len(entries) - len(survivors)
        self.denials_dropped = report["denials"]
        gone = {u for e in entries if isinstance(u := e.get("uuid"), str)} - {
            e.get("uuid") for e in survivors
        }
        relinked, report["relinked"] = relink(survivors, entries, gone)
        return relinked


def _ledger_rows(inner: Sessions, given: LedgerRows | None) -> LedgerRows:
    """The ledger's rows: as given, or a SQLite store's own table."""
    if given is not None:
        return given
    if isinstance(inner, SqliteSessionStore):
        return SqliteLedgerRows(inner)
    raise TypeError(
        f"a PruningSessionStore over a {type(inner).__name__} needs ledger=, the tool"
        " ledger's rows of the same backend (its run state's ledger)"
    )


def _prune_and_ephemeral(prune: Any, ephemeral: Any) -> tuple[PrunePolicy | None, Any]:
    """``(prune, ephemeral)`` as given, or swapped when given in the trimming layer's order."""
    if isinstance(prune, EphemeralPolicy) and (
        ephemeral is None or isinstance(ephemeral, PrunePolicy)
    ):
        prune, ephemeral = ephemeral, prune
    if prune is not None and not isinstance(prune, PrunePolicy):
        raise TypeError(f"prune must be a PrunePolicy or None, not {type(prune).__name__}")
    if ephemeral is not None and not isinstance(ephemeral, EphemeralPolicy):
        raise TypeError(
            f"ephemeral must be an EphemeralPolicy or None, not {type(ephemeral).__name__}"
        )
    return prune, ephemeral


_CHAIN_TYPES = ("user", "assistant", "attachment", "system")


def _message_id(entry: Entry) -> Any:
    msg = entry.get("message")
    return msg.get("id") if isinstance(msg, dict) else None


def _heal_orphans(entries: list[Entry], text: str) -> int:
    """Answer, in place, every ``tool_use`` that has no ``tool_result`` anywhere, except
    those of the last response on their thread (the CLI answers those itself on resume)."""
    answered = {b.get("tool_use_id") for e in entries for _, b in tool_results(e)}
    open_calls: dict[int, list[str]] = {}
    for n, entry in enumerate(entries):
        for _, block in tool_uses(entry):
            tid = block.get("id")
            if isinstance(tid, str) and tid not in answered:
                open_calls.setdefault(n, []).append(tid)
    healed = 0
    for n in sorted(open_calls, reverse=True):  # from the end: earlier indexes stay valid
        if _last_response(entries, n):
            continue
        use = entries[n]
        when = timestamp_epoch(use.get("timestamp"))
        calls = [(tid, _orphan_call(tid, use, text, when)) for tid in open_calls[n]]
        healed += insert_after_response(entries, n, calls)
    return healed


def _orphan_call(tid: str, use: Entry, text: str, when: float | None) -> Call:
    names = [b.get("name") for _, b in tool_uses(use) if b.get("id") == tid]
    return Call(
        tool_use_id=tid,
        session_id=str(use.get("sessionId") or ""),
        name=str(names[0] if names else ""),
        state=DONE,
        content=text,
        is_error=True,
        response=text,
        ended_at=when,
    )


def _last_response(entries: list[Entry], n: int) -> bool:
    """Is entry ``n``'s response the last thing on its thread (API errors aside)?"""
    msg_id, side = _message_id(entries[n]), bool(entries[n].get("isSidechain"))
    for entry in entries[n + 1 :]:
        if not entry.get("uuid") or entry.get("type") not in _CHAIN_TYPES:
            continue
        if bool(entry.get("isSidechain")) != side or is_api_error(entry):
            continue
        if msg_id and entry.get("type") == "assistant" and _message_id(entry) == msg_id:
            continue  # another content block of the same response
        return False
    return True


def _drop_api_errors(out: list[Entry | None]) -> int:
    dropped = 0
    for n, entry in enumerate(out):
        if entry is not None and is_api_error(entry):
            out[n], dropped = None, dropped + 1
    return dropped


def _neutralise_interrupted(out: list[Entry | None], text: str) -> int:
    count = 0
    for n, entry in enumerate(out):
        if entry is None or entry.get("isCompactSummary"):
            continue
        for i, block in tool_results(entry):
            if is_interrupted(entry, block) and result_text(block) is not None:
                out[n] = entry = with_result_text(entry, i, text)
                count += 1
    return count


def _drop_denials(out: list[Entry | None], keep: int) -> int:
    """Drop all denied calls but the latest ``keep``, both halves of each."""
    denied = [
        (n, block.get("tool_use_id"))
        for n, entry in enumerate(out)
        if entry is not None and not entry.get("isCompactSummary")
        for _, block in tool_results(entry)
        if is_denied(entry, block)
    ]
    doomed = denied[: max(0, len(denied) - max(0, keep))]
    ids = {tid for _, tid in doomed if isinstance(tid, str)}
    rows = {n for n, _ in doomed}
    for n, entry in enumerate(out):
        if entry is None:
            continue
        if n in rows:
            out[n] = _without_blocks(entry, tool_results, ids, "tool_use_id")
        elif ids and entry.get("type") == "assistant":
            out[n] = _without_blocks(entry, tool_uses, ids, "id")
    return len(doomed)


def _without_blocks(
    entry: Entry,
    blocks: Callable[[Entry], Any],
    ids: set[str],
    id_key: str,
) -> Entry | None:
    """``entry`` without the blocks whose ``id_key`` is in ``ids``; None if none are left."""
    drop = {i for i, block in blocks(entry) if block.get(id_key) in ids}
    if not drop:
        return entry
    content = [b for i, b in enumerate(entry["message"]["content"]) if i not in drop]
    if not content:
        return None
    return {**entry, "message": {**entry["message"], "content": content}}


# ======================================================================================
# relinking
# ======================================================================================


def relink(
    survivors: list[Entry], original: list[Entry], gone: set[str]
) -> tuple[list[Entry], int]:
    """Point every reference to a ``gone`` uuid at its nearest surviving ancestor.

    ``original`` gives the chain (each uuid's ``parentUuid`` before anything was removed).
    Returns the new list (changed entries are copies) and how many references moved.
    """
    if not gone:
        return survivors, 0
    parents = {e["uuid"]: e.get("parentUuid") for e in original if e.get("uuid")}

    def ancestor(uuid: Any) -> Any:
        seen: set[str] = set()
        while isinstance(uuid, str) and uuid in gone and uuid not in seen:
            seen.add(uuid)
            uuid = parents.get(uuid)
        return None if uuid in gone else uuid

    out, moved = [], 0
    for entry in survivors:
        changes = {
            k: ancestor(entry[k])
            for k in ("parentUuid", "logicalParentUuid", "leafUuid")
            if entry.get(k) in gone
        }
        meta = _relinked_compact(entry.get("compactMetadata"), gone, parents)
        if meta is not None:
            changes["compactMetadata"] = meta
        if changes:
            entry = {**entry, **changes}
            moved += len(changes)
        out.append(entry)
    return out, moved


def _relinked_compact(meta: Any, gone: set[str], parents: dict[str, Any]) -> dict[str, Any] | None:
    """A compact boundary's preserved messages without the removed ones, or None if none
    of them was removed. The CLI rebuilds the kept tail from these lists (a listed uuid
    that is missing aborts its fast path) and walks ``tailUuid`` up to ``headUuid``."""
    if not isinstance(meta, dict):
        return None
    new = dict(meta)
    kept = meta.get("preservedMessages")
    if isinstance(kept, dict) and any(
        u in gone for k in ("uuids", "allUuids") for u in kept.get(k) or ()
    ):
        new["preservedMessages"] = {
            **kept,
            **{
                k: [u for u in kept[k] if u not in gone] for k in ("uuids", "allUuids") if k in kept
            },
        }
    seg = meta.get("preservedSegment")
    if isinstance(seg, dict) and (seg.get("headUuid") in gone or seg.get("tailUuid") in gone):
        moved = _relinked_segment(seg, gone, parents)
        if moved is None:
            del new["preservedSegment"]  # nothing of it survives: a plain boundary
        else:
            new["preservedSegment"] = moved
    return new if new != meta else None


def _relinked_segment(
    seg: dict[str, Any], gone: set[str], parents: dict[str, Any]
) -> dict[str, Any] | None:
    """The segment from its last to its first surviving entry (None if none survives).

    The CLI walks ``parentUuid`` from ``tailUuid`` up to ``headUuid``; relinked parents
    skip removed entries, so that walk still ends at the new head.
    """
    path, uuid = [], seg.get("tailUuid")
    while isinstance(uuid, str) and uuid not in path:
        path.append(uuid)
        if uuid == seg.get("headUuid"):
            break
        uuid = parents.get(uuid)
    alive = [u for u in path if u not in gone]
    if not alive:
        return None
    return {**seg, "tailUuid": alive[0], "headUuid": alive[-1]}
