"""Flows for the hook-layer drills, written with flower's public API only (as a user would).

Markers in the prompts select the scripted model's conversations (tests/test_e2e_roles.py,
tests/test_e2e_ledger.py).
"""

from __future__ import annotations

from flower import AgentSpec, Step, Workflow, coordinator, judge, worker

# A coordinator with one worker, on the Runtime's workbench (<run_dir>/workbench).
coder = worker("写代码、跑命令的活交给它", "你负责动手:写代码、跑命令。")
coordinated = Workflow(
    [Step("协调", coordinator("协调者", "", {"coder": coder}), "[[coordinate]] 开始")],
    name="coordinated",
    workbench=True,
)

# The same with an isolated worker (its own git worktree).
isolated_coder = worker("在自己的工作树里干活", "你负责动手。", isolate=True)
isolating = Workflow(
    [Step("协调", coordinator("协调者", "", {"coder": isolated_coder}), "[[isolate]] 开始")],
    name="isolating",
    workbench=True,
)

# Judges: one that may only read, one that may also run commands.
judging = Workflow([Step("判定", judge("判定者", None), "[[judge]] 判一下")], name="judging")
judging_runs = Workflow(
    [Step("判定", judge("判定者", None, can_run=True), "[[judge-run]] 判一下")],
    name="judging_runs",
)

# A worker-like agent on a workbench: big outputs spill, scripts are indexed.
hands = AgentSpec(
    "hands",
    "test agent",
    allowed_tools=["Bash", "Read", "Write", "Edit"],
    permission_mode="acceptEdits",
)
bench = Workflow([Step("work", hands, "[[bench]] go")], name="bench", workbench=True)

# One Bash call, then a reply: the ledger drill kills the supervisor right after the call.
ledger = Workflow([Step("work", hands, "[[ledger]] go")], name="ledger")

# A long step for the handoff drill (no workbench: the handoff still reaches the successor).
long = Workflow([Step("long", hands, "[[long]] go")], name="long", workbench=True)

# Step names that look like paths (they are keys, never paths).
odd = Workflow(
    [Step("../" * 12 + "x", hands, "[[odd]] go"), Step("a/b", hands, "[[oddb]] go")], name="odd"
)
