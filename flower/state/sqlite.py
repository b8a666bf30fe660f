"""``SqliteSessionStore``: the SDK's ``SessionStore`` protocol on one SQLite file.

The local backend's session store (the seam's ``Sessions``), and the bottom of the three
store layers (sqlite → trimming → pruning; the two layers wrap any ``Sessions``, this one
or PostgreSQL's). It keeps every entry exactly as it was appended; the layers above reshape
what ``load()`` returns, never what is stored.

Layout (three tables, as seed 003 names them):

- ``entries(seq, key, uuid, data)``: one row per transcript entry, ``data`` the entry as
  compact JSON text, ``key`` the string ``project_key/session_id[/subpath]``. ``seq`` is the
  commit order; an entry's ``uuid`` is unique per key (the SDK retries whole batches).
- ``meta(key, project_key, session_id, subpath, mtime)``: one row per stored key with its
  last write time (epoch ms). The row whose ``key`` is ``''`` is the store-wide write clock.
- ``summaries(project_key, session_id, mtime, data)``: the SDK's incrementally folded
  session summary (``fold_session_summary``), written in the same transaction as the append.
- ``tool_calls``: flower's tool ledger, one row per tool call (:mod:`flower.state.ledger`,
  through :class:`SqliteLedgerRows`); never part of a transcript, only consulted when one
  is loaded.

Fencing (:mod:`flower.state.seam`): one machine, and the supervisor keeps one writer per
session, so :meth:`SqliteSessionStore.begin_attempt` is a counter of this object and
:meth:`SqliteSessionStore.claim` does nothing: no write here is ever refused.

Concurrency: several processes write one file at once. The file is in WAL mode and every
write is one short ``BEGIN IMMEDIATE`` transaction. SQLite's own busy handler sleeps
1, 2, 5 ... 100 ms between tries *inside* the C call, so the whole event loop stops while it
waits (four writers on 2 cores: waits of 0.2-0.75 s measured). Connections here have no
busy handler; a busy transaction is retried with short jittered pauses, awaited when they
are 1 ms or more, up to ``BUSY_DEADLINE_S``, after which :class:`SessionStoreBusy` is
raised. ``scripts/bench_store.py`` measures both side by side.

Durability: WAL with ``synchronous=NORMAL``. A commit is in the WAL file (the OS page
cache) before ``append()`` returns, so it survives kill -9 of the writer; after a power loss
the file is consistent (WAL frames are checksummed, a torn tail is ignored) but the commits
since the last checkpoint may be gone. ``FULL`` would add an fsync to every commit *while
the write lock is held*: 0.1–0.3 ms on a quiet disk, 4–12 ms (p50–p99) measured here while
other processes used the disk, and every other writer queues behind it. Losing the last
moments of a transcript to a power cut costs little (lineage validation treats a session
that is not in the store as "start fresh", and the workspace keeps the work); stalling
every step's writes on the disk costs always.
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import json
import logging
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from claude_agent_sdk import fold_session_summary
from claude_agent_sdk.types import (
    SessionKey,
    SessionListSubkeysKey,
    SessionStore,
    SessionStoreEntry,
    SessionStoreListEntry,
    SessionSummaryEntry,
)
from tenacity import (
    AsyncRetrying,
    RetryError,
    Retrying,
    retry_if_exception,
    stop_after_delay,
    wait_random_exponential,
)

from .._errors import FlowerError
from ..util.fsutil import open_private, private_dir
from .dbfile import SESSION_EXISTS, damage
from .records import LedgerRow

__all__ = [
    "BUSY_DEADLINE_S",
    "SessionStoreBusy",
    "SessionStoreDamaged",
    "SessionStoreError",
    "SqliteLedgerRows",
    "SqliteSessionStore",
]

T = TypeVar("T")
logger = logging.getLogger(__name__)

SCHEMA_VERSION = 2  # 2: the tool ledger's table (flower.state.ledger)
BUSY_DEADLINE_S = 30.0  # below the SDK's 60 s send timeout, so our error is what it logs
_CLOCK_KEY = ""  # real keys always contain "/", so "" can never collide with one
CHECKPOINT_EVERY = 100  # appends of one process between background WAL checkpoints
FORK_WAIT_S = 1.0  # how long a fork waits for a store busy in another thread to go idle
_WAL_SIZE_LIMIT = 16 << 20  # a rewound WAL file is cut back to this
_AUTOCHECKPOINT_PAGES = 10_000  # SQLite's inline checkpoint, only as a last resort (40 MB)
_RESTART_FRAMES = 4096  # a WAL past ~16 MB is rewound by the worker
_RESTART_WAIT_S = 1.0  # how long the worker waits for the write lock to rewind it

# Full-jitter backoff between tries of a busy transaction (windows 0.25, 0.5, 1, 2, 2 ... ms).
# A write transaction holds the lock ~0.1-0.3 ms, so most waits end in the first window; the
# low cap keeps waiters polling often enough to find the short gaps between another
# writer's transactions (a 4 ms cap measured 2-3x longer worst cases under 4 writers).
# A failed try costs ~3 us of CPU.
_BACKOFF_MULTIPLIER_S = 0.00025
_BACKOFF_MAX_S = 0.002

# asyncio's epoll timer has 1 ms granularity (it rounds timeouts up), so a shorter await
# would sleep a whole millisecond; pauses below it block the loop instead, for < 1 ms.
_LOOP_TICK_S = 0.001

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    seq  INTEGER PRIMARY KEY,
    key  TEXT NOT NULL,
    uuid TEXT,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS entries_by_key ON entries(key, seq);
CREATE UNIQUE INDEX IF NOT EXISTS entries_uuid ON entries(key, uuid) WHERE uuid IS NOT NULL;
CREATE TABLE IF NOT EXISTS meta (
    key         TEXT PRIMARY KEY,
    project_key TEXT,
    session_id  TEXT,
    subpath     TEXT,
    mtime       INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS meta_by_session ON meta(session_id, project_key);
CREATE INDEX IF NOT EXISTS meta_by_project ON meta(project_key, session_id);
CREATE TABLE IF NOT EXISTS tool_calls (
    tool_use_id TEXT PRIMARY KEY,
    session_id  TEXT NOT NULL,
    agent_id    TEXT,
    name        TEXT NOT NULL,
    input       TEXT NOT NULL,
    message     TEXT,
    state       TEXT NOT NULL,
    response    TEXT,
    content     TEXT,
    is_error    INTEGER NOT NULL DEFAULT 0,
    started_at  REAL NOT NULL,
    ended_at    REAL
);
CREATE INDEX IF NOT EXISTS tool_calls_by_session ON tool_calls(session_id, started_at);
CREATE TABLE IF NOT EXISTS summaries (
    project_key TEXT NOT NULL,
    session_id  TEXT NOT NULL,
    mtime       INTEGER NOT NULL,
    data        TEXT NOT NULL,
    PRIMARY KEY (project_key, session_id)
);
"""


