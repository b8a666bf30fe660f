"""The public API, held against its reference.

The reference is the original project's API page (``docs/en/reference/api.md``: "the 62
public symbols in flower's top-level ``__all__``", "every signature corresponds verbatim to
the source"). Everything below is typed in from that page: each name's parameters (name,
positional or keyword-only, default), each dataclass's fields and defaults, each constant's
value where the page gives one, and the signatures of the members it documents.

What counts as a match:

- Parameters the reference documents are there with its kind and default; its positional
  parameters come first and in its order (keyword-only ones may come in any order).
- Additions are allowed when no documented call can notice them: an extra parameter or
  field must have a default, and an extra field comes after the documented ones.
- A default that is a ``default_factory`` is compared by what the factory makes (a fresh
  empty list, ``time.time()`` …); a default the reference names as a module constant is
  compared with that constant of the module the object comes from.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

import flower

pytestmark = pytest.mark.timeout(60)

# ======================================================================================
# the vocabulary of the expectations
# ======================================================================================

POS = inspect.Parameter.POSITIONAL_OR_KEYWORD
KW = inspect.Parameter.KEYWORD_ONLY
VAR_POS = inspect.Parameter.VAR_POSITIONAL
VAR_KW = inspect.Parameter.VAR_KEYWORD
EMPTY = inspect.Parameter.empty


class _Required:
    def __repr__(self) -> str:
        return "<required>"


REQUIRED: Any = _Required()


@dataclass(frozen=True)
class Factory:
    """A ``default_factory``: what it makes must satisfy ``check`` (or equal ``value``),
    and two calls must not share one mutable object."""

    value: Any = None
    check: Callable[[Any], bool] | None = None
    what: str = ""

    def ok(self, made: Any) -> bool:
        return self.check(made) if self.check is not None else made == self.value

    def __repr__(self) -> str:
        return f"field(default_factory=…) making {self.what or repr(self.value)}"


@dataclass(frozen=True)
class ModuleConst:
    """A default the reference gives as a constant of the defining module."""

    name: str

    def __repr__(self) -> str:
        return f"<module constant {self.name}>"


@dataclass(frozen=True)
class Param:
    name: str
    kind: Any
    default: Any = REQUIRED


def p(name: str, default: Any = REQUIRED) -> Param:
    """Positional-or-keyword."""
    return Param(name, POS, default)


def k(name: str, default: Any = REQUIRED) -> Param:
    """Keyword-only."""
    return Param(name, KW, default)


def star(name: str) -> Param:
    return Param(name, VAR_POS, EMPTY)


def starstar(name: str) -> Param:
    return Param(name, VAR_KW, EMPTY)


@dataclass(frozen=True)
class F:
    """One dataclass field."""

    name: str
    default: Any = REQUIRED
    compare: bool = True


@dataclass(frozen=True)
class Func:
    params: tuple[Param, ...]
    coroutine: bool = False


@dataclass(frozen=True)
class Class:
    """A class that is not a dataclass: its constructor's parameters."""

    params: tuple[Param, ...]
    bases: tuple[str, ...] = ()


@dataclass(frozen=True)
class DC:
    fields: tuple[F, ...]
    bases: tuple[str, ...] = ()


@dataclass(frozen=True)
class Exc:
    base: type[BaseException]


@dataclass(frozen=True)
class Const:
    value: Any = None
    check: Callable[[Any], bool] | None = None
    what: str = ""


def _nonempty_str(v: Any) -> bool:
    return isinstance(v, str) and bool(v.strip())


RULES = Const(check=_nonempty_str, what="a non-empty rule text")

# ======================================================================================
# the 62 names, as the reference gives them
# ======================================================================================

BULKY = "Bash|Read|Grep|Glob|WebFetch|WebSearch"
HANDS_ON = "Bash|Write|Edit|NotebookEdit"
RESUME_PROMPT = (
    "上一轮在中途被打断,没有跑完。检查一下工作台里已经落盘的东西,从中断处接着做,不要重头来过。"
)
EXPIRED_TEXT = "[{cmd} 的结果已过期(第 {age} 轮前),当前状态可能已变。需要请重新执行]"
WORKER_PROMPT = "你负责实现。每改一处就跑一次验证,别攒到最后。"

