"""One attempt: a single SDK client session, from starting the CLI to its ResultMessage.

Every placement runs attempts through :class:`SdkAttempt`: in this process, or inside a
forked step child. It turns the SDK's message stream into a StepResult, reports the session
id the instant it is known and the context size after every main-thread turn, stops itself
for a handoff (``call.stop_at``), and makes sure nothing of the attempt outlives it.

Starting the CLI (:meth:`SdkAttempt.connect`) and sending the prompt (:meth:`SdkAttempt.run`)
are separate so a step child can start its CLI before its prompt is known.

What goes wrong is sorted once, here (:func:`is_crash`): the CLI or the network failing is
the attempt's ``error`` (the resilience policy decides whether to retry); an exception that
says the code or its input is wrong (a bug in flower, a spec the SDK rejects, a failed import)
is an :class:`~flower.AttemptCrash`, which stops the step at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from .._errors import AttemptCrash, FlowerError
from ..agents.agent import AgentSpec, CompactPolicy, build_options, merge_hooks
from ..state.result import HANDOFF_DUE, Event, StepResult
from .call import StepCall
from .events import context_of, normalize
from .placement import Seat, Watch
from .proctree import ATTEMPT_TAG, PROCS, ProcessTree

Closer = Callable[[], Awaitable[None]]
log = logging.getLogger("flower")
LEARN_TIMEOUT_S = 20.0

# Exceptions that say the code or its input is wrong: retrying the same call cannot help.
_CODE_ERRORS: tuple[type[BaseException], ...] = (
    AttributeError,
    TypeError,
    NameError,
    LookupError,  # KeyError, IndexError
    AssertionError,
    ImportError,
    SyntaxError,
    NotImplementedError,
    RecursionError,
    ValueError,
)


def is_crash(exc: BaseException) -> bool:
    """Is ``exc`` a failure retrying cannot fix (rather than the CLI or network failing)?

    Code errors (:data:`_CODE_ERRORS`, minus text-decoding trouble from a process's output),
    flower's own deliberate errors (but a store that stayed busy), and a CLI that is not
    installed are crashes. The SDK's errors about its process, OS errors, timeouts and the
    SDK's generic ``Exception``/``RuntimeError`` (control-request timeouts, a resume that could
    not be materialised) are the attempt's error.
    """
    if isinstance(exc, BaseExceptionGroup):
        return any(is_crash(e) for e in exc.exceptions)
    from claude_agent_sdk import CLINotFoundError

    if isinstance(exc, CLINotFoundError):
        return True
    if isinstance(exc, FlowerError):
        from ..state.errors import StateUnavailable

        # A store that stayed busy or a database that is down is waited out like the network.
        return not isinstance(exc, TimeoutError | StateUnavailable)
    if isinstance(exc, UnicodeError):
        return False
    return isinstance(exc, _CODE_ERRORS)


def crash_of(exc: BaseException) -> AttemptCrash:
    """The AttemptCrash that stands for ``exc`` (its traceback kept as ``detail``)."""
    if isinstance(exc, AttemptCrash):
        return exc
    detail = "".join(traceback.format_exception(exc))
    return AttemptCrash(type(exc).__name__, str(exc)[:2000], detail=detail)


def options_for(call: StepCall, seat: Seat) -> Any:
    """The SDK options one attempt of ``call`` starts its CLI with: the spec compiled, with
    the hook layer installed from it (:func:`attempt_hooks`), the workbench's index in the
    system prompt, and the CLI's auto-compaction off when the Runtime hands off itself."""
    spec = call.spec
    if seat.no_auto_compact and spec.compact is None:
        spec = replace(spec, compact=CompactPolicy(mode="no_summary"))
    wb = seat.workbench
    add_dirs = [str(wb.root)] if wb is not None and wb.external else None
    return build_options(
        spec,
        cwd=seat.workspace,
        session_store=seat.store,
        resume=call.resume,
        fork=call.fork,
        resume_at=call.resume_at,
        portable=seat.portable,
        add_dirs=add_dirs,
        prelude=prelude_for(spec, seat),
        hooks=attempt_hooks(spec, seat),
    )


