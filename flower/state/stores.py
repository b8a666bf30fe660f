"""Session stores: the run state's sessions at the bottom, trimming and pruning layered on
top (seed 003), the tool ledger beside them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..i18n import define, t
from ..util.lazylog import lazy_logger
from .dbfile import set_aside_database

if TYPE_CHECKING:  # the SDK: status imports SESSIONS_DB from here and must not load it
    from .prune import PruningSessionStore
    from .seam import LedgerRows, Sessions
    from .sqlite import SqliteSessionStore
    from .trim import EphemeralPolicy, TrimPolicy

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


def layered(
    sessions: Sessions,
    ledger_rows: LedgerRows,
    *,
    workspace: str | Path,
    trim: TrimPolicy | bool = False,
    ephemeral: EphemeralPolicy | bool = True,
    keep_denials: int = 1,
) -> PruningSessionStore:
    """The store a Runtime uses (seed 003): the pruning layer over ``sessions``, its tool
    ledger over ``ledger_rows`` (``.ledger``), both of one run state.

    ``trim`` / ``ephemeral`` may be a policy or a bool (True: the default policy, False:
    that rule off). ``trim=False``, the Runtime's default, turns off only size trimming;
    expiry and pruning stay on.
    """
    from .prune import PrunePolicy, PruningSessionStore
    from .trim import EphemeralPolicy, TrimPolicy

    return PruningSessionStore(
        sessions,
        workspace=workspace,
        policy=trim if isinstance(trim, TrimPolicy) else TrimPolicy(enabled=bool(trim)),
        ephemeral=(
            ephemeral
            if isinstance(ephemeral, EphemeralPolicy)
            else EphemeralPolicy(enabled=bool(ephemeral))
        ),
        prune=PrunePolicy(keep_denials=keep_denials),
        ledger=ledger_rows,
    )


def open_store(runtime: Any) -> PruningSessionStore:
    """The store of a Runtime: :func:`layered` over its run state's sessions and ledger,
    with its ``workspace``, ``trim``, ``ephemeral`` and ``keep_denials``.

    """
    state = runtime.state
    return layered(
        state.sessions,
        state.ledger,
        workspace=runtime.workspace,
        trim=getattr(runtime, "trim", False),
        ephemeral=getattr(runtime, "ephemeral", True),
        keep_denials=getattr(runtime, "keep_denials", 1),
    )


def local_sessions(run_dir: str | Path) -> SqliteSessionStore:
    """The local run state's session store, ``run_dir/sessions.db`` (the first file a
    Runtime makes). A damaged file is set aside for a person and a fresh one started:
    continuity never blocks work (lineage then says its sessions cannot be continued)."""
    from ..util.fsutil import private_run_dir
    from .sqlite import SessionStoreDamaged, SessionStoreError, SqliteSessionStore

    path = private_run_dir(run_dir) / SESSIONS_DB
    try:
        return SqliteSessionStore(path)
    except SessionStoreDamaged as exc:
        try:
            aside = set_aside_database(path)
        except OSError as move:
            raise SessionStoreError(
                f"{exc.message}, and it cannot be moved aside ({move.strerror or move})",
                hint=f"move {path} (and its -wal/-shm files) away by hand, then run again",
            ) from exc
        log.warning("%s", t("stores.set_aside", problem=exc.message, aside=aside))
        return SqliteSessionStore(path)
