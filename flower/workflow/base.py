"""Step and Workflow: steps in order, state passed through ctx, continuity by default.

The same ``Workflow.run`` drives both paths: in-process with a plain ``Runtime``, and under
``flower-super`` with a ``Runtime`` whose placement (``supervisor.run.placement.Forked``) puts
each attempt in its own child process. Control flow (when / gate / on_reject / reduce /
retries) is evaluated here, in the process that owns lineage and the manifest. What holds
for one step call only (its session callback, an ``idempotent=False`` step's single
attempt) is passed with that ``Runtime.run`` call, never set on the Runtime: a map step's
items run at once.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from .._errors import ConfigError
from ..agents.agent import AgentSpec
from ..i18n import define, t
from ..state.result import Event, StepResult, jsonable
from ..state.reuse import why as reason
from ..step.call import StepCall
from . import memo
from .memo import Cache
from .resume import (
    PriorRun,
    hash_of,
    input_parts,
    prior_run,
    refuse_live_conflict,
)

if TYPE_CHECKING:
    from ..step.runtime import Runtime

Ctx = dict[str, Any]

#: How many steps ahead a placement is told about (see ``_Run._prepare``).
LOOKAHEAD = 1

ON_FAIL = ("stop", "skip", "continue")

log = logging.getLogger("flower")

define(
    {
        "workflow.manifest_unchecked": (
            "检查不了 {path}:{error}",
            "could not check {path}: {error}",
        ),
        "workflow.not_idempotent": (
            "步骤 '{step}' 声明了 idempotent=False(副作用不可逆):上次已做过,"
            "这次照样重跑,不自动重试",
            "step '{step}' is idempotent=False (irreversible side effects): it ran before and "
            "runs again now, with no automatic retry",
        ),
    }
)


class StepAbort(Exception):
    """Raised by a gate: stop now, another round will not help (seed 003).

    The step's remaining retries are not used; ``ctx["_aborted"]`` gets the message and the
    step then fails as any other (``on_fail`` decides what happens to the flow)."""


@dataclass
class Step:
    """One step's declaration; ``Runtime.run(step.spec, prompt, ...)`` is what executes."""

    name: str
    spec: AgentSpec
    prompt: str | Callable[[Ctx], str]

    resume_from: str | None = None
    fork: bool = False

    retries: int = 0
    gate: Callable[[StepResult, Ctx], Any] | None = None
    on_fail: str = "stop"
    when: Callable[[Ctx], Any] | None = None
    on_reject: Callable[[StepResult, Ctx], Any] | None = None
    resume_prompt: str | Callable[[Ctx], str] | None = None
    reduce: Callable[[StepResult, Ctx], Any] | None = None
    # seed 004: how the result may be reused (None: run-only, or cross-run under an
    # incremental flow), and whether running it twice is safe (False: never cached,
    # re-run on resume with one warning line, no automatic retry).
    cache: Cache | None = None
    idempotent: bool = True

    def __post_init__(self) -> None:
        if self.on_fail not in ON_FAIL:
            raise ConfigError(
                f"step {self.name!r}: on_fail={self.on_fail!r} is not one of {', '.join(ON_FAIL)}",
                hint='use on_fail="stop" (the default), "skip" or "continue"',
            )
        if self.reduce is not None and inspect.iscoroutinefunction(self.reduce):
            raise ConfigError(
                f"step {self.name!r}: reduce must be a plain function, not async",
                hint="gate, when and on_reject may be async; reduce runs synchronously",
            )
        if any(mark in self.name for mark in ("#", "·判定")):
            raise ConfigError(
                f"step name {self.name!r} contains '#' or '·判定'",
                hint="those mark retry/round/judge labels; pick a plain name",
            )

    def render(self, ctx: Ctx, *, resuming: bool = False) -> str:
        """What this step says: ``resume_prompt`` when continuing a session and there is
        one, else ``prompt``; a callable is called with ``ctx``."""
        text = self.resume_prompt if resuming and self.resume_prompt is not None else self.prompt
        return text(ctx) if callable(text) else text

    def label(self, attempt: int) -> str:
        """``name``, then ``name#roundN`` (with on_reject) or ``name#retryN``."""
        if attempt == 0:
            return self.name
        return (
            f"{self.name}#round{attempt + 1}" if self.on_reject else f"{self.name}#retry{attempt}"
        )


