"""The flow ``flower-super demo`` runs: three small steps, continuous, against a scripted model."""

from __future__ import annotations

from flower.core.agent import AgentSpec
from flower.workflow import Step, Workflow

hands = AgentSpec(
    name="demo-worker",
    instructions="你在做一个演示:照着做,回答一行。",
    allowed_tools=["Bash", "Read", "Write", "Edit"],
    permission_mode="acceptEdits",
)

flow = Workflow(
    [
        Step("调研", hands, "[[demo:research]] 看看工作区里有什么,记一笔。"),
        Step(
            "写稿",
            hands,
            lambda ctx: f"[[demo:write]] 根据调研写一份草稿 draft.md。调研结论:{ctx['调研']}",
        ),
        Step("收尾", hands, lambda ctx: f"[[demo:wrap]] 检查产出,一句话总结。草稿:{ctx['写稿']}"),
    ],
    name="demo",
)
