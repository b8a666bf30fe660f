"""One PostgreSQL database as this process uses it: one connection, the schema, the spool.

Every object of the backend in a process (a session store, the row stores, a second store
for the same URL) shares one :class:`Database` per URL and schema (:meth:`Database.shared`),
hence one connection, opened lazily in autocommit mode with a short connect timeout, used
under one lock (psycopg's connection is thread-safe; the lock keeps a transaction and the
spool's order whole). A forked child never touches its parent's socket: the at-fork hook
abandons the inherited connection (kept referenced, so it is never closed or collected in
the child: closing it would end the parent's session) and the child opens its own.

Writes that must not be lost (transcript appends and the tool ledger, :mod:`.fenced`; the
run's manifest rows, registry records and events, :mod:`.kept`) go through
:meth:`Database.write`: to the database, or, when it cannot be reached, to this process's
spool (:mod:`.spool`), and every later write of the process behind them, until a background
thread has delivered the spool in order. Reads (:meth:`Database.run`) deliver what this
process spooled first, so a process always reads its own writes. Connecting (the first time
in a process, and after every outage, the delivering thread's connection included) first
delivers the spools of dead processes. :meth:`Database.settle` waits for the database to
take all of that before a run ends. The other row stores (lineage, the cache) are not
spooled: their writes raise :class:`PostgresUnavailable` during an outage, for the caller to
wait and retry.

Async callers (the SDK's ``SessionStore`` methods) run their work on one worker thread per
process (:meth:`Database.call`): first in, first out, so one process's appends reach the
database in call order, and the event loop that answers the CLI's hooks never waits on the
network.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

import psycopg
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_result,
    stop_after_delay,
    wait_exponential,
)

from ..._errors import FlowerError
from ...i18n import define, t
from ...util.fsutil import set_aside
from ..errors import StateUnavailable, Superseded
from . import schema
from .fenced import OPS as FENCED_OPS
from .kept import OPS as KEPT_OPS
from .spool import Record, SpoolFile, orphans, spool_dir
from .url import StateURL

__all__ = [
    "CONNECT_TIMEOUT_S",
    "Database",
    "NoSuchDatabase",
    "PasswordRefused",
    "PostgresStateError",
    "PostgresUnavailable",
]

T = TypeVar("T")


class Patience(Protocol):
    """How a read outlives an outage: calls ``work`` (again, while it raises
    :class:`StateUnavailable`) and returns what it returns."""

    def __call__(self, work: Callable[[], T]) -> T: ...


Conn = psycopg.Connection[tuple[Any, ...]]
log = logging.getLogger("flower")

define(
    {
        "state.pg.unreachable": (
            "连不上 PostgreSQL {where}:{why}",
            "cannot reach PostgreSQL at {where}: {why}",
        ),
        "state.pg.unreachable.hint": (
            "服务器开着吗?检查地址里的主机和端口",
            "is the server running? check the host and port in the URL",
        ),
        "state.pg.refused": (
            "PostgreSQL {where} 拒绝了这个用户或密码:{why}",
            "PostgreSQL at {where} refused the user or password: {why}",
        ),
        "state.pg.refused.hint": (
            "检查 --state/FLOWER_STATE 里的用户名和密码",
            "check the user and password in --state/FLOWER_STATE",
        ),
        "state.pg.tls": (
            "和 PostgreSQL {where} 的 TLS 连接没建立起来:{why}",
            "the TLS connection to PostgreSQL at {where} was refused: {why}",
        ),
        "state.pg.tls.hint": (
            "检查地址里的 sslmode、sslrootcert(签发服务器证书的 CA)和主机名是否和证书一致",
            "check sslmode and sslrootcert (the CA that signed the server's certificate) in "
            "the URL, and that the host name is the one the certificate names",
        ),
        "state.pg.no_database": (
            "PostgreSQL {where} 上没有数据库 {database}",
            "PostgreSQL at {where} has no database {database}",
        ),
        "state.pg.no_database.hint": (
            "先建好它(createdb {database}),或者改地址里的数据库名",
            "create it first (createdb {database}), or fix the database name in the URL",
        ),
        "state.pg.denied": (
            "在 {where} 里建不了 flower 的表:{why}",
            "cannot create flower's tables in {where}: {why}",
        ),
        "state.pg.denied.hint": (
            "给这个用户这个数据库的 CREATE 权限,或者让数据库的所有者先用 flower 连一次",
            "grant this user CREATE on the database, or let its owner connect flower once",
        ),
        "state.pg.lost": (
            "和 PostgreSQL {where} 的连接断了:{why}",
            "lost the connection to PostgreSQL at {where}: {why}",
        ),
        "state.pg.spooling": (
            "{what};记录先存在本机 {spool},连上后按顺序补交",
            "{what}; writes are kept on this machine in {spool} and delivered in order "
            "once it is back",
        ),
        "state.pg.spool_superseded": (
            "补交的一条记录被拒绝:{why}",
            "a delivered write was refused: {why}",
        ),
        "state.pg.spool_refused": (
            "数据库不收这条补交的 {op} 记录,已丢弃(别的照常补交):{why}",
            "the database refuses a kept {op} record; it is dropped (the rest is delivered as "
            "usual): {why}",
        ),
        "state.pg.spool_unknown": (
            "补交记录 {spool} 里有不认得的操作 {op!r}(更新的 flower 写的?);跳过了它",
            "spool {spool} holds an operation this flower does not know ({op!r}, written "
            "by a newer flower?); skipped it",
        ),
        "state.pg.spool_unreadable": (
            "补交记录 {spool} 读不了({why});留作 {aside}",
            "spool {spool} cannot be read ({why}); kept it as {aside}",
        ),
        "state.pg.spool_stuck": (
            "补交记录 {spool} 交不进去:{why};留在本机,稍后再试",
            "spool {spool} cannot be delivered: {why}; it stays on this machine, retried later",
        ),
    }
)

CONNECT_TIMEOUT_S = 3  # libpq's own minimum is 2 s; a refused connection fails at once
PROBE_FIRST_S = 0.1  # the spool's deliverer retries after this, doubling...
PROBE_MAX_S = 2.0  # ...up to this
# The pause before the n-th look at a database that is down (tenacity's wait strategy).
PROBE_WAIT = wait_exponential(multiplier=PROBE_FIRST_S, min=PROBE_FIRST_S, max=PROBE_MAX_S)


class _Probes:
    """The deliverer's pauses between looks at a database that is down: ``PROBE_WAIT``
    counted over the looks that failed since the last one that delivered."""

    def __init__(self) -> None:
        self._state = RetryCallState(Retrying(), None, (), {})

    def pause(self) -> None:
        time.sleep(PROBE_WAIT(self._state))
        self._state.attempt_number += 1

    def reset(self) -> None:
        self._state.attempt_number = 1


DELIVER_BATCH = 64  # records delivered per hold of the lock (writers queue meanwhile)
# Commits do not wait for the server's WAL flush (its fsync): the SQLite store's choice
# (synchronous=NORMAL) in PostgreSQL's terms. A commit is in the server before the call
# returns, so a kill of any flower process, or of the machine it runs on, loses nothing; a
# crash of the database server itself may lose its last ~0.6 s of commits (3 x
# wal_writer_delay), never corrupting anything, the way a power cut may cost sessions.db
# its last moments. Measured here (one append statement, 2 KB entry, p50): 0.35-0.38 ms
# without the wait, 0.65-1.3 ms with it on a quiet disk, 3-8 ms on the same disk shared
# with the test suites of five other worktrees; every eager append pays it, a crash seldom.
_NO_FLUSH_WAIT = "SET synchronous_commit TO off"
# TCP keepalives, so a connection to a server that vanished without a word (a cut cable,
# a frozen host) fails in seconds rather than after the kernel's two hours.
_KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 3,
    "keepalives_count": 3,
    "tcp_user_timeout": 20_000,
}


class PostgresStateError(FlowerError):
    """A PostgreSQL state database flower cannot use, for a reason a person can fix."""


class PasswordRefused(PostgresStateError):
    """The server refused the URL's user or password."""


