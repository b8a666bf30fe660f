"""Workflows: steps in order, state through ctx, continuity by default."""

from .base import Ctx, Step, StepAbort, Workflow

__all__ = ["Ctx", "Step", "StepAbort", "Workflow"]
