"""Which hooks an attempt gets from its spec (the table of seed 003's hook layer), the same
for every placement because ``options_for`` builds them where the attempt runs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from flower import AgentSpec, Workbench, coordinator, judge, worker
from flower.core.attempt import attempt_hooks, options_for
from flower.core.call import StepCall
from flower.core.placement import Seat
from flower.stores.prune import PruningSessionStore
from flower.util.fsutil import file_name, inside

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def seat(tmp_path: Path):
    store = PruningSessionStore(tmp_path / "runs" / "sessions.db", workspace=tmp_path)
    made = Seat(tmp_path, store, True, tmp_path / "logs", tmp_path / "tmp")
    yield made
    store.close()


def names(hooks: dict, event: str) -> list[str]:
    return [m.matcher or "*" for m in hooks.get(event, [])]


def test_a_plain_spec_gets_the_whitelist_and_the_ledger(seat: Seat) -> None:
    spec = AgentSpec("a", "x", allowed_tools=["Read", "Bash"])
    hooks = attempt_hooks(spec, seat)
    assert names(hooks, "PreToolUse") == ["Write|Edit|NotebookEdit", "*"]
    assert names(hooks, "PostToolUse") == ["*"] and names(hooks, "PostToolUseFailure") == ["*"]


def test_a_coordinator_keeps_its_wall_and_foreground_agents_without_a_workbench(seat) -> None:
    spec = coordinator("c", "", {"w": worker("d", "p")})
    hooks = attempt_hooks(spec, seat)
    assert names(hooks, "PreToolUse") == ["Bash|Write|Edit|NotebookEdit", "Agent", "*"]


def test_a_workbench_adds_index_and_spill(seat: Seat, tmp_path: Path) -> None:
    wb = Workbench(tmp_path).ensure()
    with_wb = replace(seat, workbench=wb, spill_threshold=4000)
    hooks = attempt_hooks(judge("j", None, can_run=True), with_wb)
    assert names(hooks, "PreToolUse") == ["Write|Edit|NotebookEdit", "*"]
    assert names(hooks, "PostToolUse")[:2] == [
        "Write|Edit",
        "Bash|Read|Grep|Glob|WebFetch|WebSearch",
    ]
    no_spill = replace(with_wb, spill_threshold=None)
    assert len(attempt_hooks(judge("j", None), no_spill)["PostToolUse"]) == 2  # index + ledger


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
    path = inside(tmp_path, f"交接-{name}.md")
    assert path.parent == tmp_path


def test_two_long_names_that_share_a_beginning_stay_two_files() -> None:
    assert file_name("é" * 300 + "a") != file_name("é" * 300 + "b")
