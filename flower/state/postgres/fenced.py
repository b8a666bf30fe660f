"""The fenced writes: transcript appends and the tool ledger's rows.

Every one of them runs, in the same statement or transaction as the write itself, the
*fence*: an upsert of the session's row in ``fence`` that succeeds only when no higher epoch
owns the session, records the writer's epoch as the owner and hands out the next write
time. When it fails, nothing is written and :class:`~flower.state.seam.Superseded` is
raised. The fence row is also what serialises writers of one session (its row lock is held
to the commit), so ``seq`` order is commit order within a session, and the summary fold
reads the summary its predecessor committed.

Epoch 0 is an object that never began an attempt (a library user's store, an export):
its writes pass only while no attempt owns the session, i.e. while the owner is 0 too.

Each write is an entry of :data:`OPS`, named in the spool (:mod:`.spool`), so an entry
written to the spool during an outage is delivered later through the same function and
the same fence. Arguments are JSON-able (the spool keeps them as JSON).

``mtime`` (epoch ms) is the session's: strictly above every earlier write time of the
same session, even past a delete (the fence row stays). SQLite's store keeps one clock for
the whole file; one hot row for every writer of a shared database would serialise them all.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg

from ...i18n import define, t
from ..errors import Superseded

if TYPE_CHECKING:
    from claude_agent_sdk.types import SessionKey, SessionStoreEntry, SessionSummaryEntry

    from .schema import Sql

    Conn = psycopg.Connection[tuple[Any, ...]]

__all__ = ["OPS", "Op", "superseded"]

define(
    {
        "state.superseded": (
            "会话 {session} 已经归一次更新的尝试所有(第 {owner} 号),"
            "这次尝试(第 {epoch} 号)的写入被拒绝",
            "session {session} belongs to a newer attempt now (epoch {owner}); "
            "this attempt's write (epoch {epoch}) was refused",
        ),
        "state.superseded.hint": (
            "这次尝试已被接替,它停下即可,什么都没丢",
            "this attempt has been taken over; it should stop, nothing is lost",
        ),
    }
)

# The fence: the session's row, claimed for %(epoch)s unless a higher epoch owns it.
# ON CONFLICT ... WHERE leaves the row locked (to the commit) even when it updates nothing.
_FENCE = """
    INSERT INTO {s}.fence AS f (session_id, epoch, mtime)
    VALUES (%(sid)s, %(epoch)s, %(now)s)
    ON CONFLICT (session_id) DO UPDATE
        SET epoch = EXCLUDED.epoch, mtime = GREATEST(f.mtime + 1, EXCLUDED.mtime)
        WHERE f.epoch <= EXCLUDED.epoch
    RETURNING f.mtime
"""

# The fence, then the entries (a retried batch's uuids skipped) and the key's meta row.
_FENCED_ENTRIES = f"""
WITH fence AS ({_FENCE}),
ins AS (
    INSERT INTO {{s}}.entries (key, uuid, data)
    SELECT %(key)s, e.uuid, e.data
    FROM fence, unnest(%(uuids)s::text[], %(datas)s::text[]) WITH ORDINALITY AS e(uuid, data, n)
    ORDER BY e.n
    ON CONFLICT (key, uuid) WHERE uuid IS NOT NULL DO NOTHING
    RETURNING uuid
),
meta AS (
    INSERT INTO {{s}}.meta (key, project_key, session_id, subpath, mtime)
    SELECT %(key)s, %(pk)s, %(sid)s, %(sub)s, fence.mtime FROM fence
    WHERE EXISTS (SELECT FROM ins)
    ON CONFLICT (key) DO UPDATE SET mtime = EXCLUDED.mtime
)"""

# One statement: the write time, and the uuids the database took.
_APPEND = f"""{_FENCED_ENTRIES}
SELECT (SELECT mtime FROM fence), ARRAY(SELECT uuid FROM ins WHERE uuid IS NOT NULL)
"""

# The same in one round trip, for a process that folded the session's summary last (the
# common case: one attempt writes its session). It folds the batch into the summary it
# remembers (%(folded)s) and puts it in only if that summary is still the stored one and
# every entry was new; else stale_summary() fails the statement, the transaction rolls
# back, and append() takes the general path.
_APPEND_FOLDED = f"""{_FENCED_ENTRIES},
summary AS (
    UPDATE {{s}}.summaries AS m SET mtime = fence.mtime, data = %(folded)s
    FROM fence
    WHERE m.project_key = %(pk)s AND m.session_id = %(sid)s AND m.mtime = %(prev)s
        AND (SELECT count(*) FROM ins) = %(count)s
    RETURNING 1
)
SELECT mtime, CASE WHEN NOT EXISTS (SELECT FROM summary) THEN {{s}}.stale_summary() END
FROM fence
"""
STALE = "FL001"  # stale_summary()'s SQLSTATE
REMEMBERED = 64  # sessions whose summary a process keeps for the one-round-trip path

_SUMMARY = "SELECT mtime, data FROM {s}.summaries WHERE project_key = %s AND session_id = %s"
_PUT_SUMMARY = """
    INSERT INTO {s}.summaries (project_key, session_id, mtime, data) VALUES (%s, %s, %s, %s)
    ON CONFLICT (project_key, session_id)
    DO UPDATE SET mtime = EXCLUDED.mtime, data = EXCLUDED.data
