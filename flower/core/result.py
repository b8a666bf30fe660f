"""StepResult and Event: the record of one ``Runtime.run`` and the progress it reports."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any


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
        return max(0.0, self.ended_at - self.started_at) if self.ended_at else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Every dataclass field (``asdict`` does not see ``duration_s``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepResult:
        """Rebuild from a manifest row or a pipe frame; unknown keys are ignored."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


STEP_RESULT_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(StepResult))


@dataclass
class Event:
    """Progress reported while a step runs: ``kind`` is step / retry / handoff / context / text / task."""

    kind: str
    step: str = ""
    payload: dict[str, Any] = field(default_factory=dict)
