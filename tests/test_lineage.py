"""Lineage (runs/lineage.json): seed 000's two invariants and issue 2's promises.

Pure logic uses a fake ``has_session``; concurrency, hard kills and live holders use real
child processes (tests/fixtures/lineage_remember.py), each reaped by the ``procs`` fixture.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flower import RunDirBusy
from flower.state.lineage import LINEAGE_NAME, Lineage, bare_name
from flower.state.registry import FlowerRecord, Registry, new_run_id, process_started
from tests.fixtures.lineage_remember import session_id

FIXTURE = Path(__file__).parent / "fixtures" / "lineage_remember.py"
SID = "47395075-bec7-466e-80cd-f4d60b360235"


def spawn(procs: list, *args: str) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        [sys.executable, str(FIXTURE), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    procs.append(p)
    return p


def expect_line(p: subprocess.Popen[str], want: str) -> None:
    line = p.stdout.readline().strip()  # type: ignore[union-attr]
    assert line == want, f"child said {line!r}, expected {want!r} (exit {p.poll()})"


def write_file(run_dir: Path, doc: object) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / LINEAGE_NAME).write_text(json.dumps(doc), encoding="utf-8")


def on_disk(run_dir: Path) -> dict:
    return json.loads((run_dir / LINEAGE_NAME).read_text(encoding="utf-8"))


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    p = tmp_path / "proj"
    p.mkdir()
    return p


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    return tmp_path / "runs"


# -- names ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("label", "key"),
    [
        ("干活", "干活"),
        ("干活#retry2", "干活"),
        ("干活#round3", "干活"),
        ("确认需求#retry10", "确认需求"),
        ("干活·判定#1", None),
        ("干活·判定", None),
        ("a#b", "a#b"),  # a '#' that is not a retry/round suffix is part of the name
        ("", None),
    ],
)
def test_bare_name(label: str, key: str | None) -> None:
    assert bare_name(label) == key


# -- the happy path ---------------------------------------------------------------------


def test_first_wake_is_one_and_each_start_counts(ws: Path, runs: Path) -> None:
    assert Lineage.open(runs, ws).bump() == 1
    lin = Lineage.open(runs, ws)
    assert lin.bump() == 2
    assert lin.woke == 2
    assert on_disk(runs) == {"workspace": str(ws), "woke": 2, "steps": {}}


def test_remember_is_on_disk_at_once_and_next_process_gets_it(ws: Path, runs: Path) -> None:
    first = Lineage.open(runs, ws)
    first.bump()
    first.remember("取词", SID)
    assert on_disk(runs)["steps"] == {"取词": SID}  # written the instant, not at step end
    second = Lineage.open(runs, ws, has_session=lambda sid: sid == SID)
    assert second.load() == {"取词": SID}
    assert second.bump() == 2
    assert second.steps == {"取词": SID}


def test_relative_workspace_is_stored_absolute(ws: Path, runs: Path, monkeypatch) -> None:
    monkeypatch.chdir(ws.parent)
    lin = Lineage.open(runs, "proj")
    lin.bump()
    assert lin.workspace == ws
    assert on_disk(runs)["workspace"] == str(ws)


def test_suffixed_labels_land_under_the_bare_name(ws: Path, runs: Path) -> None:
    lin = Lineage.open(runs, ws)
    lin.remember("干活#retry2", "s-retry")
    assert on_disk(runs)["steps"] == {"干活": "s-retry"}
    lin.remember("干活#round3", "s-round")
    assert on_disk(runs)["steps"] == {"干活": "s-round"}
    assert "干活#retry2" not in on_disk(runs)["steps"]


def test_judge_label_never_lands(ws: Path, runs: Path) -> None:
    lin = Lineage.open(runs, ws)
    lin.remember("干活", SID)
    before = (runs / LINEAGE_NAME).read_bytes()
    lin.remember("干活·判定#1", "judge-session")
    assert (runs / LINEAGE_NAME).read_bytes() == before
    assert lin.steps == {"干活": SID}


def test_remember_keeps_what_other_flowers_wrote(ws: Path, runs: Path) -> None:
    a, b = Lineage.open(runs, ws), Lineage.open(runs, ws)
    a.bump()
    b.bump()
    a.remember("一", "sid-1")
    b.remember("二", "sid-2")
    a.remember("三", "sid-3")
    assert on_disk(runs) == {
        "workspace": str(ws),
        "woke": 2,
        "steps": {"一": "sid-1", "二": "sid-2", "三": "sid-3"},
    }


# -- 对不上就当没有,不报错 ----------------------------------------------------------------


def test_other_workspace_is_a_silent_fresh_start(ws: Path, runs: Path, tmp_path: Path) -> None:
    foreign = {"workspace": str(tmp_path / "elsewhere"), "woke": 7, "steps": {"干活": SID}}
    write_file(runs, foreign)
    lin = Lineage.open(runs, ws, has_session=lambda sid: True)
    assert lin.load() == {}
    assert lin.woke == 0
    assert lin.bump() == 1
    assert lin.steps == {}
    assert on_disk(runs) == {"workspace": str(ws), "woke": 1, "steps": {}}
    kept = list(runs.glob(f"{LINEAGE_NAME}.workspace-*"))  # moved aside, not lost
    assert len(kept) == 1 and json.loads(kept[0].read_text()) == foreign


def test_symlink_to_the_same_workspace_matches(ws: Path, runs: Path, tmp_path: Path) -> None:
    # The SDK keys sessions by the realpath, so a symlink reaches the same sessions.
    link = tmp_path / "link"
    link.symlink_to(ws)
    write_file(runs, {"workspace": str(link), "woke": 1, "steps": {"干活": SID}})
    assert Lineage.open(runs, ws).load() == {"干活": SID}


def test_session_gone_from_the_store_is_dropped(ws: Path, runs: Path) -> None:
    write_file(runs, {"workspace": str(ws), "woke": 2, "steps": {"活的": "alive", "死的": "gone"}})
    lin = Lineage.open(runs, ws, has_session=lambda sid: sid == "alive")
    assert lin.load() == {"活的": "alive"}
    assert lin.woke == 2
    assert lin.bump() == 3
    assert lin.steps == {"活的": "alive"}


def test_a_store_that_raises_is_not_session_gone(
    ws: Path, runs: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOWER_LANG", "en")  # the English texts are asserted

    # Issue 7: a store that cannot answer is not a session that is gone. The entry is kept
    # (the resume will say what is wrong if the store really is broken) and one line says so.
    def broken(sid: str) -> bool:
        raise RuntimeError("database is locked")

    write_file(runs, {"workspace": str(ws), "woke": 1, "steps": {"干活": SID}})
    with caplog.at_level(logging.WARNING, logger="flower"):
        assert Lineage(runs / LINEAGE_NAME, ws, has_session=broken).load() == {"干活": SID}
    (line,) = caplog.messages
    assert "干活" in line and SID in line and "database is locked" in line and "keeping it" in line


def test_every_fresh_start_says_why_in_one_line(
    ws: Path,
    runs: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Falling back quietly still happens, but never silently: one warning per case."""
    monkeypatch.setenv("FLOWER_LANG", "en")  # the English texts are asserted
    runs.mkdir()
    (runs / LINEAGE_NAME).write_bytes(b"{not json")
    with caplog.at_level(logging.WARNING, logger="flower"):
        Lineage.open(runs, ws).bump()
    (line,) = caplog.messages
    (aside,) = runs.glob(f"{LINEAGE_NAME}.corrupt-*")
    assert "not valid JSON" in line and str(aside) in line and "starts fresh" in line

    caplog.clear()
    write_file(runs, {"workspace": str(tmp_path / "moved"), "woke": 4, "steps": {"a": SID}})
    with caplog.at_level(logging.WARNING, logger="flower"):
        Lineage.open(runs, ws).bump()
    (line,) = caplog.messages
    assert str(tmp_path / "moved") in line and "starts fresh" in line

    caplog.clear()
    write_file(runs, {"workspace": str(ws), "woke": 1, "steps": {"a": "gone-sid", "b": SID}})
    with caplog.at_level(logging.WARNING, logger="flower"):
        lin = Lineage.open(runs, ws, has_session=lambda sid: sid != "gone-sid")
        assert lin.bump(["a", "b"]) == 2
    assert lin.steps == {"b": SID}
    (line,) = caplog.messages
    (copy,) = runs.glob(f"{LINEAGE_NAME}.gone-*")
    assert "'a' (gone-sid)" in line and str(copy) in line and "new session" in line
    assert json.loads(copy.read_text())["steps"]["a"] == "gone-sid"  # the old id is kept
    assert copy.stat().st_mode & 0o777 == 0o600