EMPTY_LIST = Factory([], what="[]")
EMPTY_DICT = Factory({}, what="{}")

API: dict[str, Any] = {
    # ---- run an agent ---------------------------------------------------------------
    "Runtime": Class(
        (
            k("workspace"),
            k("run_dir", "runs"),
            k("portable", True),
            k("trim", False),
            k("ephemeral", True),
            k("keep_denials", 1),
            k("workbench", False),
            k("spill_threshold", 4000),
            k("resilience", True),
            k("handoff", True),
        )
    ),
    "StepResult": DC(
        (
            F("step"),
            F("session_id", None),
            F("ok", False),
            F("cost_usd", 0.0),
            F("num_turns", 0),
            F("text", ""),
            F("error", None),
            F("started_at", 0.0),
            F("ended_at", 0.0),
            F("attempts", 1),
            F("errors", EMPTY_LIST),
            F("resumed", False),
            F("retired", EMPTY_LIST),
            F("context", 0),
        )
    ),
    # ---- chain steps together -------------------------------------------------------
    "Step": DC(
        (
            F("name"),
            F("spec"),
            F("prompt"),
            F("resume_from", None),
            F("fork", False),
            F("retries", 0),
            F("gate", None),
            F("on_fail", "stop"),
            F("when", None),
            F("on_reject", None),
            F("resume_prompt", None),
            F("reduce", None),
        )
    ),
    "Workflow": DC(
        (
            F("steps"),
            F("name", "workflow"),
            F("context", EMPTY_DICT),
            F("channel", None),
            F("workbench", None),
            F("continuous", True),
        )
    ),
    "StepAbort": Exc(Exception),
    "clarify_step": Func(
        (
            p("channel"),
            k("brief_path"),
            k("prompt"),
            k("name", "确认需求"),
            k("spec", None),
            k("instructions", ""),
            k("always_ask", False),
            k("on_fail", "stop"),
            k("retries", 0),
            starstar("spec_kw"),
        )
    ),
    "goal_step": Func(
        (
            p("channel"),
            k("goal_path"),
            k("brief_key", "确认需求"),
            k("name", "设定目标"),
            k("spec", None),
            k("instructions", ""),
            k("always_set", False),
            k("on_fail", "stop"),
            k("retries", 0),
            starstar("spec_kw"),
        )
    ),
    "with_goal": Func(
        (
            p("step"),
            p("channel"),
            k("goal_path"),
            k("spec", None),
            k("rounds", 3),
            k("instructions", ""),
            k("can_run", False),
            k("name", None),
            starstar("spec_kw"),
        )
    ),
    "starter_flow": Func(
        (
            p("ask"),
            k("workspace", "."),
            k("run_dir", "runs"),
            k("new", False),
            k("isolate", False),
            k("clarify_only", False),
            k("goal", True),
            k("rounds", 3),
            k("judge_can_run", False),
            k("max_asks", None),
            k("timeout_s", 1800.0),
            k("instructions", ""),
            k("worker_prompt", WORKER_PROMPT),
            k("brief_name", "需求.md"),
            k("goal_name", "目标.md"),
            k("log_name", "问答记录.md"),
        )
    ),
    "wake_state": Func(
        (
            p("workspace", "."),
            k("run_dir", "runs"),
            k("isolate", False),
            k("brief_name", "需求.md"),
            k("goal_name", "目标.md"),
        )
    ),
    "BRIEF_KEY": Const("_brief"),
    "MISSING_KEY": Const("_brief_missing"),
    "CLARIFY_RESUME": Const(check=_nonempty_str, what="a Chinese resume prompt"),
    "GOAL_KEY": Const("_goal"),
    "VERDICT_KEY": Const("_verdict"),
    "ROUND_KEY": Const("_goal_rounds"),
    # ---- build a role ---------------------------------------------------------------
    "coordinator": Func(
        (
            p("name"),
            p("instructions"),
            p("workers"),
            k("channel", None),
            k("can_read", True),
            k("glance", True),
            k("model", None),
            k("effort", None),
            k("max_turns", None),
            k("max_budget_usd", None),
            k("permission_mode", "acceptEdits"),
            k("compact", None),
            k("hooks", None),
            k("env", None),
        )
    ),
    "worker": Func(
        (
            p("description"),
            p("prompt"),
            k("tools", None),
            k("model", "inherit"),
            k("effort", None),
            k("max_turns", None),
            k("permission_mode", None),
            k("skills", None),
            k("discipline", True),
            k("isolate", False),
        )
    ),
    "clarify": Func(
        (
            p("name"),
            p("channel"),
            k("instructions", ""),
            k("can_read", True),
            k("model", None),
            k("effort", None),
            k("max_turns", None),
            k("max_budget_usd", None),
        )
    ),
    "judge": Func(
        (
            p("name"),
            p("channel"),
            k("instructions", ""),
            k("can_run", False),
            k("model", None),
            k("effort", None),
            k("max_turns", None),
            k("max_budget_usd", None),
        )
    ),
    "oracle": Func(
        (
            p("name", "旁路问答"),
            k("instructions", ""),
            k("model", None),
            k("effort", None),
            k("max_turns", 12),
            k("max_budget_usd", 0.5),
        )
    ),
    "COORDINATOR_RULES": RULES,
    "WORKER_RULES": RULES,
    "CLARIFIER_RULES": RULES,
    "JUDGE_RULES": RULES,
    "ORACLE_RULES": RULES,
    # ---- hand-write an agent definition ---------------------------------------------
    "AgentSpec": DC(
        (
            F("name"),
            F("instructions"),
            F("allowed_tools", Factory(["Read", "Glob", "Grep"])),
            F("disallowed_tools", EMPTY_LIST),
            F("model", None),
            F("effort", None),
            F("max_turns", None),
            F("max_budget_usd", None),
            F("permission_mode", "default"),
            F("agents", None),
            F("mcp_servers", EMPTY_DICT),
            F("hooks", None),
            F("compact", None),
            F("env", EMPTY_DICT),
            F("glance", False),
            F("workbench", True),
            F("delegate_only", False),
        )
    ),
    "build_options": Func(
        (
            p("spec"),
            k("cwd", None),
            k("session_store", None),
            k("resume", None),
            k("fork", False),
            k("resume_at", None),
            k("use_plugin", True),
            k("portable", True),
            k("add_dirs", None),
            k("flush", "eager"),
            k("prelude", ""),
        )
    ),
    "CompactPolicy": DC((F("mode", "auto"), F("window", None))),
    "HandoffPolicy": DC(
        (
            F("enabled", True),
            F(
                "window",
                Factory(check=lambda v: v == flower.default_window(), what="default_window()"),
            ),
            F("headroom", 50_000),
            F("max_generations", 8),
        )
    ),
    "default_window": Func(()),
    # ---- structured documents -------------------------------------------------------
    "Brief": DC(
        (
            F("goal", ""),
            F("accept", ""),
            F("bounds", ""),
            F("unknowns", ""),
            F("path", None, compare=False),
        )
    ),
    "Handoff": DC(
        (
            F("doing", ""),
            F("decided", ""),
            F("deadends", ""),
            F("next", ""),
            F("scene", ""),
            F("step", ""),
            F("path", None, compare=False),
        )
    ),
    "Goal": DC((F("statement", ""), F("checks", EMPTY_LIST), F("path", None))),
    "Verdict": DC((F("state", ""), F("reason", ""), F("failed", EMPTY_LIST))),
    # ---- hooks ----------------------------------------------------------------------
    "whitelist_guard": Func((p("allowed"), k("role", "这个角色"))),
    "delegate_guard": Func((k("tools", HANDS_ON), k("allow_glance", False))),
    "spill_guard": Func(
        (p("workbench"), k("threshold", 4000), k("tools", BULKY), k("main_only", False))
    ),
    "index_guard": Func((p("workbench"),)),
    "isolate_guard": Func((p("agents"), k("on_inject", None))),
    "isolated": Func((p("agent"), p("flag", True))),
    "wants_isolation": Func((p("agent"),)),
    "workbench_hooks": Func(
        (
            p("workbench"),
            k("delegate_only", True),
            k("spill_threshold", 4000),
            k("agents", None),
            k("allow_glance", False),
        )
    ),
    "merge_hooks": Func((star("groups"),)),
    # ---- the workbench --------------------------------------------------------------
    "Workbench": DC(
        (
            F("workspace"),
            F("dirname", ".flower"),
            F("max_index_entries", 40),
            F("home", None),
        )
    ),
    # ---- session stores -------------------------------------------------------------
    "SqliteSessionStore": Class((p("path"),), bases=("claude_agent_sdk.types.SessionStore",)),
    # The reference derives it from SqliteSessionStore; issue 18 makes the two layers wrap
    # any session store instead (``path`` may be one), each a session store itself.
    "TrimmingSessionStore": Class(
        (p("path"), p("workspace"), p("policy", None), p("ephemeral", None)),
        bases=("claude_agent_sdk.types.SessionStore", "flower.state.seam.Sessions"),
    ),
    "PruningSessionStore": Class(
        (p("path"), p("workspace"), p("policy", None), p("prune", None), p("ephemeral", None)),
        bases=("flower.TrimmingSessionStore",),
    ),
    "TrimPolicy": DC(
        (
            F("keep_recent", 20),
            F("min_chars", 2000),
            F("spill_dirname", ".flower/spill"),
            F("enabled", True),
        )
    ),
    "EphemeralPolicy": DC(
        (
            F("enabled", True),
            F("keep_recent", 6),
            F("max_chars", 2000),
            F("text", EXPIRED_TEXT),
        )
    ),
    "PrunePolicy": DC(
        (
            F("drop_api_errors", True),
            F("neutralize_interrupts", True),
            F("interrupt_text", "[上一轮在此处被中断,该工具结果未产生]"),
            F("heal_orphans", True),
            F("orphan_text", "[这一步被打断了,没有结果。需要的话重做。]"),
            F("keep_denials", 1),
        )
    ),
    "is_ephemeral": Func((p("cmd"),)),
    "trim_report": Func((p("store"),)),
    # ---- resilience -----------------------------------------------------------------
    "Resilience": DC(
        (
            F("enabled", True),
            F("max_attempts", 6),
            F("base_delay", 4.0),
            F("max_delay", 120.0),
            F("probe_timeout", 5.0),
            F("probe_interval", 15.0),
            F("max_offline_wait", 3600.0),
            F("retry_unknown", True),
            F("resume_prompt", RESUME_PROMPT),
        )
    ),
    "classify": Func((p("text"),)),
    "endpoint": Func(()),
    "reachable": Func((p("host"), p("port"), p("timeout", 5.0)), coroutine=True),
    # ---- events and interaction -----------------------------------------------------
    "Event": DC(
        (
            F("kind"),
            F("text", ""),
            F("tool", ""),
            F("payload", EMPTY_DICT),
            F("raw", None),
        )
    ),
    "normalize": Func((p("message"),)),
    "Ask": DC(
        (
            F("id"),
            F("question"),
            F("options", EMPTY_LIST),
            F(
                "asked_at",
                Factory(
                    check=lambda v: isinstance(v, float) and abs(v - time.time()) < 60,
                    what="time.time()",
                ),
            ),
            F("state", "asked"),
            F("answer", ""),
        )
    ),
    "HumanChannel": Class(
        (
            k("on_event", None),
            k("max_asks", None),
            k("timeout_s", 1800.0),
            k("log_path", None),
            k("amend_path", None),
            k("over_budget_text", ModuleConst("OVER_BUDGET")),
            k("timeout_text", ModuleConst("TIMEOUT")),
            k("declined_text", ModuleConst("DECLINED")),
        )
    ),
    # ---- lineage --------------------------------------------------------------------
    "Lineage": DC(
        (
            F("path"),
            F("workspace"),
            F("steps", EMPTY_DICT),
            F("woke", 0),
        )
    ),
}

