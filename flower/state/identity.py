"""The workspace's identity: what its sessions, lineage and runs are kept under.

The SDK keys a session by the working directory's path (``project_key_for_directory``), so a
workspace reached through another path — another machine's mount, a container — would not
find its own conversations. flower keys them by an identity that lives *in the workspace*:
``<workspace>/.flower/workspace-id``, one line (``ws-<32 hex>``), written the first time a
run keeps state in a database. Whatever carries the directory carries the identity: moving
or copying it, mounting it elsewhere, rsync. A fresh ``git clone`` does not (the file is not
meant to be committed: two clones are two workspaces).

A workspace that has no such file (every workspace of the local backend until it shares a
database, and every run_dir written before identities existed) is identified by its path's
project key, exactly as the SDK keys it: local state stays byte-for-byte what it was.
``flower-super state export`` writes the file when it moves a workspace's local state into a
database, keeping the path's key as the identity, so the exported sessions are found.

:class:`Rekeyed` puts the identity under the SDK: every key the SDK builds from the
workspace's path is stored and looked up under the identity instead.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path
from typing import Any

from ..util.fsutil import atomic_write_text

__all__ = ["IDENTITY_FILE", "Rekeyed", "path_key", "read_identity", "workspace_id"]

IDENTITY_FILE = Path(".flower") / "workspace-id"
# a path key starts with "-" (the SDK writes "/" as "-"): export keeps one as the identity
_VALID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{2,199}")


def path_key(workspace: str | Path) -> str:
    """The SDK's project key of a workspace path."""
    from claude_agent_sdk import project_key_for_directory

    return str(project_key_for_directory(workspace))


def read_identity(workspace: str | Path) -> str | None:
    """The identity written in the workspace, or None (missing or not one line we wrote)."""
    try:
        text = (Path(workspace) / IDENTITY_FILE).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if _VALID.fullmatch(text) else None


def workspace_id(workspace: str | Path, *, create: bool, keep: str | None = None) -> str:
    """The workspace's identity: the one written in it; else, with ``create``, a new one
    written now (``keep`` instead of a fresh one when given: export keeps the path's key);
    else its path's project key. A workspace that cannot be written keeps its path key."""
    found = read_identity(workspace)
    if found is not None:
        return found
    if not create:
        return path_key(workspace)
    ident = keep or f"ws-{secrets.token_hex(16)}"
    path = Path(workspace) / IDENTITY_FILE
    try:
        os.makedirs(path.parent, mode=0o700, exist_ok=True)
        atomic_write_text(path, ident + "\n")
    except OSError:
        return path_key(workspace)
    return read_identity(workspace) or ident


class Rekeyed:
    """A session store seen through the workspace's identity: a key whose project key is
    ``alias`` (the workspace's path key) is the identity's instead. Every other call, and
    every key of another project, passes through unchanged."""

    def __init__(self, inner: Any, alias: str, identity: str) -> None:
        self.inner, self.alias, self.identity = inner, alias, identity

    def _pk(self, project_key: str | None) -> str | None:
        return self.identity if project_key == self.alias else project_key

    def _key(self, key: Any) -> Any:
        if isinstance(key, dict) and key.get("project_key") == self.alias:
            return {**key, "project_key": self.identity}
        return key

    async def append(self, key: Any, entries: list[Any]) -> None:
        await self.inner.append(self._key(key), entries)

    async def load(self, key: Any) -> Any:
        return await self.inner.load(self._key(key))

    async def list_sessions(self, project_key: str) -> Any:
        return await self.inner.list_sessions(self._pk(project_key))

    async def list_session_summaries(self, project_key: str) -> Any:
        return await self.inner.list_session_summaries(self._pk(project_key))

    async def delete(self, key: Any) -> None:
        await self.inner.delete(self._key(key))

    async def list_subkeys(self, key: Any) -> Any:
        return await self.inner.list_subkeys(self._key(key))

    def has_session(self, project_key: str | None, session_id: str) -> bool:
        return bool(self.inner.has_session(self._pk(project_key), session_id))

    def load_sync(self, key: Any) -> Any:
        return self.inner.load_sync(self._key(key))

    def last_context(self, project_key: str, session_id: str, *, scan: int = 60) -> int:
        return int(self.inner.last_context(self._pk(project_key), session_id, scan=scan))

    def projects(self) -> list[str]:
        return list(self.inner.projects())

    def close(self) -> None:
        self.inner.close()

    def begin_attempt(self) -> int:
        return int(self.inner.begin_attempt())

    def claim(self, session_id: str) -> None:
        self.inner.claim(session_id)

    def __getattr__(self, name: str) -> Any:  # the backend's own extras (ledger rows, …)
        return getattr(self.inner, name)