@dataclass
class MapStep(Step):
    """One step over many items (seed 004's map): one child per item, at most
    ``concurrency`` at once, each item with its own input hash, session and cache entry.

    ``prompt(ctx, item)`` says what each item's agent is told; ``over`` is the ctx key of the
    items or a callable ``over(ctx) -> items``. The items' results join into ``ctx[name]``
    as a list of their texts, in input order, or whatever ``reduce(results, ctx)`` makes of
    the list of ``StepResult``s. Item ``i`` runs as ``name[i]`` (its manifest label and its
    lineage key; never the bare name); a failed item is not cached, and the map step fails
    once every item has run. A restart runs only the items that did not finish, each
    continuing its own session.
    """

    prompt: Any = None  # (ctx, item) -> str
    over: str | Callable[[Ctx], Any] = ""
    concurrency: int = 4
    reduce: Any = None  # (list[StepResult], ctx) -> Any

    def __post_init__(self) -> None:
        super().__post_init__()
        if not callable(self.prompt):
            raise ConfigError(
                f"map step {self.name!r}: prompt must be a function (ctx, item) -> str",
                hint="MapStep(name, spec, prompt=lambda ctx, item: f'... {item}', over=...)",
            )
        if not (isinstance(self.over, str) and self.over) and not callable(self.over):
            raise ConfigError(
                f"map step {self.name!r}: over must name a ctx key or be a function of ctx",
                hint='over="files" or over=lambda ctx: ctx["files"]',
            )
        if self.concurrency < 1:
            raise ConfigError(
                f"map step {self.name!r}: concurrency must be at least 1",
                hint="concurrency=4 (the default)",
            )

    def items(self, ctx: Ctx) -> list[Any]:
        source = ctx.get(self.over) if isinstance(self.over, str) else self.over(ctx)
        if source is None:
            raise ConfigError(
                f"map step {self.name!r}: ctx has no {self.over!r} to map over",
                hint="an earlier step must put the items there (its reduce, or ctx)",
            )
        return list(source)

    def item_label(self, i: int) -> str:
        return f"{self.name}[{i}]"


@dataclass
class Workflow:
    """Steps in order; ``run`` returns the final ctx, which is ``context`` itself.

    Running the same Workflow again works in the same dict (api.md): what a run put there
    is still there; what a run says about itself (``_failed_at``, ``_aborted``, ``_reuse``
    …) starts afresh each run.
    """

    steps: list[Step]
    name: str = "workflow"
    context: Ctx = field(default_factory=dict)
    # Seed 003's HumanChannel: kept for the driver program, inert until the interaction
    # layer exists. ``workbench``: the flow's own Workbench; its steps use it (run()).
    channel: Any = None
    workbench: Any = None
    continuous: bool = True
    incremental: bool = False  # seed 004: every step cross-run unless it says otherwise

    def __post_init__(self) -> None:
        names = [s.name for s in self.steps]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ConfigError(
                f"workflow {self.name!r} has two steps named {dupes[0]!r}",
                hint="step names are the keys of lineage.json; make them unique",
            )

    async def run(
        self,
        runtime: Runtime,
        *,
        on_event: Callable[[Event], None] | None = None,
        on_step: Callable[[Step, StepResult], None] | None = None,
        command: list[str] | None = None,
        new: bool = False,
        ask: str | None = None,
    ) -> Ctx:
        """Run the steps in order and return ctx.

        ``command`` (the argv that carries this run on), ``new`` (``--new``: do not pick up
        an unfinished earlier run's completed steps) and ``ask`` (what the person typed,
        put in ``ctx["_ask"]``) are what the command line adds. A flow with its own
        ``workbench`` runs its steps with it, whatever the Runtime had. A ``channel`` whose
        ``on_event`` is None sends its questions to ``on_event`` for this run.

        ``runtime`` is a :class:`~flower.Runtime`, or anything with an async
        ``run(spec, prompt, *, step_name, resume, fork, on_event)`` returning StepResults
        (api.md's way to test a flow's control flow offline). Lineage, the registry record,
        the manifest check, reuse and the cross-run cache are kept only by a runtime with a
        ``run_dir`` and a ``workspace`` (held to Runtime's interface); a bare one gets just
        its ``run`` calls, and ``_woke`` is 1.
        """
        runner = _Run(self, runtime, on_event, on_step, new)
        if ask is not None:
            runner.ctx["_ask"] = ask
        wired = self.channel is not None and getattr(self.channel, "on_event", 0) is None
        if wired:
            self.channel.on_event = on_event
        own = self.workbench is not None and runner.books
        previous = runtime.use_workbench(self.workbench) if own else None
        try:
            return await runner.run(command)
        finally:
            if wired:
                self.channel.on_event = None
            if own:
                runtime.workbench = previous


