"""AgentSpec and build_options: one agent's declaration, compiled to the SDK's options.

Nothing here imports ``claude_agent_sdk`` at module level: that import costs about a second,
and ``flower-super status`` or a person reading ``--help`` should not pay it. The step
children inherit an already-imported SDK from the supervisor they are forked from.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._errors import ConfigError

if TYPE_CHECKING:
    from claude_agent_sdk import ClaudeAgentOptions
    from claude_agent_sdk.types import SessionStore

# The values the SDK's ClaudeAgentOptions accepts (its PermissionMode and EffortLevel
# Literals; tests/test_agent.py holds these against the installed SDK). A spec outside them is
# a person's mistake, said at once, not an attempt that fails six times.
PERMISSION_MODES = ("default", "acceptEdits", "plan", "bypassPermissions", "dontAsk", "auto")
EFFORTS = ("low", "medium", "high", "xhigh", "max")

COMPACT_MODES = ("auto", "no_summary", "off")

# Read by the hook layer; in a fingerprint only when not at their defaults, so a step
# recorded before they existed is still the same step.
_HOOK_FIELDS = ("glance", "workbench", "delegate_only")

#: The key of an MCP server's config (``AgentSpec.mcp_servers``) that makes the CLI offer
#: its tools in every request instead of deferring them behind ``ToolSearch`` (measured with
#: CLI 2.1.332; an SDK server's config reaches the CLI's ``--mcp-config`` as it is). It
#: changes how a tool is offered, not which tools an agent has, so it stays out of the
#: fingerprint: a step recorded before a server carried it is still the same step.
ALWAYS_LOAD = "alwaysLoad"


@dataclass
class CompactPolicy:
    """The switches of the CLI's own auto-compaction, as environment variables.

    The compaction algorithm lives in the CLI binary; all flower can change is whether and
    when it fires. ``mode``: ``"auto"`` sets nothing (the CLI compacts at window − 33K);
    ``"no_summary"`` turns auto-compaction off (``DISABLE_AUTO_COMPACT=1``); ``"off"`` turns
    compaction off altogether, ``/compact`` included (``DISABLE_COMPACT=1``). ``window``
    sets ``CLAUDE_CODE_AUTO_COMPACT_WINDOW`` (the CLI clamps it to 100K–1M).

    Another mode is a :class:`~flower.ConfigError` (a ``ValueError``) when the policy is
    made, not only when it is used: the original raised it only inside ``Runtime.run``.
    """

    mode: str = "auto"
    window: int | None = None

    def __post_init__(self) -> None:
        self._check()

    def _check(self) -> None:
        if self.mode not in COMPACT_MODES:
            raise ConfigError(
                f"CompactPolicy mode {self.mode!r} is not one of {', '.join(COMPACT_MODES)}",
                hint="auto: the CLI compacts; no_summary: no auto-compaction; off: none at all",
            )

    def env(self) -> dict[str, str]:
        self._check()  # a mode changed after construction
        out: dict[str, str] = {}
        if self.mode == "no_summary":
            out["DISABLE_AUTO_COMPACT"] = "1"
        elif self.mode == "off":
            out["DISABLE_COMPACT"] = "1"
        if self.window:
            out["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] = str(self.window)
        return out


@dataclass
class AgentSpec:
    """The full declaration of one agent (seed 003, agent 定义)."""

    name: str
    instructions: str
    allowed_tools: list[str] = field(default_factory=lambda: ["Read", "Glob", "Grep"])
    disallowed_tools: list[str] = field(default_factory=list)
    model: str | None = None
    effort: str | None = None
    max_turns: int | None = None
    max_budget_usd: float | None = None
    permission_mode: str = "default"
    agents: dict[str, Any] | None = None
    mcp_servers: dict[str, Any] = field(default_factory=dict)
    hooks: dict[str, Any] | None = None
    compact: CompactPolicy | None = None
    env: dict[str, str] = field(default_factory=dict)
    glance: bool = False
    workbench: bool = True
    delegate_only: bool = False

    def __post_init__(self) -> None:
        problem = _spec_problem(self)
        if problem:
            raise ConfigError(f"agent {self.name!r}: {problem}", hint=_SPEC_HINT)

    def fingerprint(self) -> str:
        """A stable digest of everything that shapes what this agent does.

        Part of a step's input hash (seed 004): change the instructions, tools or model and a
        completed step is no longer "the same step". Callables (hooks, in-process MCP servers)
        enter by their qualified names, since their code cannot be hashed meaningfully.
        """
        data = {
            f.name: _stable(getattr(self, f.name))
            for f in fields(self)
            if f.name not in _HOOK_FIELDS or getattr(self, f.name) != f.default
        }
        data["mcp_servers"] = _stable(_without_always_load(self.mcp_servers))
        raw = json.dumps(data, sort_keys=True, ensure_ascii=False, default=repr)
        return hashlib.sha256(raw.encode("utf-8")).hexdigest()[:16]


_SPEC_HINT = "see AgentSpec's fields in the flower API reference"


def _spec_problem(spec: AgentSpec) -> str | None:
    """Why ``spec`` cannot be given to the SDK, or None."""
    if not isinstance(spec.name, str) or not spec.name:
        return "name must be a non-empty string"
    if spec.permission_mode not in PERMISSION_MODES:
        return (
            f"permission_mode {spec.permission_mode!r} is not one of {', '.join(PERMISSION_MODES)}"
        )
    if spec.effort is not None and spec.effort not in EFFORTS:
        return f"effort {spec.effort!r} is not one of {', '.join(EFFORTS)}"
    for name in ("allowed_tools", "disallowed_tools"):
        tools = getattr(spec, name)
        if not isinstance(tools, list) or not all(isinstance(t, str) for t in tools):
            return f"{name} must be a list of tool names"
    if spec.hooks is not None and not (
        isinstance(spec.hooks, dict) and all(isinstance(m, list) for m in spec.hooks.values())
    ):
        return "hooks must map a hook event to a list of HookMatcher"
    return None


def _without_always_load(servers: Any) -> Any:
    """``servers`` with :data:`ALWAYS_LOAD` left out of each server's config."""
    if not isinstance(servers, dict):
        return servers
    return {
        name: {k: v for k, v in cfg.items() if k != ALWAYS_LOAD} if isinstance(cfg, dict) else cfg
        for name, cfg in servers.items()
    }