def prelude_for(spec: AgentSpec, seat: Seat) -> str:
    """What goes after the instructions: the workbench's index, for specs that want it."""
    wb = seat.workbench
    return str(wb.prompt_block()) if wb is not None and spec.workbench else ""


def attempt_hooks(spec: AgentSpec, seat: Seat) -> dict[str, list[Any]]:
    """The hooks flower installs for one attempt, after ``spec.hooks`` (which
    :func:`build_options` puts first).

    As seed 003's table says: the workbench's hooks when the Runtime has a workbench
    (``delegate_guard`` for a ``delegate_only`` spec, ``index_guard``, ``spill_guard`` at
    ``spill_threshold``, the Agent guard for specs with subagents); ``whitelist_guard`` when
    the spec is not ``delegate_only``. Unlike the original, a ``delegate_only`` spec keeps its
    wall and a spec with subagents keeps its Agent guard without a workbench too (the
    original left a coordinator on ``Runtime(workbench=False)`` with no hook at all). Last,
    the tool ledger's hooks, for every spec (:mod:`flower.state.ledger`). They are folded
    into one matcher per event (:func:`~flower.agents.guard.one_per_event`: one control round
    trip per tool call and event instead of one per guard).
    """
    from ..agents.guard import (
        delegate_guard,
        isolate_guard,
        one_per_event,
        whitelist_guard,
        workbench_hooks,
    )

    groups: list[dict[str, list[Any]] | None] = []
    wb = seat.workbench
    if wb is not None:
        groups.append(
            workbench_hooks(
                wb,
                delegate_only=spec.delegate_only,
                spill_threshold=seat.spill_threshold,
                agents=spec.agents,
                allow_glance=spec.glance,
            )
        )
    else:
        pre = [delegate_guard(allow_glance=spec.glance)] if spec.delegate_only else []
        if spec.agents:
            pre.append(isolate_guard(spec.agents))
        groups.append({"PreToolUse": pre})
    if not spec.delegate_only:
        wall = whitelist_guard(spec.allowed_tools, role=spec.name)
        if wall is not None:
            groups.append({"PreToolUse": [wall]})
    ledger = getattr(seat.store, "ledger", None)
    if ledger is not None:
        groups.append(ledger.hooks())
    return one_per_event(merge_hooks(*groups))


#: The CLI compacts by default at window − 33K; flower's headroom beyond that margin is
#: kept below an auto-compaction threshold the CLI reports, and never less than
#: ``MIN_COMPACT_GAP`` (the stop and the CLI's compaction must not race).
CLI_COMPACT_MARGIN = 33_000
MIN_COMPACT_GAP = 5_000


def handoff_at(window: int, headroom: int, compact_at: int | None = None) -> int:
    """Where to hand off in a real ``window``: ``window − headroom`` (at least 10K), and
    as far below an active auto-compaction threshold ``compact_at`` as the CLI's own
    margin is below the window."""
    at = max(10_000, window - headroom)
    if compact_at:
        gap = max(MIN_COMPACT_GAP, headroom - CLI_COMPACT_MARGIN)
        at = min(at, max(10_000, compact_at - gap))
    return at


@dataclass(frozen=True)
class Window:
    """What the CLI says of its context window: its size, the auto-compaction threshold
    when auto-compaction is on, and how long asking took (ms)."""

    window: int
    compact_at: int | None
    ms: float


