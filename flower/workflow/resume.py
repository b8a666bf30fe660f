"""Incremental resume (seed 004): input hashes and the unfinished run to pick up from.

A step's input hash folds in everything that shapes what the agent will produce: the flow
name, the step's name and structure, the agent spec's fingerprint and the prompt *after*
ctx interpolation, so a changed upstream output changes the hash by itself.

The unfinished run to resume is the latest earlier run of the same flow in the same
workspace whose record is not ``finished``; its completed steps (row ok, gate passed) with
an unchanged hash are reused instead of sent to the model again.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .._errors import RunDirBusy
from ..state.registry import FINISHED, FlowerRecord, Registry

if TYPE_CHECKING:
    from ..agents.agent import AgentSpec


class HashedStep(Protocol):
    """What of a ``Step`` enters its input hash (a Protocol, so this module needs no import
    of the workflow's)."""

    name: str
    resume_from: str | None
    fork: bool

    @property
    def spec(self) -> AgentSpec: ...


def input_parts(
    flow: str,
    step: HashedStep,
    prompt: str,
    *,
    index: int = 0,
    args: Any = None,
    workspace: str = "",
) -> dict[str, str]:
    """Everything that shapes what the agent will produce, each as a short digest (so a
    report can say which one changed): the resolved prompt (after ctx interpolation: an
    upstream output that changed moves every step that reads it, and an unchanged one does
    not), the spec's fingerprint, the flow's name and the step's name and place in it, its
    structure (``resume_from``, ``fork``), the run's args and ask, and the workspace path."""
    return {
        "prompt": _digest(prompt),
        "spec": step.spec.fingerprint(),
        "flow": _digest([flow, step.name, index]),
        "structure": _digest([step.resume_from, step.fork]),
        "args": _digest(args),
        "workspace": _digest(workspace),
    }


def input_hash(flow: str, step: HashedStep, prompt: str, **more: Any) -> str:
    """The step's input hash: :func:`input_parts` folded into one digest."""
    return hash_of(input_parts(flow, step, prompt, **more))


def hash_of(parts: dict[str, str]) -> str:
    raw = json.dumps(parts, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def _digest(value: Any) -> str:
    raw = json.dumps(value, sort_keys=True, ensure_ascii=False, default=repr)
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()[:16]


@dataclass
class PriorRun:
    run: str
    state: str
    completed: dict[str, dict[str, Any]]
    in_flight: str | None = None  # the step it was running (or failed in) when it ended

    def interrupted(self, step: str) -> bool:
        return self.in_flight == step and step not in self.completed


def prior_run(
    registry: Registry,
    flow: str,
    workspace: Path,
    workspace_id: str,
    *,
    exclude: str,
) -> PriorRun | None:
    """The latest earlier run of ``flow`` in this workspace (by its identity, or by its path
    for records older than identities), if it did not finish; else None."""
    last = last_run(registry, flow, workspace, workspace_id, exclude=exclude)
    if last is None or last.state == FINISHED:
        return None
    in_flight = last.step.split("#")[0] if last.step else None
    return PriorRun(
        run=last.run, state=last.state, completed=dict(last.completed), in_flight=in_flight
    )


def last_run(
    registry: Registry,
    flow: str,
    workspace: Path,
    workspace_id: str,
    *,
    exclude: str = "",
) -> FlowerRecord | None:
    """The record of the latest earlier run of ``flow`` in this workspace (by its identity,
    or by its path for records older than identities), finished or not; None if none."""
    mine = [
        r
        for r in registry.records()
        if r.flow == flow
        and r.run != exclude
        and (r.workspace_id == workspace_id if r.workspace_id else Path(r.workspace) == workspace)
    ]
    return mine[-1] if mine else None


def refuse_live_conflict(registry: Registry, steps: list[str], *, exclude: str) -> None:
    """Refuse to start when a live flower here would continue one of our steps' sessions.

    Lineage is keyed by step name, so two live flowers sharing a step name would resume the
    very same session at once.
    """
    for other in registry.live(exclude=exclude):
        shared = [s for s in steps if s in other.steps]
        if shared:
            raise RunDirBusy(
                f"flower pid {other.pid} (flow {other.flow!r}, run {other.run}) is running in "
                f"{registry.where} and uses step {shared[0]!r}, whose session this start would "
                "resume",
                hint=f"wait for it to finish, stop it (kill {other.pid}), or use another --run-dir",
            )
