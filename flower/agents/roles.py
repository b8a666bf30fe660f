"""The five roles: coordinator, worker, clarifier, judge, oracle (seed 003, 角色工厂).

A role is a block of rule text, a tool set and a few fixed fields that only make sense
together: a coordinator's rules promise it never touches files, so its tools must not
include Write, and ``delegate_only`` must be set for the Runtime to enforce it. Factories
keep those three in step, hand every caller fresh lists, and let a flow change a model or a
budget without having to know the invariants.

Roles attach no hooks. The Runtime installs the guards from the spec it is given:
``delegate_only=True`` gets ``delegate_guard``, anything else gets ``whitelist_guard``.

``worker()`` returns the SDK's ``AgentDefinition`` (a subagent, dispatched by a
coordinator); the other four return an :class:`AgentSpec` (a session of their own). The
SDK is imported inside ``worker()`` only: importing it costs about a second.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from .._errors import ConfigError
from .agent import EFFORTS, PERMISSION_MODES, AgentSpec, CompactPolicy

if TYPE_CHECKING:
    from claude_agent_sdk import AgentDefinition
    from claude_agent_sdk.types import EffortLevel, PermissionMode

__all__ = [
    "CLARIFIER_RULES",
    "COORDINATOR_RULES",
    "JUDGE_RULES",
    "ORACLE_RULES",
    "WORKER_RULES",
    "clarify",
    "coordinator",
    "judge",
    "oracle",
    "worker",
]

COORDINATOR_TOOLS = ["Agent", "TodoWrite", "Read"]
WEB_TOOLS = ["WebFetch", "WebSearch"]
WORKER_TOOLS = ["Read", "Write", "Edit", "Bash", "Glob", "Grep", "WebFetch", "WebSearch"]

# The rule texts are model-facing, so they are Chinese like the rest of the product's
# prompts. Each is paid for on every turn of every session that carries it: keep them short.

COORDINATOR_RULES = """\
你是协调者:像一个会用 Claude Code 的人那样工作,拆解任务、派活、读报告、做决定。你不是干活的人。
- 你不写文件、不改代码、不跑测试。这些一律用 Agent 工具派给执行者。
- 你的 Bash 只够看一眼(ls、git status 之类),结果很快过时;据此做决定前要么重看,要么让执行者确认。
- 用 Agent 派活后,等执行者交回报告再往下走,不要让执行者在后台运行。
- 任务书只写这次任务特有的东西:做什么、范围、交回什么。执行者已有的规矩不要复述。
  唯一值得写上的约定:工作台在哪;长产出写进工作台的 artifacts/;回复里只给路径。
- 每完成一个里程碑动作,查一次 inbox(有的话):人可能中途补充了要求。
- ask 会一直阻塞到人回答,只在真正的岔路口用。"""

WORKER_RULES = """\
汇报规矩(你的最后一条回复就是协调者能看到的全部):
- 回复分四段:结论 / 证据 / 产出 / 未验证,合计不超过 30 行。
  结论:做成了什么,没做成什么。证据:凭什么这么说,一句话概括命令和结果。产出:新建或改动的文件路径。未验证:没能确认的地方。
- 不贴文件内容、命令输出、日志或原始 diff;要引用就给路径。
- 不讲试错过程,只报最后的状态。
- 动手前先看 .flower/scripts/(或任务书指明的工作台下的 scripts/)有没有现成脚本,能用就用。"""

CLARIFIER_RULES = """\
你是确认者:在任何人动手之前,把需求问清楚。你什么都不做,只提问。
- 用 ask 工具问人,一次问一件事,能列选项就列。提问次数不设上限,问到清楚为止。
- 能从工作区查到的,先查再问。
- 人可能不在。ask 超时或被跳过时,自己做一个合理的决定,记进「未知与假设」,再接着问。
- 不写代码,不贴文件内容。
- 问清楚后,只输出下面四段,标题和顺序都不变:
## 目标
## 验收标准
## 边界
## 未知与假设"""

JUDGE_RULES = """\
你是判定者。这次只做下面两件事中的一件,看任务要哪件。先看清你所在的环境:有哪些文件,能跑哪些命令。

【设定目标】读需求确认书,输出两段:## 目标(一两句话)和 ## 判定清单(每行一条)。
- 每条都要能当场验证:写明看什么或跑什么,期望什么结果。
- 清单多长,由可能的失败方式有几种决定;不凑数,不省略。
- 边界(不做什么)不是检查项,不进清单。
- 这个环境验证不了的条目,行末原样加上 [此环境无法验证:原因]。

【判定这一轮】对照目标和判定清单,只输出下面三段:
## 结论
## 理由
## 未通过
- 「结论」只写一个词:达成、未达成 或 无法验证。
- 判产物,不判源码:看交付物实际是什么、能不能用,不看代码里写了什么。
- 默认不信"已完成",每条都自己找证据。
- 未达成(没做完或做错了)和无法验证(这个环境确认不了)是两个结论;无法验证永远不算通过。
- 「未通过」逐条列出没过的项和原因;全部通过就写"无"。"""

