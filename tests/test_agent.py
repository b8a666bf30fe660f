"""AgentSpec and build_options: a bad spec is one clear error at once; every option does
what its name says; fields without an effect yet stay out of the input hash."""

from __future__ import annotations

import typing
from dataclasses import replace
from pathlib import Path

import pytest
from claude_agent_sdk import HookMatcher
from claude_agent_sdk.types import EffortLevel, PermissionMode

from flower import AgentSpec, ConfigError, build_options
from flower.agents.agent import ALWAYS_LOAD, EFFORTS, PERMISSION_MODES, CompactPolicy

SPEC = AgentSpec(name="a", instructions="do things")


def test_the_accepted_values_are_the_sdks() -> None:
    assert set(PERMISSION_MODES) == set(typing.get_args(PermissionMode))
    assert set(EFFORTS) == set(typing.get_args(EffortLevel))


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"permission_mode": "yolo"}, "permission_mode 'yolo' is not one of"),
        ({"effort": "extreme"}, "effort 'extreme' is not one of"),
        ({"allowed_tools": "Bash"}, "allowed_tools must be a list"),
        ({"disallowed_tools": [1]}, "disallowed_tools must be a list"),
        ({"hooks": {"PreToolUse": 5}}, "hooks must map a hook event to a list"),
        ({"name": ""}, "name must be a non-empty string"),
    ],
)
def test_a_spec_the_sdk_cannot_take_is_one_clear_error(changes: dict, says: str) -> None:
    with pytest.raises(ConfigError, match=says) as info:
        AgentSpec(**{"name": "a", "instructions": "x", **changes})
    assert info.value.hint


def test_every_field_that_shapes_behaviour_is_in_the_fingerprint() -> None:
    base = SPEC.fingerprint()
    for name in ("glance", "workbench", "delegate_only"):  # the hook layer reads them
        flipped = replace(SPEC, **{name: not getattr(SPEC, name)})
        assert flipped.fingerprint() != base, name
    assert replace(SPEC, instructions="other").fingerprint() != base
    assert replace(SPEC, allowed_tools=["Bash"]).fingerprint() != base


def test_how_the_cli_offers_a_servers_tools_is_not_in_the_fingerprint() -> None:
    """alwaysLoad decides whether the CLI defers a server's tools, not which ones the agent
    has: a step recorded before the human channel's server carried it keeps its hash."""
    server = {"type": "stdio", "command": "serve-things"}
    plain = replace(SPEC, mcp_servers={"things": server})
    marked = replace(SPEC, mcp_servers={"things": {**server, ALWAYS_LOAD: True}})
    assert marked.fingerprint() == plain.fingerprint()
    other = replace(SPEC, mcp_servers={"things": {**server, "command": "serve-others"}})
    assert other.fingerprint() != plain.fingerprint()
    assert plain.fingerprint() != SPEC.fingerprint()


def test_build_options_passes_what_each_option_names(tmp_path: Path) -> None:
    async def hook(data, tool_use_id, context):
        return {}

    extra = {"PostToolUse": [HookMatcher(matcher="Bash", hooks=[hook])]}
    spec = replace(SPEC, hooks={"PreToolUse": [HookMatcher(matcher="Write", hooks=[hook])]})
    opts = build_options(
        spec,
        cwd=tmp_path,
        resume="sid",
        fork=True,
        resume_at="uuid-1",
        add_dirs=[str(tmp_path / "bench")],
        prelude="INDEX OF THE WORKBENCH",
        hooks=extra,
        portable=True,
    )
    assert opts.add_dirs == [str(tmp_path / "bench")]
    assert opts.system_prompt["append"] == "do things\n\nINDEX OF THE WORKBENCH"
    assert (opts.resume, opts.fork_session, opts.resume_session_at) == ("sid", True, "uuid-1")
    assert set(opts.hooks) == {"PreToolUse", "PostToolUse"}
    assert opts.setting_sources == [] and opts.cwd == str(tmp_path)
    assert opts.session_store_flush == "eager"


@pytest.mark.parametrize(
    ("mode", "env"),
    [
        ("auto", {}),
        ("no_summary", {"DISABLE_AUTO_COMPACT": "1"}),
        ("off", {"DISABLE_COMPACT": "1"}),
    ],
)
def test_compact_policy_modes_become_the_clis_switches(mode: str, env: dict) -> None:
    assert CompactPolicy(mode=mode).env() == env
    assert CompactPolicy(mode=mode, window=300_000).env() == {
        **env,
        "CLAUDE_CODE_AUTO_COMPACT_WINDOW": "300000",
    }


def test_an_unknown_compact_mode_is_refused_when_made_and_when_used() -> None:
    with pytest.raises(ValueError, match="summary"):
        CompactPolicy(mode="summary")
    policy = CompactPolicy()
    policy.mode = "never"
    with pytest.raises(ValueError, match="never"):
        policy.env()
