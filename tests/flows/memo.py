"""Flows of the memoization tests: four cross-run steps, each keyed on another fingerprint."""

from __future__ import annotations

import os
from pathlib import Path

from flower import Cache, MapStep
from flower.agents.agent import AgentSpec
from flower.workflow import Step, Workflow, with_goal

hands = AgentSpec(name="hands", instructions="test agent", allowed_tools=["Read"])

flow = Workflow(
    [
        Step(
            "data", hands, "[[m-data]] read data/", cache=Cache("cross-run", ["glob!:data/*.txt"])
        ),
        Step("src", hands, "[[m-src]] read src/", cache=Cache("cross-run", ["glob:src/*.py"])),
        Step("head", hands, "[[m-head]] note the commit", cache=Cache("cross-run", ["git:HEAD"])),
        Step(
            "sum",
            hands,
            lambda ctx: f"[[m-sum]] sum up: {ctx['data']}",
            cache=Cache("cross-run", ["env:FLOWER_MEMO_TEST"], ttl="7d"),
        ),
    ],
    name="memo",
)

# What verify refuses, each naming its step and rule.
judged = with_goal(
    Step("judged", hands, "[[j]] go", cache=Cache("cross-run")), None, goal_path="goal.md"
)
bad = Workflow(
    [
        judged,
        Step("deploy", hands, "[[d]] deploy", cache=Cache("cross-run"), idempotent=False),
        Step("odd", hands, "[[o]] go", cache=Cache("cross-run", ["svn:HEAD"])),
        Step("stale", hands, "[[s]] go", cache=Cache("cross-run", ttl="7w")),
    ],
    name="bad",
)

# Four plain steps (run-only, the default): the kill drill's flow.
four = Workflow(
    [
        Step("one", hands, "[[k-one]] first"),
        Step("two", hands, lambda ctx: f"[[k-two]] after {ctx['one']}"),
        Step("three", hands, lambda ctx: f"[[k-three]] after {ctx['two']}"),
        Step("four", hands, lambda ctx: f"[[k-four]] after {ctx['three']}"),
    ],
    name="four",
)

# incremental=True: every step cross-run, except what may never be (idempotent=False here).
inc = Workflow(
    [
        Step("look", hands, "[[i-look]] look"),
        Step("ship", hands, "[[i-ship]] ship it", idempotent=False),
    ],
    name="inc",
    incremental=True,
)

WS = Path(os.environ.get("FLOWER_MEMO_WS", "."))  # the test's workspace (items/ in it)

# A map over the files of items/ (sorted): each item one child, two at a time, cross-run.
files = Workflow(
    [
        MapStep(
            "read",
            hands,
            prompt=lambda ctx, item: f"[[m-item]] read {item}: {(WS / 'items' / item).read_text()}",
            over=lambda ctx: sorted(p.name for p in (WS / "items").iterdir()),
            concurrency=2,
            cache=Cache("cross-run"),
        ),
    ],
    name="files",
)