ORACLE_RULES = """\
你是旁路顾问。一次运行正在进行,有人从旁边问你它的情况;你不打断它,也不参与它。
- 只读:不改任何东西。
- 你答完就被丢弃,你说的话不会进入那次运行的上下文。
- 你手上只有两样:最近的事件窗口,和工作台里的产出与笔记。
- 先看再答;看不出来就直说,不要猜。
- 回答简短。"""


def _compose(rules: str, instructions: str) -> str:
    return f"{rules}\n{instructions}".strip()


def coordinator(
    name: str,
    instructions: str,
    workers: dict[str, AgentDefinition],
    *,
    channel: Any = None,
    can_read: bool = True,
    glance: bool = True,
    model: str | None = None,
    effort: str | None = None,
    max_turns: int | None = None,
    max_budget_usd: float | None = None,
    permission_mode: str = "acceptEdits",
    compact: CompactPolicy | None = None,
    hooks: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
) -> AgentSpec:
    """The coordinator on the main thread: breaks the task down, delegates, reads reports.

    Tools: ``Agent``, ``TodoWrite`` and (``can_read``) ``Read``; ``glance`` adds ``Bash`` and
    sets ``AgentSpec.glance`` (what it may actually run is ``delegate_guard``'s call). A
    ``channel`` (a ``HumanChannel``, duck-typed: ``tool_name``, ``inbox_name``,
    ``mcp_servers()``) adds both its ask and inbox tools and mounts its MCP server. The
    workers' ``WebFetch``/``WebSearch`` are added too (see below). ``workers`` become
    ``agents``; ``delegate_only=True``; the workbench stays on.

    ``permission_mode`` defaults to ``"acceptEdits"``, unlike ``clarify()``/``judge()``.
    """
    tools = [t for t in COORDINATOR_TOOLS if can_read or t != "Read"]
    if glance:
        tools.append("Bash")
    mcp_servers: dict[str, Any] = {}
    if channel is not None:
        # Both or neither: once the server is mounted both tools are callable anyway
        # (allowed_tools only waives approval), so listing one would only hide the other.
        tools += [channel.tool_name, channel.inbox_name]
        mcp_servers = dict(channel.mcp_servers())
    # allowed_tools is scoped to the session, not to the main thread: a subagent calling a
    # tool that is not on it waits for an approval nobody gives when unattended, and the
    # model retries the denied call until its turns run out. So the workers' web tools must
    # be granted here. Only the read-only ones: waiving approval for Write/Edit/Bash here
    # would waive it for the coordinator itself, and subagents run those without it anyway.
    for tool in _web_tools_of(workers.values()):
        if tool not in tools:
            tools.append(tool)
    return AgentSpec(
        name=name,
        instructions=_compose(COORDINATOR_RULES, instructions),
        allowed_tools=tools,
        model=model,
        effort=effort,
        max_turns=max_turns,
        max_budget_usd=max_budget_usd,
        permission_mode=permission_mode,
        agents=dict(workers),
        mcp_servers=mcp_servers,
        hooks=hooks,
        compact=compact,
        env=dict(env or {}),
        glance=glance,
        delegate_only=True,
    )


def _web_tools_of(workers: Any) -> list[str]:
    """The web tools any of ``workers`` may call, in WEB_TOOLS order.

    A definition with ``tools=None`` inherits every tool, the web ones included, unless its
    ``disallowedTools`` removes them.
    """
    found: set[str] = set()
    for agent in workers:
        tools = getattr(agent, "tools", None)
        denied = getattr(agent, "disallowedTools", None) or []
        found.update(t for t in (WEB_TOOLS if tools is None else tools) if t not in denied)
    return [t for t in WEB_TOOLS if t in found]


