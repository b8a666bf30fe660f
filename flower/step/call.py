"""``StepCall``: one request to run a step, and (derived from it) each attempt of it.

``Runtime.run`` turns its arguments into one of these; the step loop derives every attempt
from it with :meth:`StepCall.attempting` (a new prompt, another session to resume, the
attempt's number, the context size at which it must stop); a placement runs exactly the
call it is given; the step child's ``start`` frame carries :meth:`wire` of it (the agent
spec itself crosses by fork, never by the pipe).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..agents.agent import AgentSpec


@dataclass(frozen=True)
class StepCall:
    """What one attempt sends, and which session it continues.

    ``resume`` names the session to continue (``fork`` makes the CLI branch a new one off
    it, at ``resume_at`` if given). ``attempt`` counts failed attempts plus one (interrupts
    and handoffs do not count). ``stop_at``: the context size (tokens) at which the attempt
    stops itself at the next message boundary because a handoff is due; None never stops.
    ``headroom``: when not None, ``stop_at`` was derived from a *guessed* window, and the
    attempt lowers it to what the CLI's real window allows (window − headroom; see
    :meth:`flower.step.attempt.AttemptState.learn`).
    ``fresh``: what a fresh session of this step is told when the session ``resume`` names
    cannot be resumed (the CLI has no conversation for it); None: ``prompt`` itself. It
    never crosses a pipe: the step loop, which starts the fresh session, reads it.
    ``attach``: the id of an attempt of this step that a killed supervisor left running on a
    cluster (the first attempt attaches to it instead of starting another; see
    :attr:`flower.step.placement.Watch.on_placed`).
    """

    spec: AgentSpec
    prompt: str
    label: str
    resume: str | None = None
    fork: bool = False
    resume_at: str | None = None
    attempt: int = 1
    stop_at: int | None = None
    headroom: int | None = None
    fresh: str | None = None
    attach: str | None = None

    @property
    def step(self) -> str:
        """The step this call belongs to (``干活#round2`` → ``干活``)."""
        return self.label.split("#")[0]

    def attempting(self, **changes: Any) -> StepCall:
        """This call with some fields changed (each attempt is one of these)."""
        return replace(self, **changes)

    def wire(self) -> dict[str, Any]:
        """The fields that cross the pipe in a ``start`` frame (the spec goes by its name)."""
        return {
            "label": self.label,
            "step": self.step,
            "prompt": self.prompt,
            "spec": self.spec.name,
            "resume": self.resume,
            "fork": self.fork,
            "resume_at": self.resume_at,
            "attempt": self.attempt,
            "stop_at": self.stop_at,
            "headroom": self.headroom,
        }

    def same_session_as(self, other: StepCall) -> bool:
        """Would an attempt of ``other`` start the CLI exactly as this one does?

        The options a CLI is started with are the spec and the session to continue; the
        prompt, label and attempt number are only sent once it runs.
        """
        return (self.spec, self.resume, self.fork, self.resume_at) == (
            other.spec,
            other.resume,
            other.fork,
            other.resume_at,
        )
