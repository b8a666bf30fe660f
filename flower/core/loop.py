"""The attempt loop inside ``Runtime.run`` (seed 003): four exits.

1. success → done;
2. a person interrupted → resume the same session with what they said + INTERRUPT_NOTE
   (no attempt used, no network wait);
3. the context is full → the same session writes a handoff, a fresh session continues with
   it (no attempt used; at most ``max_generations`` times);
4. a retryable failure → wait for the network, back off, resume the same session with the
   neutral resume prompt (one attempt used).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from ..docs.handoff import HANDOFF_PROMPT, Handoff, degraded, is_overflow
from .result import Event, StepResult

if TYPE_CHECKING:
    from .agent import AgentSpec
    from .runtime import OnEvent, Runtime


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
    res = StepResult(step=label, session_id=resume, started_at=time.time())
    rt._ctx, rt._warned = 0, False
    cur_prompt, cur_resume, cur_fork, cur_at = prompt, resume, fork, resume_at
    attempt = 0
    while True:
        attempt += 1
        out = await rt._attempt(
            spec, cur_prompt, label=label, resume=cur_resume, fork=cur_fork, resume_at=cur_at, on_event=on_event
        )
        _merge(res, out)
        cur_at = None
        if out.ok:
            break
        if out.error == rt.INTERRUPTED:
            if not res.session_id:
                break
            said = await rt.take_interrupt_text()
            cur_prompt = f"{said}\n\n{rt.INTERRUPT_NOTE}" if said else rt.INTERRUPT_NOTE
            cur_resume, cur_fork = res.session_id, False
            attempt -= 1
            continue
        if _handoff_due(rt, res, out):
            if len(res.retired) >= rt.handoff.max_generations:
                res.error = (
                    f"上下文已换代 {len(res.retired)} 次仍未做完(max_generations="
                    f"{rt.handoff.max_generations}),停下来等人看一眼:交接书在 notes/交接-{label}.md"
                )
                break
            h = await _hand_off(rt, spec, label, res, prompt, out, on_event)
            res.retired.append(res.session_id)  # type: ignore[arg-type]
            cur_prompt, cur_resume, cur_fork = h.prompt_block(), None, False
            rt._ctx, rt._warned = 0, False
            attempt -= 1
            continue
        res.errors.append(out.error or "unknown error")
        if not rt.resilience.enabled or attempt >= rt.resilience.max_attempts:
            break
        if not rt.resilience.should_retry(out.error or ""):
            break
        await _back_off(rt, label, attempt, out.error or "", on_event)
        if res.session_id:
            cur_prompt, cur_resume, cur_fork = rt.resilience.resume_prompt, res.session_id, False
            res.resumed = True
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


def _handoff_due(rt: Runtime, res: StepResult, out: StepResult) -> bool:
    if out.error == rt.HANDOFF_DUE:
        return True
    return bool(rt.handoff.enabled and res.session_id and out.error and is_overflow(out.error))


async def _back_off(rt: Runtime, label: str, attempt: int, error: str, on_event: OnEvent | None) -> None:
    delay = rt.resilience.delay_for(attempt)
    if on_event:
        on_event(Event("retry", label, {"attempt": attempt, "delay": round(delay, 1), "kind": rt.resilience.classify(error)}))
    await rt.resilience.wait_online()
    await asyncio.sleep(delay)


async def _hand_off(
    rt: Runtime,
    spec: AgentSpec,
    label: str,
    res: StepResult,
    task: str,
    out: StepResult,
    on_event: OnEvent | None,
) -> Handoff:
    """Have the full session write its handoff (or make a degraded one), save it, report it."""
    step = label.split("#")[0]
    if on_event:
        on_event(Event("handoff", label, {"phase": "writing", "used": rt._ctx}))
    h: Handoff | None = None
    why = ""
    if out.error == rt.HANDOFF_DUE and res.session_id:
        h, why = await _ask_for_handoff(rt, spec, label, res)
    else:
        why = out.error or ""
    degraded_ = h is None
    if h is None:
        h = degraded(step, task, why=why)
    h.step = step
    path = _save(rt, h, step)
    if on_event:
        payload: dict[str, Any] = {
            "phase": "done",
            "degraded": degraded_,
            "path": str(path) if path else None,
            "sections": [k for k in ("doing", "decided", "deadends", "next", "scene") if getattr(h, k)],
        }
        on_event(Event("handoff", label, payload))
    return h


async def _ask_for_handoff(rt: Runtime, spec: AgentSpec, label: str, res: StepResult) -> tuple[Handoff | None, str]:
    """Send HANDOFF_PROMPT to the same session: budget lifted, no UI events, no context watch."""
    prompt = HANDOFF_PROMPT.format(used=rt._ctx, window=rt.handoff.window)
    out = await rt._attempt(
        rt.budget_lifted(spec),
        prompt,
        label=label,
        resume=res.session_id,
        fork=False,
        resume_at=None,
        on_event=None,
        watch_context=False,
    )
    res.cost_usd += out.cost_usd
    if not out.ok:
        return None, out.error or "handoff turn failed"
    h = Handoff.parse(out.text)
    if not h.complete():
        return None, "交接书缺了必填段:" + "、".join(h.missing())
    return h, ""


def _save(rt: Runtime, h: Handoff, step: str) -> Any:
    notes = rt.notes_dir
    if notes is None:
        return None
    path = notes / f"交接-{step}.md"
    try:
        h.write(path)
    except OSError:
        return None
    return path
