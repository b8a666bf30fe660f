"""The README's "Testing your own flow offline" example is exactly what CI runs: the fenced
block that starts with ``# test_my_flow.py`` is written to a temporary project, beside a
conftest that enables the plugin as the README says, and run by pytest in a fresh
interpreter with the real CLI and a temporary HOME."""

from __future__ import annotations

import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from flower.testing import cli_env

from .e2e import REPO

FIRST_LINE = "# test_my_flow.py"
CONFTEST = 'pytest_plugins = ["flower.testing.pytest_plugin"]\n'
# Warnings are errors, as a strict user's suite has them.
PYTEST_ARGS = ("-q", "-p", "no:cacheprovider", "-W", "error", "-o", "junit_family=xunit2")


def readme_example() -> str:
    """The one ```python block of README.md whose first line is ``# test_my_flow.py``."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```$", readme, flags=re.S | re.M)
    found = [b for b in blocks if b.startswith(FIRST_LINE + "\n")]
    assert len(found) == 1, f"README.md needs exactly one ```python block starting {FIRST_LINE}"
    return found[0]


def test_the_example_is_short_and_enables_the_plugin_as_written():
    code = readme_example()
    assert len(code.splitlines()) < 20
    compile(code, "test_my_flow.py", "exec")
    assert re.search(r"^def test_\w+\(", code, flags=re.M)
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert CONFTEST.strip() in readme  # what the conftest here holds is what users are told
    section = readme.index("## Testing your own flow offline")
    assert section < readme.index(FIRST_LINE) < readme.index("## Roles, hooks and the workbench")


@pytest.mark.e2e
@pytest.mark.timeout(150)  # a fresh pytest, then two flower steps through the real CLI
def test_the_readme_example_passes(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_my_flow.py").write_text(readme_example(), encoding="utf-8")
    (project / "conftest.py").write_text(CONFTEST, encoding="utf-8")
    # An ini of its own: no pytest.ini/pyproject.toml above tmp_path may configure the run.
    (project / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    report = tmp_path / "report.xml"
    # A dead endpoint and a dummy key: whatever the example fails to point at its own
    # server reaches nothing, and no key of the person running the suite is inherited.
    env = cli_env(tmp_path / "home", "http://127.0.0.1:9")
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *PYTEST_ARGS, f"--junitxml={report}", "test_my_flow.py"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=140,
    )
    output = done.stdout[-4000:] + done.stderr[-4000:]
    assert done.returncode == 0, output
    suite = ET.parse(report).getroot().find("testsuite")
    assert suite is not None, output
    counts = {k: int(suite.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}
    assert counts["tests"] >= 1, (counts, output)  # it collected something, and ran it
    assert (counts["failures"], counts["errors"], counts["skipped"]) == (0, 0, 0), counts
