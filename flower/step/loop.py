"""The step loop: one step run to its result, above whichever placement runs its attempts.

Four exits (seed 003, ``Runtime.run``):

1. success → done;
2. a person interrupted → resume the same session with what they said + INTERRUPT_NOTE
   (no attempt used, no network wait);
3. the context is full → the same session writes a handoff, a fresh session continues with
   it (no attempt used; at most ``max_generations`` times);
4. a retryable failure → wait for the network, back off, resume the same session with the
   neutral resume prompt (one attempt used). Attempts are counted by tenacity, once, for
   every placement: a step child that dies is one more failed attempt, like a 529.

A session the CLI refuses to resume ("No conversation found") is started afresh with the
step's own prompt (no attempt used, once per session); any other failure of the CLI on this
machine before a request (``classify`` → ``"local"``) is not retried: waiting for the
network cannot mend it.

A crash (:class:`~flower.AttemptCrash`: a bug in flower, a spec the SDK rejects) stops the
step at once: no retry, no network probe. An interrupt that arrives while no attempt runs
(during a backoff, or while a handoff is written) ends the wait at once; what the person said
goes with the next attempt's prompt.

The loop owns no process and touches no file but the handoff note: it gets its placement,
policies, interrupts and callbacks from ``Runtime.run``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tenacity

from .._errors import AttemptCrash
from ..docs.handoff import HANDOFF_PROMPT, Handoff, degraded
from ..i18n import define, t
from ..state.result import HANDOFF_DUE, INTERRUPTED, Event, StepResult
from ..util.fsutil import inside
from ..util.overflow import is_overflow
from .attempt import Window, crash_of, handoff_at
from .call import StepCall
from .interrupts import Interrupts
from .placement import Placement, Seat, Watch, write_crash_log
from .resilience import Resilience, gone_session_id, session_gone
from .window import HandoffPolicy, is_guess

OnEvent = Callable[[Event], None]
log = logging.getLogger("flower")

define(
    {
        "loop.handoff_unsaved": (
            "{step} 的交接没能存到 {path}:{error}",
            "could not save the handoff of {step} to {path}: {error}",
        ),
    }
)

INTERRUPT_NOTE = (
    "(这是人在运行中按 Ctrl-C 打断后说的话。当时在飞的工具调用如果返回 interrupted,"
    "那是打断的正常副作用,不是环境故障,不用排查;按这句话调整,然后接着做。)"
)


def model_key(spec: Any) -> str:
    """What a learned window is kept under: the model the spec's CLI will use (its
    ``model``, else the model variables of its ``env``; "" for the CLI's default)."""
    env = spec.env or {}
    names = (spec.model, env.get("ANTHROPIC_MODEL"), env.get("ANTHROPIC_DEFAULT_OPUS_MODEL"))
    return "|".join(str(n or "") for n in names)


def handoff_at_for(window: Window, policy: HandoffPolicy) -> int:
    return handoff_at(window.window, policy.headroom, window.compact_at)


def handoff_fields(spec: Any, policy: HandoffPolicy, windows: dict[str, Window]) -> dict[str, Any]:
    """``stop_at`` and ``headroom`` for an attempt of ``spec`` (see :class:`StepCall`): the
    policy's threshold, lowered by a window learned earlier; ``headroom`` only while the
    window is still a guess (the attempt then asks the CLI)."""
    if not policy.enabled:
        return {"stop_at": None, "headroom": None}
    if not is_guess(policy.window):
        return {"stop_at": policy.at, "headroom": None}
    known = windows.get(model_key(spec))
    if known is None:
        return {"stop_at": policy.at, "headroom": policy.headroom}
    return {"stop_at": min(policy.at, handoff_at_for(known, policy)), "headroom": None}


class _Offline(Exception):
    """The network stayed down past ``max_offline_wait``: the step stops."""


