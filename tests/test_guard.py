"""The hook layer: who is denied what and told what, what a huge result becomes, how an
Agent dispatch is edited. The hooks are called as the SDK calls them, with the input
dicts the CLI sends (a subagent's carry ``agent_id``)."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from claude_agent_sdk import AgentDefinition, HookMatcher

from flower.agents.guard import (
    BULKY,
    HANDS_ON,
    delegate_guard,
    foreground_guard,
    index_guard,
    isolate_guard,
    isolated,
    spill_guard,
    wants_isolation,
    whitelist_guard,
    workbench_hooks,
)
from flower.agents.workbench import Workbench

pytestmark = pytest.mark.timeout(30)


def _input(event: str, tool: str, args: dict[str, Any], cwd: Path, agent: str | None) -> dict:
    data: dict[str, Any] = {
        "session_id": "2b1c0d9e-0000-4000-8000-000000000001",
        "transcript_path": str(cwd / "t.jsonl"),
        "cwd": str(cwd),
        "permission_mode": "default",
        "hook_event_name": event,
        "tool_name": tool,
        "tool_input": args,
        "tool_use_id": "toolu_01",
    }
    if agent:
        data["agent_id"] = agent
        data["agent_type"] = "worker"
    return data


def pre(tool: str, args: dict[str, Any], *, cwd: Path = Path("/w"), agent: str | None = None):
    return _input("PreToolUse", tool, args, cwd, agent)


def post(
    tool: str,
    args: dict[str, Any],
    response: Any,
    *,
    cwd: Path = Path("/w"),
    agent: str | None = None,
) -> dict:
    return {**_input("PostToolUse", tool, args, cwd, agent), "tool_response": response}


def call(matcher: HookMatcher, data: dict) -> dict:
    assert len(matcher.hooks) == 1
    return asyncio.run(matcher.hooks[0](data, data.get("tool_use_id"), {"signal": None}))


def denial(out: dict) -> str:
    spec = out["hookSpecificOutput"]
    assert spec["hookEventName"] == "PreToolUse"
    assert spec["permissionDecision"] == "deny"
    return spec["permissionDecisionReason"]


def updated_input(out: dict) -> dict:
    spec = out["hookSpecificOutput"]
    assert spec["hookEventName"] == "PreToolUse"
    assert spec["permissionDecision"] == "allow"
    return spec["updatedInput"]


# ---- whitelist_guard --------------------------------------------------------------------


def test_whitelist_is_none_when_nothing_is_banned() -> None:
    assert whitelist_guard(["Read", "Bash", "Write", "Edit", "NotebookEdit", "Agent"]) is None


def test_whitelist_bans_the_hands_on_tools_missing_from_allowed() -> None:
    assert whitelist_guard(["Read", "Glob", "Grep"]).matcher == HANDS_ON
    assert whitelist_guard(None).matcher == HANDS_ON
    # A scoped permission rule is not the tool itself.
    assert whitelist_guard(["Bash(git diff:*)", "Edit"]).matcher == "Bash|Write|NotebookEdit"


def test_a_judge_that_may_run_keeps_bash_and_still_cannot_write() -> None:
    guard = whitelist_guard(["Read", "Glob", "Grep", "Bash"], role="判定者")
    assert guard is not None and guard.matcher == "Write|Edit|NotebookEdit"
    assert call(guard, pre("Bash", {"command": "pytest -q"})) == {}
    reason = denial(call(guard, pre("Write", {"file_path": "/w/x", "content": "y"})))
    assert reason.startswith("判定者 没有 Write。")
    assert "有意" in reason and "不是漏配" in reason
    assert "回复正文" in reason and "绕过" in reason


def test_whitelist_lets_subagents_through() -> None:
    guard = whitelist_guard(["Read"])
    assert guard is not None
    assert call(guard, pre("Write", {"file_path": "/w/x"}, agent="a1")) == {}
    assert "这个角色 没有 Bash" in denial(call(guard, pre("Bash", {"command": "ls"})))


# ---- delegate_guard ---------------------------------------------------------------------


def test_delegate_guard_tells_the_main_thread_to_dispatch() -> None:
    guard = delegate_guard()
    assert guard.matcher == HANDS_ON
    reason = denial(call(guard, pre("Edit", {"file_path": "/w/a.py"})))
    for says in ("Agent", "目标", "验收标准", "artifacts/", "路径", "结论"):
        assert says in reason, says
    assert call(guard, pre("Edit", {"file_path": "/w/a.py"}, agent="a1")) == {}


def test_delegate_guard_matcher_is_the_given_regex() -> None:
    assert delegate_guard(tools="Write|Edit").matcher == "Write|Edit"


@pytest.mark.parametrize(
    ("args", "passes"),
    [
        ({"command": "git status"}, True),
        ({"command": "ls -la && git log --oneline -5"}, True),
        ({"command": "rm -rf build"}, False),
        ({"command": "git status > out.txt"}, False),
        # A background glance would not expire on resume: the pass set is the expiry set.
        ({"command": "git status", "run_in_background": True}, False),
        ({}, False),
    ],
)
def test_glance_passes_exactly_the_ephemeral_commands(args: dict, passes: bool) -> None:
    out = call(delegate_guard(allow_glance=True), pre("Bash", args))
    if passes:
        assert out == {}
    else:
        assert "只读的一次性查看命令" in denial(out)


def test_without_glance_even_git_status_is_delegated() -> None:
    assert denial(call(delegate_guard(), pre("Bash", {"command": "git status"})))


# ---- spill_guard ------------------------------------------------------------------------


@pytest.fixture
def wb(tmp_path: Path) -> Workbench:
    (tmp_path / "ws").mkdir()
    return Workbench(tmp_path / "ws")


def _long(n: int) -> str:
    return "".join(f"line {i:05d} " for i in range(n // 11 + 1))[:n]


def _spill_file(wb: Workbench, text: str) -> Path:
    return wb.root / "spill" / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.txt"


def _spilled(out: dict) -> Any:
    spec = out["hookSpecificOutput"]
    assert spec["hookEventName"] == "PostToolUse"
    return spec["updatedToolOutput"]


def test_a_long_bash_stdout_is_spilled_and_pointed_at(wb: Workbench) -> None:
    text = _long(5000)
    response = {"stdout": text, "stderr": "warn", "interrupted": False, "isImage": False}
    guard = spill_guard(wb)
    assert guard.matcher == BULKY
    out = _spilled(call(guard, post("Bash", {"command": "cat big"}, response, cwd=wb.workspace)))

    assert out.keys() == response.keys()
    assert out["stderr"] == "warn" and out["interrupted"] is False and out["isImage"] is False
    path = _spill_file(wb, text)
    assert path.read_text(encoding="utf-8") == text
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    pointer, _, head = out["stdout"].partition("\n")
    assert wb.show(path) in pointer and "5000" in pointer and "Read" in pointer
    assert head == text[:400]
    assert len(out["stdout"]) < 600


def test_the_threshold_is_inclusive_and_short_results_pass(wb: Workbench) -> None:
    guard = spill_guard(wb, threshold=1000)
    assert call(guard, post("Bash", {}, {"stdout": _long(999), "stderr": ""})) == {}
    assert _spilled(call(guard, post("Bash", {}, {"stdout": _long(1000), "stderr": ""})))


def test_lists_are_never_touched(wb: Workbench) -> None:
    guard = spill_guard(wb, threshold=100)
    results = [{"title": "t", "content": _long(5000)}, _long(5000)]
    response = {"query": "q", "results": results, "durationSeconds": 1.0}
    assert call(guard, post("WebSearch", {"query": "q"}, response)) == {}

    response = {"filenames": [_long(2000)], "content": _long(2000), "numFiles": 1}
    out = _spilled(call(guard, post("Grep", {"pattern": "x"}, response)))
    assert out["filenames"] is response["filenames"] and out["numFiles"] == 1
    assert out["content"].endswith(_long(400)) and out["content"] != response["content"]


def test_a_read_is_spilled_inside_its_file_dict(wb: Workbench) -> None:
    text = _long(6000)
    file = {"filePath": "/w/big.log", "content": text, "numLines": 1, "startLine": 1}
    response = {"type": "text", "file": {**file, "totalLines": 1}}
    out = _spilled(call(spill_guard(wb), post("Read", {"file_path": "/w/big.log"}, response)))
    assert out["type"] == "text"
    assert {k: v for k, v in out["file"].items() if k != "content"} == {
        k: v for k, v in response["file"].items() if k != "content"
    }
    assert out["file"]["content"].endswith(text[:400])
    assert _spill_file(wb, text).read_text(encoding="utf-8") == text


def test_a_plain_string_response_becomes_a_string_pointer(wb: Workbench) -> None:
    text = _long(4500)
    out = _spilled(call(spill_guard(wb), post("WebFetch", {"url": "https://x"}, text)))
    assert isinstance(out, str) and out.endswith(text[:400]) and "4500" in out


def test_reading_a_spill_file_back_passes_whole(wb: Workbench) -> None:
    text = _long(5000)
    guard = spill_guard(wb)
    call(guard, post("Bash", {"command": "x"}, {"stdout": text, "stderr": ""}))
    path = _spill_file(wb, text)
    back = {"type": "text", "file": {"filePath": str(path), "content": text}}
    assert call(guard, post("Read", {"file_path": str(path)}, back)) == {}
    # The pointer's path is relative to the workspace: a relative Read from there passes too.
    relative = wb.show(path)
    assert not Path(relative).is_absolute()
    assert call(guard, post("Read", {"file_path": relative}, back, cwd=wb.workspace)) == {}
    # Any other file that large is still spilled.
    other = {"type": "text", "file": {"filePath": "/w/other", "content": text}}
    assert _spilled(call(guard, post("Read", {"file_path": "/w/other"}, other)))


def test_main_only_leaves_subagent_results_alone(wb: Workbench) -> None:
    response = {"stdout": _long(5000), "stderr": ""}
    assert call(spill_guard(wb, main_only=True), post("Bash", {}, response, agent="a1")) == {}
    assert _spilled(call(spill_guard(wb), post("Bash", {}, response, agent="a1")))


def test_a_failed_spill_keeps_the_result_whole(
    wb: Workbench, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOWER_LANG", "en")  # the English texts are asserted
    wb.root.mkdir()
    (wb.root / "spill").write_text("not a directory")
    with caplog.at_level(logging.WARNING, logger="flower"):
        out = call(spill_guard(wb), post("Bash", {}, {"stdout": _long(5000), "stderr": ""}))
    assert out == {}
    assert "not spilled" in caplog.text


def test_a_tiny_threshold_spills_even_when_the_pointer_is_longer(wb: Workbench) -> None:
    """api.md: a string field of at least ``threshold`` characters is spilled, whatever
    the pointer costs (the reference has no "not worth it" exception)."""
    out = _spilled(call(spill_guard(wb, threshold=10), post("Bash", {}, {"stdout": "x" * 50})))
    assert out["stdout"].endswith("x" * 50) and len(out["stdout"]) > 50
    assert _spill_file(wb, "x" * 50).read_text(encoding="utf-8") == "x" * 50
    assert call(spill_guard(wb, threshold=10), post("Bash", {}, {"stdout": "x" * 9})) == {}


def test_a_lone_surrogate_does_not_break_the_spill(wb: Workbench) -> None:
    text = "\ud83d" + _long(5000)  # what json.loads makes of a cut emoji escape
    out = _spilled(call(spill_guard(wb), post("Bash", {}, {"stdout": text, "stderr": ""})))
    files = list((wb.root / "spill").iterdir())
    assert len(files) == 1 and files[0].read_text(encoding="utf-8").endswith(text[1:])
    assert out["stdout"].endswith(text[:400])


def test_the_same_text_is_spilled_into_one_file(wb: Workbench) -> None:
    text = _long(5000)
    guard = spill_guard(wb)
    for _ in range(2):
        call(guard, post("Bash", {}, {"stdout": text, "stderr": ""}))
    assert [p.name for p in (wb.root / "spill").iterdir()] == [_spill_file(wb, text).name]


# ---- index_guard ------------------------------------------------------------------------


def test_a_write_into_the_workbench_refreshes_the_index(wb: Workbench) -> None:
    guard = index_guard(wb)
    assert guard.matcher == "Write|Edit"
    wb.ensure()
    script = wb.scripts / "probe.py"
    script.write_text("# desc: 探测端口\n")
    assert call(guard, post("Write", {"file_path": str(script)}, {"type": "create"})) == {}
    assert "探测端口" in wb.index_path.read_text(encoding="utf-8")


def test_a_write_elsewhere_does_not_touch_the_index(wb: Workbench) -> None:
    guard = index_guard(wb)
    args = {"file_path": str(wb.workspace / "src.py")}
    assert call(guard, post("Edit", args, {}, cwd=wb.workspace)) == {}
    assert not wb.index_path.exists()
    # A relative path is taken from the hook's cwd.
    args = {"file_path": ".flower/notes/决定.md"}
    assert call(guard, post("Write", args, {}, cwd=wb.workspace)) == {}
    assert wb.index_path.exists()


@pytest.mark.parametrize("path", [None, 3, "", "/w/\0bad", "../" * 50 + "etc"])
def test_index_guard_never_raises_on_odd_input(wb: Workbench, path: Any) -> None:
    assert call(index_guard(wb), post("Write", {"file_path": path}, {})) == {}


def test_index_guard_survives_an_unwritable_index(wb: Workbench) -> None:
    wb.ensure()
    wb.index_path.mkdir()  # os.replace onto a directory fails
    args = {"file_path": str(wb.notes / "n.md")}
    assert call(index_guard(wb), post("Write", args, {})) == {}


# ---- isolation and the Agent guard ------------------------------------------------------


def _agent(**kw: Any) -> AgentDefinition:
    return AgentDefinition(description="does work", prompt="work", **kw)


def test_isolated_marks_the_same_object_and_the_mark_never_serialises() -> None:
    a = _agent()
    assert not wants_isolation(a)
    assert isolated(a) is a and wants_isolation(a)
    assert "_flower_isolate" not in dataclasses.asdict(a)
    assert not wants_isolation(dataclasses.replace(a))  # the documented cost
    assert isolated(a, False) is a and not wants_isolation(a)
    assert not wants_isolation(None)


def test_a_marked_role_gets_a_worktree_and_the_foreground() -> None:
    seen: list[tuple[str, Any]] = []
    agents = {"builder": isolated(_agent()), "reader": _agent()}
    guard = isolate_guard(agents, on_inject=lambda *a: seen.append(a))
    assert guard.matcher == "Agent"
    args = {"description": "build it", "prompt": "…", "subagent_type": "builder"}
    assert updated_input(call(guard, pre("Agent", args))) == {
        **args,
        "isolation": "worktree",
        "run_in_background": False,
    }
    assert seen == [("builder", "build it")]


@pytest.mark.parametrize("given", [{"cwd": "/elsewhere"}, {"isolation": "remote"}])
def test_an_explicit_cwd_or_isolation_is_respected(given: dict) -> None:
    guard = isolate_guard({"builder": isolated(_agent())})
    args = {"prompt": "p", "subagent_type": "builder", **given}
    assert updated_input(call(guard, pre("Agent", args))) == {**args, "run_in_background": False}


def test_an_isolation_of_none_is_no_choice() -> None:
    guard = isolate_guard({"builder": isolated(_agent())})
    args = {"prompt": "p", "subagent_type": "builder", "isolation": None}
    assert updated_input(call(guard, pre("Agent", args)))["isolation"] == "worktree"


def test_an_unmarked_role_only_gets_the_foreground() -> None:
    guard = isolate_guard({"builder": isolated(_agent()), "reader": _agent()})
    for role in ("reader", "general-purpose"):
        args = {"prompt": "p", "subagent_type": role}
        assert updated_input(call(guard, pre("Agent", args))) == {
            **args,
            "run_in_background": False,
        }
    args = {"prompt": "p", "subagent_type": "reader", "run_in_background": False}
    assert call(guard, pre("Agent", args)) == {}


def test_a_failing_on_inject_still_isolates(caplog: pytest.LogCaptureFixture) -> None:
    def boom(role: str, description: Any) -> None:
        raise RuntimeError("observer broke")

    guard = isolate_guard({"builder": isolated(_agent())}, on_inject=boom)
    with caplog.at_level(logging.WARNING, logger="flower"):
        out = call(guard, pre("Agent", {"prompt": "p", "subagent_type": "builder"}))
    assert updated_input(out)["isolation"] == "worktree"
    assert "observer broke" in caplog.text


@pytest.mark.parametrize("given", [{}, {"run_in_background": True}])
def test_foreground_guard_keeps_the_main_thread_waiting(given: dict) -> None:
    guard = foreground_guard()
    assert guard.matcher == "Agent"
    args = {"description": "d", "prompt": "p", "subagent_type": "builder", **given}
    assert updated_input(call(guard, pre("Agent", args))) == {**args, "run_in_background": False}


def test_foreground_guard_leaves_settled_and_subagent_calls_alone() -> None:
    guard = foreground_guard()
    assert call(guard, pre("Agent", {"prompt": "p", "run_in_background": False})) == {}
    assert call(guard, pre("Agent", {"prompt": "p"}, agent="a1")) == {}
    assert call(guard, pre("Bash", {"command": "ls"})) == {}


def test_a_subagent_dispatching_a_marked_role_is_isolated_but_not_foregrounded() -> None:
    guard = isolate_guard({"builder": isolated(_agent())})
    args = {"prompt": "p", "subagent_type": "builder"}
    assert updated_input(call(guard, pre("Agent", args, agent="a1"))) == {
        **args,
        "isolation": "worktree",
    }


# ---- workbench_hooks --------------------------------------------------------------------


def _matchers(hooks: dict) -> dict[str, list[str | None]]:
    return {event: [m.matcher for m in found] for event, found in hooks.items()}


def test_workbench_hooks_by_default(wb: Workbench) -> None:
    hooks = workbench_hooks(wb)
    assert _matchers(hooks) == {"PreToolUse": [HANDS_ON], "PostToolUse": ["Write|Edit", BULKY]}
    assert all(isinstance(m, HookMatcher) for found in hooks.values() for m in found)


def test_workbench_hooks_drop_what_is_not_asked_for(wb: Workbench) -> None:
    for threshold in (None, 0):
        hooks = workbench_hooks(wb, delegate_only=False, spill_threshold=threshold, agents={})
        assert _matchers(hooks) == {"PostToolUse": ["Write|Edit"]}


def test_workbench_hooks_pass_the_threshold_and_the_glance_on(wb: Workbench) -> None:
    hooks = workbench_hooks(wb, spill_threshold=100, allow_glance=True)
    assert call(hooks["PreToolUse"][0], pre("Bash", {"command": "git status"})) == {}
    assert _spilled(call(hooks["PostToolUse"][1], post("Bash", {}, {"stdout": _long(1000)})))


def test_workbench_hooks_install_the_agent_guard_for_subagents(wb: Workbench) -> None:
    plain = workbench_hooks(wb, agents={"reader": _agent()})
    assert _matchers(plain)["PreToolUse"] == [HANDS_ON, "Agent"]
    args = {"prompt": "p", "subagent_type": "reader"}
    assert updated_input(call(plain["PreToolUse"][1], pre("Agent", args))) == {
        **args,
        "run_in_background": False,
    }
    marked = workbench_hooks(wb, delegate_only=False, agents={"builder": isolated(_agent())})
    assert _matchers(marked)["PreToolUse"] == ["Agent"]
    args = {"prompt": "p", "subagent_type": "builder"}
    assert updated_input(call(marked["PreToolUse"][0], pre("Agent", args)))["isolation"] == (
        "worktree"
    )


def test_importing_the_hook_layer_does_not_import_the_sdk() -> None:
    code = "import sys, flower.agents.guard; print('claude_agent_sdk' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=20
    )
    assert out.stdout.strip() == "False"
