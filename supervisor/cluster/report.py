"""What a worker says about itself: its row in the state (``flower-super workers``) and, with
``--metrics HOST:PORT``, Prometheus metrics beside the Temporal SDK's own.

One :class:`WorkerReport` per worker process counts what its attempts did; the worker's
report loop writes :meth:`WorkerReport.record` to the state every :data:`REPORT_EVERY_S`
seconds and as soon as an attempt begins or ends; the metrics are the same counts on the
Temporal runtime's meter (so one endpoint serves both: the runtime's Prometheus exporter).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from flower.i18n import define, t

#: How often a worker writes its row.
REPORT_EVERY_S = 2.0

define(
    {
        "worker.metrics_failed": (
            "没法在 {where} 上提供指标:{why}",
            "cannot serve metrics on {where}: {why}",
        ),
        "worker.metrics_failed.hint": (
            "--metrics 要写成 主机:端口,端口不能被占用(例如 --metrics 127.0.0.1:9464)",
            "--metrics takes HOST:PORT on a free port (for example --metrics 127.0.0.1:9464)",
        ),
        "worker.metrics": (
            "-- 指标在 http://{where}/metrics",
            "-- metrics at http://{where}/metrics",
        ),
    }
)


@dataclass
class Running:
    id: str
    run: str
    label: str
    attempt: int
    since: float = field(default_factory=time.time)


class WorkerReport:
    """The counts of one worker process, and the attempts it runs now."""

    def __init__(self, queue: str, slots: int, target: str, meter: Any = None) -> None:
        self.queue, self.slots, self.target = queue, slots, target
        self.pid = os.getpid()
        self.started_at = time.time()
        self.running: dict[str, Running] = {}
        self.counts = {"finished": 0, "failed": 0, "takeovers": 0, "refusals": 0}
        self.spool = (0, 0)  # (files, bytes) of this machine's kept writes
        self.news = asyncio.Event()  # set when an attempt began or ended: report it now
        self._metrics: dict[str, Any] = {}
        if meter is not None:
            self._metrics = {
                "running": meter.create_gauge(
                    "flower_attempts_running", "attempts this worker runs now"
                ),
                "finished": meter.create_counter(
                    "flower_attempts_finished", "attempts that ended with a step result"
                ),
                "failed": meter.create_counter(
                    "flower_attempts_failed", "attempts that ended without one (stopped, crashed)"
                ),
                "takeovers": meter.create_counter(
                    "flower_takeovers", "attempts taken over from a worker that died or froze"
                ),
                "refusals": meter.create_counter(
                    "flower_refusals", "attempts handed back to the queue (cannot run here)"
                ),
                "spool_files": meter.create_gauge(
                    "flower_spool_files", "processes here with state writes waiting for PostgreSQL"
                ),
                "spool_bytes": meter.create_gauge(
                    "flower_spool_bytes", "bytes of state writes here waiting for PostgreSQL"
                ),
            }
        self._labels = {"queue": queue}
        for name in self.counts:  # every series there from the start, at 0
            if name in self._metrics:
                self._metrics[name].add(0, self._labels)
        self._gauge("running", 0)

    # -- what happened -------------------------------------------------------------------

    def began(self, attempt_id: str, run: str, label: str, attempt: int, took_over: bool) -> None:
        self.running[attempt_id] = Running(attempt_id, run, label, attempt)
        self.news.set()
        if took_over:
            self._count("takeovers")
        self._gauge("running", len(self.running))

    def ended(self, attempt_id: str, ok: bool) -> None:
        self.running.pop(attempt_id, None)
        self.news.set()
        self._count("finished" if ok else "failed")
        self._gauge("running", len(self.running))

    def refused(self) -> None:
        self._count("refusals")

    def spooled(self, files: int, size: int) -> None:
        """This machine's writes waiting for the state: ``files`` processes, ``size`` bytes."""
        self.spool = (files, size)
        self._gauge("spool_files", files)
        self._gauge("spool_bytes", size)

    # -- what is said ----------------------------------------------------------------------

    def record(self) -> dict[str, Any]:
        """The row's record (the state adds name, queue, host, heartbeat)."""
        return {
            "pid": self.pid,
            "slots": self.slots,
            "target": self.target,
            "host": socket.gethostname(),
            "running": [
                {"id": r.id, "run": r.run, "label": r.label, "try": r.attempt, "since": r.since}
                for r in self.running.values()
            ],
            "spool_files": self.spool[0],
            "spool_bytes": self.spool[1],
            **self.counts,
        }

    def _count(self, name: str) -> None:
        self.counts[name] += 1
        if name in self._metrics:
            self._metrics[name].add(1, self._labels)

    def _gauge(self, name: str, value: int) -> None:
        if name in self._metrics:
            self._metrics[name].set(value, self._labels)


def metrics_failed(where: str, exc: BaseException) -> Any:
    """The one line for a ``--metrics`` address the runtime cannot serve on."""
    from flower import FlowerError

    why = str(exc).removeprefix("Failed starting Prometheus exporter: ")
    return FlowerError(
        t("worker.metrics_failed", where=where, why=why), hint=t("worker.metrics_failed.hint")
    )