#: Reasons of an item that the unfinished run had begun but that say less than that.
NOT_BEGUN = ("memo.why.never", "memo.why.ran_unfinished")

#: What a run says about itself in ctx: gone from ``Workflow.context`` when it runs again.
_OUTCOME_KEYS = ("_ask", "_failed_at", "_aborted", "_aborted_step", "_reuse", "_lineage")


class _Run:
    """One execution of a Workflow (kept apart so run() reads top to bottom)."""

    def __init__(
        self, wf: Workflow, rt: Runtime, on_event: Any, on_step: Any, new: bool = False
    ) -> None:
        self.wf, self.rt, self.on_event, self.on_step = wf, rt, on_event, on_step
        self.new = new
        # api.md: a runtime with a run_dir and a workspace keeps lineage and the rest.
        self.books = all(getattr(rt, a, None) is not None for a in ("run_dir", "workspace"))
        self.workspace = str(rt.workspace) if self.books else ""
        self.ctx: Ctx = wf.context  # the same dict, run after run (api.md)
        for key in _OUTCOME_KEYS:
            self.ctx.pop(key, None)
        # The run's args as its input hashes see them: what the flow was given, not what a
        # run (this one or an earlier one in this process) put in the dict since.
        names = {s.name for s in wf.steps}
        self.args = jsonable(
            {k: v for k, v in self.ctx.items() if not k.startswith("_") and k not in names}
        )
        self.lineage = rt.lineage() if self.books else None
        self.lineage_sessions: dict[str, str] = {}
        self.prior: PriorRun | None = None
        self.report: list[dict[str, Any]] = []  # per step: reused or ran, and why
        self.ran_before: set[str] = set()  # step labels with a session from an earlier run

    async def run(self, command: list[str] | None) -> Ctx:
        rt, wf = self.rt, self.wf
        names = [s.name for s in wf.steps]
        woke, sessions = self._open(names, command) if self.books else (1, {})
        self.ctx.update(
            _woke=woke,
            _sessions=dict(sessions),
            _results={},
            _runtime=rt,
            _on_event=self.on_event,
            _flow=wf.name,
        )
        if wf.continuous and self.lineage is not None:
            self.ctx["_lineage"] = self.lineage
        self.lineage_sessions = dict(sessions)
        if woke > 1 and self.on_event:
            self._emit(self._wake_event(woke, sessions, names))
        state, stopped_at = "finished", None
        try:
            for i, step in enumerate(wf.steps):
                if not await self._run_step(i, step):
                    state, stopped_at = "failed", step.name
                    break
        except BaseException:
            self._note(state="interrupted", ended_at=_now())
            raise
        finally:
            if self.books:
                rt.prepare([])  # nothing more will run: drop what was got ready
        self._note(state=state, step=stopped_at, ended_at=_now())
        return self.ctx

    def _open(self, names: list[str], command: list[str] | None) -> tuple[int, dict[str, str]]:
        """Register this flower, wake lineage; the wake count and the sessions to continue."""
        rt, wf, lineage = self.rt, self.wf, self.lineage
        assert lineage is not None
        registry = rt.state.registry
        self.prior = (
            None
            if self.new
            else prior_run(
                registry, wf.name, rt.workspace, rt.state.workspace_id, exclude=rt.run_id
            )
        )
        with registry.locked():  # check-then-register is one step for concurrent starts
            refuse_live_conflict(registry, names, exclude=rt.run_id)
            registry.set_aside_damaged()
            ask = self.ctx.get("_ask")
            ask = ask if isinstance(ask, str) else None
            rt.begin_flow(wf.name, names, command=command, ask=ask)
        try:
            woke = lineage.bump(names if wf.continuous else ())
        except BaseException:
            rt.end_flow(discard=True)  # refused (another workspace holds the run_dir): no trace
            raise
        _check_manifest(rt)
        rt.note(woke=woke)
        self.ran_before = set(lineage.steps)
        return woke, dict(lineage.steps) if wf.continuous else {}

    def _note(self, **fields: Any) -> None:
        """Update this flower's registry record (a runtime that keeps one)."""
        if self.books:
            self.rt.note(**fields)

    def _record(self) -> Any:
        """This flower's registry record, or None (a bare runtime keeps none)."""
        return self.rt.record if self.books else None

    def _wake_event(self, woke: int, sessions: dict[str, str], names: list[str]) -> Event:
        """seed 000: report the wake, or "does it remember?" is invisible. A flow may name
        the steps whose context size the line shows (``banner_steps``) and what it says
        first (``wake_banner()``, e.g. the starter flow's 需求已确认 · 目标 N 条)."""
        shown = getattr(self.wf, "banner_steps", None) or names
        contexts = {
            name: self.rt.session_context(sessions[name]) for name in shown if name in sessions
        }
        lead = getattr(self.wf, "wake_banner", None)
        payload = {
            "woke": woke,
            "workspace": str(self.rt.workspace),
            "contexts": contexts,
            "lead": list(lead()) if callable(lead) else [],
        }
        return Event("wake", payload=payload)

    async def _run_step(self, index: int, step: Step) -> bool:
        """Run one step with its retries; False means the flow stops here."""
        ctx = self.ctx
        if step.when is not None and not await _maybe_await(step.when(ctx)):
            return True
        if isinstance(step, MapStep):
            return await self._run_map(index, step)
        prompt = step.render(ctx)
        parts = input_parts(
            self.wf.name,
            step,
            prompt,
            index=index,
            args={"context": self.args, "ask": ctx.get("_ask")},
            workspace=self.workspace,
        )
        digest = hash_of(parts)
        scope = memo.scope_of(step, self.wf)
        if scope != "off" and self._reuse(step, digest, index):
            return True
        cross = (
            memo.CrossRun.open(self.rt.state.cache, self.rt.workspace, self.wf.name, step, digest)
            if scope == "cross-run" and self.books
            else None
        )
        if cross is not None and cross.hit is not None:
            self._restore(step, index, digest, parts, cross)
            return True
        why = self._why_run(step, scope, parts, cross)
        if not step.idempotent and self._ran_before(step):
            log.warning("%s", t("workflow.not_idempotent", step=step.name))
        resume = self._session_for(step)
        prompt_cur = self._resume_text(step, prompt) if resume else prompt
        self._step_event(index, step, resumed=bool(resume))
        self._prepare(index, StepCall(step.spec, "", step.name, resume, step.fork))
        result, passed = await self._attempts(step, prompt, prompt_cur, resume)
        if passed:
            value = step.reduce(result, ctx) if step.reduce else result.text
            ctx[step.name] = value
            self._completed(step, digest, result, value, parts)
            if cross is not None:
                cross.store_result(result, jsonable(value), parts, self.rt.run_id)
        elif step.on_fail == "continue":
            ctx[step.name] = result.text  # the incomplete result goes on
        elif step.on_fail == "stop":
            ctx["_failed_at"] = step.name
        self._explain(step, "ran" if passed else "failed", scope, why, result.cost_usd)
        if self.on_step:
            self.on_step(step, result)
        return passed or step.on_fail != "stop"

    async def _run_map(self, index: int, step: MapStep) -> bool:
        """A map step: its items side by side, each reused, restored or run on its own."""
        import asyncio

        ctx, rt = self.ctx, self.rt
        items = step.items(ctx)
        scope = memo.scope_of(step, self.wf)
        self._step_event(index, step, resumed=False, items=len(items))
        gate = asyncio.Semaphore(step.concurrency)
        results: list[StepResult | None] = [None] * len(items)

        async def one(i: int, item: Any) -> None:
            label = step.item_label(i)
            prompt = str(step.prompt(ctx, item))
            shape = _ItemShape(label, step)
            parts = input_parts(
                self.wf.name,
                shape,
                prompt,
                index=index,
                args={"context": self.args, "ask": ctx.get("_ask")},
                workspace=self.workspace,
            )
            digest = hash_of(parts)
            done = self.prior.completed.get(label) if self.prior else None
            if scope != "off" and done and done.get("hash") == digest:
                result = StepResult.from_dict(done["result"])
                rt.record_reused(result, "run-only")
                self._explain(
                    shape,
                    "reused",
                    "run-only",
                    reason("memo.why.same_in_run", run=self.prior.run if self.prior else "?"),
                    result.cost_usd,
                )
                self._item_done(step, label, digest, result, parts)
                results[i] = result
                return
            cross = (
                memo.CrossRun.open(rt.state.cache, rt.workspace, self.wf.name, shape, digest)
                if scope == "cross-run" and self.books
                else None
            )
            if cross is not None and cross.hit is not None:
                result = StepResult.from_dict(cross.hit.result)
                result.step = label
                rt.record_reused(result, "cross-run")
                why = reason("memo.why.same_cross", run=cross.hit.result.get("run") or "?")
                self._explain(shape, "reused", "cross-run", why, result.cost_usd)
                self._item_done(step, label, digest, result, parts)
                results[i] = result
                return
            why = self._why_run(shape, scope, parts, cross)
            async with gate:
                resume = self.lineage_sessions.get(label) if self.wf.continuous else None
                # Cut off mid-way last time (a session, never completed): the neutral
                # "you were interrupted" text; an item that changed: its new prompt.
                cut = resume is not None and self.prior is not None and not done
                text = rt.resilience.resume_prompt if cut else prompt
                if cut and why.get("key") in NOT_BEGUN:  # it had begun last time: say so
                    why = reason("memo.why.unfinished")
                result = await rt.run(
                    step.spec,
                    text,
                    step_name=label,
                    resume=resume,
                    on_event=self.on_event,
                    **self._per_call(step, label, label, prompt),
                )
            if result.session_id:
                self._remember(label, label, result.session_id)
            results[i] = result
            outcome = "ran" if result.ok else "failed"
            self._explain(shape, outcome, scope, why, result.cost_usd)
            if result.ok:
                self._item_done(step, label, digest, result, parts)
                if cross is not None:
                    cross.store_result(result, result.text, parts, rt.run_id)

        await asyncio.gather(*(one(i, item) for i, item in enumerate(items)))
        finished = [r for r in results if r is not None]
        passed = len(finished) == len(items) and all(r.ok for r in finished)
        summary = _map_result(step, finished, passed)
        ctx["_results"][step.name] = summary
        if passed:
            value = step.reduce(finished, ctx) if step.reduce else [r.text for r in finished]
            ctx[step.name] = value
        elif step.on_fail == "continue":
            ctx[step.name] = [r.text for r in finished]
        elif step.on_fail == "stop":
            ctx["_failed_at"] = step.name
        if self.on_step:
            self.on_step(step, summary)
        return passed or step.on_fail != "stop"

    def _item_done(
        self, step: MapStep, label: str, digest: str, result: StepResult, parts: dict[str, str]
    ) -> None:
        rec = self._record()
        if rec is not None:
            rec.completed[label] = {
                "hash": digest,
                "result": result.to_dict(),
                "value": result.text,
                "parts": parts,
            }
            self.rt.note()
        self._emit(
            Event(
                "step",
                label,
                payload={"step": label, "map": step.name, "item_done": True, "ok": result.ok},
            )
        )

    def _per_call(self, step: Step, name: str, label: str, prompt: str) -> dict[str, Any]:
        """What holds for one ``Runtime.run`` call only, passed with it (never set on the
        Runtime: a map's items run at once): ``on_session`` records each session id of
        ``name`` in lineage the instant it is known, ``on_session_gone`` forgets one the CLI
        refused to resume (a fresh session then starts with the step's own ``prompt``), and
        an ``idempotent=False`` step gets one attempt (no automatic retry of an irreversible
        action; its own ``retries`` are not used either). A bare runtime keeps no lineage
        and is called as api.md's ``run`` is."""
        if not self.books:
            return {}
        return {
            "on_session": partial(self._remember, name, label),
            "on_session_gone": partial(self._forget, name, label),
            "fresh_prompt": prompt,
            **({} if step.idempotent else {"max_attempts": 1}),
        }

    def _ran_before(self, step: Step) -> bool:
        done = self.prior.completed if self.prior else {}
        return step.name in done or (self.prior is not None and self.prior.in_flight == step.name)

    def _why_run(
        self, step: Any, scope: str, parts: dict[str, str], cross: memo.CrossRun | None
    ) -> dict[str, Any]:
        """Why this step is sent to the model (the reuse report's words)."""
        if scope == "off":
            if not step.idempotent:
                return reason("memo.why.not_idempotent")
            return reason("memo.why.off")
        before = self.prior.completed.get(step.name) if self.prior else None
        old = (before or {}).get("parts") or (cross.last_parts if cross is not None else None)
        if cross is not None and cross.last_fingerprints is not None:
            moved = memo.changed_inputs(cross.last_fingerprints, cross.fingerprints)
            if moved:
                return reason("memo.why.changed", what=", ".join(moved))
        if old:
            moved = memo.changed_inputs(old, parts)
            if moved:
                return reason("memo.why.changed", what=", ".join(moved))
            if cross is not None:
                return reason("memo.why.expired")
        if self.prior is not None and self.prior.in_flight == step.name:
            return reason("memo.why.unfinished")
        if scope == "run-only" and step.cache is None and self.wf.incremental:
            key = memo.why_not_cross_run_key(step)
            if key:
                return reason("memo.why.not_cacheable", why=reason(key))
        if step.name in self.ran_before or (self.prior and step.name in self.prior.completed):
            # It had a session before: an unfinished run did not complete it, or the last
            # run finished and this one is new. "never ran" is only for what never ran.
            return reason("memo.why.ran_unfinished" if self.prior else "memo.why.ran_again")
        return reason("memo.why.never")

    def _explain(
        self, step: Any, outcome: str, scope: str, why: dict[str, Any], cost: float
    ) -> None:
        entry: dict[str, Any] = {"step": step.name, "outcome": outcome, "scope": scope, "why": why}
        entry["cost_usd" if outcome != "reused" else "saved_usd"] = round(cost, 6)
        self.report.append(entry)
        self.ctx["_reuse"] = self.report
        rec = self._record()
        if rec is not None:
            rec.reuse = list(self.report)

    async def _attempts(
        self, step: Step, prompt: str, prompt_cur: str, resume: str | None
    ) -> tuple[StepResult, bool]:
        ctx, rt = self.ctx, self.rt
        resume_cur, fork_cur = resume, step.fork
        result: StepResult | None = None
        passed = False
        retries = step.retries if step.idempotent else 0  # an irreversible step: one go
        for attempt in range(retries + 1):
            label = step.label(attempt)
            result = await rt.run(
                step.spec,
                prompt_cur,
                step_name=label,
                resume=resume_cur,
                fork=fork_cur,
                on_event=self.on_event,
                **self._per_call(step, step.name, label, prompt),
            )
            ctx["_results"][step.name] = result
            if result.session_id:
                self._remember(step.name, label, result.session_id)
            passed = result.ok
            if passed and step.gate is not None:
                try:
                    passed = bool(await _maybe_await(step.gate(result, ctx)))
                except StepAbort as exc:
                    ctx["_aborted"] = str(exc)
                    ctx["_aborted_step"] = step.name
                    passed = False
                    break
            if passed:
                break
            feedback = ""
            if step.on_reject is not None and result.session_id:
                feedback = str(await _maybe_await(step.on_reject(result, ctx)) or "")
            if feedback:
                prompt_cur, resume_cur, fork_cur = feedback, result.session_id, False
            else:
                prompt_cur, resume_cur, fork_cur = prompt, self._session_for(step), step.fork
        assert result is not None
        return result, passed

    def _prepare(self, index: int, now: StepCall) -> None:
        """Tell the runtime which first attempts come now and next, so a placement can get
        them ready while this step runs (only their prompt waits for ctx). ``now`` is the
        step about to run: a child already prepared for it is kept for it."""
        if not self.books:
            return
        steps = self.wf.steps[index + 1 : index + 1 + LOOKAHEAD]
        calls = [c for s in steps if (c := self._likely_call(s, index, now))]
        self.rt.prepare([now, *calls])

    def _likely_call(self, step: Step, running: int, now: StepCall) -> StepCall | None:
        """A later step's first attempt as far as it is known while step ``running`` runs
        (its prompt aside), or None when its session is not settled yet: a step that
        continues another step's session before that one has run, or the very session the
        running step is writing."""
        if self.prior is not None and step.name in self.prior.completed:
            return None  # most likely reused from the unfinished run: nothing to send
        if step.resume_from is not None:
            names = [s.name for s in self.wf.steps]
            source = names.index(step.resume_from) if step.resume_from in names else None
            if source is None or source >= running:
                return None
        resume = self._session_for(step, strict=False)
        if resume is not None and resume == now.resume and not now.fork:
            return None
        return StepCall(step.spec, "", step.name, resume, step.fork)

    def _resume_text(self, step: Step, prompt: str) -> str:
        """What a continued session is told: the step's resume_prompt; for the step a dead
        run was in the middle of, the neutral "you were interrupted" text; else the prompt."""
        if step.resume_prompt is not None:
            return step.render(self.ctx, resuming=True)
        if self.prior is not None and self.prior.interrupted(step.name):
            return self.rt.resilience.resume_prompt
        return prompt

    def _session_for(self, step: Step, *, strict: bool = True) -> str | None:
        """Which session this step continues (seed 000's resume_from table). A
        ``resume_from`` naming a step that has no session (not run yet, or failed before
        it had one) is a mistake in the flow: ValueError, never a silent fresh session."""
        sessions: dict[str, str] = self.ctx["_sessions"]
        if step.resume_from is not None:
            sid = sessions.get(step.resume_from)
            if sid is None and strict:
                raise ValueError(
                    f"step {step.name!r}: resume_from={step.resume_from!r} has no session "
                    "(that step has not run, or failed before it had one)"
                )
            return sid
        if self.wf.continuous:
            return self.lineage_sessions.get(step.name)
        return None

    def _remember(self, name: str, label: str, sid: str) -> None:
        self.ctx["_sessions"][name] = sid
        self.lineage_sessions[name] = sid
        if self.lineage is not None:
            self.lineage.remember(label, sid)

    def _forget(self, name: str, label: str, sid: str) -> None:
        """The CLI cannot resume ``sid``: nothing names it any more (a later run must not
        try it again), unless a newer session has taken its place already."""
        for known in (self.ctx["_sessions"], self.lineage_sessions):
            if known.get(name) == sid:
                del known[name]
        if self.lineage is not None:
            self.lineage.forget(label, sid)

    def _reuse(self, step: Step, digest: str, index: int) -> bool:
        """Seed 004: a step the unfinished last run completed with the same input is skipped."""
        done = self.prior.completed.get(step.name) if self.prior else None
        if not done or done.get("hash") != digest:
            return False
        result = StepResult.from_dict(done["result"])
        self.ctx["_results"][step.name] = result
        if result.session_id:
            self.ctx["_sessions"][step.name] = result.session_id
        self.ctx[step.name] = done.get("value", result.text)
        self._completed(step, digest, result, self.ctx[step.name], done.get("parts"), write=False)
        run = self.prior.run if self.prior else None
        self._step_event(index, step, resumed=False, reused=True, run=run, cache="run-only")
        self.rt.record_reused(result, "run-only")
        self._explain(
            step, "reused", "run-only", reason("memo.why.same_in_run", run=run), result.cost_usd
        )
        if self.on_step:
            self.on_step(step, result)
        return True

    def _restore(
        self, step: Step, index: int, digest: str, parts: dict[str, str], cross: memo.CrossRun
    ) -> None:
        """A cross-run hit: the stored result at $0.00, no child started."""
        hit = cross.hit
        assert hit is not None
        result = StepResult.from_dict(hit.result)
        result.step = step.name
        self.ctx["_results"][step.name] = result
        self.ctx[step.name] = hit.ctx_value
        self._completed(step, digest, result, hit.ctx_value, parts, write=False)
        self._step_event(index, step, resumed=False, reused=True, cache="cross-run")
        self.rt.record_reused(result, "cross-run")
        why = reason("memo.why.same_cross", run=hit.result.get("run") or "?")
        self._explain(step, "reused", "cross-run", why, result.cost_usd)
        if self.on_step:
            self.on_step(step, result)

    def _completed(
        self,
        step: Step,
        digest: str,
        result: StepResult,
        value: Any,
        parts: dict[str, str] | None = None,
        *,
        write: bool = True,
    ) -> None:
        """Record ``step`` as completed in this run's record; ``write=False`` for a reused
        step (lost in a crash it is only reused again, from the same place, next time:
        the registry write is left to the next step's)."""
        rec = self._record()
        if rec is None:
            return
        rec.completed[step.name] = {
            "hash": digest,
            "result": result.to_dict(),
            "value": jsonable(value),
            "parts": parts or {},
        }
        if write:
            self.rt.note()

    def _step_event(self, index: int, step: Step, **more: Any) -> None:
        """seed 003's ``Event("step")``: index, total, resumed, woke (and what ``more`` adds)."""
        payload = {
            "index": index,
            "total": len(self.wf.steps),
            "woke": self.ctx["_woke"],
            "step": step.name,
            **more,
        }
        self._emit(Event("step", step.name, payload=payload))

    def _emit(self, event: Event) -> None:
        if self.on_event:
            self.on_event(event)


