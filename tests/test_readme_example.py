"""The README's "Testing your own flow offline" examples are exactly what CI runs: each fenced
block that starts with ``# test_<name>.py`` is written to a temporary project, beside a
conftest that enables the plugin as the README says, and run by pytest in a fresh
interpreter with the real CLI and a temporary HOME.

``# test_my_flow.py`` runs a two-step flow in-process; ``# test_starter_flow.py`` runs the
``flower`` command on the starter flow, scripted with ``starter_script``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from flower.testing import cli_env
from tests.e2e import REPO

MY_FLOW = "# test_my_flow.py"
STARTER = "# test_starter_flow.py"
CONFTEST = 'pytest_plugins = ["flower.testing.pytest_plugin"]\n'
# Warnings are errors, as a strict user's suite has them.
PYTEST_ARGS = ("-q", "-p", "no:cacheprovider", "-W", "error", "-o", "junit_family=xunit2")


def readme_example(first_line: str = MY_FLOW) -> str:
    """The one ```python block of README.md whose first line is ``first_line``."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```$", readme, flags=re.S | re.M)
    found = [b for b in blocks if b.startswith(first_line + "\n")]
    assert len(found) == 1, f"README.md needs exactly one ```python block starting {first_line}"
    return str(found[0])


@pytest.mark.parametrize("first_line", [MY_FLOW, STARTER])
def test_the_example_is_short_and_enables_the_plugin_as_written(first_line):
    code = readme_example(first_line)
    assert len(code.splitlines()) < 20
    compile(code, first_line[2:], "exec")
    assert re.search(r"^def test_\w+\(", code, flags=re.M)
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert CONFTEST.strip() in readme  # what the conftest here holds is what users are told
    section = readme.index("## Testing your own flow offline")
    assert section < readme.index(first_line) < readme.index("## Roles, hooks and the workbench")


def run_example(tmp_path: Path, first_line: str, timeout: float) -> None:
    """Run the README block ``first_line`` as a user's project would: pytest, the plugin, a
    ``flower`` on PATH (an activated virtualenv), and nothing of ours in the environment."""
    project = tmp_path / "project"
    project.mkdir()
    name = first_line[2:]
    (project / name).write_text(readme_example(first_line), encoding="utf-8")
    (project / "conftest.py").write_text(CONFTEST, encoding="utf-8")
    # An ini of its own: no pytest.ini/pyproject.toml above tmp_path may configure the run.
    (project / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    report = tmp_path / "report.xml"
    # A dead endpoint and a dummy key: whatever the example fails to point at its own
    # server reaches nothing, and no key of the person running the suite is inherited.
    env = cli_env(tmp_path / "home", "http://127.0.0.1:9")
    env["PYTHONPATH"] = str(REPO)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *PYTEST_ARGS, f"--junitxml={report}", name],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    output = done.stdout[-4000:] + done.stderr[-4000:]
    assert done.returncode == 0, output
    suite = ET.parse(report).getroot().find("testsuite")
    assert suite is not None, output
    counts = {k: int(suite.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}
    assert counts["tests"] >= 1, (counts, output)  # it collected something, and ran it
    assert (counts["failures"], counts["errors"], counts["skipped"]) == (0, 0, 0), counts


@pytest.mark.e2e
@pytest.mark.timeout(150)  # a fresh pytest, then two flower steps through the real CLI
def test_the_readme_example_passes(tmp_path):
    run_example(tmp_path, MY_FLOW, timeout=140)


@pytest.mark.e2e
@pytest.mark.timeout(200)  # a fresh pytest, then `flower`: its probe and five CLI sessions
def test_the_readme_starter_example_passes(tmp_path):
    run_example(tmp_path, STARTER, timeout=190)