"""

_LEDGER_STARTED = f"""
WITH fence AS ({_FENCE}),
ins AS (
    INSERT INTO {{s}}.tool_calls
        (tool_use_id, session_id, agent_id, name, input, message, state, started_at)
    SELECT %(tid)s, %(sid)s, %(agent)s, %(name)s, %(input)s, %(message)s, %(state)s,
        %(started_at)s
    FROM fence
    ON CONFLICT (tool_use_id) DO NOTHING
)
SELECT count(*) FROM fence
"""

_LEDGER_FINISHED = f"""
WITH fence AS ({_FENCE}),
ins AS (
    INSERT INTO {{s}}.tool_calls (tool_use_id, session_id, agent_id, name, input, state,
        response, content, is_error, started_at, ended_at)
    SELECT %(tid)s, %(sid)s, %(agent)s, %(name)s, %(input)s, %(state)s, %(response)s,
        %(content)s, %(is_error)s, %(started_at)s, %(ended_at)s
    FROM fence
    ON CONFLICT (tool_use_id) DO UPDATE SET
        state = EXCLUDED.state, response = EXCLUDED.response, content = EXCLUDED.content,
        is_error = EXCLUDED.is_error, ended_at = EXCLUDED.ended_at
)
SELECT count(*) FROM fence
"""

_LEDGER_EXACT = f"""
WITH fence AS ({_FENCE}),
upd AS (
    UPDATE {{s}}.tool_calls SET content = %(content)s, is_error = %(is_error)s
    WHERE tool_use_id = %(tid)s AND state IN ('done', 'failed') AND EXISTS (SELECT FROM fence)
)
SELECT count(*) FROM fence
"""

Op = Callable[["Conn", "Sql", int, dict[str, Any], Any], None]


def superseded(conn: Conn, sql: Sql, session_id: str, epoch: int) -> Superseded:
    """The error for a write of ``epoch`` that the fence of ``session_id`` refused."""
    row = conn.execute(sql("SELECT epoch FROM {s}.fence WHERE session_id = %s"), (session_id,))
    owner = (row.fetchone() or ("?",))[0]
    return Superseded(
        t("state.superseded", session=session_id, owner=owner, epoch=epoch),
        hint=t("state.superseded.hint"),
    )


def _fold(
    prev: SessionSummaryEntry | None, key: SessionKey, entries: list[SessionStoreEntry]
) -> SessionSummaryEntry:
    # the SDK is loaded in every process that appends transcripts (the attempts); only one
    # that delivers a dead process's spool (status, say) loads it here, when it must
    from claude_agent_sdk import fold_session_summary

    return fold_session_summary(prev, key, entries)


def _json(value: Any) -> str:
    """Compact JSON text, ASCII (a lone surrogate stays encodable, escaped)."""
    return json.dumps(value, separators=(",", ":"))


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def append(conn: Conn, sql: Sql, epoch: int, args: dict[str, Any], entries: Any) -> None:
    """``args``: ``key`` (the key string), ``project_key``, ``session_id``, ``subpath``,
    ``uuids`` and ``datas`` (each entry's uuid or None, its JSON text). ``entries``: the
    parsed entries when the caller has them (the spool does not keep them twice)."""
    pk, sid, sub = args["project_key"], args["session_id"], args["subpath"]
    params = {
        "sid": sid,
        "epoch": epoch,
        "now": _now_ms(),
        "key": args["key"],
        "pk": pk,
        "sub": sub,
        "uuids": args["uuids"],
        "datas": args["datas"],
    }
    if sub is not None:  # subagent transcripts never feed the main session's summary
        mtime, _ = conn.execute(sql(_APPEND), params).fetchone() or (None, None)
        if mtime is None:
            raise superseded(conn, sql, sid, epoch)
        return
    parsed = entries if entries is not None else [json.loads(d) for d in args["datas"]]
    key: SessionKey = {"project_key": pk, "session_id": sid}
    if _append_folded(conn, sql, params, key, parsed):
        return
    # The general path, two round trips: BEGIN, the append and the summary's read go
    # together (the read is its own statement, so it sees what the session's previous
    # writer committed before the fence let this one in); the folded summary and COMMIT
    # go together.
    with conn.pipeline(), conn.transaction():
        appended = conn.execute(sql(_APPEND), params)
        summary = conn.execute(sql(_SUMMARY), (pk, sid))
        mtime, fresh_uuids = appended.fetchone() or (None, None)
        row = summary.fetchone()
        if mtime is None:
            raise superseded(conn, sql, sid, epoch)
        fresh = _fresh(args["uuids"], parsed, set(fresh_uuids or ()))
        if not fresh:  # a retried batch that had landed: nothing changed
            return
        prev: SessionSummaryEntry | None = None
        if row is not None:
            prev = {"session_id": sid, "mtime": row[0], "data": json.loads(row[1])}
        folded = _fold(prev, key, fresh)
        conn.execute(sql(_PUT_SUMMARY), (pk, sid, mtime, _json(folded["data"])))
    _remember(sql, (pk, sid), (mtime, folded["data"]))


def _append_folded(
    conn: Conn,
    sql: Sql,
    params: dict[str, Any],
    key: SessionKey,
    entries: list[SessionStoreEntry],
) -> bool:
    """The one-round-trip append (:data:`_APPEND_FOLDED`); False when it cannot be used
    (no summary remembered, or not the stored one any more), and nothing was written."""
    pk, sid = key["project_key"], key["session_id"]
    known = sql.summaries.get((pk, sid))
    if known is None:
        return False
    prev: SessionSummaryEntry = {"session_id": sid, "mtime": known[0], "data": known[1]}
    folded = _fold(prev, key, entries)
    extra = {"prev": known[0], "folded": _json(folded["data"]), "count": len(entries)}
    try:
        row = _statement(conn, sql(_APPEND_FOLDED), {**params, **extra})
    except psycopg.Error as exc:
        if exc.sqlstate != STALE:
            raise
        del sql.summaries[(pk, sid)]
        return False
    if row is None:
        raise superseded(conn, sql, sid, params["epoch"])
    _remember(sql, (pk, sid), (row[0], folded["data"]))
    return True


def _statement(conn: Conn, query: str, params: dict[str, Any]) -> tuple[Any, ...] | None:
    """One statement's first row; inside a transaction (a spool's delivery), in a savepoint
    of its own, so its failure leaves the transaction usable."""
    if conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        return conn.execute(query, params).fetchone()
    with conn.transaction():
        return conn.execute(query, params).fetchone()


def _remember(sql: Sql, key: tuple[str, str], summary: tuple[int, dict[str, Any]]) -> None:
    sql.summaries.pop(key, None)
    sql.summaries[key] = summary
    while len(sql.summaries) > REMEMBERED:  # the oldest first (dicts keep insertion order)
        del sql.summaries[next(iter(sql.summaries))]


def _fresh(
    uuids: list[str | None], entries: list[SessionStoreEntry], stored: set[str]
) -> list[SessionStoreEntry]:
    """The entries this append stored: every one without a uuid, and the first of each
    uuid the database took."""
    out: list[SessionStoreEntry] = []
    for n, uuid in enumerate(uuids):
        if uuid is not None:
            if uuid not in stored:
                continue
            stored.discard(uuid)  # a uuid twice in one batch: the first one is stored
        out.append(entries[n])
    return out


def ledger_started(conn: Conn, sql: Sql, epoch: int, args: dict[str, Any], _: Any) -> None:
    _ledger(conn, sql, _LEDGER_STARTED, epoch, args)


def ledger_finished(conn: Conn, sql: Sql, epoch: int, args: dict[str, Any], _: Any) -> None:
    _ledger(conn, sql, _LEDGER_FINISHED, epoch, args)


def ledger_exact(conn: Conn, sql: Sql, epoch: int, args: dict[str, Any], _: Any) -> None:
    """``args``: ``tid``, ``content``, ``is_error``; the session is the stored call's."""
    found = conn.execute(
        sql("SELECT session_id FROM {s}.tool_calls WHERE tool_use_id = %s"), (args["tid"],)
    ).fetchone()
    if found is not None:  # a call's session never changes: no transaction needed
        _ledger(conn, sql, _LEDGER_EXACT, epoch, {**args, "sid": found[0]})


def _ledger(conn: Conn, sql: Sql, template: str, epoch: int, args: dict[str, Any]) -> None:
    params = {**args, "epoch": epoch, "now": _now_ms()}
    (passed,) = conn.execute(sql(template), params).fetchone() or (0,)
    if not passed:
        raise superseded(conn, sql, args["sid"], epoch)


#: The fenced writes by name (the spool records name them).
OPS: dict[str, Op] = {
    "append": append,
    "ledger.started": ledger_started,
    "ledger.finished": ledger_finished,
    "ledger.exact": ledger_exact,
}