def _check_manifest(rt: Runtime) -> None:
    """A damaged manifest is set aside now (one warning), not at the first row."""
    try:
        rt.manifest.check()
    except OSError as exc:  # the row writes will say it again; the run goes on
        log.warning("%s", t("workflow.manifest_unchecked", path=rt.manifest.path, error=exc))


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _now() -> float:
    import time

    return time.time()


class _ItemShape:
    """One map item as the input hash and the cache see it: its label, the map's agent and
    policy (so an item is hashed, stored and explained like a step of its own)."""

    def __init__(self, label: str, step: MapStep) -> None:
        self.name = label
        self.spec = step.spec
        self.cache = step.cache
        self.idempotent = step.idempotent
        self.gate = step.gate
        self.resume_from: str | None = None
        self.fork = False


def _map_result(step: MapStep, results: list[StepResult], passed: bool) -> StepResult:
    """The map step as one result (its items' rows are in the manifest already)."""
    errors = [f"{r.step}: {r.error}" for r in results if not r.ok and r.error]
    return StepResult(
        step=step.name,
        ok=passed,
        cost_usd=round(sum(r.cost_usd for r in results), 6),
        num_turns=sum(r.num_turns for r in results),
        text="\n".join(r.text for r in results),
        error="; ".join(errors) or (None if passed else "not every item finished"),
        started_at=min((r.started_at for r in results), default=0.0),
        ended_at=max((r.ended_at for r in results), default=0.0),
        attempts=max((r.attempts for r in results), default=0),
        errors=errors,
    )