def test_a_gone_session_of_another_flow_is_not_this_flows_business(
    ws: Path, runs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_file(runs, {"workspace": str(ws), "woke": 1, "steps": {"theirs": "gone-sid"}})
    with caplog.at_level(logging.WARNING, logger="flower"):
        Lineage.open(runs, ws, has_session=lambda sid: False).bump(["mine"])
    assert caplog.messages == [] and not list(runs.glob(f"{LINEAGE_NAME}.gone-*"))
    assert on_disk(runs)["steps"] == {"theirs": "gone-sid"}  # never dropped from the file


def test_a_failed_lineage_write_warns_once(
    ws: Path, runs: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    lin = Lineage.open(runs, ws)
    lin.bump()

    def full(*_a: object, **_k: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("flower.state.lineage.atomic_write_text", full)
    with caplog.at_level(logging.WARNING, logger="flower"):
        lin.remember("一", "sid-1")
        lin.remember("二", "sid-2")
    (line,) = caplog.messages
    assert "No space left on device" in line and str(runs / LINEAGE_NAME) in line
    assert lin.steps == {"一": "sid-1", "二": "sid-2"}  # the run goes on with what it knows


GOOD = {"workspace": "WS", "woke": 3, "steps": {"干活": SID}}


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        json.dumps(GOOD).encode()[:25],  # truncated mid-write by something that is not us
        b"",
        b"[]",
        b'"just a string"',
        b"\xff\xfe not utf-8",
        json.dumps({**GOOD, "workspace": 5}).encode(),
        json.dumps({**GOOD, "woke": "3"}).encode(),
        json.dumps({**GOOD, "woke": True}).encode(),
        json.dumps({**GOOD, "woke": -1}).encode(),
        json.dumps({**GOOD, "steps": ["干活", SID]}).encode(),
    ],
    ids=[
        "garbage",
        "truncated",
        "empty",
        "array",
        "string",
        "not-utf8",
        "workspace-int",
        "woke-str",
        "woke-bool",
        "woke-negative",
        "steps-list",
    ],
)
def test_broken_file_is_a_silent_fresh_start(ws: Path, runs: Path, content: bytes) -> None:
    runs.mkdir()
    content = content.replace(b"WS", str(ws).encode())
    (runs / LINEAGE_NAME).write_bytes(content)
    lin = Lineage.open(runs, ws, has_session=lambda sid: True)
    assert lin.load() == {}
    assert lin.woke == 0
    assert (runs / LINEAGE_NAME).read_bytes() == content  # load() writes nothing
    assert lin.bump() == 1
    assert on_disk(runs) == {"workspace": str(ws), "woke": 1, "steps": {}}
    kept = list(runs.glob(f"{LINEAGE_NAME}.corrupt-*"))
    assert [p.read_bytes() for p in kept] == [content]


def test_wrong_typed_entries_are_dropped_the_rest_kept(ws: Path, runs: Path) -> None:
    write_file(runs, {"workspace": str(ws), "woke": 1, "steps": {"a": 5, "b": "", "c": SID}})
    assert Lineage.open(runs, ws).load() == {"c": SID}


def test_load_never_writes(ws: Path, tmp_path: Path) -> None:
    runs = tmp_path / "never"
    assert Lineage.open(runs, ws).load() == {}
    assert not runs.exists()


# -- writes that must never fail a step -------------------------------------------------


def test_run_dir_under_a_regular_file_does_not_raise(ws: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    lin = Lineage.open(blocker / "runs", ws)  # mkdir fails with ENOTDIR, even for root
    assert lin.bump() == 1
    lin.remember("干活", SID)
    assert lin.steps == {"干活": SID}
    assert lin.load() == {}


def _writes_blocked_by_mode(d: Path) -> bool:
    """chmod 0500 stops writes unless we are privileged (root ignores it)."""
    probe = d / ".probe"
    try:
        probe.write_text("x")
    except PermissionError:
        return True
    probe.unlink()
    return False


def test_read_only_run_dir_does_not_raise(ws: Path, runs: Path) -> None:
    lin = Lineage.open(runs, ws)
    lin.bump()
    lin.remember("一", "sid-1")
    before = (runs / LINEAGE_NAME).read_bytes()
    runs.chmod(0o500)
    try:
        if not _writes_blocked_by_mode(runs):
            pytest.skip("running privileged: chmod 0500 does not stop writes here")
        again = Lineage.open(runs, ws)
        assert again.bump() == 2  # counted in memory, from what could be read
        again.remember("二", "sid-2")
        assert again.steps == {"一": "sid-1", "二": "sid-2"}
    finally:
        runs.chmod(0o700)
    assert (runs / LINEAGE_NAME).read_bytes() == before


def test_full_disk_or_any_oserror_is_swallowed(ws: Path, runs: Path, monkeypatch) -> None:
    import flower.state.lineage as mod

    def no_space(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(mod, "atomic_write_text", no_space)
    lin = Lineage.open(runs, ws)
    assert lin.bump() == 1
    lin.remember("干活", SID)
    assert lin.steps == {"干活": SID}


# -- processes --------------------------------------------------------------------------


@pytest.mark.timeout(120)  # 4 interpreters start and each does 25 locked read-merge-writes
def test_concurrent_flowers_lose_no_entries(ws: Path, runs: Path, procs: list) -> None:
    kids = [spawn(procs, str(runs), str(ws), f"p{k}-", "25", "60", "--wait") for k in range(4)]
    for p in kids:
        expect_line(p, "ready")
    for p in kids:
        p.stdin.write("go\n")  # type: ignore[union-attr]
        p.stdin.flush()  # type: ignore[union-attr]
    for p in kids:
        expect_line(p, "done")
        assert p.wait(timeout=30) == 0
    steps = on_disk(runs)["steps"]
    want = {f"p{k}-{i}": session_id(f"p{k}-", i, 0, 60) for k in range(4) for i in range(25)}
    assert steps == want


@pytest.mark.timeout(
    180
)  # 20-120 rounds of: start a child, let it rewrite 1 MB a few times, kill it
def test_sigkill_mid_write_leaves_old_or_new_never_torn(ws: Path, runs: Path, procs: list) -> None:
    rng = random.Random(20260907)
    count, payload = 10, 100_000  # a ~1 MB file: each replace takes a while to write
    seen_gens: set[int] = set()
    killed_mid_write = 0
    # Random kill instants; keep going (bounded) until some landed inside a write, so the
    # check below is never vacuous on a machine whose timing differs from this one.
    for n in range(120):
        if n >= 20 and killed_mid_write >= 2 and len(seen_gens) > 1:
            break
        p = spawn(procs, str(runs), str(ws), "s", str(count), str(payload), "--loop")
        expect_line(p, "looping")
        deadline = time.monotonic() + rng.uniform(0.0, 0.1)  # one write round takes ~50 ms
        while time.monotonic() < deadline and p.poll() is None:
            pass  # busy-wait: the kill must land at a random instant of the write loop
        p.kill()
        p.wait(timeout=10)
        leftovers = list(runs.glob(f".{LINEAGE_NAME}.*.tmp"))
        killed_mid_write += bool(leftovers)
        for tmp in leftovers:
            tmp.unlink()
        doc = on_disk(runs)  # must parse: an atomic replace leaves old or new, never half
        assert doc["workspace"] == str(ws)
        assert set(doc["steps"]) == {f"s{i}" for i in range(count)}
        for i in range(count):
            sid = doc["steps"][f"s{i}"]
            gen = int(sid.split(":")[1])
            assert sid == session_id("s", i, gen, payload)
            seen_gens.add(gen)
    assert len(seen_gens) > 1  # the kills landed at different points of the loop
    assert killed_mid_write > 0  # ... and some inside a write (its temp file was left behind)


def test_wake_clears_temp_files_of_killed_writers(ws: Path, runs: Path) -> None:
    runs.mkdir()
    stale = runs / f".{LINEAGE_NAME}.4242.123456789.tmp"
    stale.write_text('{"workspace": "half')
    Lineage.open(runs, ws).bump()
    assert not stale.exists()


def _hold_record(runs: Path, workspace: Path, p: subprocess.Popen) -> FlowerRecord:
    rec = FlowerRecord(
        run=new_run_id(),
        flow="starter",
        pid=p.pid,
        pid_started=process_started(p.pid),
        workspace=str(workspace),
        started_at=time.time(),
    )
    Registry(runs).write(rec)
    return rec


def test_live_flower_of_another_workspace_refuses_then_dead_one_does_not(
    ws: Path, runs: Path, tmp_path: Path, procs: list
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    write_file(runs, {"workspace": str(other), "woke": 4, "steps": {"干活": SID}})
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, text=True
    )
    procs.append(holder)
    _hold_record(runs, other, holder)

    with pytest.raises(RunDirBusy) as err:
        Lineage.open(runs, ws).bump()
    one_line = err.value.one_line()
    assert str(holder.pid) in one_line and str(other) in one_line and "--run-dir" in one_line
    assert "\n" not in one_line
    assert on_disk(runs)["workspace"] == str(other)  # their lineage untouched

    holder.kill()
    holder.wait(timeout=10)
    lin = Lineage.open(runs, ws)
    assert lin.bump() == 1
    assert on_disk(runs) == {"workspace": str(ws), "woke": 1, "steps": {}}


def test_live_flower_of_the_same_workspace_or_ourselves_does_not_refuse(
    ws: Path, runs: Path, procs: list
) -> None:
    write_file(runs, {"workspace": str(ws), "woke": 1, "steps": {}})
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, text=True
    )
    procs.append(holder)
    _hold_record(runs, ws, holder)
    assert Lineage.open(runs, ws).bump() == 2
    # Our own record (by run id) never blocks us, even if it names a different workspace.
    mine = FlowerRecord(
        run=new_run_id(),
        flow="x",
        pid=os.getpid(),
        pid_started=process_started(os.getpid()),
        workspace="/somewhere/else",
        started_at=time.time(),
    )
    Registry(runs).write(mine)
    write_file(runs, {"workspace": "/somewhere/else", "woke": 9, "steps": {}})
    assert Lineage.open(runs, ws, run_id=mine.run).bump() == 1


# -- files ------------------------------------------------------------------------------


def test_files_are_owner_only(ws: Path, runs: Path) -> None:
    old = os.umask(0o022)
    try:
        lin = Lineage.open(runs, ws)
        lin.bump()
        lin.remember("干活", SID)
    finally:
        os.umask(old)
    assert stat.S_IMODE(runs.stat().st_mode) == 0o700
    assert stat.S_IMODE((runs / LINEAGE_NAME).stat().st_mode) == 0o600
    assert stat.S_IMODE((runs / f"{LINEAGE_NAME}.lock").stat().st_mode) == 0o600


def test_archive_moves_the_three_files_and_resets(ws: Path, runs: Path) -> None:
    lin = Lineage.open(runs, ws)
    lin.bump()
    lin.remember("干活", SID)
    (ws / "需求.md").write_text("# 需求\n", encoding="utf-8")
    (ws / "目标.md").write_text("# 目标\n", encoding="utf-8")
    (runs / "sessions.db").write_bytes(b"archive, never touched")
    lineage_bytes = (runs / LINEAGE_NAME).read_bytes()
    archive = ws / "notes" / "archive"

    into = lin.archive(archive, extra=[ws / "需求.md", ws / "目标.md", ws / "absent.md"])

    assert into.parent == archive and re.fullmatch(r"\d{8}-\d{6}(-\d+)?", into.name)
    assert sorted(p.name for p in into.iterdir()) == sorted([LINEAGE_NAME, "需求.md", "目标.md"])
    assert (into / LINEAGE_NAME).read_bytes() == lineage_bytes
    assert (into / "需求.md").read_text(encoding="utf-8") == "# 需求\n"
    assert stat.S_IMODE(into.stat().st_mode) == 0o700
    assert not (runs / LINEAGE_NAME).exists()
    assert (runs / "sessions.db").read_bytes() == b"archive, never touched"
    assert (lin.steps, lin.woke) == ({}, 0)
    assert Lineage.open(runs, ws).load() == {}
    assert lin.bump() == 1


def test_archive_never_overwrites_and_with_nothing_creates_nothing(ws: Path, runs: Path) -> None:
    archive = ws / "notes" / "archive"
    lin = Lineage.open(runs, ws)
    lin.remember("一", "sid-1")
    first = lin.archive(archive)
    lin.remember("二", "sid-2")
    second = lin.archive(archive)  # within the same second: a -2 directory, nothing replaced
    assert first != second
    assert json.loads((first / LINEAGE_NAME).read_text())["steps"] == {"一": "sid-1"}
    assert json.loads((second / LINEAGE_NAME).read_text())["steps"] == {"二": "sid-2"}
    assert not lin.archive(archive).exists()


def test_a_gone_session_is_reported_once_then_dropped(
    ws: Path, runs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_file(runs, {"workspace": str(ws), "woke": 1, "steps": {"a": "gone-sid", "b": SID}})
    alive = lambda sid: sid != "gone-sid"  # noqa: E731 - a one-line stand-in for the store
    with caplog.at_level(logging.WARNING, logger="flower"):
        Lineage.open(runs, ws, has_session=alive).bump(["a", "b"])
        assert on_disk(runs)["steps"] == {"b": SID}  # the copy beside it keeps "a"
        Lineage.open(runs, ws, has_session=alive).bump(["a", "b"])
    assert len(caplog.messages) == 1 and len(list(runs.glob(f"{LINEAGE_NAME}.gone-*"))) == 1
