"""The cross-run cache on disk: one JSON file per entry under ``<run_dir>/cache/``.

Seed 004: at most 1000 entries, a hard 90-day age limit, eviction automatic and best effort,
"a full cache never breaks a run". Here that means:

- ``<root>/<key[:2]>/<key>.json``, written through a temp file, fsync and rename (a kill at
  any instant leaves the old entry or the new one); files 0600, directories 0700 (an entry
  holds a step's whole answer). Keys are 64 lower-case hex digits, checked before any path
  is made, so no key can name a file outside the store.
- :meth:`CacheStore.get` serves an entry only while it is younger than the caller's ttl and
  than :data:`MAX_AGE_S`; an entry stamped more than a day in the future (a clock that was
  wrong when it was written) is not served either.
- After each :meth:`CacheStore.put`, while there are more than :data:`MAX_ENTRIES` entries,
  the oldest go first (by ``created_at``, then by the file's mtime). Entries past their age
  are not swept separately: they are never served and, being the oldest, go first.
- A damaged entry is moved aside (``<key>.json.corrupt-<stamp>``, never deleted) and is a
  miss; a store that cannot be written makes ``put`` return False with one warning on the
  ``flower`` logger, and the run goes on.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..i18n import define, t
from ..util.fsutil import atomic_write_text, private_dir, set_aside

MAX_ENTRIES = 1000
MAX_AGE_S = 90 * 86400.0
FUTURE_SLACK_S = 86400.0
VERSION = 1

log = logging.getLogger("flower")

_KEY = re.compile(r"[0-9a-f]{64}")
_SHARD = re.compile(r"[0-9a-f]{2}")
_FILE = re.compile(r"[0-9a-f]{64}\.json")
# The writer puts created_at first, so eviction reads a few bytes of each file, not all of
# them (an entry holds a step's whole answer; a full store is 1000 of them).
_HEAD = re.compile(rb'\{"created_at": ?([-+0-9.eE]+)[,}]')
_HEAD_BYTES = 64

define(
    {
        "cache.unwritable": (
            "跨运行缓存写不进 {root}:{error};这一步的结果没存进缓存,运行照常继续",
            "could not write the cross-run cache at {root}: {error}; this step's result is "
            "not cached, the run goes on",
        ),
        "cache.unreadable": (
            "跨运行缓存 {root} 读不了:{error};当作未命中,运行照常继续",
            "could not read the cross-run cache at {root}: {error}; treated as a miss, the run "
            "goes on",
        ),
        "cache.corrupt": (
            "跨运行缓存的条目 {path} 坏了({error}),已挪到 {aside};当作未命中",
            "cross-run cache entry {path} is damaged ({error}); moved it to {aside} and "
            "treated it as a miss",
        ),
        "cache.corrupt_kept": (
            "跨运行缓存的条目 {path} 坏了({error}),也挪不走({move_error});当作未命中",
            "cross-run cache entry {path} is damaged ({error}) and could not be moved aside "
            "({move_error}); treated as a miss",
        ),
        "cache.unserializable": (
            "步骤 {step!r} 的结果存不进跨运行缓存(不是 JSON:{error});运行照常继续",
            "step {step!r}'s result cannot go into the cross-run cache (not JSON: {error}); "
            "the run goes on",
        ),
    }
)


@dataclass(frozen=True)
class Entry:
    """One cached step: what it was asked (``input_hash``, ``fingerprints``) and what it
    gave (``result``: the StepResult as JSON; ``ctx_value``: what it put in ctx, for a map
    step the stored ``reduce`` output). ``created_at`` is a ``time.time()`` stamp."""

    key: str
    step: str
    input_hash: str
    fingerprints: dict[str, str]
    result: dict[str, Any]
    ctx_value: Any
    created_at: float
    flow: str

    def to_json(self) -> str:
        """The entry's file text (``created_at`` first: eviction reads only the head)."""
        return json.dumps(
            {
                "created_at": self.created_at,
                "version": VERSION,
                "key": self.key,
                "flow": self.flow,
                "step": self.step,
                "input_hash": self.input_hash,
                "fingerprints": self.fingerprints,
                "result": self.result,
                "ctx_value": self.ctx_value,
            }
        )

    @classmethod
    def from_dict(cls, data: object) -> Entry:
        """The entry ``data`` (parsed JSON) holds; ValueError naming what is wrong."""
        if not isinstance(data, dict):
            raise ValueError(f"expected an object, got {type(data).__name__}")
        if data.get("version") != VERSION:
            raise ValueError(f"unknown version {data.get('version')!r}")
        for name in ("key", "step", "input_hash", "flow"):
            if not isinstance(data.get(name), str):
                raise ValueError(f"{name!r} is not a string")
        fps = data.get("fingerprints")
        if not isinstance(fps, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in fps.items()
        ):
            raise ValueError("'fingerprints' is not an object of strings")
        if not isinstance(data.get("result"), dict):
            raise ValueError("'result' is not an object")
        created = data.get("created_at")
        if isinstance(created, bool) or not isinstance(created, int | float):
            raise ValueError("'created_at' is not a number")
        if not math.isfinite(created):
            raise ValueError("'created_at' is not finite")
        return cls(
            key=data["key"],
            step=data["step"],
            input_hash=data["input_hash"],
            fingerprints=dict(fps),
            result=data["result"],
            ctx_value=data.get("ctx_value"),
            created_at=float(created),
            flow=data["flow"],
        )