class SessionStoreError(FlowerError):
    """``sessions.db`` cannot be used (not a database, or from a newer flower)."""


class SessionStoreDamaged(SessionStoreError):
    """``sessions.db`` is not a usable SQLite database (garbage, or cut short)."""


class SessionStoreBusy(SessionStoreError, TimeoutError):
    """Another process kept ``sessions.db`` locked past the deadline."""


# --------------------------------------------------------------------------------------
# keys and JSON
# --------------------------------------------------------------------------------------


def _split_key(key: SessionKey | SessionListSubkeysKey) -> tuple[str, str, str, str | None]:
    """Return ``(key string, project_key, session_id, subpath or None)``."""
    project_key, session_id = key["project_key"], key["session_id"]
    for name, value in (("project_key", project_key), ("session_id", session_id)):
        # "/" would make two different keys share one key string
        if not isinstance(value, str) or not value or "/" in value:
            raise ValueError(f"{name} must be a non-empty string without '/': {value!r}")
    subpath = key.get("subpath") or None
    if subpath is not None and not isinstance(subpath, str):
        raise ValueError(f"subpath must be a string: {subpath!r}")
    parts = [project_key, session_id] + ([subpath] if subpath else [])
    return "/".join(parts), project_key, session_id, subpath


def _to_json(value: Any) -> str:
    """Compact JSON text, UTF-8 as is; escaped only if it holds a lone surrogate.

    ``json.loads`` of the CLI's output can yield lone surrogates ("\\ud800"), which SQLite's
    UTF-8 text cannot hold; escaping keeps such an entry exact instead of failing it.
    """
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(value, ensure_ascii=True, separators=(",", ":"))
    return text


