"""``flower-super cancel RUN`` from a second terminal: the live flower stops as SIGTERM
stops it (one killed-by-signal row, no survivor, resumable); a dead or unknown run is one
line and exit status 2."""

from __future__ import annotations

import signal
import subprocess

import pytest

from tests.e2e import Flower
from tests.test_e2e_kill import FLOW, HOLD, bash, script, waiting_on

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]  # two flower runs of real CLI turns


@pytest.fixture(autouse=True)
def _english(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests read cancel's English lines."""
    monkeypatch.setenv("FLOWER_LANG", "en")


def cancel(f: Flower, run: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        f.argv("cancel", run, "-r", str(f.runs)),
        cwd=f.root,
        env=f.env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cancel_stops_a_live_flower_resumably_and_refuses_a_dead_one(model_server, flower_env):
    server = model_server(
        script(
            [bash("echo ran >> counter.txt"), {"text": "second done.", "delay": HOLD, "times": 1}]
        )
    )
    f: Flower = flower_env(server)
    proc = f.start(flow=FLOW)
    waiting_on(server, "second", 1)
    code, js = f.status_json()
    (run,) = [fl["run"] for fl in js["flowers"]]

    done = cancel(f, run[:15])  # a unique prefix is enough
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"stopped run {run}" in done.stdout and "flower-super start" in done.stdout
    assert proc.wait(timeout=30) == -signal.SIGTERM
    rows = f.rows("second")
    assert len(rows) == 1 and rows[0]["error"] == "killed-by-signal", rows
    f.assert_no_survivors(within=5.0)
    # status now shows it dead and unfinished, with the command that carries it on.
    code, js = f.status_json()
    (view,) = [fl for fl in js["flowers"] if fl["run"] == run]
    assert code == 3 and not view["alive"] and view["state"] == "killed", view
    assert view["resume"] and "flower-super start" in view["resume"], view

    again = cancel(f, run)
    assert again.returncode == 2 and "not running" in again.stderr, again.stderr
    assert len(again.stderr.strip().splitlines()) == 2  # the line and its hint
    unknown = cancel(f, "19990101-000000-abcdef")
    assert unknown.returncode == 2 and "no flower run" in unknown.stderr, unknown.stderr

    code, out = f.run(flow=FLOW)
    assert code == 0, out
    assert [r["error"] for r in f.rows("second")] == ["killed-by-signal", None]
