"""Session stores: SQLite at the bottom, trimming and pruning layered on top (seed 003)."""

from __future__ import annotations

from typing import Any

from ..i18n import define, t
from ..util.lazylog import lazy_logger
from .dbfile import set_aside_database

SESSIONS_DB = "sessions.db"
log = lazy_logger("flower")  # logging loads when something is logged

define(
    {
        "stores.set_aside": (
            "{problem};已把它(连同 -wal/-shm 文件)挪到 {aside},另起了一个新的;"
            "之前的对话还在旧文件里",
            "{problem}; moved it (with its -wal/-shm files) to {aside} and started a fresh one; "
            "earlier conversations stay in the old file",
        ),
    }
)


def open_store(runtime: Any) -> Any:
    """The store a Runtime always uses (seed 003): the pruning layer on run_dir/sessions.db.

    ``runtime.trim`` / ``runtime.ephemeral`` may be a policy or a bool (True: the default
    policy, False: that rule off). ``Runtime(trim=False)``, the default, turns off only
    size trimming; expiry and pruning stay on.
    """
    from ..util.fsutil import private_run_dir
    from .prune import PrunePolicy, PruningSessionStore
    from .sqlite import SessionStoreDamaged, SessionStoreError
    from .trim import EphemeralPolicy, TrimPolicy

    def _policy(value: Any, cls: type[Any]) -> Any:
        if isinstance(value, cls):
            return value
        return cls() if value else cls(enabled=False)

    def store() -> Any:
        return PruningSessionStore(
            path,
            workspace=runtime.workspace,
            policy=_policy(getattr(runtime, "trim", False), TrimPolicy),
            ephemeral=_policy(getattr(runtime, "ephemeral", True), EphemeralPolicy),
            prune=PrunePolicy(keep_denials=getattr(runtime, "keep_denials", 1)),
        )

    path = private_run_dir(runtime.run_dir) / SESSIONS_DB  # the first file a Runtime makes
    try:
        return store()
    except SessionStoreDamaged as exc:
        # Continuity never blocks work: the damaged file is kept for a person, a fresh one
        # starts, and the sessions in the old one cannot be continued (lineage says so).
        try:
            aside = set_aside_database(path)
        except OSError as move:
            raise SessionStoreError(
                f"{exc.message}, and it cannot be moved aside ({move.strerror or move})",
                hint=f"move {path} (and its -wal/-shm files) away by hand, then run again",
            ) from exc
        log.warning("%s", t("stores.set_aside", problem=exc.message, aside=aside))
        return store()
