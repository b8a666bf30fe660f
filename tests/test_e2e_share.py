"""Several flowers in one run_dir, and ``flower-super status`` for live, finished and dead runs."""

from __future__ import annotations

import shlex

import pytest

from tests.e2e import Flower, kill

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]  # several real CLI runs side by side


@pytest.fixture(autouse=True)
def _english(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests read flower-super status's English lines."""
    monkeypatch.setenv("FLOWER_LANG", "en")


def marked(*names: str, **extra) -> dict:
    return {
        "conversations": [
            {"name": n, "match": {"marker": f"[[{n}]]"}, "turns": [{"text": f"{n} done.", **extra}]}
            for n in names
        ]
    }


def test_three_flows_at_once_share_one_run_dir(model_server, flower_env):
    # A short hold on each answer makes the three flowers overlap for real.
    server = model_server(marked("alpha", "beta", "gamma", delay=1.0))
    f: Flower = flower_env(server)
    procs = [f.start(flow=f"tests.flows.basic:{n}") for n in ("alpha", "beta", "gamma")]
    server.wait_for(
        lambda reqs: len({r.conversation for r in reqs if r.conversation}) == 3, timeout=60
    )
    outs = [p.communicate(timeout=90)[0].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    rows = f.manifest()
    assert sorted(r["step"] for r in rows) == ["alpha", "beta", "gamma"]
    assert len({r["run"] for r in rows}) == 3, "each supervisor process has its own run id"
    steps = f.lineage()["steps"]
    assert set(steps) == {"alpha", "beta", "gamma"}
    for r in rows:
        assert steps[r["step"]] == r["session_id"]
    logs = "".join(p.read_text(errors="replace") for p in (f.runs / "logs").rglob("*.log"))
    assert "database is locked" not in logs + "".join(outs)
    f.assert_no_survivors()


def test_a_second_start_of_a_live_flow_is_refused(model_server, flower_env):
    server = model_server(marked("only", delay=60, times=1))
    f: Flower = flower_env(server)
    first = f.start(flow="tests.flows.basic:one")
    server.wait_for(lambda reqs: any(r.conversation == "only" for r in reqs), timeout=60)
    code, out = f.run(flow="tests.flows.basic:one")
    assert code == 2, out
    assert f"pid {first.pid}" in out and "Traceback" not in out
    kill(first)


def test_status_live_killed_and_finished(model_server, flower_env):
    server = model_server(marked("only", delay=60, times=1))
    f: Flower = flower_env(server)
    proc = f.start(flow="tests.flows.basic:one")
    server.wait_for(lambda reqs: any(r.conversation == "only" for r in reqs), timeout=60)

    code, js = f.status_json()
    assert code == 0
    (live,) = js["flowers"]
    assert (
        live["alive"]
        and live["state"] == "running"
        and live["pid"] == proc.pid
        and live["step"] == "only"
    )
    assert js["run_dir"] == str(f.runs) and js["workspace"] == str(f.ws)
    code, text = f.status()
    assert code == 0 and "live" in text and "running" in text

    kill(proc)
    f.assert_no_survivors(within=5.0)
    code, js = f.status_json()
    assert code == 3
    (dead,) = js["flowers"]
    assert not dead["alive"] and dead["state"] == "interrupted-resumable"
    command = shlex.split(dead["resume"])
    assert command[:2] == ["flower-super", "start"] and "--flow" in command
    code, text = f.status()
    assert code == 3 and "resume:" in text and "interrupted-resumable" in text

    code, out = f.run(flow="tests.flows.basic:one")
    assert code == 0, out
    code, js = f.status_json()
    assert code == 0, js
    states = [fl["state"] for fl in js["flowers"]]
    assert states == ["interrupted-resumable", "finished"]
    assert js["woke"] == 2 and js["steps"]["only"] == js["rows"][-1]["session_id"]
    assert set(js) == {
        "run_dir",
        "state",  # issue 18: where the run state lives ("local", or the database's URL)
        "workspace",
        "woke",
        "steps",
        "flowers",
        "rows",
        "damaged",
        "set_aside",
    }
    assert js["damaged"] == [] and js["set_aside"] == []  # a clean run_dir (issue 7's keys)
    assert js["state"] == "local"
    assert {"run", "flow", "pid", "alive", "state", "step", "session_id", "started_at"} <= set(
        js["flowers"][0]
    )


def test_status_of_a_missing_run_dir_is_one_line(tmp_path):
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "supervisor", "status", "-r", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert "no run directory" in done.stderr and "Traceback" not in done.stderr
