"""Run state in PostgreSQL, end to end: the real flower-super and the real CLI against the
scripted model server, a real database per test (``pg_dsn``).

- ``state export`` then ``--state URL`` in the same workspace: the same conversation
  continues (the model is sent the first run's turns in the same session), the wake count
  goes on, and the second run writes none of the run's state under the run_dir.
- Two flowers in two workspaces on one database at the same time: each wakes its own
  conversation, and ``status`` in each workspace shows its own runs.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest

from flower.services.model_server import ModelServer
from tests.e2e import Flower, wait_until

pytestmark = pytest.mark.e2e

SECRET = "sekret-e2e"  # a password in a --state URL (the test server trusts any)
STATE_FILES = ("sessions.db", "lineage.json", "manifest.json", "flowers", "cache")


def files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` and its bytes."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def step_logs_of(before: dict[str, bytes], after: dict[str, bytes]) -> set[str]:
    """What a run added under the run_dir: only its step logs (``logs/<run>/<step>.log``)
    and the children's temporary files may be there."""
    added = set(after) - set(before)
    return {p for p in added if not (p.startswith("logs/") and p.endswith(".log"))} - {
        p for p in added if p.startswith("tmp/")
    }


def lineage_row(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT workspace_id, woke, steps FROM flower.lineage").fetchall()


def super_(f: Flower, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        f.argv(*args), cwd=f.root, env=f.env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.timeout(240)  # two flower runs of a real CLI turn, an export, status
def test_export_then_state_carries_on_the_same_conversation(
    model_server: Any, flower_env: Any, pg_dsn: str
) -> None:
    server: ModelServer = model_server(
        {
            "conversations": [
                {
                    "name": "only",
                    "match": {"marker": "[[only]]"},
                    "turns": [{"text": "one."}, {"text": "two."}],
                }
            ]
        }
    )
    f: Flower = flower_env(server)
    code, out = f.run(flow="tests.flows.basic:one")
    assert code == 0, out
    sid = f.lineage()["steps"]["only"]

    local = files(f.runs)
    done = super_(f, "state", "export", "--to", pg_dsn, "-w", str(f.ws), "-r", str(f.runs))
    assert done.returncode == 0, done.stderr
    assert files(f.runs) == local, "export changed the local files"
    assert len(done.stdout.splitlines()) == 8  # one line per kind of state, and the summary

    code, out = f.run("--state", pg_dsn, flow="tests.flows.basic:one")
    assert code == 0, out
    after = files(f.runs)
    assert step_logs_of(local, after) == set(), "the second run wrote run state under run_dir"
    assert {p: after[p] for p in local} == local, "the second run changed the local state"

    asked = [r for r in server.requests if r.conversation == "only"]
    assert [r.session_id for r in asked] == [sid, sid], "the second run began a new session"
    assert "one." in json.dumps(asked[-1].messages, ensure_ascii=False), "first run's turns"
    ((_, woke, steps),) = lineage_row(pg_dsn)
    assert (woke, steps) == (2, {"only": sid})

    code, report = f.status("--state", pg_dsn, "-w", str(f.ws), "--json")
    doc = json.loads(report)
    assert code == 0 and doc["woke"] == 2 and len(doc["flowers"]) == 2, report
    assert {row["session_id"] for row in doc["rows"]} == {sid}


GATE = "until [ -e {gate} ]; do sleep 0.1; done; echo through"


@pytest.mark.timeout(300)  # four flower runs of real CLI turns, two at a time
def test_two_workspaces_on_one_database_at_once_each_wake_their_own(
    model_server: Any, flower_env: Any, pg_dsn: str, tmp_path: Path
) -> None:
    """Both first runs are held in a tool call until both are live in the database, then
    released; both then wake at once. Workspace A names the database with --state (a URL
    with a password), workspace B with FLOWER_STATE in its .env."""
    gates = {name: tmp_path / f"gate-{name}" for name in "ab"}
    server: ModelServer = model_server(
        {
            "conversations": [
                {
                    "name": name,
                    "match": {"marker": f"[[{name}]]"},
                    "turns": [
                        {
                            "tool_use": {
                                "name": "Bash",
                                "input": {"command": GATE.format(gate=gate)},
                            }
                        },
                        {"text": f"{name} one."},
                        {"text": f"{name} two."},
                    ],
                }
                for name, gate in (("alpha", gates["a"]), ("beta", gates["b"]))
            ]
        }
    )
    a: Flower = flower_env(server)
    b: Flower = flower_env(server)
    (b.ws / ".env").write_text(f"FLOWER_STATE={pg_dsn}\n")
    url = pg_dsn.replace("postgres@", f"postgres:{SECRET}@")
    runs = {
        "a": lambda: a.start("--state", url, flow="tests.flows.basic:alpha"),
        "b": lambda: b.start(flow="tests.flows.basic:beta"),
    }
    try:
        first = {name: start() for name, start in runs.items()}
        wait_until(lambda: _live(pg_dsn) == 2, 120, "both flowers live in the database")
        for gate in gates.values():
            gate.touch()
        for name, proc in first.items():
            out, _ = proc.communicate(timeout=120)
            assert proc.returncode == 0, (name, out)
        second = {name: start() for name, start in runs.items()}
        for name, proc in second.items():
            out, _ = proc.communicate(timeout=120)
            assert proc.returncode == 0, (name, out)
    finally:
        for gate in gates.values():
            gate.touch()  # a flower still held in its tool call is let go before the reaping

    by_flow: dict[str, list[str]] = {}
    for r in server.requests:
        if r.conversation in ("alpha", "beta"):
            by_flow.setdefault(r.conversation, []).append(r.session_id)
    assert set(by_flow["alpha"]) != set(by_flow["beta"])
    assert all(len(set(ids)) == 1 for ids in by_flow.values()), by_flow  # each woke its own
    lineages = {tuple(steps): woke for _, woke, steps in lineage_row(pg_dsn)}
    assert lineages == {("alpha",): 2, ("beta",): 2}, lineages

    seen = {}
    for name, f in (("a", a), ("b", b)):
        where = ["--state", url] if name == "a" else []
        code, report = f.status(*where, "-w", str(f.ws), "--json")
        assert code == 0 and SECRET not in report, report
        seen[name] = json.loads(report)
        assert not any((f.runs / name_).exists() for name_ in STATE_FILES), f.runs
    assert {fl["flow"] for fl in seen["a"]["flowers"]} == {"alpha"}
    assert {fl["flow"] for fl in seen["b"]["flowers"]} == {"beta"}
    assert len(seen["a"]["flowers"]) == len(seen["b"]["flowers"]) == 2
    commands = _commands(pg_dsn)
    assert all("--state" in c and SECRET not in " ".join(c) for c in commands["alpha"]), commands
    assert all("--state" not in c for c in commands["beta"]), "from .env: found there again"


def _live(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            row = conn.execute(
                "SELECT count(*) FROM flower.registry WHERE record->>'state' = 'running'"
            ).fetchone()
        except psycopg.errors.UndefinedTable:
            return 0
    return int(row[0]) if row else 0


def _commands(dsn: str) -> dict[str, list[list[str]]]:
    """Each flow's resume commands, as the registry keeps them."""
    out: dict[str, list[list[str]]] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for flow, command in conn.execute(
            "SELECT record->>'flow', record->'command' FROM flower.registry"
        ):
            out.setdefault(flow, []).append(command)
    return out
