"""Flows the cluster drills run on Temporal workers (tests/test_e2e_cluster.py)."""

from __future__ import annotations

from flower.agents.agent import AgentSpec
from flower.workflow import MapStep, Step, Workflow

hands = AgentSpec(
    name="hands",
    instructions="test agent",
    allowed_tools=["Bash", "Read", "Write", "Edit"],
    permission_mode="acceptEdits",
)

# A -> B -> C: B is where the drills kill a worker, freeze it or kill the supervisor.
abc = Workflow(
    [
        Step("A", hands, "[[A]] do the first thing"),
        Step("B", hands, lambda ctx: f"[[B]] then the second, after: {ctx['A']}"),
        Step("C", hands, lambda ctx: f"[[C]] and the last, after: {ctx['B']}"),
    ],
    name="abc",
)

ITEMS = 8

# One step over eight items, at most eight in flight: the queue spreads them over workers.
spread = Workflow(
    [
        MapStep(
            "M",
            hands,
            prompt=lambda ctx, item: f"[[M{item}]] handle item {item}",
            over=lambda ctx: list(range(ITEMS)),
            concurrency=ITEMS,
        )
    ],
    name="spread",
)

# X, Y, Z each in a session of its own: while one runs, a worker gets the next one ready
# (its child forked, its CLI started), as the local fork does.
xyz = Workflow(
    [
        Step("X", hands, "[[X]] one"),
        Step("Y", hands, "[[Y]] two"),
        Step("Z", hands, "[[Z]] three"),
    ],
    name="xyz",
    continuous=False,
)