@dataclass
class StepHooks:
    """What the loop reports to its Runtime besides events."""

    on_session: Callable[[str], None]
    on_attempt: Callable[[int], None]
    #: A session the CLI refused to resume: whoever named it (lineage) forgets it.
    on_gone: Callable[[str], None] = lambda sid: None
    #: Where the attempt is on record (:attr:`flower.step.placement.Watch.on_placed`).
    on_placed: Callable[[dict[str, Any] | None], None] = lambda where: None


class StepLoop:
    """One ``Runtime.run``: attempts until success or a reason to stop."""

    def __init__(
        self,
        call: StepCall,
        *,
        placement: Placement,
        seat: Seat,
        resilience: Resilience,
        handoff: HandoffPolicy,
        interrupts: Interrupts,
        notes_dir: Path | None,
        hooks: StepHooks,
        on_event: OnEvent | None,
        windows: dict[str, Window] | None = None,
    ) -> None:
        self.task = call  # what the step was asked to do (a handoff's successor needs it)
        self.placement, self.seat = placement, seat
        self.resilience, self.handoff = resilience, handoff
        self.interrupts, self.notes_dir, self.hooks = interrupts, notes_dir, hooks
        self.on_event = on_event
        self.result = StepResult(step=call.label, session_id=call.resume, started_at=time.time())
        # Where to hand off: the policy's threshold; when its window is a guess, by what the
        # CLI's real window allows (learned by an attempt: a "window" event, kept per model
        # in ``windows``, which the Runtime shares between its steps).
        self.windows = windows if windows is not None else {}
        fields = handoff_fields(call.spec, handoff, self.windows)
        self.next = call.attempting(**fields)  # the next attempt to make
        self.at: int = fields["stop_at"] or handoff.at
        known = self.windows.get(model_key(call.spec)) if self._guessed() else None
        self.window: int = known.window if known is not None else int(handoff.window)
        self.seen: str | None = None  # the session this step's attempts have written to
        self.attempt = 0
        self.ctx, self.warned = 0, False
        self._retryable = False
        self.gone: set[str] = set()  # sessions the CLI would not resume: never tried again
        self.versions: dict[str, str] = {}  # the SDK and CLI the last attempt ran on

    # -- the whole step -------------------------------------------------------------------

    async def run(self) -> StepResult:
        res = self.result
        policy = self.resilience
        retrying = policy.backoff(
            # delay_for, not policy.wait itself: a policy that overrides it is honoured
            wait=lambda state: policy.delay_for(state.attempt_number),
            retry=tenacity.retry_if_result(lambda _: self._retryable),
            before=self._before_attempt,
            before_sleep=self._before_retry,
            sleep=self._pause,
            retry_error_callback=lambda state: state.outcome.result() if state.outcome else None,
        )
        try:
            await retrying(self._counted_attempt)
        except _Offline as gave_up:
            res.error = f"{res.error}\n{gave_up}"
        except AttemptCrash as crash:
            res.ok, res.error = False, crash.one_line()
            res.errors.append(res.error)
        res.attempts = max(1, self.attempt)
        res.context = self.ctx
        res.ended_at = time.time()
        return res

    def _before_attempt(self, state: tenacity.RetryCallState) -> None:
        self.attempt = state.attempt_number
        self.next = self.next.attempting(attempt=self.attempt)
        self.hooks.on_attempt(self.attempt)

    async def _counted_attempt(self) -> StepResult:
        """Attempts until one counts: a success, or a failure that is not an interrupt or a
        handoff. Sets ``_retryable`` for the retry policy."""
        self._retryable = False
        while True:
            if self.interrupts.requested:  # arrived while no attempt was running
                self.next = self.next.attempting(
                    prompt=f"{self.next.prompt}\n\n{await self._words()}"
                )
            out = await self._attempt(self.next, self._watch())
            if self.next.attach:  # attached to what a killed supervisor left: once
                self.next = self.next.attempting(attach=None)
            self._merge(out)
            self.seen = out.session_id or self.seen
            if out.ok:
                return out
            if out.error == INTERRUPTED:
                # Its result is taken: a supervisor stopped while the person is asked (Ctrl-C
                # twice) leaves no attempt on record, so the next start resumes the session
                # in an attempt of its own, as a run on this machine does.
                self.hooks.on_placed(None)
                if not await self._heard():
                    return out
            elif self._handoff_due(out):
                if not await self._next_generation(out):
                    return out
            elif not self._start_fresh(out):
                self.result.errors.append(out.error or "unknown error")
                self._retryable = self.resilience.should_retry(out.error or "")
                return out

    async def _attempt(self, call: StepCall, watch: Watch) -> StepResult:
        """One attempt through the placement. Anything but a result stops the step as a
        crash: a placement's own bug (or a callback's) is not a reason to retry."""
        try:
            out = await self.placement.attempt(call, self.seat, watch)
        except AttemptCrash as known:
            if not known.log:  # it happened where no step log was written
                known.log = str(write_crash_log(self.seat.log_for(call.label), known))
            raise
        except Exception as exc:
            crash = crash_of(exc)
            crash.log = str(write_crash_log(self.seat.log_for(call.label), crash))
            raise crash from exc
        if self.interrupts.requested:
            out.ok, out.error = False, INTERRUPTED
        return out

    # -- a session the CLI cannot resume --------------------------------------------------

    def _start_fresh(self, out: StepResult) -> bool:
        """The CLI refused to resume a session ("No conversation found"): it never held a
        conversation (killed before its prompt was stored) or lost it. The step starts a
        fresh session with its own prompt, once per refused session, and says so in one
        line; the session is forgotten (lineage no longer names it). False when ``out`` is
        not such a refusal, or this session was already given up once."""
        if not session_gone(out.error):
            return False
        dead = gone_session_id(out.error) or self.next.resume or self.seen
        if not dead or dead in self.gone:
            return False
        self._emit("fresh", {"session": dead, "error": (out.error or "").splitlines()[0][:200]})
        self._forget(dead)
        self.result.resumed = False
        task = self.task
        self.next = self.next.attempting(
            prompt=task.fresh if task.fresh is not None else task.prompt,
            resume=None,
            fork=False,
            resume_at=None,
        )
        return True

    def _forget(self, dead: str) -> None:
        """``dead`` cannot be resumed: not this step's session any more, nor lineage's."""
        if not dead or dead in self.gone:
            return
        self.gone.add(dead)
        self.hooks.on_gone(dead)
        if self.seen == dead:
            self.seen = None
        if self.result.session_id == dead:
            self.result.session_id = None

    def _watch(self, *, quiet: bool = False) -> Watch:
        return Watch(
            on_session=self._session_seen,
            on_event=_ignore if quiet else self._on_attempt_event,
            on_handle=self.interrupts.attach,
            on_placed=self.hooks.on_placed,
        )

    def _session_seen(self, sid: str) -> None:
        """An attempt's session id, the instant it is known (rescue() writes it, too)."""
        self.result.session_id = self.seen = sid
        self.hooks.on_session(sid)

    def _merge(self, out: StepResult) -> None:
        """Fold one attempt into the step's result."""
        res = self.result
        if out.session_id:
            res.session_id = out.session_id
        res.cost_usd += out.cost_usd
        res.num_turns += out.num_turns
        res.ok, res.error = out.ok, out.error
        if out.ok:
            res.text = out.text

    def _emit(self, kind: str, payload: dict[str, Any]) -> None:
        if self.on_event:
            self.on_event(
                Event(
                    kind,
                    str(payload.get("text", "")),
                    payload={"step": self.result.step, **payload},
                )
            )

    # -- events from the attempt; the context watermark -----------------------------------

    def _on_attempt_event(self, event: Event) -> None:
        if event.kind == "versions":  # on the step's manifest row, not on the screen
            self.versions = {k: str(v) for k, v in event.payload.items() if k in ("sdk", "cli")}
            return
        if event.kind == "fresh":  # a takeover would not resume what was never stored
            self._forget(str(event.payload.get("session") or ""))
        if event.kind == "window":
            self._learned(event.payload)
        if event.kind != "context":
            if self.on_event:
                self.on_event(event)
            return
        used = int(event.payload.get("used") or 0)
        self.ctx = used
        self._emit("context", {"used": used, "window": self.window})
        if self.handoff.enabled and used >= max(1_000, self.at - 20_000) and not self.warned:
            self.warned = True
            self._emit("handoff", {"phase": "near", "used": used, "window": self.window})

    def _guessed(self) -> bool:
        return self.handoff.enabled and is_guess(self.handoff.window)

    def _learned(self, payload: dict[str, Any]) -> None:
        """An attempt learned the CLI's real window: later attempts (and steps) hand off by
        it too. What the CLI itself said beats a result's ``contextWindow`` (which does not
        say whether auto-compaction is on)."""
        window = int(payload.get("window") or 0)
        if not self._guessed() or window <= 0:
            return
        key = model_key(self.task.spec)
        if payload.get("source") != "cli" and key in self.windows:
            return
        compact_at = payload.get("compact_at")
        learned = Window(window, int(compact_at) if compact_at else None, 0.0)
        self.windows[key] = learned
        self.window, self.at = window, min(self.at, handoff_at_for(learned, self.handoff))
        self.next = self.next.attempting(stop_at=self.at, headroom=None)

    # -- exit 2: a person interrupted -----------------------------------------------------

    async def _words(self) -> str:
        """What the person said (waiting for it if need be), with INTERRUPT_NOTE after it."""
        said = await self.interrupts.take()
        return f"{said}\n\n{INTERRUPT_NOTE}" if said else INTERRUPT_NOTE

    async def _heard(self) -> bool:
        """Resume the same session with the person's words; False without a session."""
        words = await self._words()
        if not self.seen:
            return False
        self._carry_on(words)
        return True

    def _carry_on(self, prompt: str) -> None:
        """Continue the seen session with ``prompt``."""
        self.next = self.next.attempting(
            prompt=prompt, resume=self.seen, fork=False, resume_at=None
        )

    # -- exit 3: the context is full ------------------------------------------------------

    def _handoff_due(self, out: StepResult) -> bool:
        if out.error == HANDOFF_DUE:
            return True
        return bool(self.handoff.enabled and self.seen and out.error and is_overflow(out.error))

    async def _next_generation(self, out: StepResult) -> bool:
        """Retire the full session for a fresh one carrying its handoff; False past the limit."""
        res = self.result
        if len(res.retired) >= self.handoff.max_generations:
            res.error = self._too_many_generations(len(res.retired))
            return False
        old = self.seen
        assert old is not None  # _handoff_due holds only for a seen session
        h = await self._hand_off(old, out)
        res.retired.append(old)
        self.next = self.next.attempting(
            prompt=h.prompt_block(), resume=None, fork=False, resume_at=None
        )
        self.seen = None
        self.ctx, self.warned = 0, False
        return True

    def _too_many_generations(self, n: int) -> str:
        where = self._note_path()
        last = f"最近一份交接书在 {where}" if where and where.exists() else "交接书没有落盘"
        return (
            f"上下文已换代 {n} 次仍未做完(max_generations={self.handoff.max_generations}),"
            f"停下来等人看一眼:{last}"
        )

    async def _hand_off(self, old: str, out: StepResult) -> Handoff:
        """Have the full session write its handoff (or make a degraded one), save it, report it."""
        step = self.task.step
        self._emit("handoff", {"phase": "writing", "used": self.ctx})
        h: Handoff | None = None
        if out.error == HANDOFF_DUE:
            h, why = await self._ask_for_handoff(old)
        else:
            why = out.error or ""  # the API refused the prompt: the session cannot write one
        was_degraded = h is None
        if h is None:
            h = degraded(step, self.task.prompt, why=why)
        h.step = step
        path = self._save(h)
        sections = [k for k in ("doing", "decided", "deadends", "next", "scene") if getattr(h, k)]
        self._emit(
            "handoff",
            {
                "phase": "done",
                "degraded": was_degraded,
                "path": str(path) if path else None,
                "sections": sections,
                "summary": {k: _first_line(getattr(h, k)) for k in sections},
            },
        )
        return h

    async def _ask_for_handoff(self, old: str) -> tuple[Handoff | None, str]:
        """Send HANDOFF_PROMPT to the full session: budget lifted, no events, no context watch."""
        from dataclasses import replace

        call = self.next.attempting(
            spec=replace(self.next.spec, max_budget_usd=None),
            prompt=HANDOFF_PROMPT.format(used=self.ctx, window=self.window),
            resume=old,
            fork=False,
            resume_at=None,
            stop_at=None,
            headroom=None,
        )
        out = await self._attempt(call, self._watch(quiet=True))
        self.result.cost_usd += out.cost_usd
        self.result.num_turns += out.num_turns
        if not out.ok:
            return None, out.error or "handoff turn failed"
        h = Handoff.parse(out.text)
        if not h.complete():
            return None, "交接书缺了必填段:" + "、".join(h.missing())
        return h, ""

    def _note_path(self) -> Path | None:
        """``<notes>/交接-<step>.md``, whatever the step is called (a name with ``/`` or
        ``..`` in it still names a file in notes/); None without a workbench."""
        if self.notes_dir is None:
            return None
        return inside(self.notes_dir, f"交接-{self.task.step}", ".md")

    def _save(self, h: Handoff) -> Path | None:
        """The handoff at :meth:`_note_path` (the previous one archived)."""
        path = self._note_path()
        if path is None:
            return None
        try:
            return h.write(path)
        except OSError as exc:
            log.warning("%s", t("loop.handoff_unsaved", step=self.task.step, path=path, error=exc))
            return None

    # -- exit 4: a retryable failure ------------------------------------------------------

    def _before_retry(self, state: tenacity.RetryCallState) -> None:
        """A counted attempt failed and will be retried: say so, and resume what it wrote."""
        error = self.result.error or ""
        delay = state.next_action.sleep if state.next_action else 0.0
        payload = {
            "attempt": state.attempt_number,
            "delay": round(delay, 1),
            "kind": self.resilience.classify(error),
            "error": error.splitlines()[0][:200] if error else "",
            # Nothing of the step stored to continue (killed before its prompt was): the
            # next attempt starts it afresh, and the line says so.
            "fresh": not (self.seen or self.next.resume),
        }
        self._emit("retry", payload)
        if self.seen:
            self._carry_on(self.resilience.resume_prompt)
            self.result.resumed = True

    async def _pause(self, delay: float) -> None:
        """Wait for the network, then ``delay`` seconds; an interrupt ends either at once."""
        policy = self.resilience

        def offline(elapsed: float) -> None:  # one event per failed probe: the terminal shows it
            self._emit("offline", {"elapsed": round(elapsed), "interval": policy.probe_interval})

        async def wait() -> bool:
            if not await policy.wait_online(on_wait=offline):
                return False
            await asyncio.sleep(delay)
            return True

        if await self._unless_interrupted(wait()) is False:
            raise _Offline(f"(等了 {policy.max_offline_wait:.0f} 秒网络仍不通,停下)")

    async def _unless_interrupted(self, wait: Awaitable[bool]) -> bool | None:
        """``wait``'s answer, or None when an interrupt ended it first."""
        waiting = _Waiting()
        task: asyncio.Future[bool] = asyncio.ensure_future(wait)
        self.interrupts.attach(waiting)  # delivers an interrupt that is already pending, too
        try:
            first: list[asyncio.Future[Any]] = [task, waiting.woken]
            done, _ = await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.interrupts.attach(None)
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        return task.result() if task in done else None


class _Waiting:
    """Stands in for an attempt while the loop waits, so an interrupt ends the wait."""

    def __init__(self) -> None:
        self.woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def interrupt(self) -> None:
        if not self.woken.done():
            self.woken.set_result(None)


def _ignore(event: Event) -> None:
    return None


def _first_line(text: str, limit: int = 120) -> str:
    """A handoff section's first non-empty line, for the terminal's handoff block."""
    line = next((x.strip(" -*\t") for x in str(text).splitlines() if x.strip()), "")
    return line[:limit]