def _entry_uuid(entry: SessionStoreEntry) -> str | None:
    uuid = entry.get("uuid")
    return uuid if isinstance(uuid, str) and uuid else None


def _is_busy(exc: BaseException) -> bool:
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    message = str(exc)
    return "locked" in message or "busy" in message


def _is_damage(exc: sqlite3.DatabaseError) -> bool:
    """Does SQLite say the file's contents are bad (not a database, or malformed)?"""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)
    return not isinstance(exc, sqlite3.OperationalError)


def _create_private(path: Path) -> None:
    """Create the database file 0600 before SQLite creates it with the umask's mode.

    Only if it does not exist: opening and closing a second descriptor of a database file
    releases every POSIX lock this process holds on it, SQLite's included.
    """
    try:
        fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return
    os.close(fd)


async def _pause(seconds: float) -> None:
    if seconds < _LOOP_TICK_S:
        time.sleep(seconds)  # noqa: ASYNC251 - under the loop's 1 ms tick: see _LOOP_TICK_S
    else:
        await asyncio.sleep(seconds)


# --------------------------------------------------------------------------------------
# connections that survive os.fork()
# --------------------------------------------------------------------------------------


def _abandon(conn: sqlite3.Connection) -> None:
    """Make sure a connection inherited through fork() is never closed in this process.

    SQLite forbids using a connection across fork(), and closing one counts: in WAL mode the
    close of what looks like the last connection checkpoints and deletes the -wal file under
    the parent's feet. Deallocating the object closes it, even at interpreter exit, so an
    extra reference that is never released keeps it alive for good.
    """
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(conn))


class _Connection:
    """One SQLite connection owned by one process, behind a lock.

    :meth:`get` (called with :attr:`lock` held) opens it lazily. Around ``os.fork()`` the
    module's at-fork hooks close it in the parent when it is idle, so the child inherits no
    SQLite state for the file at all (SQLite keeps per-process lock bookkeeping a child would
    inherit but not own). One still open in the child (it was busy in another thread) is
    abandoned, never used nor closed, and the child opens its own.
    """

    def __init__(self, opener: Callable[[], sqlite3.Connection]) -> None:
        self.lock = threading.Lock()
        self._opener = opener
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()
        self._held_for_fork = False
        _CONNECTIONS.add(self)

    @property
    def current(self) -> sqlite3.Connection | None:
        return self._conn

    def get(self) -> sqlite3.Connection:
        if self._conn is not None and self._pid != os.getpid():
            self._abandon()  # inherited through a fork the hooks did not see
        if self._conn is None:
            self._conn = self._opener()
            self._pid = os.getpid()
        return self._conn

    def close(self) -> None:
        with self.lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
                self._conn = None
            self._abandon()  # one left is a parent's: it must stay open

    def _abandon(self) -> None:
        if self._conn is not None:
            _abandon(self._conn)
            self._conn = None

    def before_fork(self) -> None:
        self._held_for_fork = self.lock.acquire(timeout=FORK_WAIT_S)
        if self._held_for_fork and self._conn is not None and self._pid == os.getpid():
            self._conn.close()
            self._conn = None

    def after_fork_in_parent(self) -> None:
        if self._held_for_fork:
            self._held_for_fork = False
            self.lock.release()

    def after_fork_in_child(self) -> None:
        self.lock = threading.Lock()  # one held by a parent thread would never be released
        self._held_for_fork = False
        self._abandon()


_CONNECTIONS: weakref.WeakSet[_Connection] = weakref.WeakSet()


def _on_every_connection(method: Callable[[_Connection], None]) -> Callable[[], None]:
    def hook() -> None:
        for connection in list(_CONNECTIONS):
            method(connection)

    return hook


os.register_at_fork(
    before=_on_every_connection(_Connection.before_fork),
    after_in_parent=_on_every_connection(_Connection.after_fork_in_parent),
    after_in_child=_on_every_connection(_Connection.after_fork_in_child),
)


# --------------------------------------------------------------------------------------
# the store
# --------------------------------------------------------------------------------------


