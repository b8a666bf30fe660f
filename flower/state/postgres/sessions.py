"""``PostgresSessionStore``: the SDK's ``SessionStore`` in one PostgreSQL database.

The same semantics as :class:`flower.state.sqlite.SqliteSessionStore`, table for table:
``entries`` (one row per transcript entry, its JSON text exactly as appended, ``key`` the
string ``project_key/session_id[/subpath]``, ``seq`` the order, a unique index on
``(key, uuid)`` so a batch the SDK retries or a resumed CLI re-sends lands once: ``ON
CONFLICT DO NOTHING``), ``meta`` (one row per key with its last write time), ``summaries``
(the SDK's folded summary, written in the append's transaction). Every optional method is
implemented; it passes ``claude_agent_sdk.testing.run_session_store_conformance``.

Beyond SQLite: *fencing* (:meth:`begin_attempt`, :meth:`claim`; the rules are in
:mod:`.fenced`), and an outage of the database loses no entry (the spool, :mod:`.db`).
Eager flush needs nothing special: an append is committed before ``append`` returns, in
one round trip (two when the main transcript's summary has to be read first: a process's
first append to a session, a retried batch, or another writer's fold since).
"""

from __future__ import annotations

import json
from typing import Any

from claude_agent_sdk.types import (
    SessionKey,
    SessionListSubkeysKey,
    SessionStore,
    SessionStoreEntry,
    SessionStoreListEntry,
    SessionSummaryEntry,
)

from ..sqlite import _entry_uuid, _split_key, _to_json
from .db import Conn, Database
from .fenced import superseded
from .url import parse_state_url

__all__ = ["PostgresSessionStore", "context_tokens"]

_CONTEXT_KEYS = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")


def context_tokens(entry: Any) -> int | None:
    """The context a real model response saw (see :meth:`PostgresSessionStore.last_context`),
    or None for an entry that is not one."""
    msg = entry.get("message") if isinstance(entry, dict) else None
    if entry.get("type") != "assistant" or not isinstance(msg, dict):
        return None
    if entry.get("isApiErrorMessage") or msg.get("model") == "<synthetic>":
        return None
    usage = msg.get("usage")
    if not isinstance(usage, dict) or not usage:
        return None
    return sum(int(usage.get(k) or 0) for k in _CONTEXT_KEYS)