class AttemptState:
    """Folds SDK messages into a StepResult."""

    def __init__(
        self, call: StepCall, watch: Watch, *, ledger: Any = None, store: Any = None
    ) -> None:
        self.result = StepResult(step=call.label, started_at=time.time(), attempts=call.attempt)
        self.watch = watch
        self.ledger = ledger
        self.store = store  # asked whether a session announced early is there to resume
        self._announcing: asyncio.Task[None] | None = None
        self.stop_at = call.stop_at
        self.headroom = call.headroom  # not None: stop_at was guessed and may be lowered
        self.stop_requested = False  # the loop's reader interrupts the CLI when it sees this
        self.stopped_for_handoff = False
        self.last_text = ""
        self.model: str | None = None
        self.api_error: str | None = None

    def see(self, msg: Any) -> None:
        from claude_agent_sdk import AssistantMessage, ResultMessage, SystemMessage, UserMessage

        sid = getattr(msg, "session_id", None)
        if sid is None and isinstance(msg, SystemMessage) and isinstance(msg.data, dict):
            self._see_early(msg.data.get("session_id"))  # the init message
        else:
            self._see_session(sid)
        if isinstance(msg, AssistantMessage):
            self._see_assistant(msg)
        elif isinstance(msg, UserMessage):
            self._see_results(msg)
        elif isinstance(msg, ResultMessage):
            self._see_result(msg)
        elif isinstance(msg, SystemMessage) and msg.subtype == "init":
            self.model = str(msg.data.get("model") or "") or None
            self._see_versions(msg.data.get("claude_code_version"))
        for event in normalize(msg):  # seed 003's events: text, tool calls, results, …
            event.payload["step"] = self.result.step
            self.watch.on_event(event)

    def _see_versions(self, cli: Any) -> None:
        """The SDK and the CLI this attempt runs on, for its step's manifest row."""
        from claude_agent_sdk import __version__ as sdk

        payload = {"step": self.result.step, "sdk": str(sdk), "cli": str(cli or "?")}
        self.watch.on_event(Event("versions", payload=payload))

    def _see_session(self, sid: str | None) -> None:
        if sid and sid != "default" and sid != self.result.session_id:
            self._announce_when_stored(sid)  # the first, or the CLI went on in another one

    def _see_early(self, sid: Any) -> None:
        """The init message names the session before the first request."""
        if isinstance(sid, str) and sid and sid != "default" and not self.result.session_id:
            self._announce_when_stored(sid)

    def _announce_when_stored(self, sid: str) -> None:
        """Make ``sid`` the attempt's session and announce it (lineage, the mailbox and the
        registry name it from then on) once the store holds a conversation the CLI can
        resume. Never sooner, whatever message names it: a session killed before its prompt
        is stored has nothing to resume (the CLI answers "No conversation found"), and must
        not be remembered as if it had. The CLI's first entries trail its init message by
        ~100 ms; the SDK flushes them all before it hands over the result."""
        if self._announcing is not None:  # another session took over: drop the early one
            self._announcing.cancel()
            self._announcing = None
        self.result.session_id = sid
        if self.store is None or not hasattr(self.store, "has_session"):
            self.watch.on_session(sid)
            return
        self._announcing = asyncio.get_running_loop().create_task(self._announce_stored(sid))

    def _stored(self, sid: str) -> bool:
        try:
            return bool(self.store.has_session(None, sid))
        except Exception:  # noqa: BLE001 - a store that cannot say (a database away, its
            # writes kept on this machine): announce it, lineage's load decides later
            return True

    async def _announce_stored(self, sid: str) -> None:
        # A poll: the store is another process's database, with nothing to wait on here.
        while not self._stored(sid):  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        self._announcing = None
        if sid == self.result.session_id:  # not replaced by another session meanwhile
            self.watch.on_session(sid)

    def settle(self) -> None:
        """The attempt is over: a session still waiting to be announced is announced if the
        store holds it now (the SDK flushed it before the result), else given up (a session
        that never reached the store by the end of its attempt is not one to resume)."""
        if self._announcing is None:
            return
        self._announcing.cancel()
        self._announcing = None
        sid = self.result.session_id
        if sid and self._stored(sid):
            self.watch.on_session(sid)
        else:
            self.result.session_id = None

    def _see_assistant(self, msg: Any) -> None:
        from claude_agent_sdk import TextBlock

        if msg.parent_tool_use_id is not None:
            return  # a subagent's turn: not the main thread's context
        texts = [b.text for b in msg.content if isinstance(b, TextBlock) and b.text]
        if msg.error:
            # The CLI's synthetic "API Error: ..." turns: remember the text for classify(),
            # never show it as the model's answer.
            self.api_error = "\n".join(texts) or str(msg.error)
            return
        if self.ledger is not None:  # before its PreToolUse: the call's message is kept
            self.ledger.saw(msg)
        if texts:
            self.last_text = "\n".join(texts)
        used = context_of(msg.usage)
        if used:
            self.saw_context(used, final=msg.stop_reason == "end_turn")

    def _see_results(self, msg: Any) -> None:
        """The tool results the model is sent: the ledger keeps their exact content."""
        from claude_agent_sdk import ToolResultBlock

        if self.ledger is None or not isinstance(msg.content, list):
            return
        for block in msg.content:
            if isinstance(block, ToolResultBlock):
                self.ledger.seen(block.tool_use_id, block.content, block.is_error)

    def saw_context(self, used: int, *, final: bool) -> None:
        """One main-thread turn's context size: report it; past ``stop_at`` stop for a handoff
        (never on a final turn: the step is done anyway)."""
        self.result.context = used
        self.watch.on_event(
            Event("context", payload={"step": self.result.step, "used": used, "final": final})
        )
        if self.stop_at is not None and used >= self.stop_at and not final:
            self.stop_requested = self.stopped_for_handoff = True

    def learn(
        self,
        window: int,
        *,
        compact_at: int | None = None,
        source: str,
        cost_ms: float | None = None,
    ) -> None:
        """The CLI's real context window (and its auto-compaction threshold when that is
        on): lower a guessed ``stop_at`` to what they allow, and tell the loop."""
        if self.headroom is None or self.stop_at is None or window <= 0:
            return
        self.stop_at = min(self.stop_at, handoff_at(window, self.headroom, compact_at))
        self.headroom = None  # learned: nothing more to ask
        payload: dict[str, Any] = {
            "window": window,
            "at": self.stop_at,
            "compact_at": compact_at,
            "source": source,
        }
        if cost_ms is not None:
            payload["ms"] = round(cost_ms, 1)
        self.watch.on_event(Event("window", payload={"step": self.result.step, **payload}))

    def _see_result(self, msg: Any) -> None:
        r = self.result
        r.cost_usd += float(msg.total_cost_usd or 0.0)
        r.num_turns += int(msg.num_turns or 0)
        if msg.session_id:
            self._see_session(msg.session_id)
        window = _window_of(msg.model_usage, self.model)
        if window:  # free with every result: later attempts need not ask
            self.watch.on_event(
                Event("window", payload={"step": r.step, "window": window, "source": "result"})
            )
        if msg.is_error:
            r.ok = False
            r.error = _error_text(msg, self.api_error)
        else:
            r.ok = True
            r.error = None
            r.text = msg.result if msg.result is not None else self.last_text

    def finish(self) -> StepResult:
        self.settle()
        r = self.result
        if not r.ok and self.stopped_for_handoff:
            r.error = HANDOFF_DUE
        elif not r.ok and not r.error:
            r.error = self.api_error or "the CLI ended without a result"
        r.ended_at = time.time()
        return r