def worker(
    description: str,
    prompt: str,
    *,
    tools: list[str] | None = None,
    model: str = "inherit",
    effort: str | int | None = None,
    max_turns: int | None = None,
    permission_mode: str | None = None,
    skills: list[str] | None = None,
    discipline: bool = True,
    isolate: bool = False,
) -> AgentDefinition:
    """A subagent that does the work, for ``coordinator(workers={...})``.

    ``description`` is what the coordinator picks a worker by: say what work goes to it.
    ``tools=None`` gives Read, Write, Edit, Bash, Glob, Grep, WebFetch, WebSearch.
    ``model="inherit"``: workers are not downgraded. ``discipline`` appends
    :data:`WORKER_RULES` after ``prompt``. ``max_turns``/``permission_mode`` land on the
    SDK's ``maxTurns``/``permissionMode``.

    ``isolate=True`` marks it for its own git worktree (``guard.isolated``); the workspace
    must then be a git repository. The mark is a Python attribute, not a field:
    ``dataclasses.replace()`` on the result drops it.
    """
    from claude_agent_sdk import AgentDefinition

    if permission_mode is not None and permission_mode not in PERMISSION_MODES:
        raise ConfigError(
            f"worker permission_mode {permission_mode!r} is not one of "
            f"{', '.join(PERMISSION_MODES)}",
            hint="see worker() in the flower API reference",
        )
    if effort is not None and not isinstance(effort, int) and effort not in EFFORTS:
        raise ConfigError(
            f"worker effort {effort!r} is not one of {', '.join(EFFORTS)} or a number",
            hint="see worker() in the flower API reference",
        )
    agent = AgentDefinition(
        description=description,
        prompt=f"{prompt}\n\n{WORKER_RULES}" if discipline else prompt,
        tools=list(WORKER_TOOLS if tools is None else tools),
        model=model,
        skills=list(skills) if skills is not None else None,
        maxTurns=max_turns,
        effort=cast("EffortLevel | int | None", effort),
        permissionMode=cast("PermissionMode | None", permission_mode),
    )
    if isolate:
        from .guard import isolated

        agent = isolated(agent)
    return agent


def clarify(
    name: str,
    channel: Any,
    *,
    instructions: str = "",
    can_read: bool = True,
    model: str | None = None,
    effort: str | None = None,
    max_turns: int | None = None,
    max_budget_usd: float | None = None,
) -> AgentSpec:
    """The clarifier: asks until the requirements are clear, then writes the four sections.

    ``channel`` is a ``HumanChannel`` (duck-typed: ``tool_name``, ``mcp_servers()``); its ask
    tool comes first, then Read, Glob, Grep, WebFetch, WebSearch when ``can_read``. ``None``
    is tolerated and simply leaves the ask tool out. No Write/Edit/Bash/Agent, no inbox; the
    workbench is off (nothing to write into it) and ``permission_mode`` stays ``"default"``.
    ``max_turns=None``: every question is a turn, so a small limit caps the questioning.
    """
    tools, mcp_servers = _ask_tool(channel)
    if can_read:
        tools += ["Read", "Glob", "Grep", *WEB_TOOLS]
    return AgentSpec(
        name=name,
        instructions=_compose(CLARIFIER_RULES, instructions),
        allowed_tools=tools,
        model=model,
        effort=effort,
        max_turns=max_turns,
        max_budget_usd=max_budget_usd,
        mcp_servers=mcp_servers,
        workbench=False,
    )


def judge(
    name: str,
    channel: Any,
    *,
    instructions: str = "",
    can_run: bool = False,
    model: str | None = None,
    effort: str | None = None,
    max_turns: int | None = None,
    max_budget_usd: float | None = None,
) -> AgentSpec:
    """The judge: sets the goal before a run, or judges a round after one.

    Tools: the ``channel``'s ask tool (duck-typed like in :func:`clarify`, ``None`` leaves it
    out), Read, Glob, Grep, and ``Bash`` when ``can_run``: the verdict can then rest on
    running the acceptance commands, at the price that Bash can also change the workspace.
    No Write/Edit/Agent, no inbox, no workbench.
    """
    tools, mcp_servers = _ask_tool(channel)
    tools += ["Read", "Glob", "Grep"]
    if can_run:
        tools.append("Bash")
    return AgentSpec(
        name=name,
        instructions=_compose(JUDGE_RULES, instructions),
        allowed_tools=tools,
        model=model,
        effort=effort,
        max_turns=max_turns,
        max_budget_usd=max_budget_usd,
        mcp_servers=mcp_servers,
        workbench=False,
    )


def oracle(
    name: str = "旁路问答",
    *,
    instructions: str = "",
    model: str | None = None,
    effort: str | None = None,
    max_turns: int | None = 12,
    max_budget_usd: float | None = 0.5,
) -> AgentSpec:
    """The oracle: a read-only side channel asked "where are we" while a run goes on.

    Read, Glob, Grep only and no channel (it answers, it does not ask). The workbench is on:
    reading the outputs and notes is its job. Braked by default (12 turns, $0.5): a quick
    question in passing must not run away.
    """
    return AgentSpec(
        name=name,
        instructions=_compose(ORACLE_RULES, instructions),
        allowed_tools=["Read", "Glob", "Grep"],
        model=model,
        effort=effort,
        max_turns=max_turns,
        max_budget_usd=max_budget_usd,
        workbench=True,
    )


def _ask_tool(channel: Any) -> tuple[list[str], dict[str, Any]]:
    """The ask tool (no inbox) and the MCP servers of ``channel``, or nothing for None.

    A HumanChannel's server has the CLI offer both its tools in the first request (see
    ``HumanChannel.mcp_servers``); the inbox, not on the role's ``allowed_tools``, is refused
    when called, so the person's mail stays for the coordinator.
    """
    if channel is None:
        return [], {}
    return [channel.tool_name], dict(channel.mcp_servers())