NAMES = sorted(API)

# ======================================================================================
# members the reference documents (signatures without self / cls)
# ======================================================================================


@dataclass(frozen=True)
class M:
    """A method: ``params`` after self (or cls for a classmethod)."""

    params: tuple[Param, ...] = ()
    coroutine: bool = False
    classmethod: bool = False


@dataclass(frozen=True)
class Prop:
    """A read-only ``@property``."""


CM = True  # readability: M(..., classmethod=CM)

MEMBERS: dict[str, M | Prop] = {
    # Runtime
    "Runtime.run": M(
        (
            p("spec"),
            p("prompt"),
            k("step_name", None),
            k("resume", None),
            k("fork", False),
            k("resume_at", None),
            k("on_event", None),
        ),
        coroutine=True,
    ),
    "Runtime.interrupt": M((p("message", ""),)),
    "Runtime.rescue": M(),
    "Runtime.manifest_path": Prop(),
    "Runtime.project_key": Prop(),
    "Runtime.has_session": M((p("session_id"),)),
    "Runtime.context_of": M((p("session_id"),)),
    "Runtime.total_cost": M(),
    "Runtime.close": M(),
    "StepResult.duration_s": Prop(),
    # workflow
    "Step.render": M((p("ctx"), k("resuming", False))),
    "Workflow.run": M((p("runtime"), k("on_event", None), k("on_step", None)), coroutine=True),
    # agent definition
    "CompactPolicy.env": M(),
    "HandoffPolicy.at": Prop(),
    "HandoffPolicy.warn_at": Prop(),
    # documents
    "Brief.missing": M(),
    "Brief.complete": M(),
    "Brief.parse": M((p("text"),), classmethod=CM),
    "Brief.to_markdown": M(),
    "Brief.prompt_block": M(),
    "Brief.write": M((p("path"),)),
    "Brief.load": M((p("path"),), classmethod=CM),
    "Handoff.missing": M(),
    "Handoff.complete": M(),
    "Handoff.degraded": Prop(),
    "Handoff.parse": M((p("text"), k("step", "")), classmethod=CM),
    "Handoff.to_markdown": M(),
    "Handoff.prompt_block": M(),
    "Handoff.write": M((p("path"),)),
    "Handoff.load": M((p("path"),), classmethod=CM),
    "Goal.unverifiable": Prop(),
    "Goal.missing": M(),
    "Goal.complete": M(),
    "Goal.parse": M((p("text"),), classmethod=CM),
    "Goal.to_markdown": M(),
    "Goal.prompt_block": M(),
    "Goal.write": M((p("path"),)),
    "Goal.load": M((p("path"),), classmethod=CM),
    "Goal.amend": M((p("extra"),)),
    "Verdict.achieved": Prop(),
    "Verdict.unreachable": Prop(),
    "Verdict.ok": Prop(),
    "Verdict.parse": M((p("text"),), classmethod=CM),
    "Verdict.feedback": M(),
    # workbench
    "Workbench.root": Prop(),
    "Workbench.external": Prop(),
    "Workbench.scripts": Prop(),
    "Workbench.artifacts": Prop(),
    "Workbench.notes": Prop(),
    "Workbench.index_path": Prop(),
    "Workbench.show": M((p("p"),)),
    "Workbench.ensure": M(),
    "Workbench.scan": M((p("d"),)),
    "Workbench.refresh": M(),
    "Workbench.prompt_block": M(),
    # session stores
    "SqliteSessionStore.append": M((p("key"), p("entries")), coroutine=True),
    "SqliteSessionStore.projects": M(),
    "SqliteSessionStore.has_session": M((p("project_key"), p("session_id"))),
    "SqliteSessionStore.last_context": M((p("project_key"), p("session_id"), k("scan", 60))),
    "SqliteSessionStore.load": M((p("key"),), coroutine=True),
    "SqliteSessionStore.list_sessions": M((p("project_key"),), coroutine=True),
    "SqliteSessionStore.list_session_summaries": M((p("project_key"),), coroutine=True),
    "SqliteSessionStore.delete": M((p("key"),), coroutine=True),
    "SqliteSessionStore.list_subkeys": M((p("key"),), coroutine=True),
    "SqliteSessionStore.close": M(),
    "TrimPolicy.placeholder": M((p("path"), p("n"))),
    "EphemeralPolicy.placeholder": M((p("cmd"), p("age"))),
    "TrimmingSessionStore.expire": M((p("entries"),)),
    "TrimmingSessionStore.trim": M((p("entries"),)),
    "PruningSessionStore.prune": M((p("entries"),)),
    # resilience
    "Resilience.delay_for": M((p("attempt"),)),
    "Resilience.should_retry": M((p("kind"),)),
    "Resilience.wait_online": M((p("notify", None),), coroutine=True),
    # events and interaction
    "Event.__str__": M(),
    "Ask.waited_s": Prop(),
    "Ask.event": M((p("remaining", 0),)),
    "HumanChannel.tool_name": Prop(),
    "HumanChannel.inbox_name": Prop(),
    "HumanChannel.mcp_servers": M(),
    "HumanChannel.ask": M((p("question"), p("options", None)), coroutine=True),
    "HumanChannel.send": M((p("text"),)),
    "HumanChannel.amend": M((p("text"), k("label", "运行中补充"))),
    "HumanChannel.pending_mail": M(),
    "HumanChannel.remaining": Prop(),
    "HumanChannel.pending": M(),
    "HumanChannel.next_ask": M((p("timeout", None),), coroutine=True),
    "HumanChannel.answer": M((p("ask_id"), p("text"))),
    "HumanChannel.decline": M((p("ask_id"), p("reason", ""))),
    "HumanChannel.transcript": M(),
    # lineage
    "Lineage.open": M((p("run_dir"), p("workspace")), classmethod=CM),
    "Lineage.remember": M((p("step"), p("session_id"))),
    "Lineage.bump": M(),
    "Lineage.archive": M((p("into"), k("extra", None))),
}

