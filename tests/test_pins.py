"""Pinned installs (issue 23): the README names what requirements.lock installs, the lock covers
pyproject.toml with hashes, and scripts/upgrade.sh's gate (scripts/pins.py) lets the lock move
only after `bash scripts/test.sh --latest` passed all the drills for exactly the newest
versions; its verdict line says which way it went."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.e2e import REPO


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        f"flower_scripts_{name}", REPO / "scripts" / f"{name}.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


pins = load("pins")
run_tests = load("run_tests")


def test_the_readme_names_the_locked_sdk_and_the_cli_it_bundles():
    lock = pins.locked()
    sdk = lock["claude-agent-sdk"]
    if pins.installed("claude-agent-sdk") != sdk:
        pytest.skip("not the locked venv: the bundled CLI's version is not known here")
    readme = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    assert (
        f"`claude-agent-sdk` {sdk}, whose wheel bundles Claude Code {pins.claude_code()}" in readme
    )
    assert f"temporalio {lock['temporalio']} and psycopg {lock['psycopg']}" in readme


def test_the_lock_pins_every_direct_dependency_with_hashes():
    lock = pins.locked()
    for name, _, _ in pins.direct():
        assert name in lock, name
    # Every pin is followed by its hashes (pip's --require-hashes wants them for each package).
    lines = pins.LOCK.read_text(encoding="utf-8").splitlines()
    pinned = [i for i, line in enumerate(lines) if re.match(r"^[A-Za-z0-9][^ ]*==", line)]
    assert len(pinned) >= len(lock)
    for i in pinned:
        assert lines[i + 1].startswith("    --hash=sha256:"), lines[i]


def verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **fields: object) -> None:
    monkeypatch.setattr(pins, "VERDICT", tmp_path / "verdict.json")
    monkeypatch.setattr(pins, "TESTED", tmp_path / "tested.txt")
    if not fields:
        return
    (tmp_path / "tested.txt").write_text("claude-agent-sdk==0.2.190\n")
    base = {
        "verdict": "PASS",
        "subset": False,
        "files": ["test_e2e_kill.py"],
        "failed_files": [],
        "versions": {"claude-agent-sdk": "0.2.190", "temporalio": "1.35.0"},
        "pyproject_sha256": pins.pyproject_hash(),
    }
    (tmp_path / "verdict.json").write_text(json.dumps({**base, **fields}))


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({}, "there is no verdict of a --latest run"),
        (
            {"verdict": "FAIL", "failed_files": ["test_e2e_kill.py"]},
            "its last run failed (test_e2e_kill.py), for claude-agent-sdk 0.2.190",
        ),
        ({"subset": True}, "its last run was a subset (1 file, not all the drills)"),
        ({"pyproject_sha256": "0" * 64}, "its last run is for another pyproject.toml"),
    ],
)
def test_upgrade_refuses_in_one_line(tmp_path, monkeypatch, capsys, fields, why):
    verdict(tmp_path, monkeypatch, **fields)
    assert pins.main(["may-upgrade"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"run bash scripts/test.sh --latest first: {why}"), err
    assert err.count("\n") == 1, err


def test_upgrade_refuses_when_a_newer_release_came_out_since(tmp_path, monkeypatch, capsys):
    tested = dict.fromkeys([n for n, _, _ in pins.direct()], "1.0")
    tested["claude-agent-sdk"] = "0.2.190"
    verdict(tmp_path, monkeypatch, versions=tested)
    newest = tmp_path / "newest.txt"
    lines = [f"{name}==1.0 \\\n    --hash=sha256:{'0' * 64}" for name in tested]
    newest.write_text(
        "\n".join(lines).replace("claude-agent-sdk==1.0", "claude-agent-sdk==0.2.191")
    )
    assert pins.main(["may-upgrade", "--newest", str(newest)]) == 1
    assert "claude-agent-sdk 0.2.190 tested, 0.2.191 is the newest now" in capsys.readouterr().err
    newest.write_text(
        "\n".join(lines).replace("claude-agent-sdk==1.0", "claude-agent-sdk==0.2.190")
    )
    assert pins.main(["may-upgrade", "--newest", str(newest)]) == 0


def test_the_verdict_line_and_file(tmp_path, monkeypatch, capsys):
    verdict(tmp_path, monkeypatch)
    report = tmp_path / "run.json"
    report.write_text(
        json.dumps(
            {
                "files": ["test_e2e_kill.py", "test_e2e_ledger.py"],
                "drills": True,
                "counts": {"passed": 40, "failed": 2},
                "failed": ["test_e2e_kill.py"],
            }
        )
    )
    pins.main(["verdict", "1", str(report)])
    line = capsys.readouterr().out.strip()
    sdk = f"claude-agent-sdk {pins.installed('claude-agent-sdk')}"
    assert line.startswith(f"latest: FAIL — {sdk} (Claude Code "), line
    assert line.endswith("(2 failed: test_e2e_kill.py) — keep the lock"), line
    kept = json.loads((tmp_path / "verdict.json").read_text())
    assert kept["verdict"] == "FAIL" and kept["subset"] is False and kept["failed_tests"] == 2
    assert kept["versions"]["claude-agent-sdk"] == pins.installed("claude-agent-sdk")
    assert "claude-agent-sdk==" in (tmp_path / "tested.txt").read_text()
    # A subset that passed says it cannot move the lock.
    report.write_text(json.dumps({"files": ["test_ipc.py"], "drills": False, "failed": []}))
    pins.main(["verdict", "0", str(report)])
    assert "latest: PASS, a subset (1 file, not all the drills)" in capsys.readouterr().out
    assert json.loads((tmp_path / "verdict.json").read_text())["subset"] is True


def test_tidy_leaves_out_the_tested_constraints(tmp_path):
    lock = tmp_path / "lock.txt"
    lock.write_text(
        "# This file was autogenerated by uv via the following command:\n"
        "#    bash scripts/upgrade.sh\n"
        "anyio==4.16.0 \\\n    --hash=sha256:aa\n    # via\n    #   -c .venv-latest/tested.txt\n"
        "    #   mcp\n"
        "click==8.5.1 \\\n    --hash=sha256:bb\n    # via\n    #   -c .venv-latest/tested.txt\n"
        "    #   flower (pyproject.toml)\n"
    )
    pins.main(["tidy", str(lock)])
    text = lock.read_text()
    assert "-c " not in text and "#   mcp" in text and "#   flower (pyproject.toml)" in text
    assert text.splitlines()[2].startswith("# Every package flower")


def test_the_drills_are_found_by_what_they_do():
    found = run_tests.drills()
    for name in ("test_e2e_kill.py", "test_e2e_ledger.py", "test_e2e_cluster.py"):
        assert name in found
    assert "test_ipc.py" not in found
    with pytest.raises(SystemExit):
        run_tests.chosen(["tests/test_no_such_file.py"])
