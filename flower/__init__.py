"""flower: continuous multi-step LLM-agent workflows on claude-agent-sdk.

Run it again in the same directory and it carries on the same conversation.
"""

from __future__ import annotations

from ._errors import ConfigError, FlowerError, RunDirBusy
from .core.result import Event, StepResult

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "Event",
    "FlowerError",
    "RunDirBusy",
    "StepResult",
]