#: Class constants the reference gives (``None``: any non-empty string).
CLASS_CONSTANTS: dict[str, Any] = {
    "Runtime.INTERRUPTED": "interrupted-by-human",
    "Runtime.HANDOFF_DUE": "context-full-handoff",
    "Runtime.INTERRUPT_NOTE": None,
}

# ======================================================================================
# checking
# ======================================================================================


def _get(name: str) -> Any:
    if not hasattr(flower, name):
        pytest.fail(f"flower.{name} does not exist", pytrace=False)
    return getattr(flower, name)


def _resolve(dotted: str) -> Any:
    module, _, attr = dotted.rpartition(".")
    if module == "flower":
        return _get(attr)
    return getattr(__import__(module, fromlist=[attr]), attr)


def _same_default(actual: Any, expected: Any, owner: Any) -> bool:
    if isinstance(expected, ModuleConst):
        module = sys.modules.get(getattr(owner, "__module__", ""), None)
        return module is not None and actual is getattr(module, expected.name, object())
    if isinstance(expected, bool) or isinstance(actual, bool):
        return type(actual) is type(expected) and actual == expected
    numbers = isinstance(actual, (int, float)) and isinstance(expected, (int, float))
    return (type(actual) is type(expected) or numbers) and actual == expected


_KINDS = {POS: "positional", KW: "keyword-only", VAR_POS: "*args", VAR_KW: "**kwargs"}


