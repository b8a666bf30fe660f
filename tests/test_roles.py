"""The role factories: signatures, tool sets and fixed fields as the API reference states
them; rule texts where they belong and saying what they must say."""

from __future__ import annotations

import dataclasses
import inspect
import sys
import types
from typing import Any

import pytest
from claude_agent_sdk import AgentDefinition

from flower import AgentSpec, CompactPolicy, ConfigError
from flower.agents import roles
from flower.agents.agent import _spec_problem
from flower.agents.roles import (
    CLARIFIER_RULES,
    COORDINATOR_RULES,
    JUDGE_RULES,
    ORACLE_RULES,
    WORKER_RULES,
    clarify,
    coordinator,
    judge,
    oracle,
    worker,
)

pytestmark = pytest.mark.timeout(30)

P, K = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY
REQ = inspect.Parameter.empty


class FakeChannel:
    """What the roles use of a HumanChannel."""

    tool_name = "mcp__human__ask"
    inbox_name = "mcp__human__inbox"

    def mcp_servers(self) -> dict[str, Any]:
        return {"human": {"type": "sdk", "name": "human"}}


CH = FakeChannel()
CODER = AgentDefinition(description="写代码", prompt="你写代码", tools=["Read", "Bash"])
COORDINATOR_BASE = ["Agent", "TodoWrite", "Read", "Bash"]


@pytest.mark.parametrize(
    ("factory", "expected"),
    [
        (
            coordinator,
            [
                ("name", P, REQ),
                ("instructions", P, REQ),
                ("workers", P, REQ),
                ("channel", K, None),
                ("can_read", K, True),
                ("glance", K, True),
                ("model", K, None),
                ("effort", K, None),
                ("max_turns", K, None),
                ("max_budget_usd", K, None),
                ("permission_mode", K, "acceptEdits"),
                ("compact", K, None),
                ("hooks", K, None),
                ("env", K, None),
            ],
        ),
        (
            worker,
            [
                ("description", P, REQ),
                ("prompt", P, REQ),
                ("tools", K, None),
                ("model", K, "inherit"),
                ("effort", K, None),
                ("max_turns", K, None),
                ("permission_mode", K, None),
                ("skills", K, None),
                ("discipline", K, True),
                ("isolate", K, False),
            ],
        ),
        (
            clarify,
            [
                ("name", P, REQ),
                ("channel", P, REQ),
                ("instructions", K, ""),
                ("can_read", K, True),
                ("model", K, None),
                ("effort", K, None),
                ("max_turns", K, None),
                ("max_budget_usd", K, None),
            ],
        ),
        (
            judge,
            [
                ("name", P, REQ),
                ("channel", P, REQ),
                ("instructions", K, ""),
                ("can_run", K, False),
                ("model", K, None),
                ("effort", K, None),
                ("max_turns", K, None),
                ("max_budget_usd", K, None),
            ],
        ),
        (
            oracle,
            [
                ("name", P, "旁路问答"),
                ("instructions", K, ""),
                ("model", K, None),
                ("effort", K, None),
                ("max_turns", K, 12),
                ("max_budget_usd", K, 0.5),
            ],
        ),
    ],
)
def test_signatures_are_the_references(factory: Any, expected: list[tuple[str, Any, Any]]) -> None:
    params = inspect.signature(factory).parameters.values()
    assert [(p.name, p.kind, p.default) for p in params] == expected


def test_the_exports_are_the_five_factories_and_the_five_rules() -> None:
    assert set(roles.__all__) == {
        "coordinator",
        "worker",
        "clarify",
        "judge",
        "oracle",
        "COORDINATOR_RULES",
        "WORKER_RULES",
        "CLARIFIER_RULES",
        "JUDGE_RULES",
        "ORACLE_RULES",
    }
    assert roles.COORDINATOR_TOOLS == ["Agent", "TodoWrite", "Read"]
    assert roles.WEB_TOOLS == ["WebFetch", "WebSearch"]
    assert roles.WORKER_TOOLS == [
        "Read",
        "Write",
        "Edit",
        "Bash",
        "Glob",
        "Grep",
        "WebFetch",
        "WebSearch",
    ]


