"""flower: continuous multi-step LLM-agent workflows on claude-agent-sdk.

Run it again in the same directory and it carries on the same conversation::

    from flower import AgentSpec, Runtime, Step, Workflow

``__all__`` is exactly seed 003's 62 public names. The error classes (``FlowerError`` and its
kin), ``Manifest`` and ``read_manifest`` are importable from here too, outside ``__all__``.
The session stores import the SDK (about a second), so they load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._errors import AttemptCrash as AttemptCrash
from ._errors import ConfigError as ConfigError
from ._errors import FlowerError as FlowerError
from ._errors import RunDirBusy as RunDirBusy
from .core.agent import AgentSpec, CompactPolicy, build_options, merge_hooks
from .core.credentials import CredentialsError as CredentialsError
from .core.events import normalize
from .core.guard import (
    delegate_guard,
    index_guard,
    isolate_guard,
    isolated,
    spill_guard,
    wants_isolation,
    whitelist_guard,
    workbench_hooks,
)
from .core.human import Ask, HumanChannel
from .core.lineage import Lineage
from .core.manifest import Manifest as Manifest
from .core.manifest import read_manifest as read_manifest
from .core.resilience import Resilience, classify, endpoint, reachable
from .core.result import Event, StepResult
from .core.roles import (
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
from .core.runtime import Runtime
from .core.window import HandoffPolicy, default_window
from .core.workbench import Workbench
from .docs import Brief, Goal, Handoff, Verdict
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

__version__ = "0.1.0"

_LAZY = {
    "SqliteSessionStore": "flower.stores.sqlite",
    "TrimmingSessionStore": "flower.stores.trim",
    "TrimPolicy": "flower.stores.trim",
    "EphemeralPolicy": "flower.stores.trim",
    "is_ephemeral": "flower.util.ephemeral",
    "PruningSessionStore": "flower.stores.prune",
    "PrunePolicy": "flower.stores.prune",
    "trim_report": "flower.stores.trim",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'flower' has no attribute {name!r}")


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