def _show(param: inspect.Parameter) -> str:
    kind = _KINDS.get(param.kind, str(param.kind))
    default = "required" if param.default is EMPTY else f"default {param.default!r}"
    return f"{param.name} ({kind}, {default})"


def signature_problems(
    params: list[inspect.Parameter], expected: tuple[Param, ...], owner: Any
) -> list[str]:
    """What differs between the actual parameters and the documented ones."""
    problems: list[str] = []
    by_name = {q.name: q for q in params}
    doc_pos = [e for e in expected if e.kind == POS]
    act_pos = [q for q in params if q.kind in (POS, inspect.Parameter.POSITIONAL_ONLY)]
    got_order = [q.name for q in act_pos[: len(doc_pos)]]
    if got_order != [e.name for e in doc_pos]:
        problems.append(
            f"positional parameters are {[q.name for q in act_pos]}, "
            f"the reference has {[e.name for e in doc_pos]} first"
        )
    for e in expected:
        q = by_name.get(e.name)
        if q is None:
            problems.append(f"missing parameter {e.name!r}")
            continue
        if q.kind != e.kind:
            problems.append(f"{_show(q)}: the reference has it {_KINDS[e.kind]}")
            continue
        if e.kind in (VAR_POS, VAR_KW):
            continue
        if e.default is REQUIRED:
            if q.default is not EMPTY:
                problems.append(f"{_show(q)}: the reference has it required")
        elif isinstance(e.default, Factory):
            pass  # a dataclass factory: checked on the field
        elif q.default is EMPTY or not _same_default(q.default, e.default, owner):
            problems.append(f"{_show(q)}: the reference has default {e.default!r}")
    documented = {e.name for e in expected}
    for q in params:
        if q.name in documented or q.kind in (VAR_POS, VAR_KW):
            continue
        if q.default is EMPTY:
            problems.append(f"extra required parameter {_show(q)} (an addition needs a default)")
    return problems