def test_coordinator_tools_and_fixed_fields() -> None:
    spec = coordinator("协调者", "做 X", {"coder": CODER})
    assert spec.allowed_tools == ["Agent", "TodoWrite", "Read", "Bash"]
    assert spec.delegate_only is True
    assert spec.glance is True
    assert spec.workbench is True
    assert spec.agents == {"coder": CODER}
    assert spec.agents["coder"] is CODER
    assert spec.permission_mode == "acceptEdits"
    assert spec.mcp_servers == {}
    assert spec.name == "协调者"

    bare = coordinator("c", "", {}, can_read=False, glance=False)
    assert bare.allowed_tools == ["Agent", "TodoWrite"]
    assert bare.glance is False
    assert bare.delegate_only is True


def test_coordinator_passes_its_options_through() -> None:
    compact = CompactPolicy(mode="off")
    hooks: dict[str, Any] = {"PreToolUse": []}
    spec = coordinator(
        "c",
        "",
        {},
        model="opus",
        effort="high",
        max_turns=40,
        max_budget_usd=3.0,
        permission_mode="default",
        compact=compact,
        hooks=hooks,
        env={"A": "1"},
    )
    assert (spec.model, spec.effort, spec.max_turns, spec.max_budget_usd) == (
        "opus",
        "high",
        40,
        3.0,
    )
    assert spec.permission_mode == "default"
    assert spec.compact is compact
    assert spec.hooks is hooks
    assert spec.env == {"A": "1"}


def test_a_channel_brings_both_ask_and_inbox_and_its_server() -> None:
    spec = coordinator("c", "", {}, channel=CH)
    assert CH.tool_name in spec.allowed_tools
    assert CH.inbox_name in spec.allowed_tools
    assert spec.mcp_servers == CH.mcp_servers()


def test_workers_web_tools_are_granted_to_the_session_but_not_their_hands_on_tools() -> None:
    searcher = worker("查资料", "你查资料", tools=["Read", "WebSearch", "Bash", "Write", "Edit"])
    fetcher = worker("抓网页", "你抓网页", tools=["WebFetch"])
    spec = coordinator("c", "", {"s": searcher, "f": fetcher}, glance=False)
    assert spec.allowed_tools == ["Agent", "TodoWrite", "Read", "WebFetch", "WebSearch"]
    for hands_on in ("Bash", "Write", "Edit"):
        assert hands_on not in spec.allowed_tools

    # A default worker has both web tools; each is granted once.
    spec = coordinator("c", "", {"a": worker("a", "a"), "b": worker("b", "b")})
    assert spec.allowed_tools == ["Agent", "TodoWrite", "Read", "Bash", "WebFetch", "WebSearch"]

    # Without web tools nothing is merged.
    assert coordinator("c", "", {"coder": CODER}).allowed_tools == COORDINATOR_BASE


def test_a_worker_that_inherits_every_tool_gets_the_web_tools_granted() -> None:
    inherits = AgentDefinition(description="d", prompt="p")  # tools=None: all tools
    assert coordinator("c", "", {"x": inherits}).allowed_tools == [
        *COORDINATOR_BASE,
        "WebFetch",
        "WebSearch",
    ]
    no_fetch = AgentDefinition(description="d", prompt="p", disallowedTools=["WebFetch"])
    assert coordinator("c", "", {"x": no_fetch}).allowed_tools == [*COORDINATOR_BASE, "WebSearch"]


def test_coordinator_rules_come_first_then_the_instructions() -> None:
    spec = coordinator("c", "领域说明", {})
    assert spec.instructions == f"{COORDINATOR_RULES}\n领域说明"
    assert coordinator("c", "", {}).instructions == COORDINATOR_RULES


