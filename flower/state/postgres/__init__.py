"""The PostgreSQL backend of the run state: one database holds every workspace's state.

- :mod:`.url` — ``--state``/``FLOWER_STATE`` URLs (standard library only).
- :mod:`.schema` — flower's tables in their own schema, versioned, upgraded in place.
- :mod:`.db` — a process's connection, its errors for people, the spool's delivery.
- :mod:`.spool` — fenced writes kept durably on the machine during an outage.
- :mod:`.fenced` — the writes that carry an attempt's epoch (appends, the tool ledger).
- :mod:`.sessions` — :class:`PostgresSessionStore`, the SDK's ``SessionStore``.
- :mod:`.rows` — the ledger, lineage, manifest, registry, cache and event rows.
- :mod:`.state` — :class:`PostgresState`, all of it behind the seam's ``RunState``.

May import: ``flower.state.seam``, ``flower._errors``, ``flower.i18n``, ``flower.util``,
the key and JSON helpers of ``flower.state.sqlite``, ``claude_agent_sdk`` and ``psycopg``.
Nothing of the step machinery. Importing this package loads only :mod:`.url`; the driver is
loaded with the first name below that needs it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .url import DEFAULT_SCHEMA, StateURL, StateURLError, mask, parse_state_url

if TYPE_CHECKING:
    from .db import NoSuchDatabase, PasswordRefused, PostgresStateError, PostgresUnavailable
    from .schema import SchemaTooNew
    from .sessions import PostgresSessionStore
    from .state import PostgresState

__all__ = [
    "DEFAULT_SCHEMA",
    "NoSuchDatabase",
    "PasswordRefused",
    "PostgresSessionStore",
    "PostgresState",
    "PostgresStateError",
    "PostgresUnavailable",
    "SchemaTooNew",
    "StateURL",
    "StateURLError",
    "mask",
    "parse_state_url",
]

_LAZY = {
    "NoSuchDatabase": ".db",
    "PasswordRefused": ".db",
    "PostgresStateError": ".db",
    "PostgresUnavailable": ".db",
    "SchemaTooNew": ".schema",
    "PostgresSessionStore": ".sessions",
    "PostgresState": ".state",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