def _sig(obj: Any) -> list[inspect.Parameter]:
    return list(inspect.signature(obj).parameters.values())


def _field_default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory
    return REQUIRED


def dataclass_problems(cls: Any, spec: DC) -> list[str]:
    if not dataclasses.is_dataclass(cls):
        return [f"{cls!r} is not a dataclass"]
    problems: list[str] = []
    fields = [f for f in dataclasses.fields(cls) if f.init]
    names = [f.name for f in fields]
    want = [e.name for e in spec.fields]
    if names[: len(want)] != want:
        problems.append(f"fields are {names}, the reference has {want} first and in that order")
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    for e in spec.fields:
        f = by_name.get(e.name)
        if f is None:
            continue  # reported above
        if not f.init or f.kw_only:
            problems.append(f"field {e.name!r} must be a positional __init__ parameter")
        got = _field_default(f)
        if e.default is REQUIRED:
            if got is not REQUIRED:
                problems.append(f"field {e.name!r} has a default, the reference has it required")
        elif isinstance(e.default, Factory):
            if f.default_factory is dataclasses.MISSING:
                problems.append(f"field {e.name!r} must have {e.default!r}, has default {got!r}")
            else:
                one, two = f.default_factory(), f.default_factory()
                if not e.default.ok(one):
                    problems.append(
                        f"field {e.name!r}: its factory made {one!r}, not {e.default!r}"
                    )
                if isinstance(one, (list, dict, set)) and one is two:
                    problems.append(f"field {e.name!r}: the factory returns one shared object")
        elif got is REQUIRED:
            problems.append(f"field {e.name!r} is required, the reference has {e.default!r}")
        elif f.default is dataclasses.MISSING:
            problems.append(f"field {e.name!r} uses a factory, the reference has {e.default!r}")
        elif not _same_default(f.default, e.default, cls):
            problems.append(f"field {e.name!r} defaults to {f.default!r}, not {e.default!r}")
        if f.compare != e.compare:
            problems.append(f"field {e.name!r}: compare={f.compare}, the reference has {e.compare}")
    for f in fields[len(want) :]:
        if f.name not in want and _field_default(f) is REQUIRED:
            problems.append(f"extra field {f.name!r} has no default")
    return problems


