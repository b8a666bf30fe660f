"""StepResult and Event: the record of one ``Runtime.run`` and the progress it reports."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

#: ``StepResult.error`` of an attempt a person interrupted (Ctrl-C once).
INTERRUPTED = "interrupted-by-human"
#: ``StepResult.error`` of an attempt that stopped itself because a handoff is due.
HANDOFF_DUE = "context-full-handoff"
#: ``StepResult.error`` of the step in flight when SIGTERM/SIGHUP arrived (``Runtime.rescue``).
KILLED_BY_SIGNAL = "killed-by-signal"


@dataclass
class StepResult:
    """Everything about one step run (one ``Runtime.run``): one manifest row.

    Fields and defaults exactly as seed 003 gives them.
    """

    step: str
    session_id: str | None = None
    ok: bool = False
    cost_usd: float = 0.0
    num_turns: int = 0
    text: str = ""
    error: str | None = None
    started_at: float = 0.0
    ended_at: float = 0.0
    attempts: int = 1
    errors: list[str] = field(default_factory=list)
    resumed: bool = False
    retired: list[str] = field(default_factory=list)
    context: int = 0

    @property
    def duration_s(self) -> float:
        return round(max(0.0, self.ended_at - self.started_at), 2) if self.ended_at else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Every dataclass field (``asdict`` does not see ``duration_s``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepResult:
        """Rebuild from a manifest row or a pipe frame; unknown keys are ignored."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


STEP_RESULT_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(StepResult))


def jsonable(value: Any) -> Any:
    """``value`` as a strict JSON value: tuples and sets become lists, keys strings,
    non-finite floats null, anything else its text. What crosses the pipe to the
    supervisor and what is kept of a step in the run record both go through this."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


@dataclass
class Event:
    """Progress while a step runs, in seed 003's shape: ``kind`` (text / tool_call / step /
    retry / handoff / ask / …), ``text`` the body, ``tool`` the tool name of a ``tool_call``,
    ``payload`` the structured rest, ``raw`` the SDK object it came from (never sent over a
    pipe). Events flower emits for a step carry its label in ``payload["step"]``."""

    kind: str
    text: str = ""
    tool: str = ""
    payload: dict[str, Any] = field(default_factory=dict)
    raw: Any = None

    def __str__(self) -> str:
        if self.kind == "tool_call":
            return f"[{self.tool}] {self.text}"
        return self.text or f"<{self.kind}>"

    @property
    def step(self) -> str:
        """The label of the step this event belongs to ("" when it is not a step's)."""
        return str(self.payload.get("step", ""))