def test_worker_defaults_and_field_names() -> None:
    w = worker("写代码的活", "你负责实现")
    assert isinstance(w, AgentDefinition)
    assert w.description == "写代码的活"
    assert w.tools == roles.WORKER_TOOLS
    assert w.tools is not roles.WORKER_TOOLS
    assert w.model == "inherit"
    assert (w.effort, w.maxTurns, w.permissionMode, w.skills) == (None, None, None, None)

    w = worker(
        "d",
        "p",
        tools=["Read"],
        model="sonnet",
        effort="low",
        max_turns=7,
        permission_mode="acceptEdits",
        skills=["pdf"],
    )
    assert (w.tools, w.model, w.effort) == (["Read"], "sonnet", "low")
    assert (w.maxTurns, w.permissionMode, w.skills) == (7, "acceptEdits", ["pdf"])
    assert worker("d", "p", effort=3).effort == 3


def test_worker_rules_are_appended_after_the_prompt_unless_discipline_is_off() -> None:
    assert worker("d", "你负责实现").prompt == f"你负责实现\n\n{WORKER_RULES}"
    assert worker("d", "你负责实现", discipline=False).prompt == "你负责实现"


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"permission_mode": "yolo"}, "permission_mode 'yolo'"),
        ({"effort": "extreme"}, "effort 'extreme'"),
    ],
)
def test_a_worker_value_the_sdk_cannot_take_is_one_clear_error(kw: dict, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        worker("d", "p", **kw)


def test_isolate_goes_through_guard_isolated_and_nothing_else_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[Any] = []

    def isolated(agent: AgentDefinition, flag: bool = True) -> AgentDefinition:
        calls.append(agent)
        return agent

    fake = types.ModuleType("flower.agents.guard")
    fake.isolated = isolated  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flower.agents.guard", fake)
    w = worker("d", "p", isolate=True)
    assert calls == [w]
    worker("d", "p")
    assert calls == [w]


def test_isolate_marks_the_worker_through_guard() -> None:
    from flower.agents.guard import wants_isolation

    w = worker("d", "p", isolate=True)
    assert isinstance(w, AgentDefinition)
    assert wants_isolation(w)
    assert not wants_isolation(worker("d", "p"))
    # The mark is an attribute, not a field: replace() drops it (the reference's warning).
    assert not wants_isolation(dataclasses.replace(w))


def test_clarify_asks_and_reads_and_nothing_else() -> None:
    spec = clarify("确认需求", CH)
    assert spec.allowed_tools == [CH.tool_name, "Read", "Glob", "Grep", "WebFetch", "WebSearch"]
    assert spec.mcp_servers == CH.mcp_servers()
    assert spec.workbench is False
    assert spec.permission_mode == "default"
    assert spec.delegate_only is False
    assert spec.max_turns is None
    assert clarify("c", CH, can_read=False).allowed_tools == [CH.tool_name]
    for banned in ("Write", "Edit", "Bash", "Agent", CH.inbox_name):
        assert banned not in spec.allowed_tools


def test_judge_reads_and_runs_only_when_asked() -> None:
    spec = judge("判定", CH)
    assert spec.allowed_tools == [CH.tool_name, "Read", "Glob", "Grep"]
    assert spec.mcp_servers == CH.mcp_servers()
    assert spec.workbench is False
    assert spec.permission_mode == "default"
    assert spec.delegate_only is False
    assert judge("j", CH, can_run=True).allowed_tools == [
        CH.tool_name,
        "Read",
        "Glob",
        "Grep",
        "Bash",
    ]
    for banned in ("Write", "Edit", "Agent", CH.inbox_name):
        assert banned not in judge("j", CH, can_run=True).allowed_tools


def test_clarify_and_judge_tolerate_no_channel() -> None:
    assert clarify("c", None).allowed_tools == ["Read", "Glob", "Grep", "WebFetch", "WebSearch"]
    assert clarify("c", None).mcp_servers == {}
    assert judge("j", None).allowed_tools == ["Read", "Glob", "Grep"]
    assert judge("j", None).mcp_servers == {}


def test_oracle_is_read_only_braked_and_reads_the_workbench() -> None:
    spec = oracle()
    assert spec.name == "旁路问答"
    assert spec.allowed_tools == ["Read", "Glob", "Grep"]
    assert spec.mcp_servers == {}
    assert (spec.max_turns, spec.max_budget_usd) == (12, 0.5)
    assert spec.workbench is True
    assert spec.delegate_only is False
    assert oracle("o", max_turns=None, max_budget_usd=None).max_turns is None


@pytest.mark.parametrize(
    ("build", "rules"),
    [
        (lambda extra: clarify("c", CH, instructions=extra), CLARIFIER_RULES),
        (lambda extra: judge("j", CH, instructions=extra), JUDGE_RULES),
        (lambda extra: oracle(instructions=extra), ORACLE_RULES),
    ],
)
def test_the_other_roles_put_their_rules_first(build: Any, rules: str) -> None:
    assert build("附加说明").instructions == f"{rules}\n附加说明"
    assert build("").instructions == rules


def test_every_role_is_a_valid_spec_and_a_fresh_one() -> None:
    specs = [
        coordinator("c", "x", {"w": worker("d", "p")}, channel=CH),
        clarify("c", CH),
        judge("j", CH, can_run=True),
        oracle(),
    ]
    for spec in specs:
        assert isinstance(spec, AgentSpec)
        assert _spec_problem(spec) is None
        spec.fingerprint()
    a, b = clarify("c", CH), clarify("c", CH)
    a.allowed_tools.append("Write")
    assert "Write" not in b.allowed_tools


def test_worker_rules_say_the_report_format_and_not_the_artifacts_path() -> None:
    for heading in ("结论", "证据", "产出", "未验证"):
        assert heading in WORKER_RULES
    assert "30 行" in WORKER_RULES
    for banned in ("文件内容", "命令输出", "日志", "diff", "试错"):
        assert banned in WORKER_RULES
    assert ".flower/scripts/" in WORKER_RULES
    assert "artifacts" not in WORKER_RULES


def test_coordinator_rules_say_hands_off_brief_inbox_ask_and_foreground() -> None:
    for marker in ("不写文件", "不改代码", "不跑测试", "Bash", "过时", "任务书", "artifacts/"):
        assert marker in COORDINATOR_RULES
    for marker in ("工作台", "只给路径", "inbox", "ask", "岔路口", "后台"):
        assert marker in COORDINATOR_RULES


def test_clarifier_rules_give_the_four_brief_headings_in_order() -> None:
    headings = ["## 目标", "## 验收标准", "## 边界", "## 未知与假设"]
    at = [CLARIFIER_RULES.index(h) for h in headings]
    assert at == sorted(at)
    for marker in ("不设上限", "超时", "不写代码", "不贴文件内容"):
        assert marker in CLARIFIER_RULES


def test_judge_rules_give_both_jobs_and_parseable_verdict_words() -> None:
    assert "[此环境无法验证:原因]" in JUDGE_RULES
    headings = ["## 结论", "## 理由", "## 未通过"]
    at = [JUDGE_RULES.index(h) for h in headings]
    assert at == sorted(at)
    for word in ("达成", "未达成", "无法验证"):
        assert word in JUDGE_RULES
    for marker in ("当场验证", "边界", "判产物", "不判源码", "已完成", "永远不算通过"):
        assert marker in JUDGE_RULES


def test_oracle_rules_say_side_channel_read_only_and_brief() -> None:
    for marker in ("旁路", "只读", "不会进入", "事件", "工作台", "先看再答", "简短"):
        assert marker in ORACLE_RULES
