"""The attempt loop inside ``Runtime.run`` (seed 003): four exits.

1. success → done;
2. a person interrupted → resume the same session with what they said + INTERRUPT_NOTE
   (no attempt used, no network wait);
3. the context is full → the same session writes a handoff, a fresh session continues with
   it (no attempt used; at most ``max_generations`` times);
4. a retryable failure → wait for the network, back off, resume the same session with the
   neutral resume prompt (one attempt used).

An interrupt that arrives while no CLI runs (during a backoff, or while the handoff is being
written) ends the wait at once; what the person said goes with the next attempt's prompt.
The same code runs in-process and in a supervisor's step child.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..docs.handoff import HANDOFF_PROMPT, Handoff, degraded, is_overflow
from .result import Event, StepResult

if TYPE_CHECKING:
    from .agent import AgentSpec
    from .runtime import OnEvent, Runtime

ONLINE, OFFLINE, INTERRUPTED = "online", "offline", "interrupted"


@dataclass
class Course:
    """What the next attempt sends, and which session it continues.

    ``seen`` is the session this step's attempts have been writing to (None until an attempt
    reports one, and again right after a handoff). Only a seen session is resumed after a
    failure: before that, the failed request is simply made again (a fork is forked again,
    never resumed in the parent it was meant to leave alone).
    """

    prompt: str
    resume: str | None
    fork: bool
    at: str | None = None
    seen: str | None = None

    def carry_on(self, prompt: str) -> None:
        """Continue the seen session with ``prompt``."""
        self.prompt, self.resume, self.fork, self.at = prompt, self.seen, False, None

    def fresh(self, prompt: str) -> None:
        """Start a new session with ``prompt`` (a handoff's successor)."""
        self.prompt, self.resume, self.fork, self.at, self.seen = prompt, None, False, None, None


async def execute(
    rt: Runtime,
    spec: AgentSpec,
    prompt: str,
    *,
    label: str,
    resume: str | None,
    fork: bool,
    resume_at: str | None,
    on_event: OnEvent | None,
) -> StepResult:
    """Run one step to its result: attempts until success or a reason to stop."""
    res = StepResult(step=label, session_id=resume, started_at=time.time())
    rt._ctx, rt._warned = 0, False
    course = Course(prompt, resume, fork, resume_at)
    attempt = 0
    while True:
        attempt += 1
        if rt._interrupted:  # arrived while no CLI was running
            course.prompt = f"{course.prompt}\n\n{await _words(rt)}"
        out = await rt._attempt(
            spec,
            course.prompt,
            label=label,
            resume=course.resume,
            fork=course.fork,
            resume_at=course.at,
            on_event=on_event,
        )
        _merge(res, out)
        course.seen = out.session_id or course.seen
        if out.ok:
            break
        if out.error == rt.INTERRUPTED:
            if not await _heard(rt, course):
                break
            attempt -= 1  # an interrupt is not a failed attempt
        elif _handoff_due(rt, course, out):
            if not await _next_generation(rt, spec, label, res, prompt, out, course, on_event):
                break
            attempt -= 1  # neither is a handoff
        else:
            res.errors.append(out.error or "unknown error")
            if not await _retry(rt, label, attempt, res, out, course, on_event):
                break
    res.attempts = max(1, attempt)
    res.context = rt._ctx
    res.ended_at = time.time()
    return res


def _merge(res: StepResult, out: StepResult) -> None:
    """Fold one attempt into the step's result."""
    if out.session_id:
        res.session_id = out.session_id
    res.cost_usd += out.cost_usd
    res.num_turns += out.num_turns
    res.ok, res.error = out.ok, out.error
    if out.ok:
        res.text = out.text


# --- exit 2: a person interrupted ---------------------------------------------------------


async def _words(rt: Runtime) -> str:
    """What the person said (waiting for it if need be), with INTERRUPT_NOTE after it."""
    said = await rt.take_interrupt_text()
    return f"{said}\n\n{rt.INTERRUPT_NOTE}" if said else rt.INTERRUPT_NOTE


async def _heard(rt: Runtime, course: Course) -> bool:
    """Resume the same session with the person's words; False without a session to resume."""
    words = await _words(rt)
    if not course.seen:
        return False
    course.carry_on(words)
    return True


# --- exit 3: the context is full ----------------------------------------------------------


def _handoff_due(rt: Runtime, course: Course, out: StepResult) -> bool:
    if out.error == rt.HANDOFF_DUE:
        return True
    return bool(rt.handoff.enabled and course.seen and out.error and is_overflow(out.error))


async def _next_generation(
    rt: Runtime,
    spec: AgentSpec,
    label: str,
    res: StepResult,
    task: str,
    out: StepResult,
    course: Course,
    on_event: OnEvent | None,
) -> bool:
    """Retire the full session for a fresh one carrying its handoff; False past the limit."""
    step = _step_of(label)
    if len(res.retired) >= rt.handoff.max_generations:
        res.error = _too_many_generations(rt, step, len(res.retired))
        return False
    old = course.seen
    assert old is not None  # _handoff_due holds only for a seen session
    h = await _hand_off(rt, spec, label, old, res, task, out, on_event)
    res.retired.append(old)
    course.fresh(h.prompt_block())
    rt._ctx, rt._warned = 0, False
    return True


def _step_of(label: str) -> str:
    """The step a label belongs to (``干活#round2`` → ``干活``): handoffs are per step."""
    return label.split("#")[0]


def _too_many_generations(rt: Runtime, step: str, n: int) -> str:
    where = rt.notes_dir / f"交接-{step}.md" if rt.notes_dir else None
    last = f"最近一份交接书在 {where}" if where and where.exists() else "交接书没有落盘"
    return (
        f"上下文已换代 {n} 次仍未做完(max_generations={rt.handoff.max_generations}),"
        f"停下来等人看一眼:{last}"
    )


async def _hand_off(
    rt: Runtime,
    spec: AgentSpec,
    label: str,
    old: str,
    res: StepResult,
    task: str,
    out: StepResult,
    on_event: OnEvent | None,
) -> Handoff:
    """Have the full session write its handoff (or make a degraded one), save it, report it."""
    step = _step_of(label)
    if on_event:
        on_event(Event("handoff", label, {"phase": "writing", "used": rt._ctx}))
    h: Handoff | None = None
    if out.error == rt.HANDOFF_DUE:
        h, why = await _ask_for_handoff(rt, spec, label, old, res)
    else:
        why = out.error or ""  # the API refused the prompt: the session cannot write one
    was_degraded = h is None
    if h is None:
        h = degraded(step, task, why=why)
    h.step = step
    path = _save(rt, h, step)
    if on_event:
        payload: dict[str, Any] = {
            "phase": "done",
            "degraded": was_degraded,
            "path": str(path) if path else None,
            "sections": [
                k for k in ("doing", "decided", "deadends", "next", "scene") if getattr(h, k)
            ],
        }
        on_event(Event("handoff", label, payload))
    return h


async def _ask_for_handoff(
    rt: Runtime, spec: AgentSpec, label: str, old: str, res: StepResult
) -> tuple[Handoff | None, str]:
    """Send HANDOFF_PROMPT to the full session: budget lifted, no UI events, no context watch."""
    prompt = HANDOFF_PROMPT.format(used=rt._ctx, window=rt.handoff.window)
    out = await rt._attempt(
        rt.budget_lifted(spec),
        prompt,
        label=label,
        resume=old,
        fork=False,
        resume_at=None,
        on_event=None,
        watch_context=False,
    )
    res.cost_usd += out.cost_usd
    res.num_turns += out.num_turns
    if not out.ok:
        return None, out.error or "handoff turn failed"
    h = Handoff.parse(out.text)
    if not h.complete():
        return None, "交接书缺了必填段:" + "、".join(h.missing())
    return h, ""


def _save(rt: Runtime, h: Handoff, step: str) -> Path | None:
    """``<notes>/交接-<step>.md`` (the previous one archived); nowhere without a workbench."""
    notes = rt.notes_dir
    if notes is None:
        return None
    path = notes / f"交接-{step}.md"
    try:
        return h.write(path)
    except OSError:
        return None


# --- exit 4: a retryable failure ----------------------------------------------------------


async def _retry(
    rt: Runtime,
    label: str,
    attempt: int,
    res: StepResult,
    out: StepResult,
    course: Course,
    on_event: OnEvent | None,
) -> bool:
    """Wait and set up the next attempt; False when this failure ends the step."""
    policy = rt.resilience
    error = out.error or ""
    if not policy.enabled or attempt >= policy.max_attempts or not policy.should_retry(error):
        return False
    if await _back_off(rt, label, attempt, error, on_event) == OFFLINE:
        res.error = f"{error}\n(等了 {policy.max_offline_wait:.0f} 秒网络仍不通,停下)"
        return False
    if course.seen:
        course.carry_on(policy.resume_prompt)
        res.resumed = True
    return True


async def _back_off(
    rt: Runtime, label: str, attempt: int, error: str, on_event: OnEvent | None
) -> str:
    """Wait for the network, then the backoff delay: ONLINE, OFFLINE, or INTERRUPTED early."""
    policy = rt.resilience
    delay = policy.delay_for(attempt)
    if on_event:
        payload = {"attempt": attempt, "delay": round(delay, 1), "kind": policy.classify(error)}
        on_event(Event("retry", label, payload))

    def offline(elapsed: float) -> None:  # one event per failed probe: the terminal shows the wait
        if on_event:
            on_event(
                Event(
                    "offline", label, {"elapsed": round(elapsed), "interval": policy.probe_interval}
                )
            )

    async def wait() -> bool:
        if not await policy.wait_online(on_wait=offline):
            return False
        await asyncio.sleep(delay)
        return True

    return await _unless_interrupted(rt, wait())


class _Waiting:
    """Stands in for the CLI client while the loop waits, so an interrupt ends the wait."""

    def __init__(self) -> None:
        self.woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def interrupt(self) -> None:
        if not self.woken.done():
            self.woken.set_result(None)


async def _unless_interrupted(rt: Runtime, wait: Awaitable[bool]) -> str:
    waiting = _Waiting()
    task = asyncio.ensure_future(wait)
    rt._set_client(waiting)  # delivers an interrupt that is already pending, too
    try:
        done, _ = await asyncio.wait({task, waiting.woken}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        rt._set_client(None)
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task in done:
        return ONLINE if task.result() else OFFLINE
    return INTERRUPTED
