"""The seam's row stores on PostgreSQL: the tool ledger, lineage, manifest, registry, cache
and event log (the protocols and what each row holds: :mod:`flower.state.seam`).

The ledger is fenced like the session its calls belong to and spooled during an outage
(:mod:`.fenced`, :mod:`.db`); manifest rows, registry records and events are spooled too
(:mod:`.kept`), so a step that runs through an outage loses none of them; the others
(lineage, the cache, every read) raise :class:`~flower.state.postgres.PostgresUnavailable`
while the database cannot be reached, for their caller to wait and retry. Read-modify-write
blocks (:meth:`LineageRows.update`, :meth:`RegistryRows.locked`) run in one transaction
under an advisory lock keyed by the workspace, holding this process's connection for the
block: call no coroutine of the store from inside one (the worker thread would wait for the
block, and the block for it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.types.json import Json

from ...i18n import t
from ..records import LedgerRow, LineageDoc
from .db import Conn, Database
from .kept import LIVE, NOW, workspace_lock

if TYPE_CHECKING:
    from .sessions import PostgresSessionStore

__all__ = [
    "PostgresCacheRows",
    "PostgresEventRows",
    "PostgresLedgerRows",
    "PostgresLineageRows",
    "PostgresManifestRows",
    "PostgresRegistryRows",
    "PostgresWorkerRows",
]


def _lock(conn: Conn, db: Database, what: str, workspace_id: str) -> None:
    workspace_lock(conn, db.sql, what, workspace_id)


# ---------------------------------------------------------------------------------------
# the tool ledger
# ---------------------------------------------------------------------------------------

_LEDGER_COLUMNS = (
    "tool_use_id, session_id, agent_id, name, input, state, started_at, message, response,"
    " content, is_error, ended_at"
)


class PostgresLedgerRows:
    """The ``tool_calls`` table (SQLite's columns). Writes carry the epoch of ``owner``, the
    session store of the same attempt."""

    def __init__(self, db: Database, owner: PostgresSessionStore) -> None:
        self._db = db
        self._owner = owner

    async def started(self, row: LedgerRow) -> None:
        """Insert a started call; a row that exists already is left as it is."""
        args = {**_who(row), "message": row.message, "state": row.state}
        epoch = self._owner.epoch
        await self._db.call(lambda: self._db.write("ledger.started", epoch, args))

    async def finished(self, row: LedgerRow) -> None:
        """Insert or update the call's end."""
        args = {
            **_who(row),
            "state": row.state,
            "response": row.response,
            "content": row.content,
            "is_error": bool(row.is_error),
            "ended_at": row.ended_at,
        }
        epoch = self._owner.epoch
        await self._db.call(lambda: self._db.write("ledger.finished", epoch, args))

    def exact(self, tool_use_id: str, content: str, is_error: bool) -> None:
        """Replace a finished call's content with what the model was really sent."""
        args = {"tid": tool_use_id, "content": content, "is_error": bool(is_error)}
        self._db.write("ledger.exact", self._owner.epoch, args)

    def by_ids(self, ids: Sequence[str]) -> list[LedgerRow]:
        wanted = sorted(set(ids))
        if not wanted:
            return []
        return self._select("tool_use_id = ANY(%s)", (wanted,))

    def in_session(self, session_id: str, since: float) -> list[LedgerRow]:
        """Main-thread calls of the session that started at ``since`` or later, oldest
        first."""
        where = "session_id = %s AND agent_id IS NULL AND started_at >= %s ORDER BY started_at"
        return self._select(where, (session_id, since))

    def _select(self, where: str, params: Any) -> list[LedgerRow]:
        sql = self._db.sql(f"SELECT {_LEDGER_COLUMNS} FROM {{s}}.tool_calls WHERE {where}")
        rows = self._db.run(lambda conn: conn.execute(sql, params).fetchall())
        return [LedgerRow(*row) for row in rows]


def _who(row: LedgerRow) -> dict[str, Any]:
    return {
        "tid": row.tool_use_id,
        "sid": row.session_id,
        "agent": row.agent_id,
        "name": row.name,
        "input": row.input,
        "started_at": row.started_at,
    }


# ---------------------------------------------------------------------------------------
# lineage, manifest
# ---------------------------------------------------------------------------------------


class PostgresLineageRows:
    """One lineage document per workspace; ``--new`` keeps the old one in an archive.

    Naming and dropping a step's session (:meth:`put`, :meth:`drop`) are kept writes
    (:mod:`.kept`): a session started, resumed or handed off while the database is away is
    named in this machine's spool and delivered, in order with the transcript it names,
    when it is back (by this process, or by the next one that connects)."""

    path: Path | None = None  # no file: the database keeps it

    def __init__(self, db: Database, where: str) -> None:
        self._db = db
        self.where = where

    def read(self, workspace_id: str) -> LineageDoc | None:
        return self._db.run(lambda conn: self._read(conn, workspace_id))

    @contextlib.contextmanager
    def update(
        self, workspace_id: str, run_id: str | None = None
    ) -> Iterator[list[LineageDoc | None]]:
        """Read-modify-write under the workspace's lock (see the module docstring); a
        workspace's row is only ever its own, so ``run_id`` has nothing to refuse."""
        sql = self._db.sql(
            "INSERT INTO {s}.lineage (workspace_id, workspace, woke, steps)"
            " VALUES (%s, %s, %s, %s::json) ON CONFLICT (workspace_id) DO UPDATE SET"
            " workspace = EXCLUDED.workspace, woke = EXCLUDED.woke, steps = EXCLUDED.steps"
        )
        with self._db.transaction() as conn:
            _lock(conn, self._db, "lineage", workspace_id)
            box: list[LineageDoc | None] = [self._read(conn, workspace_id)]
            yield box
            doc = box[0]
            if doc is not None:
                params = (workspace_id, doc.workspace, int(doc.woke), Json(doc.steps))
                conn.execute(sql, params)

    def put(self, workspace_id: str, workspace: str, woke: int, step: str, sid: str) -> None:
        """Name ``step``'s session, merged with what others wrote (kept through an outage)."""
        args = {"workspace_id": workspace_id, "workspace": workspace, "woke": woke}
        self._db.write("lineage.put", 0, {**args, "step": step, "sid": sid})

    def drop(self, workspace_id: str, step: str, sid: str) -> None:
        """Drop ``step``'s entry if it still names ``sid`` (kept through an outage)."""
        self._db.write("lineage.drop", 0, {"workspace_id": workspace_id, "step": step, "sid": sid})

    def keep_copy(self, workspace_id: str) -> str:
        return t("lineage.gone.in_db")

    def archive(self, workspace_id: str, into: Path) -> bool:
        """Keep the current document under ``into``'s name and drop it; False if none."""
        sql = self._db.sql(
            "WITH gone AS (DELETE FROM {s}.lineage WHERE workspace_id = %s"
            " RETURNING workspace_id, workspace, woke, steps)"
            " INSERT INTO {s}.lineage_archive (workspace_id, stamp, workspace, woke, steps)"
            " SELECT workspace_id, %s, workspace, woke, steps FROM gone RETURNING 1"
        )
        rows = self._db.run(lambda conn: conn.execute(sql, (workspace_id, into.name)).fetchall())
        return bool(rows)

    def _read(self, conn: Conn, workspace_id: str) -> LineageDoc | None:
        sql = self._db.sql("SELECT workspace, woke, steps FROM {s}.lineage WHERE workspace_id = %s")
        row = conn.execute(sql, (workspace_id,)).fetchone()
        return None if row is None else LineageDoc(row[0], int(row[1]), dict(row[2]))


class PostgresManifestRows:
    """Manifest rows in the order written, per workspace."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def append(self, workspace_id: str, row: dict[str, Any]) -> None:
        """Kept through an outage (:mod:`.kept`): never raises for a database that is down."""
        row = json.loads(json.dumps(row))  # JSON's own types only, and a copy of its own
        self._db.write("manifest.append", 0, {"workspace_id": workspace_id, "row": row}, LIVE)

    def check(self) -> None:
        """A row is appended once, in one statement: no torn table to set aside."""

    def rows(self, workspace_id: str | None = None) -> list[dict[str, Any]]:
        where, params = _of_workspace(workspace_id)
        sql = f"SELECT row FROM {{s}}.manifest{where} ORDER BY id"
        return [row for (row,) in _fetch(self._db, sql, params)]


# ---------------------------------------------------------------------------------------
# registry, cache, events
# ---------------------------------------------------------------------------------------


class PostgresRegistryRows:
    """Who ran where: one record per run, with the host it runs on and a heartbeat in the
    database's clock (epoch seconds), so a lease can be judged from any machine.

    A record names its workspace by ``workspace_id`` (``workspace``, its path, when it has
    none)."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self.host = socket.gethostname()

    def write(self, record: dict[str, Any]) -> None:
        """Insert or replace the run's record. Kept through an outage (:mod:`.kept`): never
        raises for a database that is down."""
        args = {
            "run": str(record["run"]),
            "workspace_id": record.get("workspace_id") or record.get("workspace"),
            "started_at": float(record.get("started_at") or 0.0),
            "host": self.host,
            "record": {k: v for k, v in record.items() if k not in ("host", "heartbeat_at")},
            "at": time.time(),
        }
        self._db.write("registry.write", 0, args, LIVE)

    def get(self, run: str) -> dict[str, Any] | None:
        sql = "SELECT record, host, heartbeat_at FROM {s}.registry WHERE run = %s"
        found = [_record(*row) for row in _fetch(self._db, sql, (run,))]
        return found[0] if found else None

    def records(self, workspace_id: str | None = None) -> list[dict[str, Any]]:
        """Oldest start first."""
        where, params = _of_workspace(workspace_id)
        sql = (
            f"SELECT record, host, heartbeat_at FROM {{s}}.registry{where} ORDER BY started_at, run"
        )
        return [_record(*row) for row in _fetch(self._db, sql, params)]

    def remove(self, run: str) -> None:
        """Forget the run's record. Kept through an outage like :meth:`write`, and in order
        after it: a record written during an outage and then removed stays removed."""
        self._db.write("registry.remove", 0, {"run": run}, LIVE)

    def heartbeat(self, run: str) -> None:
        sql = self._db.sql(f"UPDATE {{s}}.registry SET heartbeat_at = {NOW} WHERE run = %s")
        self._db.run(lambda conn: conn.execute(sql, (run,)))

    @contextlib.contextmanager
    def locked(self, workspace_id: str) -> Iterator[None]:
        """Check-then-register as one step: the block runs in one transaction holding the
        workspace's advisory lock (see the module docstring)."""
        with self._db.transaction() as conn:
            _lock(conn, self._db, "registry", workspace_id)
            yield

    def damaged(self) -> list[Path]:
        """A record is one row, written in one statement: none is ever damaged."""
        return []


def _record(record: dict[str, Any], host: str, heartbeat_at: float) -> dict[str, Any]:
    return {**record, "host": host, "heartbeat_at": heartbeat_at}


_LAST = "'last/%%'"  # flower.cache.store's key of the last run's report (%% is psycopg's %)


class PostgresCacheRows:
    """The cross-run cache: one entry per key (``flower.cache.Entry.to_json``'s object)."""

    def __init__(self, db: Database, where: str = "the cache table") -> None:
        self._db = db
        self.where = where

    def get(self, key: str) -> dict[str, Any] | None:
        found = _fetch(self._db, "SELECT entry FROM {s}.cache WHERE key = %s", (key,))
        entry = found[0][0] if found else None
        return dict(entry) if isinstance(entry, dict) else None

    def discard(self, key: str, error: BaseException) -> None:
        """A damaged row stays where it is, a miss, until eviction takes it (a row holds no
        byte a person could want back that the JSON column did not already check)."""

    def read_last(self, workspace_id: str) -> dict[str, Any] | None:
        return self.get(f"last/{workspace_id}")

    def write_last(self, workspace_id: str, last: dict[str, Any]) -> None:
        self.put(f"last/{workspace_id}", last)

    def put(self, key: str, entry: dict[str, Any]) -> None:
        sql = self._db.sql(
            "INSERT INTO {s}.cache (key, created_at, entry) VALUES (%s, %s, %s::json)"
            " ON CONFLICT (key) DO UPDATE SET created_at = EXCLUDED.created_at,"
            " entry = EXCLUDED.entry"
        )
        params = (key, float(entry.get("created_at") or 0.0), Json(entry))
        self._db.run(lambda conn: conn.execute(sql, params))

    def evict(self, *, max_entries: int, max_age_s: float, now: float) -> int:
        """Drop entries older than ``max_age_s`` and the oldest past ``max_entries``. The
        ``last/<workspace>`` rows (what the last run reused, as the local store's own file)
        are no entries: never evicted, never counted."""
        old = self._db.sql("DELETE FROM {s}.cache WHERE created_at < %s AND key NOT LIKE " + _LAST)
        extra = self._db.sql(
            "DELETE FROM {s}.cache WHERE key IN (SELECT key FROM {s}.cache"
            " WHERE key NOT LIKE " + _LAST + " ORDER BY created_at DESC, key OFFSET %s)"
        )

        def work(conn: Conn) -> int:
            with conn.transaction():
                gone = conn.execute(old, (now - max_age_s,)).rowcount
                return gone + conn.execute(extra, (max(0, max_entries),)).rowcount

        return self._db.run(work)

    def __len__(self) -> int:
        sql = "SELECT count(*) FROM {s}.cache WHERE key NOT LIKE " + _LAST
        return int(_fetch(self._db, sql, ())[0][0])


class PostgresEventRows:
    """Each run's event log; :meth:`wait` and :meth:`changed` sleep on LISTEN/NOTIFY, not on
    a poll. Each run's events notify a channel of its own (:func:`channel_of`), so a
    follower is woken by the runs it follows only: fifty supervisors sharing a database
    are not each woken by every frame of the other forty-nine."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self.schema = db.sql.schema
        self._listening: object | None = None  # the connection that LISTENs for changed()
        self._channels: dict[str, str] = {}  # its channels -> their runs
        self._pending: set[str] = set()  # runs whose notification wait() took meanwhile
        self._wake: tuple[int, int] | None = None  # nudge()'s pipe (read end, write end)
        self._wake_lock = threading.Lock()

    def channel_of(self, run: str) -> str:
        return channel_of(self.schema, run)

    def append(self, run: str, event: dict[str, Any]) -> None:
        """Kept through an outage (:mod:`.kept`): never raises for a database that is down."""
        args = {"run": run, "event": event, "channel": self.channel_of(run)}
        self._db.write("events.append", 0, args, LIVE)

    def read(self, run: str, after: int = 0) -> list[tuple[int, dict[str, Any]]]:
        sql = "SELECT pos, event FROM {s}.events WHERE run = %s AND pos > %s ORDER BY pos"
        return [(int(pos), event) for pos, event in _fetch(self._db, sql, (run, after))]

    def wait(self, run: str, after: int, timeout: float) -> bool:
        """Until the run has an event after ``after`` (True) or ``timeout`` passes."""
        lock, conn = self._db.listener()
        newer = self._db.sql("SELECT EXISTS (SELECT FROM {s}.events WHERE run = %s AND pos > %s)")
        channel = self.channel_of(run)
        deadline = time.monotonic() + max(0.0, timeout)
        with lock:
            try:
                conn.execute(f'LISTEN "{channel}"')
                try:
                    while True:
                        if conn.execute(newer, (run, after)).fetchone() == (True,):
                            return True
                        left = deadline - time.monotonic()
                        if left <= 0:
                            return False
                        for n in conn.notifies(timeout=left, stop_after=1):
                            self._pending.add(n.payload)  # changed() still names it
                finally:
                    if not (conn is self._listening and channel in self._channels):
                        conn.execute(f'UNLISTEN "{channel}"')
            except psycopg.Error as exc:
                raise self._db.unavailable(exc) from None

    def changed(self, timeout: float, runs: AbstractSet[str]) -> set[str] | None:
        """Those of ``runs`` that got an event since the last call (the notifications'
        payloads), waiting up to ``timeout`` for one (or a :meth:`nudge`). The listening
        connection keeps listening to their channels between calls (psycopg keeps what
        arrives in between), so none is missed; a run the last call did not name is given
        at once (its channel was not listened to). On a connection that has just started
        listening (the first call, or after the database was away) nobody can say what came
        before: None."""
        lock, conn = self._db.listener()
        wanted = {self.channel_of(r): r for r in runs}
        with lock:
            try:
                fresh = conn is not self._listening
                if fresh:
                    self._listening, self._channels, self._pending = conn, {}, set()
                gone = [c for c in self._channels if c not in wanted]
                new = [c for c in wanted if c not in self._channels]
                if gone or new:  # one round trip (no parameters: several statements go)
                    conn.execute(
                        "; ".join(
                            [f'UNLISTEN "{c}"' for c in gone] + [f'LISTEN "{c}"' for c in new]
                        )
                    )
                self._channels = wanted
                if fresh:
                    return None
                got = self._pending | {wanted[c] for c in new}
                self._pending = set()
                got.update(n.payload for n in conn.notifies(timeout=0.0))
                if not got and timeout > 0:
                    self._sleep(conn, timeout)
                    got.update(n.payload for n in conn.notifies(timeout=0.0))
                return got & set(runs)
            except psycopg.Error as exc:
                self._listening = None
                raise self._db.unavailable(exc) from None

    def nudge(self) -> None:
        with contextlib.suppress(BlockingIOError):  # a full pipe: it is nudged already
            os.write(self._wake_pipe()[1], b"!")

    def _wake_pipe(self) -> tuple[int, int]:
        with self._wake_lock:
            if self._wake is None:
                r, w = os.pipe()
                os.set_blocking(r, False)
                os.set_blocking(w, False)
                self._wake = (r, w)
            return self._wake

    def _sleep(self, conn: Any, timeout: float) -> None:
        """Until the listening connection has something to read, a nudge, or ``timeout``.
        (What libpq had buffered was taken by the ``notifies`` just before: nothing runs
        on this connection in between.)"""
        woke, _, _ = select.select([conn.fileno(), self._wake_pipe()[0]], [], [], timeout)
        if self._wake_pipe()[0] in woke:
            with contextlib.suppress(BlockingIOError):
                while os.read(self._wake_pipe()[0], 4096):
                    pass


def channel_of(schema: str, run: str) -> str:
    """The NOTIFY channel of one run's events in ``schema``: an identifier (at most 63
    bytes) of its own, whatever the run's name; channels are database-wide, so the schema
    is part of it."""
    digest = hashlib.sha256(f"{schema}\0{run}".encode()).hexdigest()[:40]
    return f"flower_{digest}"


class PostgresWorkerRows:
    """A cluster's workers, one row each as it last said it was: its queue, host, start, a
    heartbeat in the database's clock (so silence can be judged from any machine), and when
    it stopped. Not kept through an outage: a worker's next report replaces this one."""

    #: A stopped (or silent) worker's row is forgotten this long after its last word.
    KEEP_STOPPED_S = 24 * 3600.0

    def __init__(self, db: Database) -> None:
        self._db = db

    def report(self, name: str, queue: str, started_at: float, record: dict[str, Any]) -> None:
        """Insert or replace ``name``'s row, its heartbeat now (raises while the database
        cannot be reached)."""
        sql = self._db.sql(
            "INSERT INTO {s}.workers (name, queue, host, started_at, heartbeat_at, record)"
            f" VALUES (%s, %s, %s, %s, {NOW}, %s) ON CONFLICT (name) DO UPDATE SET"
            " queue = EXCLUDED.queue, host = EXCLUDED.host, started_at = EXCLUDED.started_at,"
            " heartbeat_at = EXCLUDED.heartbeat_at, stopped_at = NULL, record = EXCLUDED.record"
        )
        args = (name, queue, socket.gethostname(), started_at, Json(record))
        self._db.run(lambda conn: conn.execute(sql, args))

    def stopped(self, name: str) -> None:
        """``name`` has stopped; rows of workers that stopped (or went silent) a day ago go."""
        mark = self._db.sql(f"UPDATE {{s}}.workers SET stopped_at = {NOW} WHERE name = %s")
        old = self._db.sql(
            f"DELETE FROM {{s}}.workers WHERE coalesce(stopped_at, heartbeat_at) < {NOW} - %s"
        )

        def work(conn: Conn) -> None:
            conn.execute(mark, (name,))
            conn.execute(old, (self.KEEP_STOPPED_S,))

        self._db.run(work)

    def rows(self, queue: str | None = None) -> list[dict[str, Any]]:
        """Every worker's row (of ``queue``'s only, when given), by queue and name; each
        its record with ``name``, ``queue``, ``host``, ``started_at``, ``heartbeat_at``,
        ``stopped_at`` (None while it runs) and ``now`` (the database's clock)."""
        where, params = (" WHERE queue = %s", (queue,)) if queue else ("", ())
        sql = (
            "SELECT name, queue, host, started_at, heartbeat_at, stopped_at, record,"
            f" {NOW} FROM {{s}}.workers{where} ORDER BY queue, name"
        )
        keys = ("name", "queue", "host", "started_at", "heartbeat_at", "stopped_at")
        # (the record's own keys come first: the columns win)
        return [
            {**(row[6] or {}), **dict(zip(keys, row[:6], strict=True)), "now": row[7]}
            for row in _fetch(self._db, sql, params)
        ]

    def kept(self) -> tuple[int, int]:
        """This machine's writes waiting for the database (:mod:`.spool`): how many
        processes kept some, and their bytes."""
        from .spool import SUFFIX, spool_dir

        files = size = 0
        with contextlib.suppress(OSError):
            for entry in os.scandir(spool_dir(self._db.url.database_key)):
                if entry.name.endswith(SUFFIX):
                    with contextlib.suppress(OSError):
                        size += entry.stat().st_size
                        files += 1
        return files, size


def _of_workspace(workspace_id: str | None) -> tuple[str, tuple[str, ...]]:
    """A WHERE clause (and its parameters) for one workspace's rows, or for all of them."""
    return ("", ()) if workspace_id is None else (" WHERE workspace_id = %s", (workspace_id,))


def _fetch(db: Database, template: str, params: Any) -> list[tuple[Any, ...]]:
    sql = db.sql(template)
    return db.run(lambda conn: conn.execute(sql, params).fetchall())
