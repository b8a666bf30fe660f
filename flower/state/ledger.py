"""The tool ledger: a tool call's result is durable before the CLI goes on.

Why: the CLI writes a turn's transcript entries late. Measured with CLI 2.1.332, the
``tool_result`` entry of a Bash call reaches the session store about 100 ms after the call
finished, once the next request has been sent; a kill -9 in that window lost the result,
and on resume the model was told the call was interrupted (or, when the ``tool_use`` entry
itself was not in yet, asked for the call again: the command ran twice).

What: one row per tool call, kept by the backend's ``LedgerRows`` (:mod:`flower.state.seam`:
the ``tool_calls`` table of sessions.db, or of the PostgreSQL database; the transcript
tables keep every original byte). Three hooks, installed for every attempt of every Runtime
in every placement (they run where the attempt runs, synchronously for the CLI):

- ``PreToolUse`` records that the call started (a new session's first call first waits
  until the session is in the store at all and, in a step child, until the supervisor has
  written it into lineage: before either, a kill left the step to start a fresh session, and
  the call ran again), with the model's message that asked for it
  (as the attempt saw it on the SDK's stream, :meth:`ToolLedger.saw`): the CLI commits that
  message's entry only some 85 ms later, so a kill in between would otherwise lose the call
  altogether (on resume the model asked for it again, and it ran twice).
- ``PostToolUse`` records the result and returns only after the row is committed. The
  text is rendered from the tool's structured response the way the CLI shows it;
  ``PostToolUseFailure`` records the error.
- The attempt then sees the ``tool_result`` the model is actually sent on the SDK's stream
  and stores that exact content over the rendered one (:meth:`ToolLedger.seen`).

On resume, :func:`fill` (called by the pruning layer at load) gives every ``tool_use``
that has no result in the transcript, or only the CLI's "[Tool call interrupted…" filler,
the result it really had: the entry the CLI would have written, its uuid derived from the
call's id so the chain stays the same on every load. A main-thread call whose ``tool_use``
entry never reached the transcript gets that entry back too (the CLI's own uuid, from the
stream), after the transcript's last entry. A call that started and never finished is
told, neutrally, that its effect is unknown (:data:`NOT_FINISHED_TEXT`).

``PreToolUse`` runs before the CLI's own permission check and beside a spec's own hooks:
a call refused there is recorded as started and never finished. It then has the CLI's
denial as its result in the transcript, so nothing is supplied for it, except when a kill
lost that result too: then the model is told its effect is unknown, although it never ran.

What is stored is capped at :data:`MAX_CONTENT_CHARS` characters per call (the CLI itself
cuts a Bash result at 30,000 unless ``BASH_MAX_OUTPUT_LENGTH`` is raised); a longer result
is cut with a note saying so. Writing the ledger never blocks work: a failed write is one
warning, and the call goes on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from ..i18n import define, t
from .errors import Superseded
from .records import LedgerRow
from .trim import tool_results, tool_uses

if TYPE_CHECKING:
    from .seam import LedgerRows, Sessions

log = logging.getLogger("flower")

define(
    {
        "ledger.db_unreadable": (
            "sessions.db 读不了:{error}",
            "sessions.db could not be read: {error}",
        ),
        "ledger.session_late": (
            "会话 {session} 没能及时写进 sessions.db",
            "session {session} did not reach sessions.db in time",
        ),
        "ledger.session_unkept": (
            "会话 {session} 没能及时记下来以便续跑",
            "session {session} was not recorded for resuming in time",
        ),
        "ledger.unwritable": (
            "工具台账写不进去:{error}",
            "the tool ledger could not be written: {error}",
        ),
        "ledger.may_repeat": (
            "{why};CLI 记下这次调用之前要是被杀掉,它可能会再执行一次",
            "{why}; a kill before the CLI records the call may repeat it",
        ),
    }
)

__all__ = [
    "MAX_CONTENT_CHARS",
    "NOT_FINISHED_TEXT",
    "Call",
    "ToolLedger",
    "fill",
]

MAX_CONTENT_CHARS = 200_000
#: Main-thread messages kept in memory for ``PreToolUse`` (one per content block).
KEEP_MESSAGES = 256
#: How long a new session's first tool call waits, at most, for the session to be in the store.
SESSION_WAIT_S = 2.0
#: How long it waits, at most, for the session to be on record (:attr:`ToolLedger.kept`). A
#: bound, not a cost: the wait ends the moment the record is made (a step child's supervisor
#: took over 200 ms with every core busy); a supervisor that never answers is gone, and its
#: children with it.
KEPT_WAIT_S = 10.0

NOT_FINISHED_TEXT = (
    "[这次工具调用已经开始执行,但会话在它结束之前中断了,结果没有记录下来,"
    "它的效果未知。重复之前先检查它是否已经生效。]"
)
_CUT_NOTE = "\n[…工具账本只保存了前 {n} 个字符]"
_BLOCK_NOTE = "[这里原有一个 {kind} 块,太大,工具账本没有保存;需要时请重新获取]"
_NAMESPACE = uuid.UUID("6b4c8f2e-1f0a-4a56-9a5e-6f1d0e2c7a31")

STARTED, DONE, FAILED, INTERRUPTED = "started", "done", "failed", "interrupted"

Entry = dict[str, Any]


@dataclass(frozen=True)
class Call:
    """One row of the ledger."""

    tool_use_id: str
    session_id: str
    name: str
    state: str  # started | done | failed | interrupted
    content: Any  # the tool_result content (a string or a list of blocks); None if started
    is_error: bool
    response: Any  # the tool's structured response, as the hook saw it
    ended_at: float | None
    started_at: float = 0.0
    agent_id: str | None = None
    message: Any = None  # the model's message entries up to this tool_use (see ToolLedger.saw)

    @property
    def finished(self) -> bool:
        return self.state in (DONE, FAILED)


def render(response: Any) -> str:
    """A tool's structured response as the text the CLI sends the model (best effort:
    the exact content replaces it as soon as the attempt sees it, see :meth:`ToolLedger.seen`).
    """
    if isinstance(response, str):
        return response
    if isinstance(response, dict):
        if "stdout" in response or "stderr" in response:  # Bash
            parts = [str(response.get(k) or "").rstrip("\n") for k in ("stdout", "stderr")]
            return "\n".join(p for p in parts if p)
        file = response.get("file")
        if isinstance(file, dict) and isinstance(file.get("content"), str):  # Read
            start = int(file.get("startLine") or 1)
            lines = file["content"].split("\n")
            return "\n".join(f"{start + i}\t{line}" for i, line in enumerate(lines))
    return json.dumps(response, ensure_ascii=False, default=str)


def capped(content: Any) -> Any:
    """``content`` as a tool_result can hold it (a string or a list of blocks), cut to
    :data:`MAX_CONTENT_CHARS`: text past it cut with a note, a block too big replaced by one."""
    if content is None:
        return ""
    if isinstance(content, str):
        if len(content) <= MAX_CONTENT_CHARS:
            return content
        return content[:MAX_CONTENT_CHARS] + _CUT_NOTE.format(n=MAX_CONTENT_CHARS)
    if isinstance(content, list):
        left, out = MAX_CONTENT_CHARS, []
        for block in content:
            if isinstance(block, dict) and block.get("type") == "text":
                text = str(block.get("text", ""))
                if len(text) > left:
                    text = text[:left] + _CUT_NOTE.format(n=MAX_CONTENT_CHARS)
                left = max(0, left - len(text))
                block = {**block, "text": text}
            elif len(_dumps(block)) > left:  # an image, a document: too big to keep
                kind = block.get("type") if isinstance(block, dict) else type(block).__name__
                block = {"type": "text", "text": _BLOCK_NOTE.format(kind=kind)}
            else:
                left -= len(_dumps(block))
            out.append(block)
        return out
    return render(content)  # anything else a tool_result cannot hold becomes text


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _dumps_response(value: Any) -> str:
    """A tool's structured response for ``toolUseResult`` (CLI metadata, never sent to the
    model): past the cap, its JSON text cut, kept as a string."""
    text = _dumps(value)
    if len(text) > MAX_CONTENT_CHARS:
        return _dumps(text[:MAX_CONTENT_CHARS] + _CUT_NOTE.format(n=MAX_CONTENT_CHARS))
    return text


#: What this process does when a tool call's write is refused because a newer attempt owns
#: the session (:func:`when_superseded`); None: the refusal reaches the hook as an error.
_SUPERSEDED: Callable[[], None] | None = None


def when_superseded(act: Callable[[], None] | None) -> None:
    """Set what a refused (superseded) ledger write does in this process."""
    global _SUPERSEDED
    _SUPERSEDED = act


class ToolLedger:
    """The ledger of one session store: its rows in ``rows`` (the backend's), and ``store``
    asked whether a new session has reached it yet. A forked step child inherits its
    parent's object and uses it with its own connection (the backend's); what it keeps in
    memory is its own."""

    def __init__(self, rows: LedgerRows, store: Sessions) -> None:
        self.rows = rows
        self.store = store
        self._warned = False
        self._turn: tuple[str | None, list[dict[str, Any]]] = (None, [])  # message id, parts
        self._asked: dict[str, list[dict[str, Any]]] = {}  # tool_use id -> its message
        self._waited: set[str] = set()  # sessions whose first call has waited
        #: Awaited with a new session's id before its first call runs, once the session is in
        #: the store: returns when whoever resumes the session after a kill has it on record.
        #: A step child sets it (its supervisor writes lineage); in one process lineage is
        #: written from the very message that asked for the call, before its hook runs.
        self.kept: Callable[[str], Awaitable[None]] | None = None
        self._recorded: dict[str, tuple[str, bool]] = {}  # tool_use id -> content written

    # -- writing ------------------------------------------------------------------------

    def saw(self, msg: Any) -> None:
        """A main-thread assistant message on the SDK's stream (the CLI streams one per
        content block, each with the uuid of its transcript entry): kept for the
        ``PreToolUse`` of every ``tool_use`` in it, with the blocks before it."""
        from claude_agent_sdk import TextBlock, ThinkingBlock, ToolUseBlock

        msg_id, parts = self._turn
        if msg.message_id != msg_id or msg_id is None:
            parts = []
            self._turn = (msg.message_id, parts)
        for block in msg.content:
            if isinstance(block, TextBlock):
                raw: dict[str, Any] = {"type": "text", "text": block.text}
            elif isinstance(block, ThinkingBlock):
                raw = {"type": "thinking", "thinking": block.thinking, "signature": block.signature}
            elif isinstance(block, ToolUseBlock):
                raw = {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
            else:
                continue
            parts.append({"uuid": msg.uuid, "id": msg.message_id, "model": msg.model, "block": raw})
            if raw["type"] == "tool_use":
                self._asked[block.id] = list(parts)
        while len(self._asked) > KEEP_MESSAGES:
            del self._asked[next(iter(self._asked))]

    async def started(self, data: dict[str, Any], tool_use_id: str | None) -> None:
        tid = str(data.get("tool_use_id") or tool_use_id or "")
        if not tid:
            return
        main = not data.get("agent_id")
        for _ in range(5):  # the stream's reader may not have handed us the message yet
            if not main or tid in self._asked:
                break
            await asyncio.sleep(0)
        asked = self._asked.pop(tid, None) if main else None
        call = _who(tid, data)
        sid = call[1]
        if sid and sid not in self._waited:
            await self._wait_for(sid)
        row = LedgerRow(
            *call,
            state=STARTED,
            started_at=time.time(),
            message=_dumps(asked) if asked else None,
        )
        await self._write(lambda: self.rows.started(row))

    def _remember(self, tid: str, text: str, is_error: bool) -> str:
        self._recorded[tid] = (text, is_error)
        while len(self._recorded) > KEEP_MESSAGES:
            del self._recorded[next(iter(self._recorded))]
        return text

    async def _wait_for(self, session_id: str) -> None:
        """Until the session can be resumed after a kill: it is in the store at all, and
        whoever resumes it has it on record (:attr:`kept`). A kill before the CLI's first
        entries land (they trail by ~100 ms) leaves nothing to resume and nothing to restore
        a call into; a kill before a step child's supervisor has written the session into
        lineage leaves the step to start a fresh session. Either way the call would run
        again, so a new session's first call waits for both; every later call is free."""
        started = time.monotonic()
        deadline = started + SESSION_WAIT_S
        self._waited.add(session_id)  # waited for once, whatever comes of it
        while True:
            try:
                if self.store.has_session(None, session_id):
                    break
            except Exception as exc:  # noqa: BLE001 - the call goes on; said once
                self._warn(t("ledger.db_unreadable", error=exc))
                break
            if time.monotonic() > deadline:
                self._warn(t("ledger.session_late", session=session_id))
                break
            await asyncio.sleep(0.005)
        if self.kept is not None:
            try:
                left = started + KEPT_WAIT_S - time.monotonic()
                await asyncio.wait_for(self.kept(session_id), left)
            except TimeoutError:
                self._warn(t("ledger.session_unkept", session=session_id))

    async def finished(self, data: dict[str, Any], tool_use_id: str | None) -> None:
        tid = str(data.get("tool_use_id") or tool_use_id or "")
        if not tid:
            return
        failed = data.get("hook_event_name") == "PostToolUseFailure"
        if failed:
            state = INTERRUPTED if data.get("is_interrupt") else FAILED
            response: Any = str(data.get("error") or "")
            content: Any = response
        else:
            state, response = DONE, data.get("tool_response")
            content = render(response)
        now = time.time()
        row = LedgerRow(
            *_who(tid, data),
            state=state,
            started_at=now,  # kept only if PreToolUse recorded nothing
            response=_dumps_response(response),
            content=self._remember(tid, _dumps(capped(content)), failed),
            is_error=failed,
            ended_at=now,
        )
        await self._write(lambda: self.rows.finished(row))

    def seen(self, tool_use_id: str, content: Any, is_error: bool | None) -> None:
        """The exact ``tool_result`` the model was sent for a finished call.

        Called from the attempt's stream reader, on the loop that also answers the CLI's
        hooks: one try, never a wait for a busy database (the rendered result, written by
        ``PostToolUse``, then stays; it differs from the exact one in form at most)."""
        text = _dumps(capped(content))
        if self._recorded.pop(tool_use_id, None) == (text, bool(is_error)):
            return  # what the hook rendered is what the model got: nothing to write
        try:
            self.rows.exact(tool_use_id, text, bool(is_error))
        except Exception as exc:  # noqa: BLE001 - busy or failing: the rendered one stays
            log.debug("exact result of %s not recorded: %s", tool_use_id, exc)

    async def _write(self, write: Callable[[], Awaitable[None]]) -> None:
        try:
            await write()
        except Superseded:
            # A newer attempt owns this session (this one's worker was frozen and woke up
            # after the takeover): this attempt must not go on. A step child ends its whole
            # tree here, before the tool runs or the CLI sends another request.
            if _SUPERSEDED is not None:
                _SUPERSEDED()
            raise
        except Exception as exc:  # noqa: BLE001 - continuity never blocks work
            self._warn(t("ledger.unwritable", error=exc))

    def _warn(self, text: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning("%s", t("ledger.may_repeat", why=text))

    # -- reading ------------------------------------------------------------------------

    def calls(self, ids: Iterable[str]) -> dict[str, Call]:
        wanted = sorted(set(ids))
        if not wanted:
            return {}
        return {row.tool_use_id: _call(row) for row in self.rows.by_ids(wanted)}

    def in_session(self, session_id: str, since: float) -> list[Call]:
        """The main thread's calls of ``session_id`` that started at ``since`` or later."""
        return [_call(row) for row in self.rows.in_session(session_id, since)]

    # -- the hooks ----------------------------------------------------------------------

    def hooks(self) -> dict[str, list[Any]]:
        """The ledger's hook matchers (every tool: no matcher)."""
        from claude_agent_sdk.types import HookMatcher

        async def pre(data: Any, tool_use_id: str | None, _ctx: Any) -> Any:
            await self.started(data, tool_use_id)
            return {}

        async def post(data: Any, tool_use_id: str | None, _ctx: Any) -> Any:
            await self.finished(data, tool_use_id)
            return {}

        return {
            "PreToolUse": [HookMatcher(matcher=None, hooks=[pre])],
            "PostToolUse": [HookMatcher(matcher=None, hooks=[post])],
            "PostToolUseFailure": [HookMatcher(matcher=None, hooks=[post])],
        }


def _who(tid: str, data: dict[str, Any]) -> tuple[str, str, Any, str, str]:
    """A hook input's call, as the first columns of its row: id, session, agent, tool, input."""
    return (
        tid,
        str(data.get("session_id") or ""),
        data.get("agent_id"),
        str(data.get("tool_name") or ""),
        _dumps(data.get("tool_input")),
    )


def _call(row: LedgerRow) -> Call:
    """A stored row, its JSON columns parsed."""
    return Call(
        row.tool_use_id,
        row.session_id,
        row.name,
        row.state,
        _loads(row.content),
        bool(row.is_error),
        _loads(row.response),
        row.ended_at,
        row.started_at,
        row.agent_id,
        _loads(row.message),
    )


def _loads(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


# ======================================================================================
# at load: results the transcript lacks
# ======================================================================================


class Calls(Protocol):
    """What :func:`fill` asks the ledger (a :class:`ToolLedger`, or a fake in tests)."""

    def calls(self, ids: Iterable[str]) -> dict[str, Call]: ...

    def in_session(self, session_id: str, since: float) -> list[Call]: ...


def fill(
    entries: list[Entry],
    ledger: Calls,
    is_interrupted: Callable[[Entry, dict[str, Any]], bool],
) -> int:
    """Give ``tool_use``\\ s without a real result the one the ledger recorded, in place.

    ``entries`` is modified (a list of new or shared dicts; no dict is mutated); a result
    for which ``is_interrupted`` holds (the pruning layer's test) counts as none. Returns
    how many results were supplied or replaced (those of restored calls included).
    """
    count = _restore_lost(entries, ledger)
    uses: dict[str, int] = {}  # tool_use id -> index of its entry
    for n, entry in enumerate(entries):
        for _, block in tool_uses(entry):
            if isinstance(block.get("id"), str):
                uses[block["id"]] = n
    if not uses:
        return count
    answered: dict[str, tuple[int, int, bool]] = {}  # id -> (entry, block, interrupted)
    for n, entry in enumerate(entries):
        for i, block in tool_results(entry):
            tid = block.get("tool_use_id")
            if isinstance(tid, str):
                answered[tid] = (n, i, is_interrupted(entry, block))
    open_ids = [tid for tid in uses if tid not in answered or answered[tid][2]]
    if not open_ids:
        return count
    calls = ledger.calls(open_ids)
    for tid in open_ids:  # results the CLI filled in as "interrupted"
        call = calls.get(tid)
        if call is None or tid not in answered or call.state == INTERRUPTED:
            continue
        n, i, _ = answered[tid]
        entries[n] = _replaced(entries[n], i, call)
        count += 1
    missing = [tid for tid in open_ids if tid not in answered and tid in calls]
    for n in sorted({uses[tid] for tid in missing}, reverse=True):
        group = [tid for tid in missing if uses[tid] == n]
        count += insert_after_response(entries, n, [(tid, calls[tid]) for tid in group])
    return count


def _restore_lost(entries: list[Entry], ledger: Calls) -> int:
    """Main-thread calls whose ``tool_use`` entry never reached the transcript: their
    message's entries and their results, put back where they belong.

    Where: after the transcript's last entry for calls that started after it (the first
    resume after the kill); and, on every later load, before the first entry the CLI wrote
    on top of an earlier restore (its ``parentUuid`` names a restored entry: the uuids are
    the CLI's own and :func:`result_uuid`, the same on every load), so the chain holds.
    """
    chain = [e for e in entries if e.get("uuid") and e.get("type") in _CHAIN_TYPES]
    if not chain or chain[-1].get("isSidechain"):
        return 0
    sid = chain[-1].get("sessionId")
    if not isinstance(sid, str):
        return 0
    present = {b.get("id") for e in entries for _, b in tool_uses(e)}
    lost = [
        c
        for c in ledger.in_session(sid, 0.0)
        if c.tool_use_id not in present and isinstance(c.message, list) and c.message
    ]
    if not lost:
        return 0
    uuids = {e.get("uuid") for e in entries if e.get("uuid")}
    referenced = {e.get("parentUuid") for e in entries} - uuids - {None}
    # Episodes: runs of lost calls closed by the first entry the CLI hung off one of them.
    episodes: list[tuple[int, list[Call]]] = []
    run: list[Call] = []
    for call in lost:
        run.append(call)
        mine = _uuids_of(call) & referenced
        if mine:
            at = next(n for n, e in enumerate(entries) if e.get("parentUuid") in mine)
            episodes.append((at, run))
            run = []
    leaf_time = timestamp_epoch(chain[-1].get("timestamp"))
    if run and leaf_time is not None:
        fresh = [c for c in run if c.started_at >= leaf_time - _CLOCK_SLACK_S]
        if fresh:
            episodes.append((len(entries), fresh))
    count = 0
    for at, calls in sorted(episodes, key=lambda e: e[0], reverse=True):
        before = [e for e in entries[:at] if e.get("uuid") and e.get("type") in _CHAIN_TYPES]
        if not before:
            continue
        made, answered = _restored(calls, before[-1])
        entries[at:at] = made
        count += answered
    return count


def result_uuid(tool_use_id: str) -> str:
    """The uuid of the result entry the ledger supplies for ``tool_use_id``."""
    return str(uuid.uuid5(_NAMESPACE, tool_use_id))


def _uuids_of(call: Call) -> set[str]:
    parts = call.message if isinstance(call.message, list) else []
    found = {p["uuid"] for p in parts if isinstance(p, dict) and isinstance(p.get("uuid"), str)}
    return found | {result_uuid(call.tool_use_id)}


def _message_of(call: Call) -> Any:
    for part in call.message or ():
        block = part.get("block") if isinstance(part, dict) else None
        if isinstance(block, dict) and block.get("id") == call.tool_use_id:
            return part.get("id")
    return None


def _restored(calls: list[Call], parent_entry: Entry) -> tuple[list[Entry], int]:
    """The entries of ``calls`` hung off ``parent_entry``: each model message's entries,
    then the results of its calls, then the next message (a model never sees a call
    issued before the results of the message before it)."""
    made: list[Entry] = []
    by_uuid: dict[str, Entry] = {}
    parent, answered, i = parent_entry.get("uuid"), 0, 0
    while i < len(calls):
        group, msg_id = [calls[i]], _message_of(calls[i])
        i += 1
        while i < len(calls) and msg_id is not None and _message_of(calls[i]) == msg_id:
            group.append(calls[i])
            i += 1
        for call in group:
            for part in call.message:
                uuid_ = part.get("uuid") if isinstance(part, dict) else None
                if not isinstance(uuid_, str) or not isinstance(part.get("block"), dict):
                    continue
                if uuid_ not in by_uuid:
                    entry = _assistant_entry(parent_entry, part, parent, call.started_at)
                    made.append(entry)
                    by_uuid[uuid_] = entry
                    parent = uuid_
        for call in group:
            holder = next(
                (
                    by_uuid[p["uuid"]]
                    for p in call.message
                    if isinstance(p, dict)
                    and p.get("uuid") in by_uuid
                    and (p.get("block") or {}).get("id") == call.tool_use_id
                ),
                None,
            )
            if holder is None:  # its message did not hold it: nothing to answer
                continue
            made.append(_result_entry(holder, call.tool_use_id, call, parent))
            parent = made[-1]["uuid"]
            answered += 1
    return made, answered


_CHAIN_TYPES = ("user", "assistant", "attachment", "system")
_CLOCK_SLACK_S = 1.0


def timestamp_epoch(stamp: Any) -> float | None:
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _assistant_entry(leaf: Entry, part: dict[str, Any], parent: Any, when: float) -> Entry:
    entry: Entry = {"parentUuid": parent, "isSidechain": False}
    entry.update({k: leaf[k] for k in ("userType", "entrypoint", "cwd", "sessionId") if k in leaf})
    entry.update(
        {
            "type": "assistant",
            "message": {
                "id": part.get("id"),
                "type": "message",
                "role": "assistant",
                "model": part.get("model"),
                "content": [part.get("block")],
                "stop_reason": "tool_use",
                "stop_sequence": None,
            },
            "uuid": part["uuid"],
            "timestamp": _iso(when),
        }
    )
    entry.update({k: leaf[k] for k in _COPIED_TAIL if k in leaf})
    return entry


def _iso(when: float) -> str:
    return (
        datetime.fromtimestamp(when, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )


def _replaced(entry: Entry, index: int, call: Call) -> Entry:
    content, is_error = _result_of(call)
    msg = dict(entry["message"])
    blocks = list(msg["content"])
    blocks[index] = {**blocks[index], "content": content, "is_error": is_error}
    msg["content"] = blocks
    out = {k: v for k, v in entry.items() if k not in ("toolDenialKind", "interruptedByShutdown")}
    out["message"] = msg
    out["toolUseResult"] = call.response if call.finished else content
    return out


def _result_of(call: Call) -> tuple[Any, bool]:
    if call.finished and isinstance(call.content, (str, list)):
        return call.content, call.is_error
    return NOT_FINISHED_TEXT, True


def insert_after_response(entries: list[Entry], n: int, calls: list[tuple[str, Call]]) -> int:
    """Insert one result entry per call after the last entry of entry ``n``'s response,
    chained one after the other; whatever hung off that entry now hangs off the last one."""
    use_entry = entries[n]
    msg = use_entry.get("message")
    msg_id = msg.get("id") if isinstance(msg, dict) else None
    last = n
    for j in range(n + 1, len(entries)):
        other = entries[j].get("message")
        same = isinstance(other, dict) and msg_id and other.get("id") == msg_id
        if entries[j].get("type") == "assistant" and same:
            last = j
            continue
        if entries[j].get("uuid"):
            break
    parent = entries[last].get("uuid")
    made: list[Entry] = []
    for tid, call in calls:
        made.append(_result_entry(use_entry, tid, call, parent))
        parent = made[-1]["uuid"]
    old_parent = entries[last].get("uuid")
    for j in range(last + 1, len(entries)):
        if old_parent and entries[j].get("parentUuid") == old_parent:
            entries[j] = {**entries[j], "parentUuid": parent}
    entries[last + 1 : last + 1] = made
    return len(made)


_COPIED = ("isSidechain", "promptId", "agentId", "userType", "entrypoint", "cwd", "sessionId")
_COPIED_TAIL = ("version", "gitBranch")


def _result_entry(use_entry: Entry, tid: str, call: Call, parent: Any) -> Entry:
    content, is_error = _result_of(call)
    when = call.ended_at or time.time()
    entry: Entry = {"parentUuid": parent}
    entry.update({k: use_entry[k] for k in _COPIED if k in use_entry})
    entry.update(
        {
            "type": "user",
            "message": {
                "role": "user",
                "content": [
                    {
                        "tool_use_id": tid,
                        "type": "tool_result",
                        "content": content,
                        "is_error": is_error,
                    }
                ],
            },
            "uuid": result_uuid(tid),
            "timestamp": datetime.fromtimestamp(when, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "toolUseResult": call.response if call.finished else content,
            "sourceToolAssistantUUID": use_entry.get("uuid"),
        }
    )
    entry.update({k: use_entry[k] for k in _COPIED_TAIL if k in use_entry})
    return entry
