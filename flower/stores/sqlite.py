"""``SqliteSessionStore``: the SDK's ``SessionStore`` protocol on one SQLite file.

This is the bottom of the three store layers (sqlite → trimming → pruning). It keeps every
entry exactly as it was appended; the layers above reshape what ``load()`` returns, never
what is stored.

Layout (three tables, as seed 003 names them):

- ``entries(seq, key, uuid, data)``: one row per transcript entry, ``data`` the entry as
  compact JSON text, ``key`` the string ``project_key/session_id[/subpath]``. ``seq`` is the
  commit order; an entry's ``uuid`` is unique per key (the SDK retries whole batches).
- ``meta(key, project_key, session_id, subpath, mtime)``: one row per stored key with its
  last write time (epoch ms). The row whose ``key`` is ``''`` is the store-wide write clock.
- ``summaries(project_key, session_id, mtime, data)``: the SDK's incrementally folded
  session summary (``fold_session_summary``), written in the same transaction as the append.

Concurrency: several processes write one file at once. The file is in WAL mode and every
write is one short ``BEGIN IMMEDIATE`` transaction. SQLite's own busy handler sleeps
1–100 ms between tries (40–100 ms tails measured on 2 cores), so connections have no busy
handler and a busy transaction is retried here with short jittered sleeps, up to
``BUSY_DEADLINE_S``, after which :class:`SessionStoreBusy` is raised.

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
import json
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable
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
from ..core.fsutil import open_private, private_dir

__all__ = ["BUSY_DEADLINE_S", "SessionStoreBusy", "SessionStoreError", "SqliteSessionStore"]

T = TypeVar("T")

SCHEMA_VERSION = 1
BUSY_DEADLINE_S = 30.0  # below the SDK's 60 s send timeout, so our error is what it logs
_CLOCK_KEY = ""  # real keys always contain "/", so "" can never collide with one

# Full-jitter backoff between tries of a busy transaction (windows 0.25, 0.5, 1, 2, 2 ... ms).
# A write transaction holds the lock ~0.1-0.3 ms, so most waits end in the first window; the
# low cap keeps waiters polling often enough to find the short gaps between another
# writer's transactions (a 4 ms cap measured 2-3x longer worst cases under 4 writers).
# A failed try costs ~20 us.
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
        time.sleep(seconds)
    else:
        await asyncio.sleep(seconds)


# --------------------------------------------------------------------------------------
# fork safety
# --------------------------------------------------------------------------------------

_STORES: weakref.WeakSet[SqliteSessionStore] = weakref.WeakSet()


def _abandon(conn: sqlite3.Connection) -> None:
    """Make sure an inherited connection is never closed in this process.

    SQLite forbids using a connection across fork(); closing one counts: in WAL mode the
    close of what looks like the last connection checkpoints and deletes the -wal file under
    the parent's feet. Deallocating the object closes it, even at interpreter exit, so an
    extra reference that is never released keeps it alive for good.
    """
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(conn))


def _before_fork() -> None:
    for store in list(_STORES):
        store._prepare_fork()


def _after_fork_in_parent() -> None:
    for store in list(_STORES):
        store._resume_after_fork()


def _after_fork_in_child() -> None:
    for store in list(_STORES):
        store._reset_in_child()


os.register_at_fork(
    before=_before_fork,
    after_in_parent=_after_fork_in_parent,
    after_in_child=_after_fork_in_child,
)


# --------------------------------------------------------------------------------------
# the store
# --------------------------------------------------------------------------------------


class SqliteSessionStore(SessionStore):
    """The SDK's ``SessionStore`` on SQLite, shared safely by many processes.

    ``path`` is the database file (``run_dir/"sessions.db"``); its directory is created
    0700 and the file 0600 if missing. Implements ``append``/``load`` and every optional
    method (``list_sessions``, ``list_session_summaries``, ``delete``, ``list_subkeys``),
    plus the synchronous helpers :meth:`has_session`, :meth:`load_sync` and :meth:`close`.

    An object may be inherited across ``os.fork()``: the child opens its own connection and
    never touches the parent's. Calls are serialised per object by a lock, so one object may
    be used from several threads.
    """

    #: SQLite's own busy handler timeout (seconds); 0 means none, retries happen here.
    _busy_timeout_s: float = 0.0

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        private_dir(self.path.parent)
        _create_private(self.path)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()
        self._last_mtime = 0
        self._held_for_fork = False
        _STORES.add(self)
        self._run_sync(lambda conn: None, write=False)  # open now: a bad file fails here

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

    async def load(self, key: SessionKey) -> list[SessionStoreEntry] | None:
        """Every entry stored under ``key`` in append order, or None if there is none."""
        return await self._run(self._loader(key))

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

    def has_session(self, session_id: str, project_key: str | None = None) -> bool:
        """True if a main transcript of ``session_id`` with at least one entry is stored
        (under ``project_key`` if given, else under any project)."""
        sql = (
            "SELECT 1 FROM meta m WHERE m.session_id = :sid AND m.subpath IS NULL"
            " AND (:pk IS NULL OR m.project_key = :pk)"
            " AND EXISTS (SELECT 1 FROM entries e WHERE e.key = m.key) LIMIT 1"
        )
        params = {"sid": session_id, "pk": project_key}
        return self._run_sync(lambda c: c.execute(sql, params).fetchone() is not None)

    def load_sync(self, key: SessionKey) -> list[SessionStoreEntry] | None:
        """:meth:`load` for callers outside an event loop."""
        return self._run_sync(self._loader(key))

    def close(self) -> None:
        """Close this process's connection; a later call opens a new one."""
        with self._lock:
            self._drop_connection()

    # ---- transactions ------------------------------------------------------------------

    def _loader(self, key: SessionKey) -> Callable[[sqlite3.Connection], list[Any] | None]:
        key_string = _split_key(key)[0]
        sql = "SELECT data FROM entries WHERE key = ? ORDER BY seq"

        def load(conn: sqlite3.Connection) -> list[Any] | None:
            rows = conn.execute(sql, (key_string,)).fetchall()
            loads = json.loads
            return [loads(data) for (data,) in rows] if rows else None

        return load

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
        fresh = [entry for row, entry in zip(rows, entries) if conn.execute(sql, row).rowcount]
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

    def _delete_tx(
        self, conn: sqlite3.Connection, parts: tuple[str, str, str, str | None]
    ) -> None:
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
            return Retrying(sleep=time.sleep, **self._retry_policy())(self._attempt, work, write)
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
        with self._lock:
            conn = self._connection()
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

    # ---- connection ---------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._conn is not None and self._pid != os.getpid():
            # inherited through a fork the at-fork hooks did not see: never touch it
            _abandon(self._conn)
            self._conn = None
        if self._conn is None:
            self._conn = self._open()
            self._pid = os.getpid()
        return self._conn

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path,
            timeout=self._busy_timeout_s,
            isolation_level=None,  # we issue BEGIN/COMMIT ourselves
            check_same_thread=False,  # self._lock serialises every use
        )
        try:
            self._configure(conn)
        except sqlite3.OperationalError as exc:
            conn.close()
            if _is_busy(exc):
                raise
            raise self._unusable(exc) from exc
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise self._unusable(exc) from exc
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
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA journal_size_limit=67108864")  # WAL shrinks back after bursts
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

    def _unusable(self, exc: BaseException) -> SessionStoreError:
        return SessionStoreError(
            f"{self.path} is not a usable SQLite database: {exc}",
            hint="move it aside (flower never deletes it) and run again to start a fresh one",
        )

    def _drop_connection(self) -> None:
        if self._conn is None:
            return
        if self._pid == os.getpid():
            self._conn.close()
        else:
            _abandon(self._conn)
        self._conn = None

    # ---- at-fork hooks (module-level hooks call these for every live store) -------------

    def _prepare_fork(self) -> None:
        # Closing before fork leaves the child no SQLite state for this file at all (SQLite
        # keeps per-process lock bookkeeping that a child would inherit but not own).
        # A store busy in another thread keeps its connection; the child abandons it.
        self._held_for_fork = self._lock.acquire(blocking=False)
        if self._held_for_fork:
            self._drop_connection()

    def _resume_after_fork(self) -> None:
        if self._held_for_fork:
            self._held_for_fork = False
            self._lock.release()

    def _reset_in_child(self) -> None:
        self._lock = threading.Lock()  # a lock held by a parent thread would never free
        self._held_for_fork = False
        if self._conn is not None:
            _abandon(self._conn)
            self._conn = None