def _window_of(model_usage: Any, model: str | None) -> int:
    """The main model's context window from a ResultMessage's ``model_usage``."""
    if not isinstance(model_usage, dict) or not model_usage:
        return 0
    usage = model_usage.get(model) if model else None
    if not isinstance(usage, dict):  # else the model that read the most
        usages = [u for u in model_usage.values() if isinstance(u, dict)]
        usage = max(usages, key=lambda u: int(u.get("inputTokens") or 0), default=None)
    try:
        return int((usage or {}).get("contextWindow") or 0)
    except (TypeError, ValueError):
        return 0


def local_failure(result: Mapping[str, Any]) -> str | None:
    """The error text of a CLI that failed on this machine before it sent any request, from
    its ``result`` payload; None for anything else (an API error included).

    Claude Code 2.1.337 says so itself (``startup_failure_reason``, e.g.
    ``resume_target_not_found``); 2.1.332 only by the shape of its result: an
    ``error_during_execution`` with no turn, no API time, no API status and no terminal
    reason (a refused connection is a turn that ends with ``terminal_reason: api_error``).
    The text begins with :data:`~flower.step.resilience.CLI_FAILED`, which
    :func:`~flower.step.resilience.classify` reads as ``"local"``: never retried as the
    network."""
    from .resilience import CLI_FAILED

    reason = result.get("startup_failure_reason")
    if not reason:
        said_api = any(result.get(k) for k in ("api_error_status", "terminal_reason"))
        spent = any(result.get(k) for k in ("num_turns", "duration_api_ms"))
        if said_api or spent or result.get("subtype") != "error_during_execution":
            return None
        reason = result.get("subtype")
    errors = [str(e) for e in result.get("errors") or [] if e]
    words = "; ".join(errors) or str(result.get("result") or "") or "no reason given"
    return f"{CLI_FAILED} ({reason}): {words}"


