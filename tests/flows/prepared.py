"""Flows for the drills of children prepared ahead of their step (issue 7)."""

from __future__ import annotations

from flower.agents.agent import AgentSpec
from flower.workflow import Step, Workflow

hands = AgentSpec(name="hands", instructions="test agent", allowed_tools=["Bash"])

# b is prepared while a runs, then never runs: its when says no.
skipped = Workflow(
    [
        Step("a", hands, "[[a]] go"),
        Step("b", hands, "[[b]] go", when=lambda ctx: False),
        Step("c", hands, lambda ctx: f"[[c]] after {ctx['a']}"),
    ],
    name="skipped",
)

# b is prepared while a runs, and then runs in that very child.
used = Workflow(
    [Step("a", hands, "[[a]] go"), Step("b", hands, lambda ctx: f"[[b]] after {ctx['a']}")],
    name="used",
)

# a fails for good: the flow stops, and b (prepared) never runs.
stops = Workflow([Step("a", hands, "[[a]] go"), Step("b", hands, "[[b]] go")], name="stops")