def _report(what: str, problems: list[str]) -> None:
    if problems:
        pytest.fail(f"{what} differs from the reference:\n- " + "\n- ".join(problems), False)


# ======================================================================================
# the tests
# ======================================================================================


def test_the_reference_lists_62_names() -> None:
    assert len(API) == 62


def test_all_is_exactly_the_documented_names() -> None:
    exported = set(flower.__all__)
    assert len(flower.__all__) == len(exported), "flower.__all__ lists a name twice"
    assert exported == set(API), (
        f"not in the reference: {sorted(exported - set(API))}; "
        f"missing from __all__: {sorted(set(API) - exported)}"
    )


def test_star_import_yields_the_documented_names() -> None:
    namespace: dict[str, Any] = {}
    exec("from flower import *", namespace)
    namespace.pop("__builtins__", None)
    assert set(namespace) == set(API), (
        f"extra: {sorted(set(namespace) - set(API))}; missing: {sorted(set(API) - set(namespace))}"
    )
    for name, value in namespace.items():
        assert value is getattr(flower, name), name


@pytest.mark.parametrize("name", NAMES)
def test_name(name: str) -> None:
    obj = _get(name)
    spec = API[name]
    problems: list[str] = []
    if isinstance(spec, Const):
        if spec.check is not None:
            if not spec.check(obj):
                problems.append(f"flower.{name} = {obj!r}, expected {spec.what}")
        elif obj != spec.value or type(obj) is not type(spec.value):
            problems.append(f"flower.{name} = {obj!r}, the reference has {spec.value!r}")
    elif isinstance(spec, Exc):
        if not (isinstance(obj, type) and issubclass(obj, spec.base)):
            problems.append(f"flower.{name} is not a subclass of {spec.base.__name__}")
        elif str(obj("why")) != "why":
            problems.append(f"str(flower.{name}('why')) is not the message")
    elif isinstance(spec, Func):
        if isinstance(obj, type) or not callable(obj):
            problems.append(f"flower.{name} is not a function")
        else:
            problems += signature_problems(_sig(obj), spec.params, obj)
            if inspect.iscoroutinefunction(obj) != spec.coroutine:
                problems.append(
                    f"flower.{name} must {'' if spec.coroutine else 'not '}be a coroutine function"
                )
    elif isinstance(spec, Class):
        if not isinstance(obj, type):
            problems.append(f"flower.{name} is not a class")
        else:
            problems += signature_problems(_sig(obj), spec.params, obj)
            for base in spec.bases:
                if _resolve(base) not in obj.__mro__:
                    problems.append(f"flower.{name} does not derive from {base}")
    elif isinstance(spec, DC):
        problems += dataclass_problems(obj, spec)
        if not problems:  # the constructor too (an InitVar, kw_only …)
            as_params = tuple(p(e.name, e.default) for e in spec.fields)
            problems += [f"__init__: {x}" for x in signature_problems(_sig(obj), as_params, obj)]
    else:  # pragma: no cover - a typo in the table above
        raise AssertionError(f"unknown expectation {spec!r}")
    _report(f"flower.{name}", problems)


