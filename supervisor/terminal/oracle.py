"""The oracle: "? 现在到哪了" typed while a run works (the reference's 旁路问答).

A line that starts with ``?`` — or the full-width ``？`` a Chinese input method types; the
original meant to accept it and compared ``?`` twice — is not for the running agent. It goes
to an *independent* Runtime whose run_dir is ``<run_dir>/aside/`` (its own ``sessions.db``,
``manifest.json``, ``logs/``, ``tmp/``): its cost and sessions never mix into the main run's.
That holds with a state URL too: the answers are not the run's state, so they stay in those
local files on the supervisor's machine, never in the run's database.
The agent is :func:`flower.oracle` (read-only: Read, Glob, Grep; 12 turns; $0.5). What it
sees is the run's most recent 60 events (thinking and prompt events left out), each cut to
200 characters (:class:`RecentEvents`), and where the workspace, the workbench and the run's
record are. It runs concurrently in the caller's event loop, the run never waits for it, and
what it says is only shown (:class:`Oracle`)::

    # 旁路
      <回答正文>
      ($0.0123,没有打扰正在跑的运行)

or, on any failure, one line ``# 旁路问答失败:<类型>: <消息>``; nothing escapes into the
run. On exit :meth:`Oracle.drain` waits at most 120 s for answers in flight, saying
``(等 N 条旁路问答收尾…)`` first.

Where the oracle's step runs. Under ``flower-super`` the oracle shares the supervisor's own
:class:`~supervisor.run.placement.Forked` (pass ``placement=rt.placement``): its step is one more
forked child, like every step attempt. Not an in-process placement, though it would be
simplest (the SDK is preloaded here either way), because in the supervisor

- the supervisor is a child subreaper, and whenever a step child ends uncleanly its
  ``Forked`` kills and reaps every direct child it does not know
  (``ProcessTree.reap_orphans(keep=children)``): a CLI started here by an in-process attempt,
  or the child of a second ``Forked``, would be killed as an orphan mid-answer;
- one ``Forked`` knows every pipe: each fork closes the other children's pipe ends in the new
  child. A second one would leak the oracle child's pipes into step children and back (a
  child holding another's pipe end keeps it from seeing EOF when the supervisor dies);
- SIGTERM/SIGHUP and a second Ctrl-C stop the placement's children (``stop_now``): sharing it,
  the oracle's child and CLI go down with the rest, with nothing more to wire;
- the oracle's CLI, its hooks (``whitelist_guard``, the tool ledger) and its SDK client run
  outside the supervisor, which only reads frames: the terminal stays as responsive as during
  any step, and a fork from the preloaded supervisor costs a few milliseconds.

The step's label (``旁路问答``) never matches a prepared child, and its sessions live in
another sessions.db, so the main flow's bookkeeping in that ``Forked`` is untouched. Only the
one-time sweep of a killed flower's temporary files runs for whichever seat forks first.
Without ``placement`` (library use: ``Workflow.run`` in-process, no subreaper) the attempt is
:class:`~flower.step.inprocess.InProcess`.

Two Runtimes in one process share no state: run id, results, store, manifest, interrupts and
windows are per instance; the registry record (``<run_dir>/flowers/``) is written only after
``begin_flow`` and lineage only through ``on_session``, and the aside Runtime uses neither.
Three settings keep it off the main workbench, which it reads: no handoff (that would write
``notes/交接-旁路问答.md``), no spill guard (that writes long results into the workbench), and
the workbench assigned after construction (the constructor rewrites its ``INDEX.md``).
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from flower import FlowerError
from flower.agents.agent import AgentSpec
from flower.agents.roles import oracle as oracle_role
from flower.agents.workbench import Workbench
from flower.i18n import define, t
from flower.state.result import Event, StepResult
from flower.step.placement import Placement
from flower.step.resilience import Resilience
from flower.step.runtime import Runtime

__all__ = [
    "ASIDE_DIRNAME",
    "DRAIN_S",
    "EVENT_CHARS",
    "MARKS",
    "RECENT_EVENTS",
    "STEP_NAME",
    "Oracle",
    "OracleFailed",
    "RecentEvents",
    "is_question",
]

#: What starts an oracle question: the ASCII ``?`` and the full-width ``？`` (U+FF1F).
MARKS = ("?", "\uff1f")
#: The oracle's run_dir, under the main run's.
ASIDE_DIRNAME = "aside"
#: How many events the oracle sees, and how many characters of each.
RECENT_EVENTS = 60
EVENT_CHARS = 200
#: How long :meth:`Oracle.drain` waits for answers in flight.
DRAIN_S = 120.0
#: The step label of every answer in ``aside/manifest.json`` (the role's default name).
STEP_NAME = "旁路问答"

# Left out of the window: thinking and the prompts sent (the reference), and the two meters
# flower reports after every turn ("context", "window": sizes, not things that happened,
# and outside EventKind), which would otherwise crowd the last 60 out.
SKIPPED_KINDS = frozenset({"thinking", "prompt", "context", "window"})
# Payload keys not worth the model's attention when an event has no text of its own.
_NOISE_KEYS = frozenset({"step", "subagent", "parent_tool_use_id", "context", "id", "tool_use_id"})


def oracle_resilience() -> Resilience:
    """A question in passing: one retry and a minute of waiting for the network at most,
    never the hour a step may wait (the exit gives answers in flight 120 s)."""
    return Resilience(max_attempts=2, probe_interval=5.0, max_offline_wait=60.0)


define(
    {
        "oracle.head": ("# 旁路", "# aside"),
        "oracle.cost": (
            "(${cost},没有打扰正在跑的运行)",
            "(${cost}, the running run was not disturbed)",
        ),
        "oracle.failed": (
            "# 旁路问答失败:{kind}: {message}",
            "# aside question failed: {kind}: {message}",
        ),
        "oracle.draining": (
            "(等 {n} 条旁路问答收尾…)",
            "(waiting for {n} aside {n|question|questions} to finish…)",
        ),
        "oracle.abandoned": (
            "(还有 {n} 条旁路问答没答完,不等了)",
            "({n} aside {n|question|questions} did not finish in time; not waiting any longer)",
        ),
        "oracle.empty": (
            "? 后面写上要问的,比如:? 现在到哪了",
            "write the question after the ?, for example: ? where are we now",
        ),
        "oracle.no_text": ("(它没有给出文字回答)", "(it gave no text answer)"),
        "oracle.no_answer": ("没有得到回答", "no answer came back"),
    }
)


class OracleFailed(FlowerError):
    """The oracle's step ended without an answer (its error is the message)."""


