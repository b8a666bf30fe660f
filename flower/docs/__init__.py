"""Documents: a model's reply parsed into fixed sections, then written to disk (seed 003, 文书).

Each document shares one shape: ``parse()``, ``missing()`` / ``complete()``, ``to_markdown()``
for people, ``prompt_block()`` for the next model, ``write()`` / ``load()``.
"""

from __future__ import annotations

from .handoff import HANDOFF_PROMPT, Handoff, degraded, is_overflow

__all__ = ["HANDOFF_PROMPT", "Handoff", "degraded", "is_overflow"]
