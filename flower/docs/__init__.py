"""Documents: a model's reply parsed into fixed sections, then written to disk (seed 003, 文书).

Each document shares one shape: ``parse()``, ``missing()`` / ``complete()``, ``to_markdown()``
for people, ``prompt_block()`` for the next model, ``write()`` / ``load()``.
"""

from __future__ import annotations

from .brief import Brief
from .goal import Goal
from .handoff import HANDOFF_PROMPT, Handoff, degraded, is_overflow
from .verdict import Verdict

__all__ = ["HANDOFF_PROMPT", "Brief", "Goal", "Handoff", "Verdict", "degraded", "is_overflow"]
