"""SupervisedRuntime: the Runtime whose steps each run in a forked child process.

Everything a step does inside (the SDK, retries of API errors, interrupts, handoffs) runs in
the child through the very same loop as in-process use (``flower.core.loop``). What lives
here is what only the parent can do: write lineage the instant a child reports a session,
write the manifest row, and treat a child that dies without a result (OOM, kill -9) as a
failed attempt that a new child resumes, with backoff, up to the resilience attempt limit.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from flower.core.agent import AgentSpec
from flower.core.fsutil import private_dir
from flower.core.result import Event, StepResult
from flower.core.runtime import OnEvent, Runtime
from ipc import (
    Answer,
    Ask,
    EventMsg,
    Failure,
    Hello,
    Interrupt,
    ProtocolError,
    Result,
    Session,
    Start,
)
from stepproc.proctree import kill_group, reap_orphans
from stepproc.spawn import ChildHandle, describe_status, spawn

log = logging.getLogger("flower.supervisor")

KILLED_BY_SIGNAL = "killed-by-signal"

AskPerson = Callable[[Ask], Awaitable[str | None]]


class SupervisedRuntime(Runtime):
    """A Runtime for the supervisor process: one child per step attempt."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.children: dict[int, ChildHandle] = {}
        self.in_flight: StepResult | None = None
        self.current: ChildHandle | None = None  # the child whose result is awaited
        self.ask_person: AskPerson | None = None
        self._reapers: set[asyncio.Task[int]] = set()
        self._closing: dict[str, asyncio.Task[int]] = {}  # session id -> its child's reaper

    # -- one step through children ----------------------------------------------------

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
        res = StepResult(step=label, session_id=resume, started_at=time.time(), attempts=0)
        self.in_flight = res
        start = Start(
            label=label,
            step=label.split("#")[0],
            prompt=prompt,
            spec=spec.name,
            resume=resume,
            fork=fork,
            resume_at=resume_at,
            attempt=1,
        )
        try:
            await self._children_until_result(spec, start, res, on_event)
        finally:
            self.in_flight = None
        res.ended_at = time.time()
        return res

    async def _children_until_result(
        self, spec: AgentSpec, start: Start, res: StepResult, on_event: OnEvent | None
    ) -> None:
        deaths = 0
        while True:
            out, death = await self._one_child(spec, start, res, on_event)
            if out is not None:
                _fold_child_result(res, out)
                return
            deaths += 1
            res.attempts += 1
            res.errors.append(death)
            res.ok, res.error = False, death
            if not self.resilience.enabled or res.attempts >= self.resilience.max_attempts:
                return
            delay = self.resilience.delay_for(deaths)
            if on_event:
                on_event(
                    Event(
                        "retry",
                        start.label,
                        {
                            "attempt": res.attempts,
                            "delay": round(delay, 1),
                            "kind": "child-died",
                            "error": death,
                        },
                    )
                )
            await asyncio.sleep(delay)
            if res.session_id:
                res.resumed = True
                start = Start(
                    label=start.label,
                    step=start.step,
                    prompt=self.resilience.resume_prompt,
                    spec=start.spec,
                    resume=res.session_id,
                    fork=False,
                    resume_at=None,
                    attempt=res.attempts + 1,
                )

    async def _one_child(
        self, spec: AgentSpec, start: Start, res: StepResult, on_event: OnEvent | None
    ) -> tuple[StepResult | None, str]:
        """Run one child to its result: (its result, "") or (None, why it gave none)."""
        if start.resume and start.resume in self._closing:
            # That session's CLI (of a child that already reported) is still shutting down,
            # flushing its last entries: resume only once they are all in sessions.db.
            await asyncio.shield(self._closing[start.resume])
        child = self._spawn(spec, start.label)
        self.current = child
        self.note(attempt=res.attempts + 1)
        out: StepResult | None = None
        problem = ""
        try:
            if not child.send(start):
                child.stop()
                status = await self._reap(child)
                return (
                    None,
                    f"could not hand the step to child {child.pid} ({describe_status(status)} before reading it)",
                )
            async for item in child.messages():
                if isinstance(item, ProtocolError):
                    problem = f"protocol error from step child: {item}"
                    child.stop()
                    break
                got = await self._dispatch(child, item, res, on_event)
                if isinstance(got, StepResult):
                    out = got
                    break  # the child now closes its CLI and exits; see _reap_later
                if isinstance(got, str):
                    problem = got
        except BaseException:
            self._retire(child)
            raise
        finally:
            self.current = None
        if out is not None:
            self._reap_later(child, out.session_id)
            return out, ""
        status = await self._reap(child)
        return (
            None,
            problem or f"step child {child.pid} died without a result ({describe_status(status)})",
        )

    def _reap_later(self, child: ChildHandle, session_id: str | None) -> None:
        """The flow goes on at once while the child shuts its CLI down and exits; until it
        has, its session counts as closing (see the wait at the top of _one_child)."""
        task = asyncio.get_running_loop().create_task(self._reap(child))
        self._reapers.add(task)
        task.add_done_callback(self._reapers.discard)
        if session_id:
            self._closing[session_id] = task
            task.add_done_callback(
                lambda t: (
                    self._closing.pop(session_id, None)
                    if self._closing.get(session_id) is t
                    else None
                )
            )

    async def _reap(self, child: ChildHandle) -> int:
        try:
            return await child.wait()
        finally:
            self._retire(child)

    async def drain(self) -> None:
        """Wait for children that already reported to finish exiting."""
        while self._reapers:
            await asyncio.gather(*list(self._reapers), return_exceptions=True)

    def _retire(self, child: ChildHandle) -> None:
        self._forget(child)
        self._sweep(child)

    async def _dispatch(
        self, child: ChildHandle, item: Any, res: StepResult, on_event: OnEvent | None
    ) -> Any:
        if isinstance(item, Session):
            res.session_id = item.session_id
            self._session_seen(item.session_id)
        elif isinstance(item, EventMsg):
            if on_event:
                on_event(Event(item.kind, item.step, dict(item.payload)))
        elif isinstance(item, Ask):
            text = await self.ask_person(item) if self.ask_person else None
            child.send(
                Answer(id=item.id, state="answered" if text is not None else "closed", text=text)
            )
        elif isinstance(item, Result):
            return StepResult.from_dict(item.fields)
        elif isinstance(item, Failure):
            return f"step child failed: {item.kind}: {item.message}"
        elif not isinstance(item, Hello):
            return f"unexpected message from step child: {type(item).__name__}"
        return None

    def _spawn(self, spec: AgentSpec, label: str) -> ChildHandle:
        logs = private_dir(self.run_dir / "logs" / self.run_id)
        log_path = logs / f"{_safe(label)}.log"
        others = tuple(fd for c in self.children.values() for fd in c.parent_fds)
        child = spawn(self, spec, log_path, close_fds=others)
        self.children[child.pid] = child
        return child

    def _forget(self, child: ChildHandle) -> None:
        self.children.pop(child.pid, None)
        child.close()

    def _sweep(self, child: ChildHandle) -> None:
        """Whatever the child left behind dies too: its process group (the CLI, tool
        shells) and any orphan re-parented to us, the subreaper, gets killed and reaped."""
        kill_group(child.pid)
        reap_orphans(keep=set(self.children))

    # -- what the supervisor's signal handlers need -----------------------------------

    async def interrupt_child(self) -> bool:
        """Ctrl-C once: ask the in-flight child to stop at a message boundary.

        Only that child: one that already reported and is shutting its CLI down has
        nothing left to interrupt."""
        return self.current is not None and self.current.send(Interrupt(text=None))

    def answer_interrupt(self, text: str | None) -> None:
        if self.current is not None:
            self.current.send(
                Answer(
                    id="interrupt", state="answered" if text is not None else "closed", text=text
                )
            )

    def rescue(self) -> StepResult | None:
        """SIGTERM/SIGHUP: write the in-flight step as ``killed-by-signal`` (exactly once)."""
        res = self.in_flight
        self.in_flight = None
        if res is None:
            return None
        res.ok = False
        res.error = KILLED_BY_SIGNAL
        res.attempts = max(1, res.attempts + 1)
        res.ended_at = time.time()
        return self._finish(res)

    def stop_children(self) -> None:
        """Stop every child and its whole tree (blocking, bounded)."""
        for child in list(self.children.values()):
            child.stop()
            self._forget(child)


def _fold_child_result(res: StepResult, out: StepResult) -> None:
    """The last child's result, with the deaths before it counted in."""
    res.session_id = out.session_id or res.session_id
    res.ok, res.error, res.text = out.ok, out.error, out.text
    res.cost_usd += out.cost_usd
    res.num_turns += out.num_turns
    res.attempts += out.attempts
    res.errors.extend(out.errors)
    res.resumed = res.resumed or out.resumed
    res.retired.extend(out.retired)
    res.context = out.context


def _safe(label: str) -> str:
    return "".join(c if c not in "/\\\0" else "_" for c in label)
