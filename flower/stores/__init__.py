"""Session stores: SQLite at the bottom, trimming and pruning layered on top (seed 003)."""

from __future__ import annotations

from typing import Any

SESSIONS_DB = "sessions.db"


def open_store(runtime: Any) -> Any:
    """The store a Runtime always uses (seed 003): the pruning layer on run_dir/sessions.db.

    ``runtime.trim`` / ``runtime.ephemeral`` may be a policy or a bool (True: the default
    policy, False: that rule off). ``Runtime(trim=False)``, the default, turns off only
    size trimming; expiry and pruning stay on.
    """
    from .prune import PrunePolicy, PruningSessionStore
    from .trim import EphemeralPolicy, TrimPolicy

    def _policy(value: Any, cls: type[Any]) -> Any:
        if isinstance(value, cls):
            return value
        return cls() if value else cls(enabled=False)

    return PruningSessionStore(
        runtime.run_dir / SESSIONS_DB,
        workspace=runtime.workspace,
        policy=_policy(getattr(runtime, "trim", False), TrimPolicy),
        ephemeral=_policy(getattr(runtime, "ephemeral", True), EphemeralPolicy),
        prune=PrunePolicy(keep_denials=getattr(runtime, "keep_denials", 1)),
    )