def cache_key(input_hash: str, fingerprint: str) -> str:
    """The store key of a step's input hash and its fingerprint digest: 64 hex digits."""
    raw = json.dumps([f"flower-cache-v{VERSION}", input_hash, fingerprint])  # unambiguous
    return hashlib.sha256(raw.encode("ascii")).hexdigest()


def check_key(key: object) -> str:
    """``key`` when it is a store key (64 lower-case hex digits); ValueError otherwise."""
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise ValueError(f"not a cache key: {key!r}")
    return key


class CacheRows(Protocol):
    """The cross-run cache's rows: the run-state seam's part for the cache
    (:mod:`flower.state.seam` re-exports it). What an entry is and when it is served is
    :class:`CacheStore`'s, written once above them."""

    @property
    def where(self) -> str:
        """Where the cache lives, for a person (a folder, a database's table)."""
        ...

    def get(self, key: str) -> dict[str, Any] | None:
        """The entry (``flower.cache.Entry.to_json``'s object) or None (absent, or kept in
        a form that is no object: then put out of the way as :meth:`discard` does)."""
        ...

    def put(self, key: str, entry: dict[str, Any]) -> None: ...

    def discard(self, key: str, error: BaseException) -> None:
        """The entry under ``key`` is damaged (``error`` says how): keep it out of the way,
        never serving it again."""
        ...

    def evict(self, *, max_entries: int, max_age_s: float, now: float) -> int:
        """Drop the oldest entries past ``max_entries`` (and those older than
        ``max_age_s`` where that is cheap to find); how many went."""
        ...

    def read_last(self, workspace_id: str) -> dict[str, Any] | None:
        """What each cross-run step of the workspace ran with last (the reuse report's
        "why"), or None."""
        ...

    def write_last(self, workspace_id: str, last: dict[str, Any]) -> None: ...

    def __len__(self) -> int: ...


LAST_NAME = "last.json"  # <run_dir>/cache/last.json: what each step ran with last


