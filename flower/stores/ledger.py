"""The tool ledger: a tool call's result is durable before the CLI goes on.

Why: the CLI writes a turn's transcript entries late. Measured with CLI 2.1.332, the
``tool_result`` entry of a Bash call reaches the session store about 100 ms after the call
finished, once the next request has been sent; a kill -9 in that window lost the result,
and on resume the model was told the call was interrupted (or, when the ``tool_use`` entry
itself was not in yet, asked for the call again: the command ran twice).

What: one row per tool call in the ``tool_calls`` table of sessions.db (the transcript
tables keep every original byte). Three hooks, installed for every attempt of every Runtime
in every placement (they run where the attempt runs, synchronously for the CLI):

- ``PreToolUse`` waits until the entry holding the ``tool_use`` is committed (so the call
  is in the transcript before it can have any effect), then records that the call started.
- ``PostToolUse`` records the result and returns only after the row is committed. The
  text is rendered from the tool's structured response the way the CLI shows it;
  ``PostToolUseFailure`` records the error.
- The attempt then sees the ``tool_result`` the model is actually sent on the SDK's stream
  and stores that exact content over the rendered one (:meth:`ToolLedger.seen`).

On resume, :func:`fill` (called by the pruning layer at load) gives every ``tool_use``
that has no result in the transcript, or only the CLI's "[Tool call interrupted…" filler,
the result it really had: the entry the CLI would have written, its uuid derived from the
call's id so the chain stays the same on every load. A call that started and never
finished is told, neutrally, that its effect is unknown (:data:`NOT_FINISHED_TEXT`).

What is stored is capped at :data:`MAX_CONTENT_CHARS` characters per call (the CLI itself
cuts a Bash result at 30,000 unless ``BASH_MAX_OUTPUT_LENGTH`` is raised); a longer result
is cut with a note saying so. Writing the ledger never blocks work: a failed write is one
warning, and the call goes on.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .trim import tool_results, tool_uses

if TYPE_CHECKING:
    from .sqlite import SqliteSessionStore

log = logging.getLogger("flower")

__all__ = [
    "MAX_CONTENT_CHARS",
    "NOT_FINISHED_TEXT",
    "Call",
    "ToolLedger",
    "fill",
]

MAX_CONTENT_CHARS = 200_000
#: How long ``PreToolUse`` waits for the ``tool_use`` entry to be committed.
ENTRY_WAIT_S = 2.0

NOT_FINISHED_TEXT = (
    "[这次工具调用已经开始执行,但会话在它结束之前中断了,结果没有记录下来,"
    "它的效果未知。重复之前先检查它是否已经生效。]"
)
_CUT_NOTE = "\n[…工具账本只保存了前 {n} 个字符]"
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
    """``content`` cut to :data:`MAX_CONTENT_CHARS` (text parts only; other blocks kept)."""
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
            out.append(block)
        return out
    return content


def _dumps(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    if len(text) > 4 * MAX_CONTENT_CHARS:  # a huge structured response: keep a cut copy
        return json.dumps({"cut": text[: 4 * MAX_CONTENT_CHARS]}, ensure_ascii=False)
    return text


class ToolLedger:
    """The ledger of one session store (one per process: a forked child makes its own)."""

    def __init__(self, store: SqliteSessionStore) -> None:
        self.store = store
        self._warned = False

    # -- writing ------------------------------------------------------------------------

    async def started(self, data: dict[str, Any], tool_use_id: str | None) -> None:
        tid = str(data.get("tool_use_id") or tool_use_id or "")
        if not tid:
            return
        if not await self.store.durable.wait(tid, within=ENTRY_WAIT_S):
            self._warn(f"the transcript entry of tool call {tid} was not written in time")
        row = (
            tid,
            str(data.get("session_id") or ""),
            data.get("agent_id"),
            str(data.get("tool_name") or ""),
            _dumps(data.get("tool_input")),
            STARTED,
            time.time(),
        )
        sql = (
            "INSERT INTO tool_calls(tool_use_id, session_id, agent_id, name, input, state,"
            " started_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(tool_use_id) DO NOTHING"
        )
        await self._write(lambda conn: conn.execute(sql, row))

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
        row = (
            tid,
            str(data.get("session_id") or ""),
            data.get("agent_id"),
            str(data.get("tool_name") or ""),
            _dumps(data.get("tool_input")),
            state,
            _dumps(response),
            _dumps(capped(content)),
            int(failed),
            time.time(),
            time.time(),
        )
        sql = (
            "INSERT INTO tool_calls(tool_use_id, session_id, agent_id, name, input, state,"
            " response, content, is_error, started_at, ended_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(tool_use_id) DO UPDATE SET"
            " state = excluded.state, response = excluded.response,"
            " content = excluded.content, is_error = excluded.is_error,"
            " ended_at = excluded.ended_at"
        )
        await self._write(lambda conn: conn.execute(sql, row))

    def seen(self, tool_use_id: str, content: Any, is_error: bool | None) -> None:
        """The exact ``tool_result`` the model was sent for a finished call."""
        sql = (
            "UPDATE tool_calls SET content = ?, is_error = ? WHERE tool_use_id = ?"
            " AND state IN ('done', 'failed')"
        )
        args = (_dumps(capped(content)), int(bool(is_error)), tool_use_id)
        try:
            self.store._run_sync(lambda conn: conn.execute(sql, args), write=True)
        except Exception as exc:  # noqa: BLE001 - the rendered result stays; say so once
            self._warn(f"could not record the result of tool call {tool_use_id}: {exc}")

    async def _write(self, work: Callable[[Any], Any]) -> None:
        try:
            await self.store._run(work, write=True)
        except Exception as exc:  # noqa: BLE001 - continuity never blocks work
            self._warn(f"the tool ledger could not be written: {exc}")

    def _warn(self, text: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning("%s; a kill before the CLI records the call may repeat it", text)

    # -- reading ------------------------------------------------------------------------

    def calls(self, ids: Iterable[str]) -> dict[str, Call]:
        wanted = sorted(set(ids))
        if not wanted:
            return {}
        marks = ",".join("?" * len(wanted))
        sql = (
            "SELECT tool_use_id, session_id, name, state, content, is_error, response,"
            f" ended_at FROM tool_calls WHERE tool_use_id IN ({marks})"
        )
        rows = self.store._run_sync(lambda conn: conn.execute(sql, wanted).fetchall())
        out: dict[str, Call] = {}
        for tid, sid, name, state, content, is_error, response, ended in rows:
            out[tid] = Call(
                tid,
                sid,
                name,
                state,
                _loads(content),
                bool(is_error),
                _loads(response),
                ended,
            )
        return out

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


def fill(
    entries: list[Entry],
    calls_for: Callable[[Iterable[str]], dict[str, Call]],
    is_interrupted: Callable[[Entry, dict[str, Any]], bool],
) -> int:
    """Give ``tool_use``\\ s without a real result the one the ledger recorded, in place.

    ``entries`` is modified (a list of new or shared dicts; no dict is mutated); a result
    for which ``is_interrupted`` holds (the pruning layer's test) counts as none. Returns
    how many results were supplied or replaced.
    """

    uses: dict[str, int] = {}  # tool_use id -> index of its entry
    for n, entry in enumerate(entries):
        for _, block in tool_uses(entry):
            if isinstance(block.get("id"), str):
                uses[block["id"]] = n
    if not uses:
        return 0
    answered: dict[str, tuple[int, int, bool]] = {}  # id -> (entry, block, interrupted)
    for n, entry in enumerate(entries):
        for i, block in tool_results(entry):
            tid = block.get("tool_use_id")
            if isinstance(tid, str):
                answered[tid] = (n, i, is_interrupted(entry, block))
    open_ids = [t for t in uses if t not in answered or answered[t][2]]
    if not open_ids:
        return 0
    calls = calls_for(open_ids)
    count = 0
    for tid in open_ids:  # results the CLI filled in as "interrupted"
        call = calls.get(tid)
        if call is None or tid not in answered or call.state == INTERRUPTED:
            continue
        n, i, _ = answered[tid]
        entries[n] = _replaced(entries[n], i, call)
        count += 1
    missing = [t for t in open_ids if t not in answered and t in calls]
    for n in sorted({uses[t] for t in missing}, reverse=True):
        group = [t for t in missing if uses[t] == n]
        count += _insert_after_response(entries, n, [(t, calls[t]) for t in group])
    return count


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
    if call.finished and call.content is not None:
        return call.content, call.is_error
    return NOT_FINISHED_TEXT, True


def _insert_after_response(entries: list[Entry], n: int, calls: list[tuple[str, Call]]) -> int:
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
            "uuid": str(uuid.uuid5(_NAMESPACE, tid)),
            "timestamp": datetime.fromtimestamp(when, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "toolUseResult": call.response if call.finished else content,
            "sourceToolAssistantUUID": use_entry.get("uuid"),
        }
    )
    entry.update({k: use_entry[k] for k in _COPIED_TAIL if k in use_entry})
    return entry
