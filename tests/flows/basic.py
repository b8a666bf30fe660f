"""Flows the end-to-end tests run under flower-super (markers select the scripted turns)."""

from __future__ import annotations

from flower.core.agent import AgentSpec
from flower.workflow import Step, Workflow

hands = AgentSpec(
    name="hands",
    instructions="test agent",
    allowed_tools=["Bash", "Read", "Write", "Edit"],
    permission_mode="acceptEdits",
)

# Two steps: "first" finishes quickly, "second" is where the tests kill things.
two = Workflow(
    [
        Step("first", hands, "[[first]] do the first thing"),
        Step("second", hands, lambda ctx: f"[[second]] then the second, after: {ctx['first']}"),
    ],
    name="two",
)

one = Workflow([Step("only", hands, "[[only]] do it")], name="one")

alpha = Workflow([Step("alpha", hands, "[[alpha]] go")], name="alpha")
beta = Workflow([Step("beta", hands, "[[beta]] go")], name="beta")
gamma = Workflow([Step("gamma", hands, "[[gamma]] go")], name="gamma")
