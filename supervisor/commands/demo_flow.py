"""The flow ``flower-super demo`` runs: three small steps, continuous, against a scripted model.

The step names are in the person's language (they show on every line of the demo); the
prompts are the model's and stay as they are.
"""

from __future__ import annotations

from flower.agents.agent import AgentSpec
from flower.i18n import define, t
from flower.workflow import Step, Workflow

define(
    {
        "demo.step.research": ("调研", "research"),
        "demo.step.write": ("写稿", "draft"),
        "demo.step.wrap": ("收尾", "wrap-up"),
    }
)
RESEARCH, WRITE, WRAP = t("demo.step.research"), t("demo.step.write"), t("demo.step.wrap")

hands = AgentSpec(
    name="demo-worker",
    instructions="你在做一个演示:照着做,回答一行。",
    allowed_tools=["Bash", "Read", "Write", "Edit"],
    permission_mode="acceptEdits",
)

flow = Workflow(
    [
        Step(RESEARCH, hands, "[[demo:research]] 看看工作区里有什么,记一笔。"),
        Step(
            WRITE,
            hands,
            lambda ctx: f"[[demo:write]] 根据调研写一份草稿 draft.md。调研结论:{ctx[RESEARCH]}",
        ),
        Step(WRAP, hands, lambda ctx: f"[[demo:wrap]] 检查产出,一句话总结。草稿:{ctx[WRITE]}"),
    ],
    name="demo",
)