class TLSRefused(PostgresStateError):
    """The TLS handshake failed for a reason a wait would not change (an unknown CA, a host
    name the certificate does not name, a root certificate that cannot be read)."""


# libpq's words for TLS failures that are a setting, not an outage
_TLS_REFUSALS = (
    "certificate verify failed",
    "does not match host name",
    "root certificate file",
    "server does not support ssl",
    "invalid sslmode",
    "certificate present, but not private key",
    "could not load private key",
    "could not read certificate",
    "tlsv1 alert",
    "sslv3 alert",
)


class NoSuchDatabase(PostgresStateError):
    """The URL names a database the server does not have."""


class PostgresUnavailable(StateUnavailable):
    """The server cannot be reached (down, or the connection was lost)."""


def _reason(exc: BaseException, url: StateURL) -> str:
    """libpq's message as one short line (no password: libpq never prints it, and the
    URL's is masked should it appear)."""
    text = " ".join(str(exc).split())
    text = re.split(r"failed: ", text)[-1] if "failed: " in text else text
    text = re.sub(r"^(FATAL|ERROR):\s*", "", text)
    password = psycopg.conninfo.conninfo_to_dict(url.url).get("password")
    return text.replace(str(password), "***") if password else text


def connect_error(exc: psycopg.Error, url: StateURL) -> FlowerError:
    """The error a failed connect means for a person."""
    why = _reason(exc, url)
    low = why.lower()
    where = url.masked()
    if (
        "authentication failed" in low
        or "no password supplied" in low
        or ("role" in low and "does not exist" in low)
    ):
        return PasswordRefused(
            t("state.pg.refused", where=where, why=why), hint=t("state.pg.refused.hint")
        )
    if any(mark in low for mark in _TLS_REFUSALS):
        return TLSRefused(t("state.pg.tls", where=where, why=why), hint=t("state.pg.tls.hint"))
    if "database" in low and "does not exist" in low:
        name = str(psycopg.conninfo.conninfo_to_dict(url.url).get("dbname") or "?")
        return NoSuchDatabase(
            t("state.pg.no_database", where=where, database=name),
            hint=t("state.pg.no_database.hint", database=name),
        )
    return PostgresUnavailable(
        t("state.pg.unreachable", where=where, why=why), hint=t("state.pg.unreachable.hint")
    )


