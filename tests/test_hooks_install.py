"""Which hooks an attempt gets from its spec (the table of seed 003's hook layer), the same
for every placement because ``options_for`` builds them where the attempt runs."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from flower import AgentSpec, Workbench, coordinator, judge, worker
from flower.state.prune import PruningSessionStore
from flower.step.attempt import attempt_hooks, options_for
from flower.step.call import StepCall
from flower.step.placement import Seat
from flower.util.fsutil import file_name, inside

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def seat(tmp_path: Path):
    store = PruningSessionStore(tmp_path / "runs" / "sessions.db", workspace=tmp_path)
    first = {"type": "user", "uuid": "u0", "sessionId": "s1", "message": {"content": "go"}}
    asyncio.run(store.append({"project_key": "p", "session_id": "s1"}, [first]))  # it exists
    made = Seat(tmp_path, store, True, tmp_path / "logs", tmp_path / "tmp")
    yield made
    store.close()


def call(hooks: dict, event: str, **data: Any) -> dict:
    """What the CLI gets back from the one matcher flower installs for ``event``."""
    (matcher,) = hooks[event]  # folded: one control round trip per tool call and event
    assert matcher.matcher is None
    (hook,) = matcher.hooks
    data.setdefault("session_id", "s1")
    data.setdefault("tool_use_id", f"t-{data.get('tool_name')}")
    return asyncio.run(hook({"hook_event_name": event, **data}, data["tool_use_id"], None))


def decision(out: dict) -> str | None:
    return (out.get("hookSpecificOutput") or {}).get("permissionDecision")


def test_a_plain_spec_gets_the_whitelist_and_the_ledger(seat: Seat) -> None:
    hooks = attempt_hooks(AgentSpec("a", "x", allowed_tools=["Read", "Bash"]), seat)
    assert set(hooks) == {"PreToolUse", "PostToolUse", "PostToolUseFailure"}
    assert decision(call(hooks, "PreToolUse", tool_name="Write", tool_input={})) == "deny"
    assert call(hooks, "PreToolUse", tool_name="Bash", tool_input={"command": "ls"}) == {}
    assert seat.store.ledger.calls(["t-Bash"])["t-Bash"].state == "started"


def test_a_coordinator_keeps_its_wall_and_foreground_agents_without_a_workbench(seat) -> None:
    hooks = attempt_hooks(coordinator("c", "", {"w": worker("d", "p")}), seat)
    bash = {"tool_name": "Bash", "tool_input": {"command": "make"}}
    assert decision(call(hooks, "PreToolUse", **bash)) == "deny"
    assert call(hooks, "PreToolUse", agent_id="a1", **bash) == {}, "a worker's Bash is walled"
    agent = {"subagent_type": "w", "description": "d", "prompt": "p"}
    out = call(hooks, "PreToolUse", tool_name="Agent", tool_input=agent)
    assert out["hookSpecificOutput"]["updatedInput"] == {**agent, "run_in_background": False}
    row = seat.store.ledger.calls(["t-Agent"])["t-Agent"]
    assert row.state == "started"


def test_a_workbench_adds_index_and_spill_and_the_ledger_records_what_the_model_gets(
    seat: Seat, tmp_path: Path
) -> None:
    wb = Workbench(tmp_path).ensure()
    with_wb = replace(seat, workbench=wb, spill_threshold=4000)
    hooks = attempt_hooks(judge("j", None, can_run=True), with_wb)
    assert decision(call(hooks, "PreToolUse", tool_name="Write", tool_input={})) == "deny"
    big = {"stdout": "y" * 50_000, "stderr": "", "interrupted": False}
    out = call(hooks, "PostToolUse", tool_name="Bash", tool_input={}, tool_response=big)
    shown = out["hookSpecificOutput"]["updatedToolOutput"]["stdout"]
    assert len(shown) < 1000 and shown.count("y") >= 400
    (spilled,) = (wb.root / "spill").iterdir()
    assert spilled.read_text() == "y" * 50_000
    row = seat.store.ledger.calls(["t-Bash"])["t-Bash"]
    assert row.content == shown, "the ledger must keep what the model was sent"
    script = wb.scripts / "a.py"
    script.write_text("# desc: 试试\n")
    call(
        hooks,
        "PostToolUse",
        tool_name="Write",
        tool_input={"file_path": str(script)},
        tool_response={},
    )
    assert "试试" in wb.index_path.read_text()
    no_spill = attempt_hooks(judge("j", None), replace(with_wb, spill_threshold=None))
    out = call(
        no_spill,
        "PostToolUse",
        tool_name="Bash",
        tool_input={},
        tool_response=big,
        tool_use_id="t2",
    )
    assert out == {}


def test_handoff_switches_the_clis_compaction_off_unless_the_spec_chose(seat: Seat) -> None:
    from flower import CompactPolicy

    spec = AgentSpec("a", "x")
    call = StepCall(spec, "p", "a")
    off = replace(seat, no_auto_compact=True)
    assert options_for(call, off).env.get("DISABLE_AUTO_COMPACT") == "1"
    assert "DISABLE_AUTO_COMPACT" not in options_for(call, seat).env
    chosen = StepCall(replace(spec, compact=CompactPolicy()), "p", "a")
    assert "DISABLE_AUTO_COMPACT" not in options_for(chosen, off).env


def test_the_workbench_index_goes_after_the_instructions_and_an_outside_one_is_added(
    seat: Seat, tmp_path: Path
) -> None:
    wb = Workbench(tmp_path, home=tmp_path.parent / "wb-outside").ensure()
    opts = options_for(StepCall(AgentSpec("a", "INSTR"), "p", "a"), replace(seat, workbench=wb))
    append = opts.system_prompt["append"]
    assert append.startswith("INSTR\n\n") and wb.prompt_block() in append
    assert str(wb.root) in opts.add_dirs
    quiet = options_for(
        StepCall(AgentSpec("a", "INSTR", workbench=False), "p", "a"), replace(seat, workbench=wb)
    )
    assert quiet.system_prompt["append"] == "INSTR"


@pytest.mark.parametrize(
    "name", ["../" * 12 + "x", "a/b", "..", ".", "", "a\\b", "x\0y", "line\nbreak", "é" * 300]
)
def test_a_step_name_becomes_one_file_name_inside_its_folder(name: str, tmp_path: Path) -> None:
    one = file_name(name)
    assert one and "/" not in one and "\\" not in one and "\0" not in one and "\n" not in one
    assert one not in (".", "..") and len(one.encode()) <= 255
    path = inside(tmp_path, f"交接-{name}", ".md")
    assert path.parent == tmp_path and path.name.endswith(".md")


def test_two_long_names_that_share_a_beginning_stay_two_files() -> None:
    assert file_name("é" * 300 + "a") != file_name("é" * 300 + "b")
