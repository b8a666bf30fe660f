"""Runtime: the one verb that runs a step (seed 003, 运行时).

``Runtime.run`` runs one step to its result through the step loop (:mod:`.loop`): retries of
transient API errors that resume the same session, cooperative interrupts, handoffs when the
context fills up. One ``run`` call is one manifest row. Where each attempt runs is the
Runtime's *placement*: this process by default (:class:`~.placement.InProcess`), a forked
step child under ``flower-super`` (``supervisor.run.placement.Forked``). Everything else —
lineage, the manifest, the registry record, interrupts — is the same for both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from .._errors import ConfigError
from ..agents.agent import AgentSpec
from ..i18n import define, t
from ..people.credentials import check_credentials, load_dotenv, lookup
from ..state.backends import STATE_ENV, RunState, open_state
from ..state.lineage import Lineage
from ..state.registry import FlowerRecord, new_run_id, process_started, this_host
from ..state.result import HANDOFF_DUE, INTERRUPTED, KILLED_BY_SIGNAL, StepResult
from ..util.loops import call_on
from .attempt import Window
from .call import StepCall
from .inprocess import InProcess
from .interrupts import Interrupts
from .loop import INTERRUPT_NOTE, OnEvent, StepHooks, StepLoop, handoff_fields
from .placement import Placement, Seat
from .resilience import Resilience
from .window import HandoffPolicy

log = logging.getLogger("flower")

define(
    {
        "runtime.manifest_unwritten": (
            "写不了 {path}:{error}",
            "could not write {path}: {error}",
        ),
        "runtime.session_unrecorded": (
            "记录会话 {session} 失败",
            "recording session {session} failed",
        ),
    }
)

__all__ = ["OnEvent", "Runtime"]


class Runtime:
    """Holds the workspace, the session store and the policies; runs steps.

    ``placement`` (an extension of seed 003's signature) is where attempts run; the default
    runs them in this process.
    """

    INTERRUPTED = INTERRUPTED
    HANDOFF_DUE = HANDOFF_DUE
    INTERRUPT_NOTE = INTERRUPT_NOTE

    def __init__(
        self,
        *,
        workspace: str | Path,
        run_dir: str | Path = "runs",
        portable: bool = True,
        trim: Any = False,
        ephemeral: Any = True,
        keep_denials: int = 1,
        workbench: Any = False,
        spill_threshold: int | None = 4000,
        resilience: Resilience | bool = True,
        handoff: HandoffPolicy | bool = True,
        placement: Placement | None = None,
        state: RunState | str | None = None,
    ) -> None:
        self.workspace = Path(workspace).expanduser().resolve()
        self.run_dir = Path(run_dir).expanduser().absolute()
        self.portable = portable
        self.trim, self.ephemeral, self.keep_denials = trim, ephemeral, keep_denials
        self.spill_threshold = spill_threshold  # spill_guard's threshold (None/0: no guard)
        self.resilience: Resilience = _policy(resilience, Resilience)
        self.handoff: HandoffPolicy = _policy(handoff, HandoffPolicy)
        self.placement: Placement = placement or InProcess()
        self.run_id = new_run_id()
        self.results: list[StepResult] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._interrupting: set[asyncio.Task[None]] = set()
        # Told every session id of a call that brings no ``on_session`` of its own.
        self.on_session: Callable[[str], None] | None = None
        # Each manifest row this Runtime writes, the moment it is written (an interaction
        # layer shows what every attempt and judge round cost).
        self.on_result: Callable[[StepResult], None] | None = None
        self.record: FlowerRecord | None = None
        # Attempts on a cluster a killed supervisor of this flow left (label -> its ``placed``
        # entry, found by begin_flow): the new record starts with them, so a start killed
        # before attaching to one still leaves it on record for the next; the first attempt
        # of that label attaches to it (StepCall.attach).
        self.left_placed: dict[str, dict[str, Any]] = {}
        self.interrupts = Interrupts()
        self.windows: dict[str, Window] = {}  # the CLI's real windows, learned per model
        self.in_flight: StepLoop | None = None  # the step running now (rescue() writes it)
        self._flying: list[StepLoop] = []  # every step running now (a map's items run at once)
        # Credentials first: a start refused for want of a key leaves no run_dir behind.
        load_dotenv(self.workspace, Path.cwd())
        check_credentials()
        # Where the run's state lives (flower.state.backends): ``state`` (a URL or an opened
        # state), else $FLOWER_STATE (the environment, or any .env file of the credentials'
        # lookup order), else run_dir's files.
        if state is None:
            state = lookup(STATE_ENV, self.workspace)
        self.state = open_state(state, run_dir=self.run_dir, workspace=self.workspace)
        self.workbench = _workbench(workbench, self.workspace, self.run_dir)
        self.store = self._make_store()
        self._manifest: Any = None

    # -- stores and files -------------------------------------------------------------

    def _make_store(self) -> Any:
        from ..state.stores import open_store

        return open_store(self)

    @property
    def seat(self) -> Seat:
        """Where this Runtime's attempts run (the same for every placement)."""
        return Seat(
            workspace=self.workspace,
            store=self.store,
            portable=self.portable,
            logs=self.run_dir / "logs" / self.run_id,
            tmp=self.run_dir / "tmp",
            workbench=self.workbench,
            spill_threshold=self.spill_threshold or None,
            no_auto_compact=self.handoff.enabled,
            run=self.run_id,
        )

    def use_workbench(self, workbench: Any) -> Any:
        """Make ``workbench`` (a Workbench, True or False) this Runtime's; returns the one
        it had. ``Workflow.run`` uses it for a flow that names its own workbench."""
        previous = self.workbench
        self.workbench = _workbench(workbench, self.workspace, self.run_dir)
        return previous

    @property
    def notes_dir(self) -> Path | None:
        """Where handoffs land: the workbench's notes/, or nowhere without a workbench."""
        return self.workbench.notes if self.workbench is not None else None

    def has_session(self, session_id: str) -> bool:
        """Is ``session_id`` a transcript of this workspace in sessions.db? Raises what the
        store raises: a store that cannot answer is not a session that is gone."""
        from claude_agent_sdk import project_key_for_directory

        return bool(self.store.has_session(project_key_for_directory(self.workspace), session_id))

    @property
    def manifest_path(self) -> Path | str:
        """Where manifest rows go: ``<run_dir>/manifest.json``, or the database's table."""
        return self.state.manifest_where

    @property
    def project_key(self) -> str:
        """The SDK's key for this workspace's sessions (derived from the path: moving the
        workspace loses them)."""
        from claude_agent_sdk import project_key_for_directory

        return str(project_key_for_directory(self.workspace))

    def context_of(self, session_id: str) -> int:
        """The context size of ``session_id``'s last turn (what the handoff is judged by)."""
        return self.session_context(session_id)

    def total_cost(self) -> float:
        """What the steps this process ran cost, in US dollars."""
        return round(sum(r.cost_usd for r in self.results), 4)

    def session_context(self, session_id: str) -> int:
        """The context size of ``session_id``'s last main-thread turn, read from sessions.db."""
        from claude_agent_sdk import project_key_for_directory

        from .events import context_of

        key = {"project_key": project_key_for_directory(self.workspace), "session_id": session_id}
        try:
            entries = self.store.load_sync(key) or []
        except Exception:  # noqa: BLE001 - a banner figure is not worth failing a start
            return 0
        for entry in reversed(entries):
            msg = entry.get("message") if entry.get("type") == "assistant" else None
            if isinstance(msg, dict) and msg.get("usage") and not entry.get("isApiErrorMessage"):
                return context_of(msg["usage"])
        return 0

    def lineage(self) -> Lineage:
        lineage: Lineage = self.state.lineage(has_session=self.has_session, run_id=self.run_id)
        return lineage

    @property
    def manifest(self) -> Any:
        """This run's manifest writer (``record(result, extra)``, ``check()``, ``rows()``)."""
        if self._manifest is None or self._manifest.run_id != self.run_id:
            self._manifest = self.state.manifest(self.run_id)
        return self._manifest

    def settle_state(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s until the run state holds everything this run wrote: a
        database that was down kept writes on this machine and takes them once it is
        back. True at once for local files, and when nothing is waiting."""
        return bool(self.state.settle(timeout))

    def close(self) -> None:
        """Close the stores (the only cleanup a double Ctrl-C still does)."""
        close = getattr(self.store, "close", None)
        if close:
            close()
        self.state.close()

    # -- the flower's registry record -------------------------------------------------

    def begin_flow(
        self,
        flow: str,
        steps: list[str],
        *,
        command: list[str] | None = None,
        ask: str | None = None,
    ) -> None:
        self.left_placed = self._left_running(flow)
        self.record = FlowerRecord(
            run=self.run_id,
            flow=flow,
            pid=os.getpid(),
            pid_started=process_started(os.getpid()),
            workspace=str(self.workspace),
            started_at=time.time(),
            command=list(command or []),
            cwd=str(Path.cwd()),
            steps=list(steps),
            host=this_host(),
            workspace_id=self.state.workspace_id,
            placed={k: dict(v) for k, v in self.left_placed.items()},
            ask=ask,
        )
        self.note()

    def _left_running(self, flow: str) -> dict[str, dict[str, Any]]:
        """Attempts the last run of ``flow`` here left on a cluster: its supervisor is gone
        (killed), the attempt was dispatched and its step's row never written (label -> its
        ``placed`` entry). Nothing for a placement that keeps no attempt elsewhere."""
        try:
            records = self.state.registry.records()
        except Exception:
            log.debug("registry unreadable", exc_info=True)
            return {}
        mine = [r for r in records if r.flow == flow and r.run != self.run_id]
        if not mine or mine[-1].alive or mine[-1].state not in ("running", "interrupted"):
            return {}
        return {label: dict(p) for label, p in mine[-1].placed.items() if p.get("id")}

    def _placed(self, label: str, where: dict[str, Any] | None) -> None:
        """An attempt of ``label`` is on record elsewhere (``where``), or off it (None)."""
        record = self.record
        if record is None:
            return
        now = {k: v for k, v in record.placed.items() if k != label}
        if where is not None:
            now[label] = dict(where)
        if now != record.placed:
            self.note(placed=now)

    def end_flow(self, *, discard: bool = False) -> None:
        """Forget this flower's record (a start that was refused leaves no trace)."""
        if self.record is not None and discard:
            with contextlib.suppress(OSError):
                self.state.registry.remove(self.record.run)
            self.record = None

    def note(self, **fields: Any) -> None:
        """Update this flower's registry record (best-effort: status is not worth a crash).

        Fields that already hold these values are not written again (a step's start notes its
        attempt and session; the loop reports both once more)."""
        if self.record is None:
            return
        if fields and all(getattr(self.record, k) == v for k, v in fields.items()):
            return
        for k, v in fields.items():
            setattr(self.record, k, v)
        try:
            self.state.registry.write(self.record)
        except Exception:
            log.debug("registry write failed", exc_info=True)

    # -- running a step ---------------------------------------------------------------

    async def run(
        self,
        spec: AgentSpec,
        prompt: str,
        *,
        step_name: str | None = None,
        resume: str | None = None,
        fork: bool = False,
        resume_at: str | None = None,
        on_event: OnEvent | None = None,
        max_attempts: int | None = None,
        on_session: Callable[[str], None] | None = None,
        fresh_prompt: str | None = None,
        on_session_gone: Callable[[str], None] | None = None,
    ) -> StepResult:
        """Run one step to its result (one manifest row), retrying inside as seed 003 says.

        What holds for this call only travels with it (several calls may run at once, a
        map step's items): ``max_attempts`` caps its attempts below the Runtime's
        resilience (an ``idempotent=False`` step passes 1), and ``on_session`` is told each
        session id the instant it is known, in place of the Runtime's :attr:`on_session`.
        When the CLI cannot resume ``resume`` (it has no conversation for it), the step
        starts a fresh session with ``fresh_prompt`` (default: ``prompt``) and
        ``on_session_gone`` is told the refused id.
        """
        self._loop = asyncio.get_running_loop()
        label = step_name or spec.name
        left = self.left_placed.pop(label, None)
        call = StepCall(
            spec,
            prompt,
            label,
            resume,
            fork,
            resume_at,
            fresh=fresh_prompt,
            attach=str(left["id"]) if left else None,
        )
        self.note(step=call.label, session_id=call.resume, attempt=1)
        policy = self.resilience
        if max_attempts is not None:
            policy = replace(policy, max_attempts=max(1, min(max_attempts, policy.max_attempts)))

        def session_seen(sid: str) -> None:
            self._session_seen(sid, on_session or self.on_session)

        loop = StepLoop(
            call,
            placement=self.placement,
            seat=self.seat,
            resilience=policy,
            handoff=self.handoff,
            interrupts=self.interrupts,
            notes_dir=self.notes_dir,
            hooks=StepHooks(
                on_session=session_seen,
                on_attempt=self._attempt_began,
                on_gone=on_session_gone or _forget_nothing,
                on_placed=partial(self._placed, label),
            ),
            on_event=on_event,
            windows=self.windows,
        )
        self._flying.append(loop)
        self.in_flight = loop
        try:
            result = await loop.run()
        finally:
            self._flying.remove(loop)
            self.in_flight = self._flying[-1] if self._flying else None
        return self._finish(result, loop.versions)

    def prepare(self, calls: Sequence[StepCall]) -> None:
        """The first attempts of the steps likely to run next: a placement may get them
        ready ahead of time (see :mod:`.placement`). ``[]`` drops whatever was prepared.
        Each is given the handoff fields its first attempt will have."""
        ready = [c.attempting(**handoff_fields(c.spec, self.handoff, self.windows)) for c in calls]
        self.placement.prepare(ready, self.seat)

    async def drain(self) -> None:
        """Drop what the placement prepared and wait for what is still exiting."""
        await self.placement.close()

    def record_reused(self, result: StepResult, scope: str) -> StepResult:
        """A step reused instead of run (seed 004): its manifest row has ``cost_usd`` 0, a
        ``reused`` field (``"run-only"`` or ``"cross-run"``) and ``saved_usd``, what the
        result cost when it was made. Nothing was spent: it is not in :attr:`results`."""
        now = time.time()
        row = StepResult(
            step=result.step,
            session_id=result.session_id,
            ok=True,
            cost_usd=0.0,
            num_turns=0,
            text=result.text,
            started_at=now,
            ended_at=now,
            attempts=0,
            context=result.context,
        )
        self.left_placed.pop(result.step, None)
        self._placed(result.step, None)  # reused: nothing to attach to
        try:
            self.manifest.record(row, {"reused": scope, "saved_usd": round(result.cost_usd, 6)})
        except OSError as exc:
            log.warning(
                "%s",
                t("runtime.manifest_unwritten", path=self.manifest_path, error=exc),
            )
        return row

    def _finish(self, result: StepResult, versions: dict[str, str] | None = None) -> StepResult:
        """Record ``result`` as its manifest row; ``versions``: the SDK and CLI that ran its
        last attempt (``sdk``, ``cli``), so a difference between two runs shows."""
        result.ended_at = result.ended_at or time.time()
        self.results.append(result)
        try:
            self.manifest.record(result, dict(versions) if versions else None)
        except OSError as exc:
            log.warning(
                "%s",
                t("runtime.manifest_unwritten", path=self.manifest_path, error=exc),
            )
        # The row is written: the attempt that made it leaves the record (a later start
        # reuses the row instead of attaching to the attempt).
        self._placed(result.step, None)
        if self.on_result is not None:
            self.on_result(result)
        return result

    def _attempt_began(self, n: int) -> None:
        self.note(attempt=n)

    def _session_seen(self, sid: str, hook: Callable[[str], None] | None) -> None:
        """The instant a session id is known: the call's ``hook`` first (the Workflow writes
        lineage there: the hard-kill invariant), then the registry record ``status`` reads."""
        if hook is not None:
            try:
                hook(sid)
            except Exception:
                log.warning("%s", t("runtime.session_unrecorded", session=sid), exc_info=True)
        self.note(session_id=sid)

    def rescue(self) -> StepResult | None:
        """SIGTERM/SIGHUP: write the in-flight step as ``killed-by-signal`` (exactly once).

        Only small synchronous writes; the caller then stops the placement and dies.
        """
        flying = list(self._flying) or ([self.in_flight] if self.in_flight else [])
        self._flying.clear()
        self.in_flight = None
        last: StepResult | None = None
        for loop in flying:  # one row each (a map runs several items at once)
            res = loop.result
            res.ok, res.error = False, KILLED_BY_SIGNAL
            res.attempts = max(1, loop.attempt)
            res.context = loop.ctx or res.context
            res.ended_at = time.time()
            last = self._finish(res, loop.versions)
        return last

    # -- interrupts -------------------------------------------------------------------

    def interrupt(self, message: str | None = "") -> None:
        """Interrupt the current turn at a message boundary; callable from any thread.

        ``message`` is what the person says; the same session resumes with it (followed by
        :attr:`INTERRUPT_NOTE`). ``""`` interrupts without saying anything; None makes the
        loop wait for :meth:`reply` (the terminal asks for the sentence afterwards). Nothing
        happens when no step of this Runtime is running.
        """
        loop = self._loop
        if loop is None or loop.is_closed() or self.in_flight is None:
            return

        def deliver() -> None:
            task = loop.create_task(self.interrupts.request(message))
            self._interrupting.add(task)  # the loop keeps only a weak reference to a task
            task.add_done_callback(self._interrupting.discard)

        call_on(loop, deliver)

    async def request_interrupt(self, message: str | None = None) -> None:
        """:meth:`interrupt` from the Runtime's own loop, returning once it is delivered."""
        await self.interrupts.request(message)

    def reply(self, text: str | None) -> None:
        """What the person typed after an interrupt (None: nothing, just carry on)."""
        self.interrupts.reply(text)


def _forget_nothing(session_id: str) -> None:
    return None


def _workbench(value: Any, workspace: Path, run_dir: Path) -> Any:
    """``Runtime(workbench=)``: an instance as is, True → ``<run_dir>/workbench`` (outside
    the workspace), False/None → none. Its index is refreshed at once."""
    if value is None or value is False:
        return None
    from ..agents.workbench import Workbench

    wb = Workbench(workspace, home=run_dir / "workbench") if value is True else value
    if not isinstance(wb, Workbench):
        raise ConfigError(
            f"workbench must be True, False or a Workbench, not {type(value).__name__}",
            hint="Runtime(workbench=True) puts it at <run_dir>/workbench",
        )
    wb.ensure()
    wb.refresh()
    return wb


def _policy(value: Any, cls: type) -> Any:
    if value is True:
        return cls()
    if value is False or value is None:
        return cls(enabled=False)
    return value