#: Every write that goes through :meth:`Database.write`, by the name its spool records use.
OPS = {**FENCED_OPS, **KEPT_OPS}

# The spool's delivered mark, created at 0 and locked to the commit (DO UPDATE locks the row).
_SPOOL_MARK = """
    INSERT INTO {s}.spools AS m (spool, delivered) VALUES (%s, 0)
    ON CONFLICT (spool) DO UPDATE SET delivered = m.delivered
    RETURNING delivered
"""

# Connections inherited through fork(): referenced for good, never used or closed here.
_ABANDONED: list[Any] = []
_ALL: weakref.WeakSet[Database] = weakref.WeakSet()
_SHARED: weakref.WeakValueDictionary[tuple[str, str], Database] = weakref.WeakValueDictionary()
_SHARED_LOCK = threading.Lock()


class Database:
    """This process's use of one database (see the module docstring)."""

    def __init__(self, url: StateURL) -> None:
        self.url = url
        self.where = url.masked()
        self.sql = schema.Sql(url.schema)
        self.lock = threading.RLock()
        self._conn: Conn | None = None
        self._listener: Conn | None = None
        self._listen_lock = threading.Lock()
        self._ready = False  # the schema was checked (once per database, inherited by forks)
        self._spool: SpoolFile | None = None
        self._deliverer: threading.Thread | None = None
        self._worker: ThreadPoolExecutor | None = None
        self._worker_lock = threading.Lock()
        self._pid = os.getpid()
        #: How :meth:`run` outlives an outage (a start's reads: ``RunState.patient``).
        self.patience: Patience | None = None
        _ALL.add(self)

    def __del__(self) -> None:
        # the last store of this database in this process is gone: so is its connection
        # (in a forked child the inherited ones are the parent's, kept in _ABANDONED)
        if getattr(self, "_pid", None) == os.getpid():
            for conn in (self._conn, self._listener):
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()

    @classmethod
    def shared(cls, url: StateURL) -> Database:
        """The one object of this process for ``url`` (made on first use)."""
        with _SHARED_LOCK:
            db = _SHARED.get((url.url, url.schema))
            if db is None:
                db = cls(url)
                _SHARED[(url.url, url.schema)] = db
            return db

    # ---- connecting ------------------------------------------------------------------

    def open(self) -> None:
        """Connect now and check the schema: a bad URL, a refused password, a missing
        database, a server that is down or a schema too new is raised here, not mid-run."""
        with self.lock:
            self._connection()

    def _connection(self) -> Conn:
        if self._pid != os.getpid():
            self._forked()
        conn = self._conn
        if conn is not None and (conn.closed or conn.broken):
            self._drop()
            conn = None
        if conn is None:
            conn = self._install(self._connect())
        return conn

    def _connect(self) -> Conn:
        """A new connection, the schema brought up to date the first time."""
        options: dict[str, Any] = {"autocommit": True, "application_name": "flower"}
        options.update(_KEEPALIVES)
        if not self.url.has_connect_timeout:
            options["connect_timeout"] = CONNECT_TIMEOUT_S
        try:
            conn: Conn = psycopg.connect(self.url.url, **options)
            conn.execute(_NO_FLUSH_WAIT)
        except psycopg.Error as exc:
            raise connect_error(exc, self.url) from None
        if not self._ready:
            try:
                schema.ensure(conn, self.sql, self.where)
            except psycopg.errors.InsufficientPrivilege as exc:
                conn.close()
                raise PostgresStateError(
                    t("state.pg.denied", where=self.where, why=_reason(exc, self.url)),
                    hint=t("state.pg.denied.hint"),
                ) from None
            except psycopg.Error as exc:
                conn.close()
                raise self.unavailable(exc) from None
            except BaseException:
                conn.close()
                raise
            self._ready = True
        return conn

    def _install(self, conn: Conn) -> Conn:
        """Make ``conn`` this process's connection, delivering dead processes' spools."""
        self._conn = conn
        self._deliver_orphans(conn)
        return conn

    def _deliver_orphans(self, conn: Conn) -> None:
        """Deliver the spools of dead processes (called with the lock held). One the
        database refuses is kept for later, one that cannot be read is set aside; raises
        :class:`PostgresUnavailable` when the database goes away meanwhile."""
        for orphan in orphans(spool_dir(self.url.database_key)):
            try:
                self._deliver(conn, orphan, limit=None)
                orphan.remove()
                self._forget(conn, orphan.id)
            except psycopg.Error as exc:
                failure = self._failed(conn, exc)
                if isinstance(failure, StateUnavailable):
                    raise failure from None
                # kept for the next process that connects (the database refuses it now)
                log.warning("%s", t("state.pg.spool_stuck", spool=orphan.path, why=failure))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                self._set_aside(orphan, exc)
            finally:
                orphan.close()

    @staticmethod
    def _set_aside(spool: SpoolFile, exc: BaseException) -> None:
        """A spool file that cannot be read: kept beside itself for a person, never deleted."""
        try:
            aside: object = set_aside(spool.path, "unreadable")
        except OSError as move:
            aside = move
        log.warning("%s", t("state.pg.spool_unreadable", spool=spool.path, why=exc, aside=aside))

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def unavailable(self, exc: BaseException) -> PostgresUnavailable:
        return PostgresUnavailable(
            t("state.pg.lost", where=self.where, why=_reason(exc, self.url)),
            hint=t("state.pg.unreachable.hint"),
        )

    def _failed(self, conn: Conn, exc: psycopg.Error) -> Exception:
        """What a failed statement means: the server gone (the connection is dropped and a
        later call connects again), or the error itself."""
        if conn.closed or conn.broken:
            self._drop()
            return self.unavailable(exc)
        return exc

    def close(self) -> None:
        """Close this process's connections; a spool not delivered yet stays (its thread
        goes on delivering it, or the next process to connect does)."""
        with self.lock:
            if self._pid != os.getpid():
                self._forked()
            if self._spool is not None and self._conn is not None:
                with contextlib.suppress(Exception):
                    self._drain(self._conn)
            self._drop()
        with self._listen_lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(Exception):
                listener.close()
        with self._worker_lock:
            worker, self._worker = self._worker, None
        if worker is not None:
            worker.shutdown(wait=False)

    def settle(self, timeout: float) -> bool:
        """Deliver what this process kept in its spool during an outage and the spools that
        dead processes left for this database (a step child whose attempt ended during the
        outage), waiting for the database up to ``timeout`` seconds. True when nothing of
        either is left; at once, with no connection made, when there was nothing.

        A spool the database refuses for another reason than being down is kept for a
        later process (:meth:`_install`'s warning) and not waited for."""
        directory = spool_dir(self.url.database_key)

        def look() -> bool | None:
            """True: nothing left; False: nothing to wait for; None: down, look again."""
            with self.lock:
                if self._pid != os.getpid():
                    self._forked()
                if self._spool is None and not _orphans_left(directory):
                    return True
                try:
                    conn = self._connection()  # a new one delivers the orphans first
                    try:
                        self._deliver_orphans(conn)  # those that died since it was made
                        if self._drain(conn):
                            return True
                    except psycopg.Error as exc:
                        failure = self._failed(conn, exc)
                        if not isinstance(failure, StateUnavailable):
                            # refused, not down: the deliverer keeps trying (and says so)
                            log.warning(
                                "%s", t("state.pg.spool_stuck", spool=directory, why=failure)
                            )
                            return False
                        raise failure from None
                except StateUnavailable:
                    return None  # down: wait and look again
                except FlowerError:
                    return False  # a database this process cannot use: nothing to wait for
            return None

        timeout = max(0.0, timeout)

        def wait(state: RetryCallState) -> float:  # the last look comes at the deadline
            return min(PROBE_WAIT(state), max(0.0, timeout - (state.seconds_since_start or 0)))

        looks = Retrying(
            retry=retry_if_result(lambda done: done is None),
            wait=wait,
            stop=stop_after_delay(timeout),
            retry_error_callback=lambda _: False,
            sleep=time.sleep,
        )
        return bool(looks(look))

    # ---- reading and writing ---------------------------------------------------------

    def run(self, work: Callable[[Conn], T]) -> T:
        """``work`` on this process's connection, after this process's spooled writes (so a
        process reads its own writes). Raises :class:`PostgresUnavailable` in an outage
        (through :attr:`patience` first, when one is set)."""
        if self.patience is not None:
            return self.patience(lambda: self._run(work))
        return self._run(work)

    def _run(self, work: Callable[[Conn], T]) -> T:
        with self.lock:
            conn = self._connection()
            try:
                if self._spool is not None:
                    self._drain(conn)
                return work(conn)
            except psycopg.Error as exc:
                raise self._failed(conn, exc) from None

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Conn]:
        """:meth:`run` as a block in one transaction, the connection held by this thread."""
        with self.lock:
            conn = self._connection()
            try:
                if self._spool is not None:
                    self._drain(conn)
                with conn.transaction():
                    yield conn
            except psycopg.Error as exc:
                raise self._failed(conn, exc) from None

    def write(self, op: str, epoch: int, args: dict[str, Any], parsed: Any = None) -> None:
        """The write ``OPS[op]`` (fenced, or kept: :mod:`.kept`): to the database, or into
        the spool when it cannot be reached or this process has spooled writes not
        delivered yet.

        Raises :class:`~flower.state.seam.Superseded` (written directly and refused),
        OSError (the spool cannot be written either), or what the database says."""
        with self.lock:
            if self._spool is None:
                try:
                    conn = self._connection()
                    try:
                        OPS[op](conn, self.sql, epoch, args, parsed)
                    except psycopg.Error as exc:
                        raise self._failed(conn, exc) from None
                    return
                except StateUnavailable as exc:
                    spool = spool_dir(self.url.database_key)
                    self._spool = SpoolFile.create(spool)
                    log.warning("%s", t("state.pg.spooling", what=exc.message, spool=spool))
            self._spool.add(op, epoch, args)
            self._start_delivery()

    async def call(self, work: Callable[[], T]) -> T:
        """``work()`` on this process's worker thread (first in, first out)."""
        with self._worker_lock:
            if self._worker is None:
                self._worker = ThreadPoolExecutor(1, thread_name_prefix="flower-state")
            worker = self._worker
        return await asyncio.get_running_loop().run_in_executor(worker, work)

    def listener(self) -> tuple[threading.Lock, Conn]:
        """A second connection of this process, for LISTEN (notifications arrive on the
        connection that listens, so it cannot be the shared one), with its lock."""
        with self._listen_lock:
            if self._listener is None or self._listener.closed or self._listener.broken:
                self._listener = self._connect()
            return self._listen_lock, self._listener

    # ---- the spool ---------------------------------------------------------------------

    def _start_delivery(self) -> None:
        """Called with the lock held; the thread exits only with it held too, after seeing
        the spool gone (so a spool made later always gets a thread)."""
        if self._deliverer is None:
            self._deliverer = threading.Thread(
                target=self._deliver_loop, args=(os.getpid(),), name="flower-spool", daemon=True
            )
            self._deliverer.start()

    def _deliver_loop(self, pid: int) -> None:
        """Until this process's spool is delivered: probe, then deliver in batches."""
        probes = _Probes()
        while os.getpid() == pid:
            with self.lock:
                if self._spool is None:
                    self._deliverer = None
                    return
                conn = self._conn
                live = conn is not None and not (conn.closed or conn.broken)
            if not live:
                try:
                    made = self._connect()  # outside the lock: it can take a while
                except FlowerError:
                    probes.pause()
                    continue
                installed = True
                spare: Conn | None = made
                with self.lock:
                    if self._conn is None or self._conn.closed or self._conn.broken:
                        self._drop()
                        installed = self._reinstall(made)
                        spare = None
                if spare is not None:
                    spare.close()
                if not installed:
                    probes.pause()
                    continue
            if self._deliver_some():
                probes.reset()
                continue
            probes.pause()

    def _reinstall(self, conn: Conn) -> bool:
        """The deliverer's new connection after an outage, installed as every connection
        is: the spools that processes left when they died during the outage (a step child
        whose attempt ended meanwhile) are delivered first. False when the database went
        away again meanwhile (the connection is dropped)."""
        try:
            self._install(conn)
        except FlowerError:
            self._drop()
            return False
        return True

    def _deliver_some(self) -> bool:
        """One batch of the spool (and any orphans, on a new connection); False when the
        database failed it."""
        with self.lock:
            try:
                conn = self._connection()
            except FlowerError:
                return False
            try:
                self._drain(conn, limit=DELIVER_BATCH)
                return True
            except psycopg.Error as exc:
                failure = self._failed(conn, exc)
            except FlowerError as exc:
                failure = exc
            if not isinstance(failure, StateUnavailable) and self._spool is not None:
                log.warning("%s", t("state.pg.spool_stuck", spool=self._spool.path, why=failure))
            return False

    def _drain(self, conn: Conn, limit: int | None = None) -> bool:
        """Deliver this process's spool (at most ``limit`` records); True when it is all
        delivered and gone. Called with the lock held: no write can slip in meanwhile."""
        spool = self._spool
        if spool is None:
            return True
        if not self._deliver(conn, spool, limit):
            return False
        spool.remove()
        self._spool = None
        self._forget(conn, spool.id)
        return True

    def _deliver(self, conn: Conn, spool: SpoolFile, limit: int | None) -> bool:
        """Deliver ``spool``'s unread records in order; True when none is left."""
        pending = spool.unread()
        for record, end in pending[:limit]:
            self._deliver_one(conn, spool, record)
            spool.mark(end)
        return limit is None or len(pending) <= limit

    def _deliver_one(self, conn: Conn, spool: SpoolFile, record: Record) -> None:
        """One record, exactly once: the spool's delivered mark moves in the same
        transaction. A write the fence refuses is dropped (a newer attempt owns its session)."""
        sql = self.sql
        with conn.transaction():
            (delivered,) = conn.execute(sql(_SPOOL_MARK), (spool.id,)).fetchone() or (0,)
            if record.n <= delivered:
                return
            op = OPS.get(record.op)
            if op is None:
                log.warning("%s", t("state.pg.spool_unknown", spool=spool.path, op=record.op))
            else:
                try:
                    with conn.transaction():
                        op(conn, sql, record.epoch, record.args, None)
                except Superseded as exc:
                    log.warning("%s", t("state.pg.spool_superseded", why=exc.message))
                except (psycopg.DataError, psycopg.IntegrityError) as exc:
                    # A kept row (manifest, registry, event) the database will never take
                    # (text it cannot store): dropped with a line, so it does not hold back
                    # every later write of the process. Anything else is retried.
                    if record.op not in KEPT_OPS:
                        raise
                    why = " ".join(str(exc).split())[:200]
                    log.warning("%s", t("state.pg.spool_refused", op=record.op, why=why))
            conn.execute(
                sql("UPDATE {s}.spools SET delivered = %s WHERE spool = %s"), (record.n, spool.id)
            )

    def _forget(self, conn: Conn, spool_id: str) -> None:
        conn.execute(self.sql("DELETE FROM {s}.spools WHERE spool = %s"), (spool_id,))

    # ---- fork --------------------------------------------------------------------------

    def _forked(self) -> None:
        """In a forked child: nothing of the parent's is used (see the module docstring)."""
        self.lock = threading.RLock()
        self._listen_lock = threading.Lock()
        self._worker_lock = threading.Lock()
        for conn in (self._conn, self._listener):
            if conn is not None:
                _ABANDONED.append(conn)
        self._conn = self._listener = None
        if self._spool is not None:
            self._spool.close()  # the parent's descriptor keeps its lock; the parent delivers it
            self._spool = None
        self._deliverer = None
        self._worker = None
        self._pid = os.getpid()


def _orphans_left(directory: Any) -> bool:
    """Is there a spool of a dead process in ``directory`` (one nobody holds)?"""
    for orphan in orphans(directory):
        orphan.close()
        return True
    return False


def _after_fork_in_child() -> None:
    global _SHARED_LOCK
    _SHARED_LOCK = threading.Lock()
    for db in list(_ALL):
        db._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)
