"""A flow whose import plants a bug in flower's attempt code (only for the test that runs it).

Folding the first SDK message raises AttributeError, as a real bug in ``AttemptState`` would.
The supervisor imports this module, so every step child it forks inherits the bug: the
attempt crashes inside flower, and retrying cannot help.
"""

from __future__ import annotations

from typing import Any

from flower.agents.agent import AgentSpec
from flower.step import attempt
from flower.workflow import Step, Workflow


def _see(self: Any, msg: Any) -> None:
    raise AttributeError("'NoneType' object has no attribute 'content' (a planted bug)")


attempt.AttemptState.see = _see  # type: ignore[method-assign]

hands = AgentSpec(name="hands", instructions="test agent", allowed_tools=["Bash"])
flow = Workflow([Step("buggy", hands, "[[buggy]] go")], name="buggy")
