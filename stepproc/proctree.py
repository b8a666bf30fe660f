"""Process-tree plumbing: parent-death signals, subreapers, killing a whole tree.

Measured here: SIGKILL of the CLI mid-tool leaves the tool's shell running, re-parented to
init. So "stop a step" always means "stop its whole tree", and every process in the chain
makes sure orphans land with someone who will kill them:

- the supervisor and each step child are *subreapers*: an orphaned descendant is
  re-parented to them, not to init, so they can still find it with psutil;
- each step child asks for SIGTERM when its parent dies (``PR_SET_PDEATHSIG``), even by
  SIGKILL, and answers any SIGTERM by killing its whole tree.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

import psutil

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, arg: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, arg, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def become_subreaper() -> bool:
    """Orphaned descendants of this process are re-parented here instead of to init."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def die_with_parent(sig: int = signal.SIGTERM, *, parent: int) -> bool:
    """Ask the kernel to send ``sig`` when the parent dies; True if it is set up.

    If the parent already died before this call, send it to ourselves right away.
    """
    ok = _prctl(PR_SET_PDEATHSIG, int(sig))
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)
    return ok


def descendants(pid: int | None = None) -> list[psutil.Process]:
    try:
        return psutil.Process(pid or os.getpid()).children(recursive=True)
    except psutil.Error:
        return []


def kill_tree(pid: int, *, include_root: bool = True, pgid: int | None = None) -> None:
    """SIGKILL ``pid``'s whole tree: every descendant, its process group, then the root."""
    procs = descendants(pid)
    for p in procs:
        _kill(p.pid)
    if pgid is not None and pgid != os.getpgid(0):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if include_root:
        _kill(pid)


def kill_group(pgid: int) -> None:
    """SIGKILL a whole process group (a step child's group holds its CLI and tool shells)."""
    if pgid <= 1 or pgid == os.getpgid(0):
        return
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_descendants() -> None:
    """SIGKILL everything below this process (used by a step child on its way out)."""
    for p in descendants():
        _kill(p.pid)


def reap_orphans(keep: set[int]) -> list[int]:
    """Kill and reap direct children not in ``keep`` (orphans a subreaper inherited)."""
    killed = []
    for p in descendants_direct():
        if p.pid in keep:
            continue
        for q in [p, *_safe_children(p)]:
            _kill(q.pid)
        killed.append(p.pid)
    for pid in killed:
        _reap(pid, within=1.0)
    return killed


def _reap(pid: int, *, within: float) -> None:
    import time

    deadline = time.monotonic() + within
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done or time.monotonic() > deadline:
            return
        time.sleep(0.005)


def descendants_direct() -> list[psutil.Process]:
    try:
        return psutil.Process().children(recursive=False)
    except psutil.Error:
        return []


def _safe_children(p: psutil.Process) -> list[psutil.Process]:
    try:
        return p.children(recursive=True)
    except psutil.Error:
        return []


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