def is_question(line: str) -> str | None:
    """The question in ``line`` when it is one for the oracle, else None.

    Leading whitespace is ignored, then one ``?`` or ``？`` is taken off and the rest
    stripped: ``"  ？ 现在到哪了"`` → ``"现在到哪了"``; a bare ``?`` is the empty question
    ``""`` (still the oracle's, not an appended requirement)."""
    text = line.lstrip()
    for mark in MARKS:
        if text.startswith(mark):
            return text[len(mark) :].strip()
    return None


class RecentEvents:
    """The last ``size`` (60) events of a run, as the oracle is shown them.

    Feed it every event the run reports (:meth:`add`; thinking, prompts and the context
    meters are left out) and, if you like, every finished step (:meth:`add_result`). Each is
    kept as one line — time, step, kind, tool, and its text (or its payload's scalar fields
    when it has none) on one line, cut to ``chars`` (200) characters — so no SDK object is
    held. :meth:`render` is the block that goes into the oracle's prompt.
    """

    def __init__(
        self,
        size: int = RECENT_EVENTS,
        *,
        chars: int = EVENT_CHARS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.size, self.chars, self.clock = size, chars, clock
        self._lines: collections.deque[str] = collections.deque(maxlen=size)

    def add(self, event: Event) -> None:
        """Keep ``event`` (unless it is of a kind the oracle is not shown)."""
        if event.kind in SKIPPED_KINDS:
            return
        head = event.kind + (f" {event.tool}" if event.tool else "")
        if event.payload.get("subagent"):
            head = f"(subagent) {head}"
        self._keep(event.step, head, event.text or _scalars(event.payload))

    def add_result(self, result: StepResult) -> None:
        """Keep a finished step: ok or not, time, cost, its error."""
        mark = "ok" if result.ok else "failed"
        body = f"{result.duration_s:.1f}s ${result.cost_usd:.4f}"
        if result.error:
            body += f" {result.error}"
        self._keep(result.step, f"step {mark}", body)

    def _keep(self, step: str, head: str, body: str) -> None:
        stamp = time.strftime("%H:%M:%S", time.localtime(self.clock()))
        where = f" [{step}]" if step else ""
        text = _cut(" ".join(body.split()), self.chars)
        self._lines.append(f"{stamp}{where} {head}" + (f": {text}" if text else ""))

    def lines(self) -> list[str]:
        """The kept lines, oldest first."""
        return list(self._lines)

    def __len__(self) -> int:
        return len(self._lines)

    def render(self) -> str:
        """The context block: a heading, then one line per event, oldest first."""
        head = (
            f"## 运行最近的事件(旧的在前,最多 {self.size} 条,每条截到 {self.chars} 字;"
            f"现在是 {time.strftime('%H:%M:%S', time.localtime(self.clock()))})"
        )
        return "\n".join([head, *(self._lines or ["(还没有事件)"])])


class Oracle:
    """Answers questions about a run while it works, without touching it.

    ``run_dir`` and ``workspace`` are the main run's; the oracle's own Runtime lives in
    ``<run_dir>/aside/`` (made on the first question). ``workbench`` is the run's workbench
    (or None), which the oracle reads and is told about; ``paths`` are more files or
    directories worth naming to it. ``say(text)`` shows text to the person (each answer is one
    call, so nothing interleaves inside it). ``recent`` is the run's event window (a fresh
    :class:`RecentEvents` by default: feed :attr:`recent`). ``placement``: under
    ``flower-super`` the supervisor's ``Forked`` (see the module docstring); None runs the
    attempt in this process. ``resilience`` (one retry, a minute offline at most) and ``spec``
    (:func:`flower.oracle`) may be changed.
    """

    def __init__(
        self,
        run_dir: str | Path,
        workspace: str | Path,
        workbench: Workbench | None = None,
        *,
        say: Callable[[str], Any],
        recent: RecentEvents | None = None,
        paths: Sequence[str | Path] = (),
        placement: Placement | None = None,
        resilience: Resilience | None = None,
        spec: AgentSpec | None = None,
    ) -> None:
        self.run_dir = Path(run_dir).expanduser().absolute()
        self.workspace = Path(workspace).expanduser().resolve()
        self.workbench = workbench
        self.say = say
        self.recent = recent if recent is not None else RecentEvents()
        self.paths = [Path(p) for p in paths]
        self.placement = placement
        self.resilience = resilience or oracle_resilience()
        self.spec = spec or oracle_role(STEP_NAME)
        self.runtime: Runtime | None = None  # made on the first question
        self._tasks: set[asyncio.Task[StepResult | None]] = set()

    is_question = staticmethod(is_question)

    @property
    def aside_dir(self) -> Path:
        return self.run_dir / ASIDE_DIRNAME

    @property
    def in_flight(self) -> int:
        """How many questions are being answered now."""
        return sum(not task.done() for task in self._tasks)

    # -- asking ---------------------------------------------------------------------------

    def ask(self, question: str) -> asyncio.Task[StepResult | None]:
        """Put ``question`` to the oracle; returns at once (call it from the running loop).

        The context is the event window as it is now. The task shows the answer (or the one
        failure line) through ``say`` and ends with the aside step's result (None when it
        failed); it never raises but when cancelled.
        """
        loop = asyncio.get_running_loop()
        question = question.strip()
        if question:
            task = loop.create_task(self._answer(self.prompt_for(question)))
        else:
            task = loop.create_task(self._hint())
        self._tasks.add(task)  # the loop keeps only a weak reference to a task
        task.add_done_callback(self._tasks.discard)
        return task

    def prompt_for(self, question: str) -> str:
        """What the oracle is sent: where to look, the recent events, the question."""
        where = [f"- 工作区:{self.workspace}"]
        if self.workbench is not None:
            root = self.workbench.root
            where += [
                f"- 工作台:{root}/",
                f"  - {root / 'notes'}/:关键决定、需求.md、目标.md、交接书(交接-<步骤>.md)",
                f"  - {root / 'artifacts'}/:长输出;{root / 'scripts'}/:可以再跑的脚本",
                f"  - {root / 'INDEX.md'}:工作台里每个文件的一句话说明",
            ]
        where.append(f"- 这次运行的步骤记录:{self.run_dir / 'manifest.json'}(每个跑完的步骤一行)")
        where += [f"- {p}" for p in self.paths]
        return "\n".join(
            [
                "一次运行正在进行,有人从旁边问了一句。只看、不改;看不出来就直说。",
                "",
                "## 可以看的地方",
                *where,
                "",
                self.recent.render(),
                "",
                "## 问题",
                question,
            ]
        )

    async def _hint(self) -> StepResult | None:
        self.say(t("oracle.empty"))
        return None

    async def _answer(self, prompt: str) -> StepResult | None:
        try:
            result = await self._open().run(self.spec, prompt, step_name=STEP_NAME)
            if not result.ok:
                raise OracleFailed(" ".join((result.error or t("oracle.no_answer")).split()))
        except Exception as exc:  # noqa: BLE001 - a side question must never reach the run
            self.say(t("oracle.failed", kind=type(exc).__name__, message=_message(exc)))
            return None
        self.say(self.shown(result))
        return result

    def shown(self, result: StepResult) -> str:
        """The answer block: the heading, the text indented, the cost line."""
        body = result.text.strip() or t("oracle.no_text")
        lines = [t("oracle.head"), *("  " + line for line in body.splitlines())]
        lines.append("  " + t("oracle.cost", cost=f"{result.cost_usd:.4f}"))
        return "\n".join(lines)

    def _open(self) -> Runtime:
        """The aside Runtime (made once; synchronous, so two questions share it)."""
        if self.runtime is None:
            rt = Runtime(
                workspace=self.workspace,
                run_dir=self.aside_dir,
                workbench=False,
                spill_threshold=None,
                resilience=self.resilience,
                handoff=False,
                placement=self.placement,
                state="",  # its own files, whatever the run's state is (the docstring)
            )
            rt.workbench = self.workbench  # read, never refreshed (see the module docstring)
            self.runtime = rt
        return self.runtime

    # -- leaving --------------------------------------------------------------------------

    # The bound is the contract (120 s, then say what was given up), not the caller's choice.
    async def drain(self, timeout: float = DRAIN_S) -> None:  # noqa: ASYNC109
        """Wait at most ``timeout`` seconds for the answers in flight (saying how many
        first), cancel what is left, close the aside store. Nothing to wait for: silent."""
        pending = [task for task in self._tasks if not task.done()]
        if pending:
            self.say(t("oracle.draining", n=len(pending)))
            _, left = await asyncio.wait(pending, timeout=timeout)
            if left:
                for task in left:
                    task.cancel()
                await asyncio.gather(*left, return_exceptions=True)
                self.say(t("oracle.abandoned", n=len(left)))
        self.close()

    def close(self) -> None:
        """Close the aside Runtime's store (the placement is the caller's to close)."""
        if self.runtime is not None:
            self.runtime.close()
            self.runtime = None


def _scalars(payload: dict[str, Any]) -> str:
    """``k=v`` of an event's plain fields (retry, handoff, offline … carry no text)."""
    return " ".join(
        f"{k}={v}"
        for k, v in payload.items()
        if k not in _NOISE_KEYS and isinstance(v, (str, int, float, bool)) and v != ""
    )


def _cut(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: max(0, chars - 1)] + "…"


def _message(exc: BaseException) -> str:
    text = exc.one_line() if isinstance(exc, FlowerError) else str(exc)
    return _cut(" ".join(text.split()), 300) or type(exc).__name__
