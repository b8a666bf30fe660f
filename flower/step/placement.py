"""Placements: where one attempt of a step runs.

The step loop (:mod:`flower.step.loop`) decides everything about a step: how many attempts,
what each one sends, which session it continues, when to wait, back off, hand off or stop.
Below it, a *placement* runs exactly one attempt somewhere and reports what happened. Two
exist: :class:`flower.step.inprocess.InProcess` (this process: library users) and the
supervisor's forked step child (``supervisor.run.placement.Forked``). A third (a task on a
cluster engine) needs no change to the loop or the workflow if it keeps this contract:

``await placement.attempt(call, seat, watch) -> StepResult``

1. Run ``call`` once: an SDK client session built by :func:`flower.step.attempt.options_for`
   from ``call`` and ``seat``, the prompt ``call.prompt`` sent, messages read to the result.
   Everything the SDK calls back (hooks, in-process MCP servers) runs where the attempt runs.
2. Report while it runs, from the event loop the placement was awaited on:
   ``watch.on_session(sid)`` the instant the session id is known (lineage is written from it:
   the hard-kill invariant), ``watch.on_event(event)`` for model text and for the context
   size after each main-thread turn (``Event("context", label, {"used": n, "final": bool})``),
   and ``watch.on_handle(h)`` with something whose ``await h.interrupt()`` stops the attempt at
   the next message boundary (``None`` once nothing can be interrupted any more). An interrupt
   requested before the attempt could take it must still reach it.
3. Stop on its own at a message boundary when a non-final turn reports a context of
   ``call.stop_at`` or more, and then return ``error=HANDOFF_DUE`` unless the result was ok.
4. Return the attempt's :class:`StepResult`: ``ok``/``text`` for a success; for a failure
   ``ok=False`` and ``error`` in words the resilience policy can classify (the CLI's own text,
   or what ended the attempt: "step child 4711 died without a result (killed by SIGKILL)").
   A placement never retries, never waits for the network, never writes lineage or the
   manifest: the loop does all of that, the same way for every placement.
5. Raise :class:`flower.AttemptCrash` when retrying cannot help (a bug in flower, a spec the
   SDK rejects, an import that fails where the attempt runs); where the traceback was written
   to the step's log file already (a child's stderr is that file), name it in ``crash.log``.
   The loop writes the traceback of every other crash, and treats any other exception out of
   ``attempt`` as a crash too.
6. Leave nothing running: when the attempt ends, its CLI and every tool process it started
   are gone or going (a successful CLI may finish exiting in the background, as long as an
   attempt that resumes the same session waits for it), and a cancelled ``attempt`` ends its
   processes too.

``placement.prepare(calls, seat)`` is a hint: the first attempts of the steps likely to run
next. A placement may get them ready (fork a child, start its CLI) so only the prompt is left
to send; a prepared attempt that is not asked for must be dropped without sending a request.
``await placement.close()`` drops whatever is prepared and waits for what is still exiting.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..state.result import Event, StepResult
from ..util.fsutil import file_name, open_private, private_dir
from .call import StepCall

#: What the error of an attempt whose runner died before it sent a result says (a forked
#: child, a worker's child): "step child 4711 died without a result (killed by SIGKILL)".
DIED = "died without a result"


class Interruptible(Protocol):
    """Whatever an interrupt reaches right now: a CLI client, a step child, a wait."""

    async def interrupt(self) -> None: ...


def _nowhere(where: dict[str, Any] | None) -> None:
    return None


@dataclass(frozen=True)
class Watch:
    """What an attempt reports upward while it runs (see the module docstring, point 2).

    ``on_placed(where)``: a placement whose attempts outlive this process (a cluster's)
    puts the attempt on record the moment it exists (``{"id": …}``, then where it runs:
    ``host``, ``pid``, ``worker``, ``try``), so a supervisor killed meanwhile is followed by
    one that attaches to it (:attr:`StepCall.attach`); ``None`` takes it off the record (it
    raised, or was told to stop). An attempt that returned stays on record until its step's
    manifest row is written (the Runtime takes it off then)."""

    on_session: Callable[[str], None]
    on_event: Callable[[Event], None]
    on_handle: Callable[[Interruptible | None], None]
    on_placed: Callable[[dict[str, Any] | None], None] = _nowhere


@dataclass(frozen=True)
class Seat:
    """Where attempts of one Runtime run: the same for every attempt and every placement."""

    workspace: Path
    store: Any  # the SessionStore (the pruning layer on run_dir/sessions.db)
    portable: bool
    logs: Path  # run_dir/logs/<run id>: one log file per step label
    # run_dir/tmp: a placement whose attempts can die without cleaning up after themselves
    # (a forked child) keeps their temporary files here, not in /tmp: the SDK copies a resumed
    # transcript (and the CLI's credentials) into a temporary directory.
    tmp: Path
    # The hook layer's setup (the same in every placement: options_for builds the hooks
    # where the attempt runs): the Runtime's workbench or None, spill_guard's threshold, and
    # whether the CLI's own auto-compaction is switched off for specs that do not set
    # ``compact`` (Runtime(handoff=True): flower's handoff must be the one that happens).
    workbench: Any = None
    spill_threshold: int | None = None
    no_auto_compact: bool = False
    run: str = ""  # the Runtime's run id (what a cluster's attempt ids are made of)

    def log_for(self, label: str) -> Path:
        """The step's log file (child stdio, crash tracebacks), its directory created 0700."""
        return private_dir(self.logs) / f"{safe_label(label)}.log"


class Placement(Protocol):
    async def attempt(self, call: StepCall, seat: Seat, watch: Watch) -> StepResult: ...

    def prepare(self, calls: Sequence[StepCall], seat: Seat) -> None: ...

    async def close(self) -> None: ...


def safe_label(label: str) -> str:
    """A label as one file name (see :func:`flower.util.fsutil.file_name`)."""
    return file_name(label)


def write_crash_log(path: Path, crash: BaseException) -> Path:
    """Append the crash's traceback to a step's log file; returns the path (best effort).

    An :class:`~flower.AttemptCrash` carries the traceback of what went wrong as ``detail``
    (it is made, not raised, where that is caught)."""
    import os

    detail = getattr(crash, "detail", "")
    text = (
        detail if isinstance(detail, str) and detail else "".join(traceback.format_exception(crash))
    )
    try:
        fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            os.write(fd, text.encode("utf-8", "backslashreplace"))
        finally:
            os.close(fd)
    except OSError:
        pass
    return path