class CacheStore:
    """The cross-run cache: what an entry is, when it is served, when it goes, written once
    over the seam's :class:`~flower.state.seam.CacheRows`: the files of one run_dir
    (``CacheStore(root)``, :class:`FileCacheRows`) or a database's rows (``CacheStore(rows=…,
    workspace_id=…)``). A store that cannot answer is a miss and a put that cannot land is
    lost, each with one warning: a cache never stops a run.

    ``durable=False`` skips the fsyncs of the file rows (tests and benchmarks: a put then
    costs no disk flush); a store used by runs keeps the default.
    """

    key = staticmethod(cache_key)

    def __init__(
        self,
        root: Path | None = None,
        *,
        durable: bool = True,
        rows: CacheRows | None = None,
        workspace_id: str = "",
    ) -> None:
        if rows is None:
            if root is None:
                raise TypeError("CacheStore needs a root or rows")
            rows = FileCacheRows(Path(root), durable=durable)
        self.rows = rows
        self.workspace_id = workspace_id
        self._warned: set[str] = set()

    def __repr__(self) -> str:
        return f"CacheStore({self.rows.where!r})"

    def get(self, key: str, *, ttl_s: float | None, now: float | None = None) -> Entry | None:
        """The entry under ``key`` if there is a sound one younger than ``ttl_s`` (None: no
        ttl) and :data:`MAX_AGE_S` at ``now`` (default: ``time.time()``); else None."""
        check_key(key)
        try:
            data = self.rows.get(key)
        except Exception as e:  # noqa: BLE001 - a store that cannot answer is a miss
            self._warn_once("cache.unreadable", root=self.rows.where, error=e)
            return None
        if data is None or _newer(data):
            return None  # a newer flower's entry: not ours to judge or move
        try:
            entry = Entry.from_dict(data)
            if entry.key != key:
                raise ValueError(f"it holds the entry of key {entry.key!r}")
        except ValueError as e:
            with contextlib.suppress(Exception):  # best effort: it is a miss either way
                self.rows.discard(key, e)
            return None
        return entry if fresh(entry, ttl_s, now) else None

    def put(self, key: str, entry: Entry) -> bool:
        """Store ``entry`` under ``key`` (which must be ``entry.key``), then evict; True when
        it was written. Never raises for the store: False and one warning instead."""
        check_key(key)
        if entry.key != key:
            raise ValueError(f"entry.key {entry.key!r} is not the key {key!r}")
        try:
            data = json.loads(entry.to_json())
        except (TypeError, ValueError, RecursionError) as e:
            log.warning("%s", t("cache.unserializable", step=entry.step, error=e))
            return False
        try:
            self.rows.put(key, data)
        except Exception as e:  # noqa: BLE001 - a full or unreachable store never stops a run
            self._warn_once("cache.unwritable", root=self.rows.where, error=e)
            return False
        with contextlib.suppress(Exception):  # best effort: a store over its size still works
            self.evict()
        return True

    def evict(self, max_entries: int = MAX_ENTRIES) -> int:
        """Remove the oldest entries until at most ``max_entries`` remain (and, where the
        rows can say it cheaply, those past :data:`MAX_AGE_S`); how many went."""
        return self.rows.evict(max_entries=max_entries, max_age_s=MAX_AGE_S, now=time.time())

    def __len__(self) -> int:
        try:
            return len(self.rows)
        except Exception:  # noqa: BLE001 - a store that cannot answer holds nothing usable
            return 0

    def read_last(self) -> dict[str, Any]:
        """What each cross-run step ran with last (for the reuse report's "why")."""
        try:
            data = self.rows.read_last(self.workspace_id)
        except Exception:  # noqa: BLE001 - only the report's "why" is lost
            return {}
        return data if isinstance(data, dict) else {}

    def write_last(self, last: dict[str, Any]) -> None:
        """Replace :meth:`read_last`'s map; raises OSError (only the report loses by it)."""
        try:
            self.rows.write_last(self.workspace_id, last)
        except OSError:
            raise
        except Exception as e:
            raise OSError(str(e)) from e

    def _warn_once(self, key: str, **fields: Any) -> None:
        # One line per store and kind: a full disk would otherwise say it at every step.
        if key not in self._warned:
            self._warned.add(key)
            log.warning("%s", t(key, **fields))


def fresh(entry: Entry, ttl_s: float | None, now: float | None = None) -> bool:
    """Is ``entry`` younger than ``ttl_s`` (None: no ttl) and :data:`MAX_AGE_S` at ``now``?"""
    age = (time.time() if now is None else now) - entry.created_at
    if age > MAX_AGE_S or age < -FUTURE_SLACK_S:
        return False
    return ttl_s is None or age <= ttl_s


