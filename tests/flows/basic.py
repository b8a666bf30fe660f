"""Flows the end-to-end tests run under flower-super (markers select the scripted turns)."""

from __future__ import annotations

from flower.agents.agent import AgentSpec
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


def says_pass(result, ctx):
    """A gate of the person's own: the step passes when its answer says PASS."""
    return "PASS" in result.text


gated = Workflow([Step("checked", hands, "[[checked]] do it", gate=says_pass)], name="gated")

alpha = Workflow([Step("alpha", hands, "[[alpha]] go")], name="alpha")
beta = Workflow([Step("beta", hands, "[[beta]] go")], name="beta")
gamma = Workflow([Step("gamma", hands, "[[gamma]] go")], name="gamma")


def _noisy_hook():
    """A PreToolUse hook that prints to stdout and stderr (in the step child)."""
    import sys

    async def hook(data, tool_use_id, context):
        print("STRAY PRINT FROM A HOOK {not json")
        print("stray stderr line", file=sys.stderr)
        return {}

    from claude_agent_sdk import HookMatcher

    return {"PreToolUse": [HookMatcher(matcher="Bash", hooks=[hook])]}


noisy = Workflow(
    [
        Step(
            "noisy",
            AgentSpec(name="noisy", instructions="t", allowed_tools=["Bash"], hooks=_noisy_hook()),
            "[[noisy]] go",
        )
    ],
    name="noisy",
)

# One step that never runs (its `when` says no): a flow that needs no model at all.
idle = Workflow([Step("idle", hands, "[[idle]] go", when=lambda ctx: False)], name="idle")

# Two steps whose first reads the words given after `start` (ctx["_ask"]): a resume that lost
# them would change its prompt, so it would be sent (and paid for) again.
asked = Workflow(
    [
        Step("first", hands, lambda ctx: f"[[first]] do what was asked: {ctx['_ask']}"),
        Step("second", hands, lambda ctx: f"[[second]] then the second, after: {ctx['first']}"),
    ],
    name="asked",
)
