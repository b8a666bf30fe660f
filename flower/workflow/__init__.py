"""Workflows: steps in order, state through ctx, continuity by default; the starter flow."""

from .base import Ctx, MapStep, Step, StepAbort, Workflow
from .goal import (
    BRIEF_KEY,
    CLARIFY_RESUME,
    GOAL_KEY,
    MISSING_KEY,
    ROUND_KEY,
    VERDICT_KEY,
    VERIFY_PROMPT,
    clarify_step,
    goal_step,
    with_goal,
)
from .starter import starter_flow, wake_state

__all__ = [
    "BRIEF_KEY",
    "CLARIFY_RESUME",
    "GOAL_KEY",
    "MISSING_KEY",
    "ROUND_KEY",
    "VERDICT_KEY",
    "VERIFY_PROMPT",
    "Ctx",
    "MapStep",
    "Step",
    "StepAbort",
    "Workflow",
    "clarify_step",
    "goal_step",
    "starter_flow",
    "wake_state",
    "with_goal",
]
