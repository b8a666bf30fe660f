"""Cross-run memoization's pure parts (seed 004, 跨运行记忆化): fingerprints of the outside
world (:mod:`.fingerprint`), ttls (:mod:`.ttl`) and the store under ``<run_dir>/cache/``
(:mod:`.store`). Nothing here starts a step or knows a workflow; the runtime asks
``resolve_all`` for a step's fingerprints, keys them with its input hash and asks the store.

    fps = resolve_all(["git:HEAD", "glob!:src/**/*.py"], workspace)
    key = store.key(input_hash, fingerprint_digest(fps))
    hit = store.get(key, ttl_s=parse_ttl("7d"))
"""

from __future__ import annotations

from .fingerprint import (
    MAX_HASH_BYTES,
    MAX_MATCHES,
    PREFIXES,
    check_entry,
    fingerprint_digest,
    resolve,
    resolve_all,
)
from .store import (
    MAX_AGE_S,
    MAX_ENTRIES,
    CacheStore,
    Entry,
    FileCacheRows,
    cache_key,
    check_key,
)
from .ttl import check_ttl, parse_ttl

__all__ = [
    "MAX_AGE_S",
    "MAX_ENTRIES",
    "MAX_HASH_BYTES",
    "MAX_MATCHES",
    "PREFIXES",
    "CacheStore",
    "Entry",
    "FileCacheRows",
    "cache_key",
    "check_entry",
    "check_key",
    "check_ttl",
    "fingerprint_digest",
    "parse_ttl",
    "resolve",
    "resolve_all",
]
