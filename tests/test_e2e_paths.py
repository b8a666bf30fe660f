"""Step names are keys, not paths: a name full of ``../`` or with a ``/`` in it writes its
handoff into the workbench's notes/ and its log into runs/logs/, and nowhere else.

Measured before the fix: a step named ``../`` twelve times plus ``x`` had its handoff written
at the filesystem root.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.e2e import Flower

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]  # one flower run, two steps, a handoff

ESCAPE = "../" * 12 + "x"
HANDOFF = "## 在做什么\n写东西。\n\n## 下一步\n[[odd-next]] 接着写。\n"


def files_under(root: Path) -> set[Path]:
    return {Path(d) / f for d, _, fs in os.walk(root) for f in fs}


def test_step_names_with_path_separators_write_inside_their_folders(model_server, flower_env):
    big = {"input_tokens": 155_000}
    server = model_server(
        {
            "conversations": [
                {
                    "name": "odd",
                    "match": {"marker": "[[odd]]"},
                    "turns": [
                        {"tool_use": {"name": "Bash", "input": {"command": "true"}}, "usage": big},
                        {"text": HANDOFF},
                    ],
                },
                {"name": "odd-next", "match": {"marker": "[[odd-next]]"}, "turns": ["next done."]},
                {"name": "oddb", "match": {"marker": "[[oddb]]"}, "turns": ["b done."]},
            ]
        }
    )
    f: Flower = flower_env(server, extra_env={"ANTHROPIC_MODEL": "claude-haiku-4-5"})
    outside = f.root.parent
    before = files_under(outside) - files_under(f.root)
    assert not Path("/x.md").exists() and not Path("/交接-x.md").exists()
    code, out = f.run(flow="tests.flows.roles:odd", timeout=100)
    assert code == 0, out
    notes = f.ws / ".flower" / "notes"
    handoffs = sorted(p.name for p in notes.iterdir() if p.name.startswith("交接-"))
    assert len(handoffs) == 1 and "/" not in handoffs[0], handoffs
    assert handoffs[0].endswith("x.md") and ".." in handoffs[0]
    logs = [p for p in (f.runs / "logs").rglob("*.log")]
    assert {p.parent.parent for p in logs} == {f.runs / "logs"}, logs
    assert len(logs) == 2, logs
    made = files_under(f.root)
    for p in made:
        assert any(p.is_relative_to(d) for d in (f.ws, f.runs, f.root / "home")), p
    assert files_under(outside) - made == before, "something was written beside the flower"
    assert not Path("/x.md").exists() and not Path("/交接-x.md").exists()
    rows = {r["step"] for r in f.manifest()}
    assert rows == {ESCAPE, "a/b"}, rows
