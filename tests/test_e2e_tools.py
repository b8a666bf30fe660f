"""The person's tools are offered directly, end to end: the real CLI, the scripted model
server, and the ``tools`` of the first request each role's session sent.

Claude Code 2.x defers MCP tools (and some built-ins) behind ``ToolSearch``: a deferred
tool is only named in the conversation, and a model must search before it can call it. A
role that holds the human channel exists to ask, so its first request must offer
``mcp__human__ask`` itself (and ``mcp__human__inbox`` for the coordinator, who holds it);
everything else stays as the CLI defers it, and a role without the channel sees no change.
"""

from __future__ import annotations

import asyncio

import pytest

from flower import AgentSpec, HumanChannel, Runtime, StepResult, clarify, judge, oracle
from flower.services.model_server import ModelServer, RecordedRequest
from flower.testing import pytest_plugin
from tests.e2e import Flower
from tests.test_e2e_starter import (
    BRIEF,
    GOAL_1,
    GOAL_MARK,
    JUDGE_MARK,
    MET,
    WORK_MARK,
    agent,
    asked,
    bash,
    conv,
    first_ws,
    no_api_errors,
    results_in,
    tool,
)

pytestmark = pytest.mark.e2e

# The plugin's fixtures, by name (our suite does not enable the plugin as a whole).
flower_runtime = pytest_plugin.flower_runtime
flower_cli_env = pytest_plugin.flower_cli_env

ASK_TOOL, INBOX_TOOL = "mcp__human__ask", "mcp__human__inbox"
# What shows the CLI still defers: its search tool is offered, and WebFetch (which it
# defers, and which the clarifier is even allowed) is not.
SEARCH, DEFERRED = "ToolSearch", "WebFetch"


def first_request(server: ModelServer, name: str) -> RecordedRequest:
    reqs = asked(server, name)
    assert reqs, f"no request reached conversation {name!r}"
    return reqs[0]


@pytest.mark.timeout(240)  # one starter-flow run: four CLI sessions and a subagent
def test_every_role_holding_the_persons_tools_offers_them_in_its_first_request(
    model_server, flower_env, tmp_path
):
    out_txt = first_ws(tmp_path) / "out.txt"
    server = model_server(
        {
            "conversations": [
                conv(
                    "clarify",
                    [tool(ASK_TOOL, question="输出放哪个文件?"), BRIEF],
                    marker="[[ask]]",
                ),
                conv("goal", [GOAL_1], marker=GOAL_MARK),
                conv("judge", [tool("Read", file_path=str(out_txt)), MET], marker=JUDGE_MARK),
                conv("coordinate", [agent("coder"), "做完了。"], marker=WORK_MARK),
                conv("coder", [bash("echo DONE > out.txt"), "CODER: 写完了"]),
            ]
        }
    )
    f: Flower = flower_env(server)
    code, out = f.run("写个 md 转 html 的脚本 [[ask]]", "--timeout", "0", timeout=200)
    assert code == 0, out

    holds = {"clarify": {ASK_TOOL}, "goal": {ASK_TOOL}, "judge": {ASK_TOOL}}
    holds["coordinate"] = {ASK_TOOL, INBOX_TOOL}
    for name, tools in holds.items():
        offered = set(first_request(server, name).tools)
        assert tools <= offered, f"{name} was not offered {sorted(tools - offered)}"
        assert SEARCH in offered and DEFERRED not in offered, (
            f"{name}: the CLI's other tools are no longer deferred: {sorted(offered)}"
        )
    # The clarifier's question went through the tool it was offered.
    log = f.ws / ".flower" / "notes" / "问答记录.md"
    assert "输出放哪个文件?" in log.read_text(encoding="utf-8")
    no_api_errors(server)
    f.assert_no_survivors()


def run_in_process(rt: Runtime, *steps: tuple[AgentSpec, str]) -> None:
    """Run each (spec, prompt) on ``rt`` in this process, one after another; each must pass."""

    async def run_all() -> list[StepResult]:
        return [await rt.run(spec, prompt) for spec, prompt in steps]

    results = asyncio.run(run_all())
    assert all(r.ok for r in results), results


@pytest.mark.timeout(120)  # two in-process CLI sessions
def test_a_role_without_the_channel_keeps_the_clis_deferral(model_server, flower_runtime):
    server = model_server(
        {"conversations": [conv("judge", ["## 结论\n达成"]), conv("oracle", ["还在第一步。"])]}
    )
    run_in_process(
        flower_runtime(server),
        (judge("判定者", None), "[[judge]] 判一下"),
        (oracle(), "[[oracle]] 到哪了"),
    )
    for name in ("judge", "oracle"):
        req = first_request(server, name)
        assert not [t for t in req.tools if t.startswith("mcp__")], req.tools
        assert SEARCH in req.tools and DEFERRED not in req.tools, req.tools
        assert any(DEFERRED in text for text in req.texts()), "WebFetch is no longer listed"


@pytest.mark.timeout(120)  # two in-process CLI sessions
def test_a_role_offered_the_inbox_it_does_not_hold_cannot_take_the_persons_mail(
    model_server, flower_runtime
):
    """The channel's server offers both tools; the clarifier and the judge hold only ask, so
    a call of the inbox is refused and what the person said stays for the coordinator."""
    inbox_then_done = [tool(INBOX_TOOL), "看过了。"]
    server = model_server(
        {"conversations": [conv("clarify", inbox_then_done), conv("judge", inbox_then_done)]}
    )
    ch = HumanChannel(timeout_s=0)
    ch.send("改成蓝色")
    run_in_process(
        flower_runtime(server),
        (clarify("确认者", ch), "[[clarify]] 问清楚"),
        (judge("判定者", ch), "[[judge]] 判一下"),
    )
    for name in ("clarify", "judge"):
        first, second = asked(server, name)[:2]
        assert INBOX_TOOL in first.tools
        (refused,) = results_in(second)
        assert refused.get("is_error"), refused
    assert [m.taken for m in ch.mail] == [False], "a role without the inbox took the mail"
