"""flower: continuous multi-step LLM-agent workflows on claude-agent-sdk.

Run it again in the same directory and it carries on the same conversation::

    from flower import AgentSpec, Runtime, Step, Workflow

The session stores import the SDK (about a second), so they load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._errors import AttemptCrash, ConfigError, FlowerError, RunDirBusy
from .core.agent import AgentSpec, CompactPolicy, build_options, merge_hooks
from .core.credentials import CredentialsError
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
from .core.lineage import Lineage
from .core.manifest import Manifest, read_manifest
from .core.resilience import Resilience
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
from .docs.handoff import Handoff
from .workflow import Step, StepAbort, Workflow

__version__ = "0.1.0"

_LAZY = {
    "SqliteSessionStore": "flower.stores.sqlite",
    "TrimmingSessionStore": "flower.stores.trim",
    "TrimPolicy": "flower.stores.trim",
    "EphemeralPolicy": "flower.stores.trim",
    "is_ephemeral": "flower.util.ephemeral",
    "PruningSessionStore": "flower.stores.prune",
    "PrunePolicy": "flower.stores.prune",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'flower' has no attribute {name!r}")


__all__ = [
    "CLARIFIER_RULES",
    "COORDINATOR_RULES",
    "JUDGE_RULES",
    "ORACLE_RULES",
    "WORKER_RULES",
    "AgentSpec",
    "AttemptCrash",
    "CompactPolicy",
    "ConfigError",
    "CredentialsError",
    "EphemeralPolicy",
    "Event",
    "FlowerError",
    "Handoff",
    "HandoffPolicy",
    "Lineage",
    "Manifest",
    "PrunePolicy",
    "PruningSessionStore",
    "Resilience",
    "RunDirBusy",
    "Runtime",
    "SqliteSessionStore",
    "Step",
    "StepAbort",
    "StepResult",
    "TrimPolicy",
    "TrimmingSessionStore",
    "Workbench",
    "Workflow",
    "build_options",
    "clarify",
    "coordinator",
    "default_window",
    "delegate_guard",
    "index_guard",
    "is_ephemeral",
    "isolate_guard",
    "isolated",
    "judge",
    "merge_hooks",
    "oracle",
    "read_manifest",
    "spill_guard",
    "wants_isolation",
    "whitelist_guard",
    "workbench_hooks",
    "worker",
]