class SqliteSessionStore(SessionStore):
    """The SDK's ``SessionStore`` on SQLite, shared safely by many processes.

    ``path`` is the database file (``run_dir/"sessions.db"``); its directory is created
    0700 and the file 0600 if missing. Implements ``append``/``load`` and every optional
    method (``list_sessions``, ``list_session_summaries``, ``delete``, ``list_subkeys``),
    plus the synchronous helpers :meth:`has_session`, :meth:`projects`, :meth:`last_context`,
    :meth:`load_sync` and :meth:`close`, and the seam's fencing (:meth:`begin_attempt`,
    :meth:`claim`, never refused here): it is a full :class:`flower.state.seam.Sessions`.

    An object may be inherited across ``os.fork()``: the child opens its own connection and
    never touches the parent's. Calls are serialised per object by a lock, so one object may
    be used from several threads. Every ``CHECKPOINT_EVERY`` appends, a worker thread copies
    the WAL back into the database.
    """

    #: SQLite's own busy handler timeout (seconds); 0 means none, retries happen here.
    _busy_timeout_s: float = 0.0
    #: ``PRAGMA synchronous`` (see the module docstring for why NORMAL).
    _synchronous: str = "NORMAL"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        private_dir(self.path.parent)
        problem = damage(self.path)
        if problem:
            raise self._unusable(problem)
        _create_private(self.path)
        self._db = _Connection(self._open)
        self._checkpointer = _Connection(self._open_for_checkpoints)
        self._checkpointing: asyncio.Future[None] | None = None
        self._appends = 0
        self._last_mtime = 0
        self.epoch = 0  # begin_attempt()'s last number; 0: no attempt began here
        self._run_sync(lambda conn: None)  # open now: a bad file fails here, not mid-step

    # ---- SessionStore protocol ------------------------------------------------------

    async def append(self, key: SessionKey, entries: list[SessionStoreEntry]) -> None:
        """Append ``entries`` to ``key`` in order; an entry whose ``uuid`` is already
        stored under ``key`` is skipped, entries without one always append."""
        if not entries:
            return
        parts = _split_key(key)
        # serialise before the transaction: the write lock is held only for SQL and fsync
        rows = [(parts[0], _entry_uuid(entry), _to_json(entry)) for entry in entries]
        await self._run(lambda conn: self._append_tx(conn, parts, rows, entries), write=True)
        self._appends += 1
        if self._appends % CHECKPOINT_EVERY == 1:  # the first too: step children live short
            self._checkpoint_in_background()

    async def load(self, key: SessionKey) -> list[SessionStoreEntry] | None:
        """Every entry stored under ``key`` in append order, or None if there is none.

        Runs in a worker thread: a long transcript takes ~250 ms to parse (20,000 entries of
        2 KB), which would otherwise stall the event loop for as long.
        """
        return await asyncio.to_thread(self.load_sync, key)

    async def list_sessions(self, project_key: str) -> list[SessionStoreListEntry]:
        """Main transcripts of ``project_key`` with their last write time (epoch ms)."""
        sql = "SELECT session_id, mtime FROM meta WHERE project_key = ? AND subpath IS NULL"
        rows = await self._run(lambda conn: conn.execute(sql, (project_key,)).fetchall())
        return [{"session_id": sid, "mtime": mtime} for sid, mtime in rows]

    async def list_session_summaries(self, project_key: str) -> list[SessionSummaryEntry]:
        """The folded summary of every main transcript of ``project_key``."""
        sql = "SELECT session_id, mtime, data FROM summaries WHERE project_key = ?"
        rows = await self._run(lambda conn: conn.execute(sql, (project_key,)).fetchall())
        return [{"session_id": s, "mtime": m, "data": json.loads(d)} for s, m, d in rows]

    async def delete(self, key: SessionKey) -> None:
        """Delete ``key``; a main key takes its subkeys and its summary with it."""
        parts = _split_key(key)
        await self._run(lambda conn: self._delete_tx(conn, parts), write=True)

    async def list_subkeys(self, key: SessionListSubkeysKey) -> list[str]:
        """The subpaths stored under a session (subagent transcripts), main excluded."""
        _, project_key, session_id, _ = _split_key(key)
        sql = (
            "SELECT subpath FROM meta WHERE project_key = ? AND session_id = ?"
            " AND subpath IS NOT NULL ORDER BY subpath"
        )
        rows = await self._run(lambda c: c.execute(sql, (project_key, session_id)).fetchall())
        return [subpath for (subpath,) in rows]

    # ---- synchronous helpers ----------------------------------------------------------

    def has_session(self, project_key: str | None, session_id: str) -> bool:
        """True if the CLI can resume ``session_id``: a main transcript of it under
        ``project_key`` (None: under any project) holds a conversation (a ``user`` entry;
        see :data:`~flower.state.dbfile.SESSION_EXISTS`)."""
        params = {"sid": session_id, "pk": project_key}
        return self._run_sync(lambda c: c.execute(SESSION_EXISTS, params).fetchone() is not None)

    def projects(self) -> list[str]:
        """Every ``project_key`` stored, sorted. The SDK derives a project key from the
        working directory; ask here which ones there are rather than guess."""
        sql = "SELECT DISTINCT project_key FROM meta WHERE project_key IS NOT NULL ORDER BY 1"
        rows = self._run_sync(lambda conn: conn.execute(sql).fetchall())
        return [project_key for (project_key,) in rows]

    def last_context(self, project_key: str, session_id: str, *, scan: int = 60) -> int:
        """The context the model saw on the session's last turn, in tokens; 0 if none.

        The last assistant entry of the main transcript, among its latest ``scan`` entries,
        that carries usage from a real response (not a synthetic API-error or "No response
        requested." entry): ``input_tokens + cache_read_input_tokens +
        cache_creation_input_tokens`` (``input_tokens`` alone leaves out the cached prefix).
        """
        key_string = _split_key({"project_key": project_key, "session_id": session_id})[0]
        sql = "SELECT data FROM entries WHERE key = ? ORDER BY seq DESC LIMIT ?"
        rows = self._run_sync(
            lambda conn: conn.execute(sql, (key_string, max(0, int(scan)))).fetchall()
        )
        for (data,) in rows:
            entry = json.loads(data)
            msg = entry.get("message") if isinstance(entry, dict) else None
            if entry.get("type") != "assistant" or not isinstance(msg, dict):
                continue
            if entry.get("isApiErrorMessage") or msg.get("model") == "<synthetic>":
                continue
            usage = msg.get("usage")
            if isinstance(usage, dict) and usage:
                keys = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
                return sum(int(usage.get(k) or 0) for k in keys)
        return 0

    def load_sync(self, key: SessionKey) -> list[SessionStoreEntry] | None:
        """:meth:`load` for callers outside an event loop."""
        key_string = _split_key(key)[0]
        sql = "SELECT data FROM entries WHERE key = ? ORDER BY seq"
        rows = self._run_sync(lambda conn: conn.execute(sql, (key_string,)).fetchall())
        loads = json.loads  # parsed outside the store's lock
        return [loads(data) for (data,) in rows] if rows else None

    def close(self) -> None:
        """Close this process's connections; a later call opens new ones."""
        self._db.close()
        self._checkpointer.close()

    # ---- fencing (the seam's Sessions) -------------------------------------------------

    def begin_attempt(self) -> int:
        """The next number of this object's counter. Nothing is stored and nothing is ever
        refused: one machine holds the file and the supervisor keeps one writer per session,
        so there is no superseded attempt to fence out (see :mod:`flower.state.seam`)."""
        self.epoch += 1
        return self.epoch

    def claim(self, session_id: str) -> None:
        """Nothing to do: a local session always belongs to the attempt that resumes it."""

    # ---- transactions ------------------------------------------------------------------

    def _append_tx(
        self,
        conn: sqlite3.Connection,
        parts: tuple[str, str, str, str | None],
        rows: list[tuple[str, str | None, str]],
        entries: list[SessionStoreEntry],
    ) -> None:
        key_string, project_key, session_id, subpath = parts
        sql = "INSERT OR IGNORE INTO entries(key, uuid, data) VALUES (?, ?, ?)"
        # rowcount 0: this uuid is already stored under the key (a retried batch)
        fresh = [
            entry
            for row, entry in zip(rows, entries, strict=True)
            if conn.execute(sql, row).rowcount
        ]
        if not fresh:  # a retried batch that had landed: nothing changed, nothing to stamp
            return
        mtime = self._next_mtime(conn)
        conn.execute(
            "INSERT INTO meta(key, project_key, session_id, subpath, mtime)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT(key) DO UPDATE SET mtime = excluded.mtime",
            (key_string, project_key, session_id, subpath, mtime),
        )
        if subpath is None:  # subagent transcripts never feed the main session's summary
            self._fold_summary(conn, project_key, session_id, fresh, mtime)

    def _fold_summary(
        self,
        conn: sqlite3.Connection,
        project_key: str,
        session_id: str,
        entries: list[SessionStoreEntry],
        mtime: int,
    ) -> None:
        row = conn.execute(
            "SELECT mtime, data FROM summaries WHERE project_key = ? AND session_id = ?",
            (project_key, session_id),
        ).fetchone()
        prev: SessionSummaryEntry | None = None
        if row is not None:
            prev = {"session_id": session_id, "mtime": row[0], "data": json.loads(row[1])}
        key: SessionKey = {"project_key": project_key, "session_id": session_id}
        folded = fold_session_summary(prev, key, entries)
        conn.execute(
            "INSERT INTO summaries(project_key, session_id, mtime, data) VALUES (?, ?, ?, ?)"
            " ON CONFLICT(project_key, session_id)"
            " DO UPDATE SET mtime = excluded.mtime, data = excluded.data",
            (project_key, session_id, mtime, _to_json(folded["data"])),
        )

    def _next_mtime(self, conn: sqlite3.Connection) -> int:
        """The next write time in epoch ms, strictly above every one handed out before.

        Called inside the write transaction: the stored clock row makes it monotonic across
        every process sharing the file, ``_last_mtime`` within this one (even past deletes).
        """
        row = conn.execute("SELECT mtime FROM meta WHERE key = ?", (_CLOCK_KEY,)).fetchone()
        stored = row[0] if row else 0
        mtime = max(time.time_ns() // 1_000_000, self._last_mtime + 1, stored + 1)
        self._last_mtime = mtime
        conn.execute(
            "INSERT INTO meta(key, mtime) VALUES (?, ?)"
            " ON CONFLICT(key) DO UPDATE SET mtime = excluded.mtime",
            (_CLOCK_KEY, mtime),
        )
        return mtime

    def _delete_tx(self, conn: sqlite3.Connection, parts: tuple[str, str, str, str | None]) -> None:
        key_string, project_key, session_id, subpath = parts
        if subpath is not None:
            conn.execute("DELETE FROM entries WHERE key = ?", (key_string,))
            conn.execute("DELETE FROM meta WHERE key = ?", (key_string,))
            return
        keys = "SELECT key FROM meta WHERE project_key = ? AND session_id = ?"
        ids = (project_key, session_id)
        conn.execute(f"DELETE FROM entries WHERE key IN ({keys})", ids)
        conn.execute("DELETE FROM meta WHERE project_key = ? AND session_id = ?", ids)
        conn.execute("DELETE FROM summaries WHERE project_key = ? AND session_id = ?", ids)

    # ---- retries ------------------------------------------------------------------------

    def _retry_policy(self) -> dict[str, Any]:
        return {
            "retry": retry_if_exception(_is_busy),
            "wait": wait_random_exponential(multiplier=_BACKOFF_MULTIPLIER_S, max=_BACKOFF_MAX_S),
            "stop": stop_after_delay(BUSY_DEADLINE_S),
        }

    async def _run(self, work: Callable[[sqlite3.Connection], T], *, write: bool = False) -> T:
        """Run ``work`` once; while SQLite says busy, retry after short async pauses."""
        try:
            return self._attempt(work, write)
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc):
                raise

        async def attempt() -> T:
            return self._attempt(work, write)

        try:
            return await AsyncRetrying(sleep=_pause, **self._retry_policy())(attempt)
        except RetryError as exc:
            raise self._busy_error() from exc.last_attempt.exception()

    def _run_sync(self, work: Callable[[sqlite3.Connection], T], *, write: bool = False) -> T:
        try:
            result: T = Retrying(sleep=time.sleep, **self._retry_policy())(
                self._attempt, work, write
            )
            return result
        except RetryError as exc:
            raise self._busy_error() from exc.last_attempt.exception()

    def _busy_error(self) -> SessionStoreBusy:
        return SessionStoreBusy(
            f"{self.path} stayed locked for {BUSY_DEADLINE_S:.0f} s",
            hint="another process holds a write transaction on it; stop stray flower"
            " processes and run again",
        )

    def _attempt(self, work: Callable[[sqlite3.Connection], T], write: bool) -> T:
        """One try of ``work``; a write runs in its own ``BEGIN IMMEDIATE`` transaction.

        No await happens inside, so a cancelled caller can never leave a transaction open.
        """
        with self._db.lock:
            conn = self._db.get()
            if not write:
                return work(conn)
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = work(conn)
                conn.execute("COMMIT")
            except BaseException:
                conn.rollback()
                raise
            return result

    # ---- checkpoints ------------------------------------------------------------------

    def _checkpoint_in_background(self) -> None:
        # The lock, not the executor's future: a future's completion is only delivered when
        # the loop runs its callbacks, which a busy appender may not let it do for long.
        if not self._checkpointer.lock.locked():
            self._checkpointing = asyncio.get_running_loop().run_in_executor(None, self._checkpoint)

    def _checkpoint(self) -> None:
        """Copy the WAL back into the database, in a worker thread.

        PASSIVE blocks no reader and no writer, but appends landing meanwhile leave it a few
        frames short, and SQLite rewinds the WAL only after a checkpoint caught up: through
        a long burst the file would grow without end. Past ``_RESTART_FRAMES`` a RESTART
        checkpoint takes the write lock for the last few frames; writers meanwhile wait in
        their own retry loops, their event loops free (SQLite's inline automatic checkpoint
        did this inside one writer's commit: stalls of 130-260 ms measured).
        """
        with self._checkpointer.lock:
            try:
                conn = self._checkpointer.get()
                _, frames, _ = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                if frames >= _RESTART_FRAMES:
                    conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchall()
            except Exception as exc:  # noqa: BLE001 - a skipped checkpoint is harmless
                # mostly busy: another process is checkpointing; the next one catches up
                logger.debug("checkpoint of %s skipped: %s", self.path, exc)

    def _open_for_checkpoints(self) -> sqlite3.Connection:
        # a busy handler is fine here: it sleeps in the worker thread, never on a loop
        conn = sqlite3.connect(
            self.path,
            timeout=_RESTART_WAIT_S,
            isolation_level=None,
            check_same_thread=False,
        )
        conn.execute(f"PRAGMA journal_size_limit={_WAL_SIZE_LIMIT}")
        return conn

    # ---- connection ---------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path,
            timeout=self._busy_timeout_s,
            isolation_level=None,  # we issue BEGIN/COMMIT ourselves
            check_same_thread=False,  # _Connection.lock serialises every use
        )
        try:
            self._configure(conn)
        except sqlite3.DatabaseError as exc:
            conn.close()
            if _is_busy(exc):
                raise
            if _is_damage(exc):
                raise self._unusable(exc) from exc
            # A full disk, a read-only or vanished directory, an I/O error: the file may be
            # fine, so it is never set aside for it.
            raise SessionStoreError(
                f"{self.path} cannot be opened: {exc}",
                hint="check the disk and the run directory's permissions, then run again",
            ) from exc
        except BaseException:
            conn.close()
            raise
        return conn

    def _configure(self, conn: sqlite3.Connection) -> None:
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode.lower() != "wal":
            raise SessionStoreError(
                f"{self.path} cannot be switched to WAL mode (it stays {mode!r})",
                hint="keep run_dir on a local filesystem that allows shared memory",
            )
        conn.execute(f"PRAGMA synchronous={self._synchronous}")
        conn.execute(f"PRAGMA journal_size_limit={_WAL_SIZE_LIMIT}")
        # SQLite's automatic checkpoint runs inside whichever commit crosses 1000 WAL pages:
        # every ~130th append paid several ms (p99 x2 measured). Checkpoints run in a worker
        # (_checkpoint) instead; the automatic one stays only as a last resort far above.
        conn.execute(f"PRAGMA wal_autocheckpoint={_AUTOCHECKPOINT_PAGES}")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version == SCHEMA_VERSION:
            return
        if version > SCHEMA_VERSION:
            raise SessionStoreError(
                f"{self.path} was written by a newer flower (schema {version})",
                hint="upgrade flower, or point it at another run_dir",
            )
        conn.execute("BEGIN IMMEDIATE")
        try:
            self._create_schema(conn)
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            conn.rollback()
            raise

    @staticmethod
    def _create_schema(conn: sqlite3.Connection) -> None:
        # executescript() would COMMIT our transaction first; run statement by statement
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)

    def _unusable(self, why: BaseException | str) -> SessionStoreDamaged:
        what = why if isinstance(why, str) else f"is not a usable SQLite database ({why})"
        return SessionStoreDamaged(
            f"{self.path} {what}",
            hint="move it aside (flower never deletes it) and run again to start a fresh one",
        )


