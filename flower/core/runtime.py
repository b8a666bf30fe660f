"""Runtime: the one verb that runs a step (seed 003, 运行时).

``Runtime.run`` owns everything that happens inside one step: retries of transient API
errors that resume the same session, cooperative interrupts, and handoffs when the context
fills up. One ``run`` call is one manifest row.

The supervisor path reuses this class: ``supervisor.runtime.SupervisedRuntime`` overrides
``_execute`` to run the same loop in a forked step child; ``run`` itself (bookkeeping,
manifest) is shared, so both paths write identical rows.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from .agent import AgentSpec, build_options
from .attempt import AttemptState, AttemptWatch, run_attempt
from .credentials import check_credentials, load_dotenv
from .lineage import Lineage
from .manifest import Manifest
from .registry import FlowerRecord, Registry, new_run_id, process_started
from .resilience import Resilience
from .result import Event, StepResult
from .window import HandoffPolicy

log = logging.getLogger("flower")

OnEvent = Callable[[Event], None]


class Runtime:
    """Holds the workspace, the session store and the policies; runs steps."""

    INTERRUPTED = "interrupted-by-human"
    HANDOFF_DUE = "context-full-handoff"
    INTERRUPT_NOTE = (
        "(这是人在运行中按 Ctrl-C 打断后说的话。当时在飞的工具调用如果返回 interrupted,"
        "那是打断的正常副作用,不是环境故障,不用排查;按这句话调整,然后接着做。)"
    )

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
    ) -> None:
        self.workspace = Path(workspace).expanduser().resolve()
        self.run_dir = Path(run_dir).expanduser().absolute()
        self.portable = portable
        self.trim, self.ephemeral, self.keep_denials = trim, ephemeral, keep_denials
        self.workbench = workbench
        self.spill_threshold = spill_threshold
        self.resilience = _policy(resilience, Resilience)
        self.handoff = _policy(handoff, HandoffPolicy)
        self.run_id = new_run_id()
        self.results: list[StepResult] = []
        self.on_session: Callable[[str], None] | None = None
        self.store = self._make_store()
        self.record: FlowerRecord | None = None
        self._manifest: Manifest | None = None
        self._deferred: list[Any] | None = None  # closers of CLIs that answered (see defer_closing)
        self._client: Any = None
        self._interrupt_text: str | None = None
        self._interrupted = False
        self._reply: asyncio.Future[str | None] | None = None
        self._handoff_due = False
        self._ctx, self._warned = 0, False
        load_dotenv(self.workspace, Path.cwd())
        check_credentials()

    # -- stores and files -------------------------------------------------------------

    def _make_store(self) -> Any:
        from ..stores import open_store

        return open_store(self)

    @property
    def notes_dir(self) -> Path | None:
        """Where handoffs land: the workbench's notes/, or nowhere without a workbench."""
        return self.workspace / ".flower" / "notes" if self.workbench else None

    def has_session(self, session_id: str) -> bool:
        """Is ``session_id`` a transcript of this workspace in sessions.db?"""
        from claude_agent_sdk import project_key_for_directory

        try:
            return self.store.has_session(session_id, project_key_for_directory(self.workspace))
        except Exception:  # noqa: BLE001 - an unreadable store means "start fresh"
            log.debug("has_session(%s) failed", session_id, exc_info=True)
            return False

    def session_context(self, session_id: str) -> int:
        """The context size of ``session_id``'s last main-thread turn, read from sessions.db."""
        from claude_agent_sdk import project_key_for_directory

        from .attempt import context_of

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
        return Lineage(
            self.run_dir, self.workspace, has_session=self.has_session, run_id=self.run_id
        )

    @property
    def manifest(self) -> Manifest:
        if self._manifest is None or self._manifest.run_id != self.run_id:
            self._manifest = Manifest(self.run_dir, self.run_id)
        return self._manifest

    def close(self) -> None:
        """Close the stores (the only cleanup a double Ctrl-C still does)."""
        close = getattr(self.store, "close", None)
        if close:
            close()

    # -- the flower's registry record -------------------------------------------------

    def begin_flow(self, flow: str, steps: list[str], *, command: list[str] | None = None) -> None:
        import os

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
        )
        self.note()

    def end_flow(self, *, discard: bool = False) -> None:
        """Forget this flower's record (a start that was refused leaves no trace)."""
        if self.record is not None and discard:
            try:
                Registry(self.run_dir).path_for(self.record.run).unlink()
            except OSError:
                pass
            self.record = None

    def note(self, **fields: Any) -> None:
        """Update this flower's registry record (best-effort: status is not worth a crash)."""
        if self.record is None:
            return
        for k, v in fields.items():
            setattr(self.record, k, v)
        try:
            Registry(self.run_dir).write(self.record)
        except OSError:
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
    ) -> StepResult:
        """Run one step to its result (one manifest row), retrying inside as seed 003 says."""
        label = step_name or spec.name
        self.note(step=label, session_id=resume, attempt=1)
        result = await self._execute(
            spec,
            prompt,
            label=label,
            resume=resume,
            fork=fork,
            resume_at=resume_at,
            on_event=on_event,
        )
        return self._finish(result)

    def _finish(self, result: StepResult) -> StepResult:
        result.ended_at = result.ended_at or time.time()
        self.results.append(result)
        try:
            self.manifest.record(result)
        except OSError as exc:
            log.warning("could not write %s: %s", self.run_dir / "manifest.json", exc)
        return result

    def _session_seen(self, sid: str) -> None:
        """The instant a session id is known: lineage first (the hard-kill invariant)."""
        self.note(session_id=sid)
        if self.on_session is not None:
            try:
                self.on_session(sid)
            except Exception:  # noqa: BLE001 - continuity must never stop the work
                log.debug("on_session failed", exc_info=True)

    async def _execute(
        self,
        spec: AgentSpec,
        prompt: str,
        *,
        label: str,
        resume: str | None,
        fork: bool,
        resume_at: str | None,
        on_event: OnEvent | None,
    ) -> StepResult:
        """The attempt loop of seed 003's Runtime.run, with its four exits."""
        from . import loop

        return await loop.execute(
            self,
            spec,
            prompt,
            label=label,
            resume=resume,
            fork=fork,
            resume_at=resume_at,
            on_event=on_event,
        )

    async def _attempt(
        self,
        spec: AgentSpec,
        prompt: str,
        *,
        label: str,
        resume: str | None,
        fork: bool,
        resume_at: str | None,
        on_event: OnEvent | None,
        watch_context: bool = True,
    ) -> StepResult:
        """One SDK session run to its result.

        An interrupt pending from before the attempt is not cleared here: the loop hands it
        on (``take_interrupt_text``) with the next prompt.
        """
        self._handoff_due = False
        watch = AttemptWatch(
            on_session=self._session_seen,
            on_event=on_event,
            on_context=(lambda used, final: self._context_seen(label, used, final, on_event))
            if watch_context
            else None,
        )
        options = build_options(
            spec,
            cwd=self.workspace,
            session_store=self.store,
            resume=resume,
            fork=fork,
            resume_at=resume_at,
            portable=self.portable,
        )
        state = AttemptState(label, watch)
        await self.close_deferred()  # the session may be the one a deferred CLI still holds
        result = await run_attempt(
            options, prompt, state, on_client=self._set_client, defer_close=self._deferred
        )
        if self._interrupted:
            result.ok, result.error = False, self.INTERRUPTED
        elif self._handoff_due and not result.ok:
            result.error = self.HANDOFF_DUE
        return result

    def defer_closing(self) -> None:
        """Let a successful attempt's CLI shut down after the result is out (step children
        report first, then close; :meth:`close_deferred` finishes the job)."""
        self._deferred = []

    async def close_deferred(self) -> None:
        while self._deferred:
            await self._deferred.pop(0)()

    def _set_client(self, client: Any) -> None:
        self._client = client
        if client is not None and self._interrupted:
            # An interrupt that arrived while the CLI was starting: deliver it now.
            asyncio.get_running_loop().create_task(client.interrupt())

    def _context_seen(self, label: str, used: int, final: bool, on_event: OnEvent | None) -> bool:
        """Track the context per turn; True asks the attempt to stop for a handoff."""
        self._ctx = used
        if on_event:
            on_event(Event("context", label, {"used": used, "window": self.handoff.window}))
        if not self.handoff.enabled:
            return False
        if used >= self.handoff.warn_at and not self._warned:
            self._warned = True
            if on_event:
                on_event(
                    Event(
                        "handoff",
                        label,
                        {"phase": "near", "used": used, "window": self.handoff.window},
                    )
                )
        if used >= self.handoff.at and not final:
            self._handoff_due = True
            return True
        return False

    # -- interrupts -------------------------------------------------------------------

    async def interrupt(self, text: str | None = None) -> None:
        """Cooperative interrupt at a message boundary (Ctrl-C once).

        ``text`` is what the person said; when None the loop waits for :meth:`reply`.
        """
        self._interrupted = True
        self._interrupt_text = text
        if text is None and self._reply is None:  # else: the reply came first, keep it
            self._reply = asyncio.get_running_loop().create_future()
        if self._client is not None:
            try:
                await self._client.interrupt()
            except Exception:  # the turn may have just ended
                log.debug("interrupt failed", exc_info=True)

    def reply(self, text: str | None) -> None:
        """What the person typed after an interrupt (None: nothing, just carry on).

        It may arrive before the interrupt itself has run (the step child reads both off its
        pipe at once and only schedules the interrupt); it is then kept for it.
        """
        if self._reply is None:
            self._reply = asyncio.get_running_loop().create_future()
        if not self._reply.done():
            self._reply.set_result(text)

    async def take_interrupt_text(self, timeout: float = 600.0) -> str | None:
        """Consume the pending interrupt: what the person said (waiting for :meth:`reply`)."""
        self._interrupted = False
        if self._reply is None:
            text, self._interrupt_text = self._interrupt_text, None
            return text
        try:
            return await asyncio.wait_for(self._reply, timeout)
        except TimeoutError:
            return None
        finally:
            self._reply = None

    def budget_lifted(self, spec: AgentSpec) -> AgentSpec:
        return replace(spec, max_budget_usd=None)


def _policy(value: Any, cls: type) -> Any:
    if value is True:
        return cls()
    if value is False or value is None:
        return cls(enabled=False)
    return value
