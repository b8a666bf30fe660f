"""``flower-super cancel RUN``: stop a live flower the way SIGTERM does.

The flower gets SIGTERM (its own handler writes the in-flight step as one
``killed-by-signal`` row, stops its children and dies of the signal), so the run stays
resumable: ``flower-super start`` in the same place carries on. RUN is a run id as
``status`` prints it, or a unique prefix of one. A run that is not live, or that no record
names, is one line and exit status 2.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from flower import FlowerError
from flower.core.registry import FlowerRecord, Registry, is_alive

STOP_WAIT_S = 30.0  # the handler writes one row and stops the children: well under a second


@dataclass
class Cancelled:
    record: FlowerRecord
    stopped: bool  # the process is gone (False: still there after STOP_WAIT_S)


def find_run(run_dir: Path, run: str) -> FlowerRecord:
    """The record ``run`` names (a run id or a unique prefix), or a FlowerError."""
    records = Registry(run_dir).records()
    exact = [r for r in records if r.run == run]
    matches = exact or [r for r in records if r.run.startswith(run)]
    if not matches:
        raise FlowerError(
            f"no flower run {run!r} in {run_dir}",
            hint="flower-super status -r RUN_DIR lists the runs there",
        )
    if len(matches) > 1:
        names = ", ".join(r.run for r in matches[:4])
        raise FlowerError(f"{run!r} names {len(matches)} runs ({names})", hint="give more of it")
    return matches[0]


def cancel(run_dir: Path, run: str, *, wait_s: float = STOP_WAIT_S) -> Cancelled:
    """SIGTERM the live flower ``run`` names and wait for it to go."""
    record = find_run(run_dir, run)
    if record.state != "running" or not record.alive:
        raise FlowerError(
            f"run {record.run} is not running (it is {record.state}); nothing to cancel",
            hint="flower-super start in its workspace carries it on",
        )
    try:
        os.kill(record.pid, signal.SIGTERM)
    except ProcessLookupError:
        raise FlowerError(f"run {record.run} ended just now", hint="nothing to cancel") from None
    except PermissionError:
        raise FlowerError(
            f"not allowed to signal pid {record.pid} (run {record.run})",
            hint="cancel it as the user who started it",
        ) from None
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if not is_alive(record.pid, record.pid_started):
            return Cancelled(record, True)
        time.sleep(0.05)
    return Cancelled(record, False)
