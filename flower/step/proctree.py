"""Every operation flower does on processes, behind one object: :class:`ProcessTree`.

The supervisor (forking step children, reaping them, stopping their trees), the step child
(its own group, subreaper, parent-death signal, killing its descendants on the way out) and
an attempt in any placement (ending what a dead CLI left running) all go through
:data:`PROCS`, so a unit test can swap in a fake whose ``fork`` raises ``EAGAIN`` or whose
``waitpid`` never reports, without a real process misbehaving. (supervisord routes every
fork/kill/waitpid through one object for the same reason.)

Measured here: SIGKILL of the CLI mid-tool leaves the tool's shell running, re-parented to
init. So "stop a step" always means "stop its whole tree", and every process in the chain
makes sure orphans land with someone who will kill them:

- the supervisor and each step child are *subreapers*: an orphaned descendant is
  re-parented to them, not to init, so they can still find it;
- each step child asks for SIGTERM when its parent dies (``PR_SET_PDEATHSIG``), even by
  SIGKILL, and answers any SIGTERM by killing its whole tree;
- every process of one attempt (the CLI and the tool shells it starts) carries
  ``FLOWER_ATTEMPT=<tag>`` in its environment, so what escaped the tree is still found.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time

import psutil

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36

# Signals held back while a step child is forked (see ProcessTree.fork).
FORK_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})

# Every process of one attempt (the CLI and the tool shells it starts) inherits this variable
# with a value unique to the attempt. Measured: SIGKILL of the CLI mid-tool leaves the tool's
# shell running, re-parented away from its CLI, where a process-tree walk no longer finds it.
ATTEMPT_TAG = "FLOWER_ATTEMPT"


class ProcessTree:
    """The operating system's process calls, as flower uses them (Linux; best effort elsewhere)."""

    # -- the primitives a fake replaces ---------------------------------------------------

    def fork(self) -> int:
        """``os.fork()``: 0 in the child, the child's pid in the parent; OSError on failure.

        :data:`FORK_SIGNALS` are blocked across the fork: until the child has its own process
        group and handlers, a Ctrl-C or SIGTERM would run the parent's handlers in it (which
        write into the parent's wakeup pipe). The parent gets its mask back at once; the
        child unblocks them with :meth:`forked` once it is ready.
        """
        old = signal.pthread_sigmask(signal.SIG_BLOCK, FORK_SIGNALS)
        try:
            pid = os.fork()
        except BaseException:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
            raise
        if pid:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        return pid

    def forked(self) -> None:
        """In a child of :meth:`fork`, with its own handlers set: let the signals in."""
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORK_SIGNALS)

    def waitpid(self, pid: int, options: int = 0) -> tuple[int, int]:
        """``os.waitpid``; ``(0, 0)`` while a WNOHANG child still runs."""
        return os.waitpid(pid, options)

    def kill(self, pid: int, sig: int = signal.SIGKILL) -> bool:
        """Send ``sig`` to ``pid``; False when there is no such process (or not ours)."""
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def killpg(self, pgid: int, sig: int = signal.SIGKILL) -> bool:
        """Signal a whole process group, never our own or init's; False if nothing was sent."""
        if pgid <= 1 or pgid == os.getpgid(0):
            return False
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def prctl(self, option: int, arg: int) -> bool:
        if not sys.platform.startswith("linux"):
            return False
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            return bool(libc.prctl(option, arg, 0, 0, 0) == 0)
        except (OSError, AttributeError):
            return False

    # -- one process's own arrangements ---------------------------------------------------

    def become_subreaper(self) -> bool:
        """Orphaned descendants of this process are re-parented here instead of to init."""
        return self.prctl(PR_SET_CHILD_SUBREAPER, 1)

    def die_with_parent(self, sig: int = signal.SIGTERM, *, parent: int) -> bool:
        """Ask the kernel to send ``sig`` when the parent dies; True if it is set up.

        If the parent already died before this call, send it to ourselves right away.
        """
        ok = self.prctl(PR_SET_PDEATHSIG, int(sig))
        if os.getppid() != parent:
            self.kill(os.getpid(), sig)
        return ok

    # -- trees --------------------------------------------------------------------------

    def descendants(self, pid: int | None = None) -> list[psutil.Process]:
        """Every process below ``pid`` (this one by default), children before grandchildren.

        Read from ``/proc/<pid>/task/<tid>/children`` where Linux offers it: psutil's walk
        reads the whole process table to map parents (about 3 ms, paid by every step child
        on its way out); this reads only the tree itself.
        """
        root = pid or os.getpid()
        pids = _tree(root)
        if pids is None:
            try:
                return psutil.Process(root).children(recursive=True)
            except psutil.Error:
                return []
        out = []
        for p in pids:
            with contextlib.suppress(psutil.Error):
                out.append(psutil.Process(p))
        return out

    def tagged_below(self, tag: str) -> list[psutil.Process]:
        """Live descendants of this process carrying ``ATTEMPT_TAG=tag`` (a look at our own
        tree only: cheaper than :meth:`leftovers`, which reads the whole process table)."""
        found = []
        for proc in self.descendants():
            try:
                if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get(ATTEMPT_TAG) == tag:
                    found.append(proc)
            except (psutil.Error, OSError):
                continue
        return found

    def kill_tree(self, pid: int, *, pgid: int | None = None) -> None:
        """SIGKILL ``pid``'s whole tree: every descendant, its process group, then the root."""
        for p in self.descendants(pid):
            self.kill(p.pid)
        if pgid is not None:
            self.killpg(pgid)
        self.kill(pid)

    def kill_descendants(self) -> None:
        """SIGKILL everything below this process (a step child on its way out)."""
        for p in self.descendants():
            self.kill(p.pid)

    def reap_orphans(self, keep: set[int]) -> list[int]:
        """Kill and reap direct children not in ``keep`` (orphans a subreaper inherited)."""
        try:
            direct = psutil.Process().children(recursive=False)
        except psutil.Error:
            direct = []
        killed = []
        for p in direct:
            if p.pid in keep:
                continue
            try:
                below = p.children(recursive=True)
            except psutil.Error:
                below = []
            for q in [p, *below]:
                self.kill(q.pid)
            killed.append(p.pid)
        for pid in killed:
            self.reap(pid, within=1.0)
        return killed

    def reap_zombies(self, keep: set[int]) -> list[int]:
        """Reap this process's direct children that have died and are not in ``keep``
        (a subreaper's adopted orphans: a step child's ``claude`` killed with its tree);
        a live child, and every child in ``keep`` (whose owner reaps it for its status),
        is left alone. Returns the pids reaped."""
        try:
            direct = psutil.Process().children(recursive=False)
        except psutil.Error:
            return []
        reaped = []
        for p in direct:
            if p.pid in keep:
                continue
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    continue
                done, _ = self.waitpid(p.pid, os.WNOHANG)
            except (psutil.Error, ChildProcessError):
                continue
            if done:
                reaped.append(p.pid)
        return reaped

    def reap(self, pid: int, *, within: float) -> int | None:
        """Wait up to ``within`` seconds for ``pid`` to be reaped; its status, or None."""
        deadline = time.monotonic() + within
        while True:
            try:
                done, status = self.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                return None
            if done:
                return status
            if time.monotonic() > deadline:
                return None
            time.sleep(0.005)

    # -- what escaped the tree ---------------------------------------------------------

    def leftovers(self, tag: str) -> list[psutil.Process]:
        """Live processes (but this one) with ``ATTEMPT_TAG=tag`` in their environment."""
        found = []
        for proc in psutil.process_iter(["pid"]):
            if proc.pid == os.getpid():
                continue
            try:
                if proc.environ().get(ATTEMPT_TAG) == tag and proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
            except (psutil.Error, OSError):
                continue  # gone meanwhile, or not ours to read
        return found

    def end_leftovers(self, tag: str, timeout: float = 3.0) -> int:
        """SIGKILL what an attempt left running once its CLI is gone; returns how many.

        A tool that outlived its CLI would otherwise go on writing files while the resumed
        session works on them.
        """
        victims = self.leftovers(tag)
        for proc in victims:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(victims, timeout=timeout)
        return len(victims)


def _tree(root: int) -> list[int] | None:
    """The pids below ``root`` from /proc's children files, or None where there are none."""
    found: list[int] = []
    queue = [root]
    while queue:
        pid = queue.pop(0)
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except FileNotFoundError:
            continue  # gone meanwhile
        except OSError:
            return None
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                    kids = [int(k) for k in f.read().split()]
            except FileNotFoundError:
                if pid == root and tid == str(root):
                    return None  # no children files in this kernel
                continue
            except (OSError, ValueError):
                continue
            found.extend(kids)
            queue.extend(kids)
    return found


def describe_status(status: int) -> str:
    """'killed by SIGKILL' / 'exited with status 3' from a waitpid status."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"killed by {name}"
    return f"exited with status {os.WEXITSTATUS(status)}"


#: The process tree every part of flower uses; tests replace it (``monkeypatch.setattr``).
PROCS = ProcessTree()
