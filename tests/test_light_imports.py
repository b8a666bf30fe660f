"""The commands where nothing runs stay light: they never load the SDK.

``flower --help``, ``flower-super status`` and ``cancel`` answer at once only while what
they import leaves out claude_agent_sdk (about a second to import), anyio (its event-loop
layer), the SQLite session store (which imports the SDK), temporalio (0.7-1 s for its
client) and, against local files, the PostgreSQL driver. Each check runs in a fresh
interpreter: this test process has the SDK loaded already (conftest's model server).
scripts/bench_cli.py measures the time itself.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import flower

# Each check is one interpreter start (~0.1 s); a loaded machine makes that a few seconds.
pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[1]
# psycopg (~0.1 s): loaded only when the run state is a database (issue 18).
HEAVY = ("claude_agent_sdk", "anyio", "flower.state.sqlite", "temporalio", "psycopg")
# The modules the light commands import.
LIGHT = (
    "supervisor.commands.cli",
    "supervisor.commands.flower_cli",
    "supervisor.inspect.status",
    "supervisor.inspect.cancel",
    "supervisor.inspect.show",
    "supervisor.inspect.logs",
)
# What `import flower` loads besides itself: the error classes every front end catches.
EAGER = {"flower", "flower._errors"}
OUTSIDE_ALL = {"CredentialsError", "Manifest", "read_manifest", "Cache", "MapStep"}  # issue 11


def loaded_after(code: str, cwd: Path = REPO) -> list[str]:
    """Run ``code`` in a fresh interpreter and return the modules it left in sys.modules."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    modules: list[str] = json.loads(done.stdout.splitlines()[-1])
    return modules


def heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if m.split(".")[0] in HEAVY or m in HEAVY]


@pytest.mark.parametrize("module", LIGHT)
def test_importing_a_light_command_leaves_the_sdk_out(module: str) -> None:
    assert heavy(loaded_after(f"import {module}")) == []


def _run_cli(args: list[str]) -> str:
    """flower-super with ``args``, in-process in the child, whatever its exit status."""
    return (
        "from supervisor.commands.cli import main\n"
        "try:\n"
        f"    main({args!r}, standalone_mode=False)\n"
        "except SystemExit:\n"
        "    pass\n"
    )


def test_status_and_cancel_leave_the_sdk_out_while_they_run(tmp_path: Path) -> None:
    """Not just the import: what they load while answering (a run_dir with a registry)."""
    run_dir = tmp_path / "runs"
    (run_dir / "flowers").mkdir(parents=True)
    (run_dir / "lineage.json").write_text(
        json.dumps({"workspace": str(tmp_path), "woke": 1, "steps": {"干活": "s1"}}),
        encoding="utf-8",
    )
    (run_dir / "manifest.json").write_text("[\n]\n", encoding="utf-8")
    record = {
        "run": "20260101-090000-a1b2c3",
        "flow": "starter",
        "pid": 0,
        "pid_started": None,
        "workspace": str(tmp_path),
        "started_at": 1.0,
        "state": "running",
        "steps": ["干活"],
        "command": ["flower-super", "start"],
        "completed": {},
    }
    (run_dir / "flowers" / f"{record['run']}.json").write_text(json.dumps(record), "utf-8")
    for args in (["status", "-r", str(run_dir)], ["cancel", "nope", "-r", str(run_dir)]):
        assert heavy(loaded_after(_run_cli(args), cwd=tmp_path)) == [], args


def test_import_flower_loads_only_the_errors() -> None:
    ours = {m for m in loaded_after("import flower") if m.split(".")[0] == "flower"}
    assert ours == EAGER


def test_every_lazy_name_is_declared_for_the_type_checker_too() -> None:
    """flower/__init__.py names each lazy attribute twice: in _SOURCES (run time) and in its
    ``if TYPE_CHECKING:`` imports (mypy). They must say the same."""
    tree = ast.parse((REPO / "flower" / "__init__.py").read_text(encoding="utf-8"))
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    )
    declared = {
        alias.asname or alias.name: f"{'.' * node.level}{node.module}"
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert declared == flower._LAZY


def test_the_lazy_names_are_all_and_the_documented_extras() -> None:
    assert set(flower._LAZY) == set(flower.__all__) | OUTSIDE_ALL


def test_the_names_outside_all_are_importable() -> None:
    from flower import (
        AttemptCrash,
        ConfigError,
        CredentialsError,
        FlowerError,
        Manifest,
        RunDirBusy,
        __version__,
        read_manifest,
    )

    for err in (AttemptCrash, ConfigError, CredentialsError, RunDirBusy):
        assert issubclass(err, FlowerError)
    assert Manifest.__module__ == read_manifest.__module__ == "flower.state.manifest"
    assert __version__


def test_dir_lists_the_lazy_names_and_unknown_names_are_attribute_errors() -> None:
    assert set(flower.__all__) <= set(dir(flower))
    assert not hasattr(flower, "Runtme")
    with pytest.raises(AttributeError, match="Runtme"):
        flower.Runtme  # type: ignore[attr-defined]  # noqa: B018
