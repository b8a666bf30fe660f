"""flower: continuous multi-step LLM-agent workflows on claude-agent-sdk.

Run it again in the same directory and it carries on the same conversation::

    from flower import AgentSpec, Runtime, Step, Workflow

``__all__`` is exactly seed 003's 62 public names. The error classes (``FlowerError`` and its
kin), ``Manifest`` and ``read_manifest`` are importable from here too, outside ``__all__``.

Every name but the errors loads on first use (PEP 562): importing all of them costs about
90 ms (asyncio, click, filelock, the guards) and the session stores import the SDK (about a
second), while ``flower-super status`` and ``flower --help`` need only ``FlowerError``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._errors import AttemptCrash as AttemptCrash
from ._errors import ConfigError as ConfigError
from ._errors import FlowerError as FlowerError
from ._errors import RunDirBusy as RunDirBusy

if TYPE_CHECKING:  # what mypy and editors see; at run time __getattr__ below loads them
    from .agents.agent import AgentSpec, CompactPolicy, build_options, merge_hooks
    from .agents.guard import (
        delegate_guard,
        index_guard,
        isolate_guard,
        isolated,
        spill_guard,
        wants_isolation,
        whitelist_guard,
        workbench_hooks,
    )
    from .agents.roles import (
        CLARIFIER_RULES,
        COORDINATOR_RULES,
        JUDGE_RULES,
        ORACLE_RULES,
        WORKER_RULES,
        clarify,
        coordinator,
        judge,
        oracle,
        worker,
    )
    from .agents.workbench import Workbench
    from .docs import Brief, Goal, Handoff, Verdict
    from .people.credentials import CredentialsError as CredentialsError
    from .people.human import Ask, HumanChannel
    from .state.lineage import Lineage
    from .state.manifest import Manifest as Manifest
    from .state.manifest import read_manifest as read_manifest
    from .state.prune import PrunePolicy, PruningSessionStore
    from .state.result import Event, StepResult
    from .state.sqlite import SqliteSessionStore
    from .state.trim import EphemeralPolicy, TrimmingSessionStore, TrimPolicy, trim_report
    from .step.events import normalize
    from .step.resilience import Resilience, classify, endpoint, reachable
    from .step.runtime import Runtime
    from .step.window import HandoffPolicy, default_window
    from .util.ephemeral import is_ephemeral
    from .workflow import (
        BRIEF_KEY,
        CLARIFY_RESUME,
        GOAL_KEY,
        MISSING_KEY,
        ROUND_KEY,
        VERDICT_KEY,
        Step,
        StepAbort,
        Workflow,
        clarify_step,
        goal_step,
        starter_flow,
        wake_state,
        with_goal,
    )
    from .workflow.base import MapStep as MapStep
    from .workflow.memo import Cache as Cache

__version__ = "0.1.0"

# Where each lazy name lives; the block above says the same to mypy, and
# tests/test_light_imports.py checks that the two agree.
_SOURCES: dict[str, tuple[str, ...]] = {
    ".agents.agent": ("AgentSpec", "CompactPolicy", "build_options", "merge_hooks"),
    ".people.credentials": ("CredentialsError",),
    ".step.events": ("normalize",),
    ".agents.guard": (
        "delegate_guard",
        "index_guard",
        "isolate_guard",
        "isolated",
        "spill_guard",
        "wants_isolation",
        "whitelist_guard",
        "workbench_hooks",
    ),
    ".people.human": ("Ask", "HumanChannel"),
    ".state.lineage": ("Lineage",),
    ".state.manifest": ("Manifest", "read_manifest"),
    ".workflow.memo": ("Cache",),  # issue 11's API, outside seed 003's __all__
    ".workflow.base": ("MapStep",),
    ".step.resilience": ("Resilience", "classify", "endpoint", "reachable"),
    ".state.result": ("Event", "StepResult"),
    ".agents.roles": (
        "CLARIFIER_RULES",
        "COORDINATOR_RULES",
        "JUDGE_RULES",
        "ORACLE_RULES",
        "WORKER_RULES",
        "clarify",
        "coordinator",
        "judge",
        "oracle",
        "worker",
    ),
    ".step.runtime": ("Runtime",),
    ".step.window": ("HandoffPolicy", "default_window"),
    ".agents.workbench": ("Workbench",),
    ".docs": ("Brief", "Goal", "Handoff", "Verdict"),
    ".state.prune": ("PrunePolicy", "PruningSessionStore"),
    ".state.sqlite": ("SqliteSessionStore",),
    ".state.trim": ("EphemeralPolicy", "TrimmingSessionStore", "TrimPolicy", "trim_report"),
    ".util.ephemeral": ("is_ephemeral",),
    ".workflow": (
        "BRIEF_KEY",
        "CLARIFY_RESUME",
        "GOAL_KEY",
        "MISSING_KEY",
        "ROUND_KEY",
        "VERDICT_KEY",
        "Step",
        "StepAbort",
        "Workflow",
        "clarify_step",
        "goal_step",
        "starter_flow",
        "wake_state",
        "with_goal",
    ),
}
_LAZY = {name: module for module, names in _SOURCES.items() for name in names}


def _load(name: str) -> Any:
    """``flower.<name>``, importing the module that defines it on first use."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups are plain module attributes
    return value


def _names() -> list[str]:
    return sorted({*globals(), *_LAZY})


# Hidden from mypy: a module-level __getattr__ would make mypy accept any `from flower import X`,
# typos included; it checks the names against the TYPE_CHECKING block instead.
if not TYPE_CHECKING:
    __getattr__ = _load
    __dir__ = _names


__all__ = [  # noqa: RUF022 - grouped as seed 003's index, not sorted
    # the runtime
    "Runtime",
    "StepResult",
    # workflows
    "Step",
    "Workflow",
    "StepAbort",
    "clarify_step",
    "goal_step",
    "with_goal",
    "starter_flow",
    "wake_state",
    "BRIEF_KEY",
    "MISSING_KEY",
    "CLARIFY_RESUME",
    "GOAL_KEY",
    "VERDICT_KEY",
    "ROUND_KEY",
    # roles
    "coordinator",
    "worker",
    "clarify",
    "judge",
    "oracle",
    "COORDINATOR_RULES",
    "WORKER_RULES",
    "CLARIFIER_RULES",
    "JUDGE_RULES",
    "ORACLE_RULES",
    # agent definitions
    "AgentSpec",
    "build_options",
    "CompactPolicy",
    "HandoffPolicy",
    "default_window",
    # documents
    "Brief",
    "Handoff",
    "Goal",
    "Verdict",
    # the hook layer
    "whitelist_guard",
    "delegate_guard",
    "spill_guard",
    "index_guard",
    "isolate_guard",
    "isolated",
    "wants_isolation",
    "workbench_hooks",
    "merge_hooks",
    "Workbench",
    # session stores
    "SqliteSessionStore",
    "TrimmingSessionStore",
    "PruningSessionStore",
    "TrimPolicy",
    "EphemeralPolicy",
    "PrunePolicy",
    "is_ephemeral",
    "trim_report",
    # resilience
    "Resilience",
    "classify",
    "endpoint",
    "reachable",
    # events and people
    "Event",
    "normalize",
    "Ask",
    "HumanChannel",
    # lineage
    "Lineage",
]