def _stable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _stable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_stable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if callable(value):
        return getattr(value, "__qualname__", type(value).__qualname__)
    if hasattr(value, "__dataclass_fields__"):
        return {f: _stable(getattr(value, f)) for f in value.__dataclass_fields__}
    return type(value).__qualname__


def build_options(
    spec: AgentSpec,
    *,
    cwd: str | Path | None = None,
    session_store: SessionStore | None = None,
    resume: str | None = None,
    fork: bool = False,
    resume_at: str | None = None,
    use_plugin: bool = True,
    portable: bool = True,
    add_dirs: list[str] | None = None,
    flush: str = "eager",
    prelude: str = "",
    hooks: dict[str, list[Any]] | None = None,
) -> ClaudeAgentOptions:
    """Compile ``spec`` into the SDK's ``ClaudeAgentOptions``.

    ``flush="eager"`` puts every transcript entry in the session store as it happens: the
    SDK batches per query otherwise, and a step killed with -9 mid-turn would then have
    nothing in sessions.db to resume from. ``portable=True`` keeps the user's and the
    project's Claude settings files out (``setting_sources=[]``), so a flow behaves the same
    on every machine; ``portable=False`` reads the project's only (``["project"]``), never
    the host's ``~/.claude``. ``hooks`` are extra hook matchers merged after ``spec.hooks``.
    ``add_dirs`` are more directories the CLI may read and write (a workbench that lives
    outside the workspace); ``prelude`` is a block appended after the instructions (the
    workbench's index). ``use_plugin`` is seed 003's switch for a Claude Code plugin shipped
    in the repository's ``plugin/`` folder; flower ships none, so it changes nothing.
    ``hooks`` (an extension) is how the Runtime adds the hook layer.
    """
    del use_plugin  # no plugin/ directory ships with flower
    from claude_agent_sdk import ClaudeAgentOptions

    append = "\n\n".join(p for p in (spec.instructions, prelude) if p)
    system_prompt: Any = {"type": "preset", "preset": "claude_code"}
    if append:
        system_prompt["append"] = append
    env = dict(spec.env)
    env.update(spec.compact.env() if spec.compact else {})  # seed 003's order: compact wins
    return ClaudeAgentOptions(
        system_prompt=system_prompt,
        allowed_tools=list(spec.allowed_tools),
        disallowed_tools=list(spec.disallowed_tools),
        model=spec.model,
        effort=spec.effort,  # type: ignore[arg-type]
        max_turns=spec.max_turns,
        max_budget_usd=spec.max_budget_usd,
        permission_mode=spec.permission_mode,  # type: ignore[arg-type]
        agents=spec.agents,
        mcp_servers=dict(spec.mcp_servers),
        hooks=merge_hooks(spec.hooks, hooks) or None,  # type: ignore[arg-type]
        env=env,
        cwd=str(cwd) if cwd is not None else None,
        session_store=session_store,
        session_store_flush=flush,  # type: ignore[arg-type]
        resume=resume,
        fork_session=fork,
        resume_session_at=resume_at,
        add_dirs=list(add_dirs or []),
        setting_sources=[] if portable else ["project"],
    )


def merge_hooks(*groups: dict[str, list[Any]] | None) -> dict[str, list[Any]]:
    """Concatenate hook matcher lists by event name (no de-duplication, as seed 003 says)."""
    out: dict[str, list[Any]] = {}
    for group in groups:
        for event, matchers in (group or {}).items():
            out.setdefault(event, []).extend(matchers)
    return {k: v for k, v in out.items() if v}