class PostgresSessionStore(SessionStore):
    """The SDK's ``SessionStore`` on PostgreSQL, shared by any number of processes and
    machines.

    ``dsn`` is a ``postgresql://`` (or ``postgres://``) URL; ``schema`` (default: the URL's
    ``?schema=``, else ``flower``) the schema its tables live in, created on first use. The
    constructor connects: a bad URL, a refused password, a missing database or a server
    that is down is raised here, one line with a hint
    (:class:`~flower.state.postgres.PostgresStateError`,
    :class:`~flower.state.postgres.PostgresUnavailable`).

    An object may be inherited across ``os.fork()`` (the child opens its own connection)
    and used from several threads. :meth:`begin_attempt` gives it an epoch; without one
    (epoch 0) it writes only sessions that no attempt owns.
    """

    def __init__(self, dsn: str, *, schema: str | None = None) -> None:
        self._db = Database.shared(parse_state_url(dsn, schema=schema))
        self._db.open()
        self.epoch = 0

    @classmethod
    def on(cls, db: Database) -> PostgresSessionStore:
        """A store on an open :class:`Database` (how :class:`PostgresState` makes one)."""
        store = cls.__new__(cls)
        store._db = db
        store.epoch = 0
        return store

    def __repr__(self) -> str:
        return f"PostgresSessionStore({self._db.where!r}, epoch={self.epoch})"

    # ---- the SDK's protocol -----------------------------------------------------------

    async def append(self, key: SessionKey, entries: list[SessionStoreEntry]) -> None:
        """Append ``entries`` to ``key`` in order; an entry whose ``uuid`` is already stored
        under ``key`` is skipped, entries without one always append. Fenced: raises
        :class:`~flower.state.seam.Superseded` when a newer attempt owns the session."""
        if not entries:
            return
        key_string, project_key, session_id, subpath = _split_key(key)
        args = {
            "key": key_string,
            "project_key": project_key,
            "session_id": session_id,
            "subpath": subpath,
            "uuids": [_entry_uuid(e) for e in entries],
            "datas": [_to_json(e) for e in entries],
        }
        epoch = self.epoch
        await self._db.call(lambda: self._db.write("append", epoch, args, entries))

    async def load(self, key: SessionKey) -> list[SessionStoreEntry] | None:
        """Every entry stored under ``key`` in append order, or None if there is none."""
        return await self._db.call(lambda: self.load_sync(key))

    async def list_sessions(self, project_key: str) -> list[SessionStoreListEntry]:
        sql = "SELECT session_id, mtime FROM {s}.meta WHERE project_key = %s AND subpath IS NULL"
        rows = await self._read_async(sql, (project_key,))
        return [{"session_id": sid, "mtime": mtime} for sid, mtime in rows]

    async def list_session_summaries(self, project_key: str) -> list[SessionSummaryEntry]:
        sql = "SELECT session_id, mtime, data FROM {s}.summaries WHERE project_key = %s"
        rows = await self._read_async(sql, (project_key,))
        return [{"session_id": s, "mtime": m, "data": json.loads(d)} for s, m, d in rows]

    async def delete(self, key: SessionKey) -> None:
        """Delete ``key``; a main key takes its subkeys and its summary with it. Not fenced:
        deleting is a person's decision, not an attempt's (the fence row stays, so write
        times go on rising and a superseded attempt stays superseded)."""
        parts = _split_key(key)
        await self._db.call(lambda: self._delete(parts))

    async def list_subkeys(self, key: SessionListSubkeysKey) -> list[str]:
        _, project_key, session_id, _ = _split_key(key)
        sql = (
            "SELECT subpath FROM {s}.meta WHERE project_key = %s AND session_id = %s"
            " AND subpath IS NOT NULL ORDER BY subpath"
        )
        rows = await self._read_async(sql, (project_key, session_id))
        return [subpath for (subpath,) in rows]

    # ---- flower's helpers (the seam's Sessions) ---------------------------------------

    def has_session(self, project_key: str | None, session_id: str) -> bool:
        """The CLI can resume ``session_id``: a main transcript of it under ``project_key``
        (None: under any project) holds a conversation, at least one ``user`` entry (see
        :data:`flower.state.dbfile.SESSION_EXISTS`, the same question for local files)."""
        sql = (
            "SELECT 1 FROM {s}.meta m WHERE m.session_id = %(sid)s AND m.subpath IS NULL"
            " AND (%(pk)s::text IS NULL OR m.project_key = %(pk)s)"
            " AND EXISTS (SELECT FROM {s}.entries e WHERE e.key = m.key"
            " AND e.data::jsonb ->> 'type' = 'user') LIMIT 1"
        )
        return bool(self._read(sql, {"sid": session_id, "pk": project_key}))

    def load_sync(self, key: SessionKey) -> list[SessionStoreEntry] | None:
        """:meth:`load` for callers outside an event loop."""
        sql = "SELECT data FROM {s}.entries WHERE key = %s ORDER BY seq"
        rows = self._read(sql, (_split_key(key)[0],))
        loads = json.loads
        return [loads(data) for (data,) in rows] if rows else None

    def projects(self) -> list[str]:
        """Every ``project_key`` stored, sorted."""
        rows = self._read("SELECT DISTINCT project_key FROM {s}.meta ORDER BY 1", ())
        return [project_key for (project_key,) in rows]

    def last_context(self, project_key: str, session_id: str, *, scan: int = 60) -> int:
        """The context the model saw on the session's last turn, in tokens; 0 if none: the
        last assistant entry among the latest ``scan`` that carries usage from a real
        response, ``input_tokens + cache_read_input_tokens + cache_creation_input_tokens``."""
        key_string = _split_key({"project_key": project_key, "session_id": session_id})[0]
        sql = "SELECT data FROM {s}.entries WHERE key = %s ORDER BY seq DESC LIMIT %s"
        for (data,) in self._read(sql, (key_string, max(0, int(scan)))):
            tokens = context_tokens(json.loads(data))
            if tokens is not None:
                return tokens
        return 0

    def close(self) -> None:
        """Close this process's connections (shared by every object on the same database);
        a later call opens new ones."""
        self._db.close()

    # ---- fencing ------------------------------------------------------------------------

    def begin_attempt(self) -> int:
        """Take a new epoch (from the database's sequence, above every one handed out
        before); every later write of this object carries it."""
        sql = self._db.sql("SELECT nextval('{s}.epochs')")
        row = self._db.run(lambda conn: conn.execute(sql).fetchone())
        self.epoch = int(row[0]) if row else 0
        return self.epoch

    def claim(self, session_id: str) -> None:
        """Make this object's epoch the owner of ``session_id`` before resuming it; raises
        :class:`~flower.state.seam.Superseded` when a newer epoch owns it already."""
        sql = self._db.sql(
            "INSERT INTO {s}.fence AS f (session_id, epoch, mtime) VALUES (%s, %s, 0)"
            " ON CONFLICT (session_id) DO UPDATE SET epoch = EXCLUDED.epoch"
            " WHERE f.epoch <= EXCLUDED.epoch RETURNING 1"
        )
        epoch, db = self.epoch, self._db

        def work(conn: Conn) -> None:
            if conn.execute(sql, (session_id, epoch)).fetchone() is None:
                raise superseded(conn, db.sql, session_id, epoch)

        db.run(work)

    # ---- internals ----------------------------------------------------------------------

    def _read(self, template: str, params: Any) -> list[tuple[Any, ...]]:
        sql = self._db.sql(template)
        return self._db.run(lambda conn: conn.execute(sql, params).fetchall())

    async def _read_async(self, template: str, params: Any) -> list[tuple[Any, ...]]:
        return await self._db.call(lambda: self._read(template, params))

    def _delete(self, parts: tuple[str, str, str, str | None]) -> None:
        key_string, project_key, session_id, subpath = parts
        sql = self._db.sql
        with self._db.transaction() as conn:
            if subpath is not None:
                conn.execute(sql("DELETE FROM {s}.entries WHERE key = %s"), (key_string,))
                conn.execute(sql("DELETE FROM {s}.meta WHERE key = %s"), (key_string,))
                return
            ids = (project_key, session_id)
            keys = "SELECT key FROM {s}.meta WHERE project_key = %s AND session_id = %s"
            conn.execute(sql(f"DELETE FROM {{s}}.entries WHERE key IN ({keys})"), ids)
            conn.execute(
                sql("DELETE FROM {s}.meta WHERE project_key = %s AND session_id = %s"), ids
            )
            where = "project_key = %s AND session_id = %s"
            conn.execute(sql(f"DELETE FROM {{s}}.summaries WHERE {where}"), ids)