@pytest.mark.parametrize("member", sorted(MEMBERS))
def test_member(member: str) -> None:
    owner_name, attr = member.split(".")
    owner = _get(owner_name)
    spec = MEMBERS[member]
    static = inspect.getattr_static(owner, attr, None)
    if static is None:
        pytest.fail(f"{member} does not exist", pytrace=False)
    if isinstance(spec, Prop):
        assert isinstance(static, property), f"{member} must be a @property, is {static!r}"
        return
    problems: list[str] = []
    is_cm = isinstance(static, classmethod)
    if spec.classmethod != is_cm:
        problems.append(f"{member} must {'' if spec.classmethod else 'not '}be a classmethod")
    if isinstance(static, (property, staticmethod)) or not callable(getattr(owner, attr)):
        pytest.fail(f"{member} must be a method, is {static!r}")
    params = _sig(getattr(owner, attr))
    if not is_cm:
        params = params[1:]  # self
    problems += signature_problems(params, spec.params, owner)
    func = getattr(owner, attr)
    if inspect.iscoroutinefunction(func) != spec.coroutine:
        problems.append(f"{member} must {'' if spec.coroutine else 'not '}be a coroutine function")
    _report(member, problems)


@pytest.mark.parametrize("constant", sorted(CLASS_CONSTANTS))
def test_class_constant(constant: str) -> None:
    owner_name, attr = constant.split(".")
    value = getattr(_get(owner_name), attr, None)
    expected = CLASS_CONSTANTS[constant]
    if expected is None:
        assert _nonempty_str(value), f"{constant} = {value!r}, expected a non-empty string"
    else:
        assert value == expected, f"{constant} = {value!r}, the reference has {expected!r}"


def test_the_five_rule_texts_differ() -> None:
    texts = [_get(n) for n in NAMES if n.endswith("_RULES")]
    assert len(texts) == 5 and len(set(texts)) == 5