def _result_fields(msg: Any) -> dict[str, Any]:
    keys = ("subtype", "errors", "result", "api_error_status", "terminal_reason", "num_turns")
    fields = {k: getattr(msg, k, None) for k in keys}
    fields["duration_api_ms"] = getattr(msg, "duration_api_ms", None)
    return fields


def _error_text(msg: Any, api_error: str | None) -> str:
    """One line describing a failed ResultMessage, preferring the CLI's own words."""
    local = local_failure(_result_fields(msg)) if not api_error else None
    if local:
        return local
    parts = [p for p in (msg.result, api_error) if p]
    if msg.errors:
        parts.extend(str(e) for e in msg.errors)
    text = parts[0] if parts else f"{msg.subtype}"
    status = getattr(msg, "api_error_status", None)
    if status and str(status) not in text:
        text = f"API Error: {status} {text}"
    return text


class SdkAttempt:
    """One SDK client session: :meth:`connect`, :meth:`run` the prompt, :meth:`close`.

    Errors of the CLI or the network become the attempt's ``error``; a crash (:func:`is_crash`)
    raises :class:`~flower.AttemptCrash` from :meth:`run`, even one that happened while
    connecting. Between ``connect`` and ``close`` it is the attempt's interrupt handle.
    """

    def __init__(
        self, call: StepCall, seat: Seat, watch: Watch, *, procs: ProcessTree | None = None
    ) -> None:
        self.call = call
        self.watch = watch
        self.procs = procs or PROCS
        self.state = AttemptState(call, watch)  # replaced by run(), which has the whole call
        self.tag = secrets.token_hex(8)
        self._seat = seat
        self._client: Any = None
        self._failed: BaseException | None = None  # what went wrong while connecting
        self._prelude = ""  # the workbench index the CLI was started with
        self._window: Window | None = None  # the CLI's real window, when connect() asked

    async def connect(self) -> None:
        """Start the CLI with the call's options (about 0.4 s); never raises but cancellation."""
        from claude_agent_sdk import ClaudeSDKClient

        try:
            self._fence()
            self._prelude = prelude_for(self.call.spec, self._seat)
            options = options_for(self.call, self._seat)
            client = ClaudeSDKClient(replace(options, env={**options.env, ATTEMPT_TAG: self.tag}))
            self._client = client
            await client.connect()
        except Exception as exc:  # noqa: BLE001 - reported by run(), sorted by is_crash
            self._failed = exc
            return
        if self.call.headroom is not None and self._window is None:  # a guessed window
            self._window = await self._ask_window()
        self.watch.on_handle(self)

    def _fence(self) -> None:
        """Take this attempt's epoch and, before the CLI loads it, make the session it
        continues ours: a write of an older attempt of it (a frozen worker woken up) is
        refused from now on, and a newer one already holding it refuses us
        (:class:`flower.state.errors.Superseded`, the attempt's error)."""
        store = self._seat.store
        begin = getattr(store, "begin_attempt", None)
        if begin is None:
            return
        begin()
        if self.call.resume and not self.call.fork:
            store.claim(self.call.resume)

    def lost(self) -> bool:
        """Is the CLI :meth:`connect` started gone: it failed to start, or died since (a CLI
        prepared long ago may have)?"""
        if self._client is None or self._failed is not None:
            return True
        return not self.procs.tagged_below(self.tag)

    def again(self) -> SdkAttempt:
        """A fresh attempt of the same call (its CLI not started), keeping what this one
        learned of the CLI's window."""
        fresh = SdkAttempt(self.call, self._seat, self.watch, procs=self.procs)
        fresh._window = self._window
        return fresh

    def stale(self) -> bool:
        """Has the workbench's index changed since :meth:`connect` (a CLI started ahead of
        time would show the next step an index without what the last one wrote)?"""
        return prelude_for(self.call.spec, self._seat) != self._prelude

    async def interrupt(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):  # the turn may have just ended
                await self._client.interrupt()

    async def run(self, call: StepCall | None = None) -> StepResult:
        """Send the call's prompt and read the session to its result.

        ``call`` is the attempt to run when it was not fully known at :meth:`connect` (a
        prepared step child learns its prompt, number and ``stop_at`` only then); it must
        start the CLI exactly as the call given to the constructor did.
        """
        call = call or self.call
        assert call.same_session_as(self.call), "run() of a call the CLI was not started for"
        state = self.state = AttemptState(
            call,
            self.watch,
            ledger=getattr(self._seat.store, "ledger", None),
            store=self._seat.store,
        )
        if self._window is not None and call.headroom is not None:
            w = self._window
            state.learn(w.window, compact_at=w.compact_at, source="cli", cost_ms=w.ms)
        try:
            if self._failed is not None:
                raise self._failed
            await self._client.query(call.prompt)
            async for msg in self._client.receive_response():
                state.see(msg)
                if state.stop_requested:
                    state.stop_requested = False
                    await self._client.interrupt()
        except Exception as exc:
            if is_crash(exc):
                raise crash_of(exc) from exc
            state.result.ok = False
            state.result.error = (
                state.result.error or _local_failure_of(exc) or f"{type(exc).__name__}: {exc}"
            )
        return state.finish()

    async def _ask_window(self) -> Window | None:
        """The CLI's real window, from ``get_context_usage``, asked once the CLI is up and
        before the prompt is sent, so every turn is judged by it. Measured with CLI 2.1.332
        (scripts/bench_hooks.py prints it): 1-2 s and some twenty ``count_tokens`` requests;
        so only when the window is a guess that nothing has corrected yet (the Runtime keeps
        what its attempts learned, per model), and ahead of time in a prepared step child.
        None if the CLI cannot say."""
        started = time.perf_counter()
        try:
            usage = await asyncio.wait_for(self._client.get_context_usage(), LEARN_TIMEOUT_S)
            window = int(usage.get("rawMaxTokens") or usage.get("maxTokens") or 0)
            on = bool(usage.get("isAutoCompactEnabled"))
            compact_at = int(usage.get("autoCompactThreshold") or 0) if on else 0
        except Exception as exc:  # noqa: BLE001 - the guess stays; the step goes on
            log.info("the CLI did not tell its context window (%s); keeping the guess", exc)
            return None
        if window <= 0:
            return None
        return Window(window, compact_at or None, (time.perf_counter() - started) * 1000)

    async def close(self, *, defer: list[Closer] | None = None) -> None:
        """Shut the CLI down; after a failure also end whatever it left running.

        A CLI that answered exits on its own and takes its tool shells with it (about 40 ms),
        so the scan of the process table is only paid when something went wrong. With
        ``defer``, a successful attempt's shutdown is appended there instead of awaited.
        """
        self.watch.on_handle(None)
        client, self._client = self._client, None
        if client is None and self._failed is None:
            return
        failed = not self.state.result.ok
        if defer is not None and not failed:
            defer.append(lambda: _shut(client, self.tag, self.procs, sweep=False))
        else:
            await _shut(client, self.tag, self.procs, sweep=failed)


def _local_failure_of(exc: BaseException) -> str | None:
    """:func:`local_failure` of an SDK ``ResultError`` (the CLI's failure at start-up, raised
    while connecting, before any message)."""
    from claude_agent_sdk import ResultError

    if not isinstance(exc, ResultError):
        return None
    return local_failure(exc.data or {"subtype": exc.subtype, "errors": exc.errors})


async def _shut(client: Any, tag: str, procs: ProcessTree, *, sweep: bool) -> None:
    if client is not None:
        with contextlib.suppress(Exception):  # the CLI may already be gone
            await client.disconnect()
    if sweep:
        await asyncio.to_thread(procs.end_leftovers, tag)
