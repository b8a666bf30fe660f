"""Flows for the "inside a step" drills (retries, cuts, kills, handoffs, interrupts).

Each flow is one or two steps whose prompt carries a ``[[marker]]`` naming the scripted
conversation that answers it; the scripts live in the tests.
"""

from __future__ import annotations

from flower.agents.agent import AgentSpec
from flower.workflow import Step, Workflow

hands = AgentSpec(
    name="hands",
    instructions="test agent",
    allowed_tools=["Bash", "Read", "Write", "Edit"],
    permission_mode="acceptEdits",
)


def single(name: str) -> Workflow:
    """A one-step flow: step ``name`` prompted with ``[[name]] go``."""
    return Workflow([Step(name, hands, f"[[{name}]] go")], name=name)


net = single("net")  # a connection outage mid-step
auth = single("auth")  # a 401
cut = single("cut")  # a stream cut mid-answer
killed = single("killed")  # the CLI SIGKILLed mid-turn
full = single("full")  # the context crosses the handoff threshold
over = single("over")  # the API says "prompt is too long"
ask = single("ask")  # a person interrupts with a sentence

# Two bursts in one run: each step starts its own attempt count, so both show the
# backoff growing from the first delay.
bursts = Workflow(
    [Step("s529", hands, "[[s529]] go"), Step("s429", hands, "[[s429]] go")],
    name="bursts",
)

# One count for every kind of failed attempt (issue 7): 529s and deaths of the step child.
mixed = single("mixed")  # every request: held 2 s, then a 529; the test kills every 2nd child
dead = single("dead")  # every request held; the test kills the child each time
backoff = single("backoff")  # a death, then Ctrl-C during the backoff that follows

# The same fault sequence through both placements (in-process and forked).
seq = Workflow([Step("seq", hands, "[[seq]] go")], name="seq")
