"""A worker reaps what it adopted as subreaper, and only that (issue 25, item 3): the dead
``claude`` of an attempt it stopped is no zombie of it for its lifetime, while another
slot's step child (alive, or dead and waiting for its own placement to take its status) is
left alone."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import psutil

from flower.step.proctree import PROCS


def _fork(then: str) -> int:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        if then == "exit":
            os._exit(3)
        signal.pause()
        os._exit(0)
    return pid


def _zombie(pid: int, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, f"{pid} did not die"
        time.sleep(0.01)


def test_only_dead_children_outside_keep_are_reaped() -> None:
    adopted = _fork("exit")  # a dead CLI the worker adopted
    sibling_dead = _fork("exit")  # another slot's step child, dead, its status not taken yet
    sibling_live = _fork("pause")  # another slot's step child, running
    try:
        _zombie(adopted)
        _zombie(sibling_dead)
        reaped = PROCS.reap_zombies(keep={sibling_dead, sibling_live})
        assert adopted in reaped
        assert sibling_dead not in reaped and sibling_live not in reaped
        # the sibling's placement still gets its status, and the live one still runs
        assert os.waitpid(sibling_dead, 0) == (sibling_dead, 3 << 8)
        assert psutil.Process(sibling_live).status() != psutil.STATUS_ZOMBIE
        assert PROCS.reap_zombies(keep={sibling_live}) == []  # nothing more to reap
    finally:
        os.kill(sibling_live, signal.SIGKILL)
        os.waitpid(sibling_live, 0)
        for pid in (adopted, sibling_dead):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def test_a_live_child_outside_keep_is_not_touched() -> None:
    live = _fork("pause")
    try:
        assert PROCS.reap_zombies(keep=set()) == []
        assert psutil.Process(live).status() != psutil.STATUS_ZOMBIE
    finally:
        os.kill(live, signal.SIGKILL)
        os.waitpid(live, 0)
