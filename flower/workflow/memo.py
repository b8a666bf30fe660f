"""Paying only for what changed (seed 004): a step's cache policy, and why it ran or not.

``Cache(scope, fingerprint, ttl)`` on a ``Step`` says how its result may be reused:

- ``"run-only"`` (the default): a step the unfinished last run completed with the same input
  hash is reused, not sent to the model again.
- ``"cross-run"``: also a result any earlier run stored under the same input hash *and* the
  same resolved fingerprints (``git:HEAD``, ``glob:``, ``glob!:``, ``file:``, ``env:``), within
  ``ttl``; the store is ``<run_dir>/cache/`` (:mod:`flower.cache`).
- ``"off"``: always run.

``Workflow(incremental=True)`` makes every step cross-run unless it says otherwise. Never
cross-run, whatever is asked: a step with a ``gate`` (a judged step; ``with_goal`` is one),
a step that talks to a person (its agent has the ``human`` MCP server: ``clarify_step`` and
any step given a channel's tools), and an ``idempotent=False`` step, which is not cached at
all. Asking for cross-run on those is an error :func:`flower.workflow.verify.verify`
reports; under ``incremental`` they silently stay as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..state import reuse as _reuse  # noqa: F401 - defines the report texts this module uses

if TYPE_CHECKING:
    from ..state.result import StepResult

# A Step and a Workflow (typed loosely here: base.py imports this module).
Step = Any
Workflow = Any

SCOPES = ("run-only", "cross-run", "off")

HUMAN_SERVER = "human"  # HumanChannel.mcp_servers()'s key


@dataclass(frozen=True)
class Cache:
    """How a step's result may be reused (see the module docstring)."""

    scope: str = "run-only"
    fingerprint: Sequence[str] = field(default_factory=tuple)
    ttl: str | int | float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.fingerprint, str):  # Cache(fingerprint="git:HEAD"): one entry
            object.__setattr__(self, "fingerprint", (self.fingerprint,))
        else:
            object.__setattr__(self, "fingerprint", tuple(self.fingerprint))


def human_facing(step: Step) -> bool:
    """Does the step talk to a person (its agent has a HumanChannel's tools)?"""
    servers = step.spec.mcp_servers
    return isinstance(servers, dict) and HUMAN_SERVER in servers


def why_not_cross_run(step: Step) -> str | None:
    """Why ``step`` can never be reused across runs (None: it can)."""
    from ..i18n import t

    key = why_not_cross_run_key(step)
    return t(key) if key else None


def why_not_cross_run_key(step: Step) -> str | None:
    """The catalogue key of :func:`why_not_cross_run`'s answer (stored in reports, which
    are shown later, maybe in another language)."""
    if not step.idempotent:
        return "memo.no_cross.idempotent"
    if step.gate is not None:
        return "memo.no_cross.gate"
    if human_facing(step):
        return "memo.no_cross.human"
    return None


def scope_of(step: Step, wf: Workflow) -> str:
    """The scope a step runs with: what it asked for, bounded by what it may have."""
    if not step.idempotent:
        return "off"
    asked = step.cache.scope if step.cache is not None else None
    if asked == "off":
        return "off"
    wants_cross = asked == "cross-run" or (asked is None and wf.incremental)
    if wants_cross and why_not_cross_run(step) is None:
        return "cross-run"
    return "run-only"


def changed_inputs(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """The names of the inputs whose digests differ (in a stable order)."""
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))


# -- cross-run memoization: one step's lookup and store ----------------------------------------

LAST_MAX = 1000


class CrossRun:
    """One cross-run step's key, its hit (if any), and what it ran with last time.

    Nothing here raises: a store that cannot be read is a miss, one that cannot be written
    loses the entry (one warning from the store); the run goes on either way.
    """

    def __init__(
        self,
        store: Any,
        flow: str,
        step: Step,
        input_hash: str,
        fingerprints: dict[str, str],
        ttl_s: float | None,
    ) -> None:
        from ..cache import cache_key, fingerprint_digest

        self.flow, self.step_name = flow, step.name
        self.input_hash, self.fingerprints = input_hash, fingerprints
        self.store = store  # the run state's cache (flower.cache.CacheStore or its like)
        self.key = cache_key(input_hash, fingerprint_digest(fingerprints))
        self.hit = self.store.get(self.key, ttl_s=ttl_s)
        last = self.store.read_last().get(_last_key(flow, step.name)) or {}
        self.last_parts: dict[str, str] | None = last.get("parts")
        self.last_fingerprints: dict[str, str] | None = last.get("fingerprints")

    @classmethod
    def open(cls, store: Any, workspace: Path, flow: str, step: Step, input_hash: str) -> CrossRun:
        from ..cache import parse_ttl, resolve_all

        cache = step.cache or Cache()
        try:
            ttl_s = parse_ttl(cache.ttl)
        except ValueError:
            ttl_s = None  # verify names a bad ttl; a run does not stop over it
        fingerprints = resolve_all(list(cache.fingerprint), workspace)
        return cls(store, flow, step, input_hash, fingerprints, ttl_s)

    def store_result(self, result: StepResult, value: Any, parts: dict[str, str], run: str) -> None:
        """A step that finished ok and was not itself a hit: keep it for later runs."""
        import time

        from ..cache import Entry

        entry = Entry(
            key=self.key,
            step=self.step_name,
            input_hash=self.input_hash,
            fingerprints=dict(self.fingerprints),
            result={**result.to_dict(), "run": run},
            ctx_value=value,
            created_at=time.time(),
            flow=self.flow,
        )
        self.store.put(self.key, entry)
        self.remember(parts)

    def remember(self, parts: dict[str, str]) -> None:
        """What this step ran with, so the next miss can say which input changed."""
        try:
            last = self.store.read_last()
            last[_last_key(self.flow, self.step_name)] = {
                "parts": parts,
                "fingerprints": self.fingerprints,
            }
            while len(last) > LAST_MAX:
                last.pop(next(iter(last)))
            self.store.write_last(last)
        except OSError:
            pass  # only the report's "which input changed" is lost


def _last_key(flow: str, step: str) -> str:
    return f"{flow}/{step}"