class FileCacheRows:
    """The cache of one run_dir as files (the seam's :class:`~flower.state.seam.CacheRows`):
    ``<root>/<key[:2]>/<key>.json``, created on the first put, and ``<root>/last.json``
    (one run_dir holds one map of what its steps ran with last, whatever the workspace)."""

    def __init__(self, root: Path, *, durable: bool = True) -> None:
        self.root = Path(root)
        self.durable = durable

    @property
    def where(self) -> str:
        return str(self.root)

    def path(self, key: str) -> Path:
        """The file of ``key`` (checked: ValueError for anything but a store key)."""
        check_key(key)
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        """The entry's parsed file, or None (absent; undecodable: then set aside)."""
        path = self.path(key)
        try:
            raw = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as e:  # UnicodeDecodeError, JSONDecodeError too
            self._set_aside(path, e)
            return None
        if not isinstance(data, dict):
            self._set_aside(path, ValueError(f"expected an object, got {type(data).__name__}"))
            return None
        return data

    def put(self, key: str, entry: dict[str, Any]) -> None:
        path = self.path(key)
        private_dir(path.parent)
        atomic_write_text(path, json.dumps(entry), durable=self.durable)

    def discard(self, key: str, error: BaseException) -> None:
        """An entry flower cannot use is moved aside (``<key>.json.corrupt-<stamp>``), never
        deleted."""
        self._set_aside(self.path(key), error)

    def read_last(self, workspace_id: str) -> dict[str, Any] | None:
        try:
            data = json.loads((self.root / LAST_NAME).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def write_last(self, workspace_id: str, last: dict[str, Any]) -> None:
        private_dir(self.root)
        atomic_write_text(self.root / LAST_NAME, json.dumps(last, ensure_ascii=False))

    def __len__(self) -> int:
        return len(self._files())

    def evict(self, *, max_entries: int, max_age_s: float, now: float) -> int:
        """Remove the oldest entries until at most ``max_entries`` remain.

        Oldest by ``created_at``, then the file's mtime; a damaged file met on the way is
        moved aside (it no longer counts), never deleted. Entries past ``max_age_s`` are
        not swept apart (that would read every file at every put): they are never served
        and, being the oldest, go first."""
        files = self._files()
        if len(files) <= max_entries:
            return 0
        ranked: list[tuple[float, int, str]] = []
        for path in files:
            age = self._age(path)
            if age is not None:
                ranked.append((*age, path))
        ranked.sort()
        removed = 0
        for _, _, path in ranked[: max(0, len(ranked) - max_entries)]:
            with contextlib.suppress(FileNotFoundError):  # another process evicted it
                os.unlink(path)
                removed += 1
        return removed

    def _files(self) -> list[str]:
        out: list[str] = []
        try:
            with os.scandir(self.root) as shards:
                dirs = [d.path for d in shards if _SHARD.fullmatch(d.name) and d.is_dir()]
        except OSError:
            return []
        for d in dirs:
            try:
                with os.scandir(d) as it:
                    out.extend(e.path for e in it if _FILE.fullmatch(e.name))
            except OSError:
                continue
        return out

    def _age(self, path: str) -> tuple[float, int] | None:
        """``(created_at, mtime_ns)`` of an entry file, ``created_at`` from its head when it
        can; None when it vanished or is damaged (then it is moved aside)."""
        try:
            fd = os.open(path, os.O_RDONLY)  # os-level: a third of open()'s cost, 1000 times
        except OSError:
            return None
        try:
            mtime = os.fstat(fd).st_mtime_ns
            head = os.read(fd, _HEAD_BYTES)
            m = _HEAD.match(head)
            if m:
                with contextlib.suppress(ValueError):
                    created = float(m.group(1))
                    if math.isfinite(created):
                        return created, mtime
            raw = head + _read_rest(fd)
        except OSError:
            return None
        finally:
            os.close(fd)
        try:
            data = json.loads(raw)
            if _newer(data):
                return None
            return Entry.from_dict(data).created_at, mtime
        except (ValueError, RecursionError) as e:
            self._set_aside(Path(path), e)
            return None

    def _set_aside(self, path: Path, error: BaseException) -> None:
        try:
            aside = set_aside(path)
        except FileNotFoundError:
            return  # another process moved it first, and said so
        except OSError as e:
            log.warning("%s", t("cache.corrupt_kept", path=path, error=error, move_error=e))
            return
        log.warning("%s", t("cache.corrupt", path=path, error=error, aside=aside))


def _read_rest(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _newer(data: object) -> bool:
    version = data.get("version") if isinstance(data, dict) else None
    return isinstance(version, int) and not isinstance(version, bool) and version > VERSION
