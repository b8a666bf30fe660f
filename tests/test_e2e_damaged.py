"""Damaged run-state files never block work and never fail silently (issue 7).

Each case: a finished run, then one file damaged the way disks, editors and kills damage
files. ``status`` and ``start`` print no traceback; ``status`` names the damage; ``start``
says in one line which file it set aside and runs the flow; the damaged bytes still exist
under ``runs/`` for a person to look at.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e import Flower

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]  # two short flower runs and a status

FLOW = "tests.flows.basic:one"
GONE = "00000000-0000-4000-8000-00000000dead"


def script() -> dict:
    return {
        "conversations": [
            {"name": "only", "match": {"marker": "[[only]]"}, "turns": ["only done."]}
        ]
    }


def _record(runs: Path) -> Path:
    (path,) = (runs / "flowers").glob("*.json")
    return path


def _cut(path: Path, keep: float) -> bytes:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path.read_bytes()


def _write(path: Path, data: bytes) -> bytes:
    path.write_bytes(data)
    return data


# name -> (the file, how to damage it; returns the bytes that must survive somewhere in runs/)
Damage = Callable[[Flower], tuple[Path, bytes]]
CASES: dict[str, Damage] = {
    "lineage-garbage": lambda f: (
        f.runs / "lineage.json",
        _write(f.runs / "lineage.json", b"{garbage \x00"),
    ),
    "lineage-torn": lambda f: (f.runs / "lineage.json", _cut(f.runs / "lineage.json", 0.5)),
    "lineage-shape": lambda f: (
        f.runs / "lineage.json",
        _write(f.runs / "lineage.json", b'["workspace", "woke", "steps"]'),
    ),
    "lineage-gone-session": lambda f: (
        f.runs / "lineage.json",
        _write(
            f.runs / "lineage.json",
            json.dumps({"workspace": str(f.ws), "woke": 1, "steps": {"only": GONE}}).encode(),
        ),
    ),
    "manifest-garbage": lambda f: (
        f.runs / "manifest.json",
        _write(f.runs / "manifest.json", b"not json [[["),
    ),
    "manifest-torn": lambda f: (f.runs / "manifest.json", _cut(f.runs / "manifest.json", 0.6)),
    "manifest-shape": lambda f: (
        f.runs / "manifest.json",
        _write(f.runs / "manifest.json", b'{"rows": []}'),
    ),
    "sessions-garbage": lambda f: (
        f.runs / "sessions.db",
        _write(f.runs / "sessions.db", b"this is not an SQLite database\n" * 200),
    ),
    "sessions-truncated": lambda f: (f.runs / "sessions.db", _cut(f.runs / "sessions.db", 0.5)),
    "registry-garbage": lambda f: (_record(f.runs), _write(_record(f.runs), b'{"run": 12, oops')),
}


def everything_under(runs: Path) -> list[bytes]:
    return [p.read_bytes() for p in runs.rglob("*") if p.is_file()]


@pytest.mark.parametrize("case", list(CASES))
def test_a_damaged_file_is_set_aside_with_one_line_and_the_flow_runs(
    case, model_server, flower_env
):
    server = model_server(script())
    f: Flower = flower_env(server)
    code, out = f.run(flow=FLOW)
    assert code == 0, out
    assert (
        not Path(f"{f.runs / 'sessions.db'}-wal").exists()
        or os.path.getsize(f"{f.runs / 'sessions.db'}-wal") == 0
    ), "the first run left WAL frames: the truncation case would test nothing"

    damaged, data = CASES[case](f)

    code, report = f.status()
    assert "Traceback" not in report, report
    assert code in (0, 3), report
    assert str(damaged) in report, f"status does not name {damaged}:\n{report}"
    code, js = f.status_json()
    assert any(d["file"] == str(damaged) for d in js["damaged"]), js["damaged"]

    code, out = f.run(flow=FLOW)
    assert code == 0, out
    assert "Traceback" not in out, out
    named = [
        line
        for line in out.splitlines()
        if str(damaged) in line and not line.startswith("总花费 ")  # the closing line names it
    ]
    assert len(named) == 1 and named[0].startswith("! "), out
    assert data in everything_under(f.runs), "the damaged bytes are gone"
    assert f.rows("only")[-1]["ok"], f.manifest()

    code, report = f.status()  # afterwards: nothing damaged left, the kept file listed
    assert "Traceback" not in report and "! " not in report, report
    f.assert_no_survivors()