# --------------------------------------------------------------------------------------
# the tool ledger's rows
# --------------------------------------------------------------------------------------

_LEDGER_COLUMNS = (
    "tool_use_id, session_id, agent_id, name, input, state, started_at, message, response,"
    " content, is_error, ended_at"
)


class SqliteLedgerRows:
    """The tool ledger's rows (the seam's ``LedgerRows``) in the ``tool_calls`` table of
    ``store``'s file, on ``store``'s connection, busy waits and fork handling."""

    def __init__(self, store: SqliteSessionStore) -> None:
        self.store = store

    def __repr__(self) -> str:
        return f"SqliteLedgerRows({str(self.store.path)!r})"

    async def started(self, row: LedgerRow) -> None:
        """Insert a started call; a row that exists already is left as it is."""
        sql = (
            "INSERT INTO tool_calls(tool_use_id, session_id, agent_id, name, input, message,"
            " state, started_at) VALUES (:tool_use_id, :session_id, :agent_id, :name, :input,"
            " :message, :state, :started_at) ON CONFLICT(tool_use_id) DO NOTHING"
        )
        args = _named(row)
        await self.store._run(lambda conn: conn.execute(sql, args), write=True)

    async def finished(self, row: LedgerRow) -> None:
        """Insert or update the call's end: state, response, content, is_error, ended_at."""
        sql = (
            "INSERT INTO tool_calls(tool_use_id, session_id, agent_id, name, input, state,"
            " response, content, is_error, started_at, ended_at) VALUES (:tool_use_id,"
            " :session_id, :agent_id, :name, :input, :state, :response, :content, :is_error,"
            " :started_at, :ended_at) ON CONFLICT(tool_use_id) DO UPDATE SET"
            " state = excluded.state, response = excluded.response,"
            " content = excluded.content, is_error = excluded.is_error,"
            " ended_at = excluded.ended_at"
        )
        args = _named(row)
        await self.store._run(lambda conn: conn.execute(sql, args), write=True)

    def exact(self, tool_use_id: str, content: str, is_error: bool) -> None:
        """Replace a finished call's content with what the model was really sent: one try,
        no wait for a busy file (raises SQLite's busy error instead)."""
        sql = (
            "UPDATE tool_calls SET content = ?, is_error = ? WHERE tool_use_id = ?"
            " AND state IN ('done', 'failed')"
        )
        args = (content, int(bool(is_error)), tool_use_id)
        self.store._attempt(lambda conn: conn.execute(sql, args), True)

    def by_ids(self, ids: Sequence[str]) -> list[LedgerRow]:
        wanted = sorted(set(ids))
        if not wanted:
            return []
        return self._select(f"tool_use_id IN ({','.join('?' * len(wanted))})", wanted)

    def in_session(self, session_id: str, since: float) -> list[LedgerRow]:
        """Main-thread calls (``agent_id`` None) of the session that started at ``since``
        or later, oldest first."""
        where = "session_id = ? AND agent_id IS NULL AND started_at >= ? ORDER BY started_at"
        return self._select(where, [session_id, since])

    def _select(self, where: str, args: Sequence[Any]) -> list[LedgerRow]:
        sql = f"SELECT {_LEDGER_COLUMNS} FROM tool_calls WHERE {where}"
        rows = self.store._run_sync(lambda conn: conn.execute(sql, args).fetchall())
        return [_ledger_row(row) for row in rows]


def _named(row: LedgerRow) -> dict[str, Any]:
    """``row``'s fields as named parameters (``is_error`` stored as 0/1)."""
    return {**dataclasses.asdict(row), "is_error": int(row.is_error)}


def _ledger_row(row: Sequence[Any]) -> LedgerRow:
    """A ``tool_calls`` row in ``_LEDGER_COLUMNS``' order (``is_error`` is stored as 0/1)."""
    values = list(row)
    values[10] = bool(values[10])
    return LedgerRow(*values)
