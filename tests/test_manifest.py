"""Manifest (runs/manifest.json): append-only, shared by concurrent flowers, never torn for readers.

Writer processes are real (tests/fixtures/manifest_writer.py) and reaped by ``procs``.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import random
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import flower.state.manifest as mod
from flower.state.manifest import (
    MANIFEST_NAME,
    FileManifestRows,
    Manifest,
    decode,
    deferred_signals,
    manifest_row,
    read_manifest,
)
from flower.state.result import STEP_RESULT_FIELDS, StepResult
from tests.fixtures.manifest_writer import row_result, row_text

FIXTURE = Path(__file__).parent / "fixtures" / "manifest_writer.py"
OLD_RUN = "20260101-000000-aaaaaa"


def spawn(procs: list, runs: Path, run_id: str, count: int, size: int, *flags: str):
    p = subprocess.Popen(
        [sys.executable, str(FIXTURE), str(runs), run_id, str(count), str(size), *flags],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    procs.append(p)
    return p


def expect_line(p: subprocess.Popen[str], want: str) -> None:
    line = p.stdout.readline().strip()  # type: ignore[union-attr]
    assert line == want, f"child said {line!r}, expected {want!r} (exit {p.poll()})"


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    return tmp_path / "runs"


def old_history(runs: Path, n: int = 5) -> list[bytes]:
    """n rows of an earlier run, written by the real writer; returns their raw lines."""
    m = Manifest(runs, OLD_RUN)
    for i in range(n):
        m.record(row_result(OLD_RUN, i, 300))
    lines = raw_lines(runs)
    assert len(lines) == n
    return lines


def raw_lines(runs: Path) -> list[bytes]:
    """The row lines of a canonical manifest, without the separating commas."""
    data = (runs / MANIFEST_NAME).read_bytes()
    return [line.rstrip(b",") for line in data.split(b"\n")[1:-2]]


def assert_run_rows(rows: list[dict], run_id: str, count: int, size: int) -> None:
    mine = [r for r in rows if r["run"] == run_id]
    assert [r["step"] for r in mine] == [f"s{i}" for i in range(count)]
    for i, r in enumerate(mine):
        assert r["text"] == row_text(run_id, i, size)
        assert r["ended_at"] == 2.0 + i and r["duration_s"] == 1.0 + i


# -- rows -------------------------------------------------------------------------------


def test_row_is_every_stepresult_field_plus_duration_and_run(runs: Path) -> None:
    result = StepResult(
        step="干活#retry1",
        session_id="sid",
        ok=True,
        cost_usd=0.41,
        num_turns=3,
        text="完成\n",
        started_at=100.0,
        ended_at=112.5,
        attempts=2,
        errors=["API Error: 529"],
        resumed=True,
        retired=["old-sid"],
        context=80_200,
    )
    row = Manifest(runs, "20260907-010203-abcdef").record(result)
    assert set(row) == set(STEP_RESULT_FIELDS) | {"duration_s", "run"}
    assert row == manifest_row(result, "20260907-010203-abcdef")
    assert row["duration_s"] == 12.5 and row["run"] == "20260907-010203-abcdef"
    assert json.loads((runs / MANIFEST_NAME).read_text(encoding="utf-8")) == [row]
    assert read_manifest(runs) == [row]


def test_layout_is_one_row_per_line(runs: Path) -> None:
    m = Manifest(runs, "r")
    for i in range(3):
        m.record(StepResult(step=f"s{i}", text="多行\n文本"))
    lines = (runs / MANIFEST_NAME).read_bytes().split(b"\n")
    assert lines[0] == b"[" and lines[-2:] == [b"]", b""] and len(lines) == 6


def test_empty_or_missing_manifest_reads_as_no_rows(runs: Path) -> None:
    assert read_manifest(runs) == []
    runs.mkdir()
    (runs / MANIFEST_NAME).write_bytes(b"")  # a crash between create and first write
    assert read_manifest(runs) == []
    Manifest(runs, "r").record(StepResult(step="a"))
    assert [r["step"] for r in read_manifest(runs)] == ["a"]
    assert not list(runs.glob(f"{MANIFEST_NAME}.*-*"))  # nothing needed setting aside


def test_text_with_lone_surrogates_is_written_not_crashed(runs: Path) -> None:
    Manifest(runs, "r").record(StepResult(step="a", text="broken \ud800 output"))
    assert read_manifest(runs)[0]["text"] == "broken \ud800 output"


# -- several writers --------------------------------------------------------------------


@pytest.mark.timeout(180)  # 4 writer processes x 200 fsynced rows on a 2-core machine
def test_concurrent_writer_processes_lose_and_change_nothing(runs: Path, procs: list) -> None:
    old = old_history(runs)
    ids = [f"20260907-12000{k}-00000{k}" for k in range(4)]
    kids = [spawn(procs, runs, run_id, 200, 400, "--wait") for run_id in ids]
    for p in kids:
        expect_line(p, "ready")
    for p in kids:  # release them together: real overlap
        p.stdin.write("go\n")
        p.stdin.flush()
    for p in kids:
        expect_line(p, "first")
        expect_line(p, "done")
        assert p.wait(timeout=60) == 0

    rows = json.loads((runs / MANIFEST_NAME).read_bytes())
    assert len(rows) == 5 + 4 * 200
    for run_id in ids:
        assert_run_rows(rows, run_id, 200, 400)
    assert raw_lines(runs)[:5] == old  # the earlier run's rows, byte for byte
    runs_in_order = [r["run"] for r in rows[5:]]
    switches = sum(a != b for a, b in itertools.pairwise(runs_in_order))
    assert switches > 3  # the writers really interleaved


@pytest.mark.timeout(120)  # two writer processes while this process reads in a loop
def test_readers_concurrent_with_writers_always_parse(runs: Path, procs: list, caplog) -> None:
    old_history(runs)
    kids = [spawn(procs, runs, f"w{k}", 150, 3000, "--wait") for k in range(2)]
    for p in kids:
        expect_line(p, "ready")
    for p in kids:
        p.stdin.write("go\n")
        p.stdin.flush()
    counts = []
    with caplog.at_level(logging.WARNING, logger="flower"):
        while any(p.poll() is None for p in kids) or len(counts) < 5:
            rows = read_manifest(runs)
            assert all(
                r["text"] == row_text(r["run"], int(r["step"][1:]), 3000)
                for r in rows
                if r["run"] != OLD_RUN
            )
            counts.append(len(rows))
        counts.append(len(read_manifest(runs)))  # after both have exited
    for p in kids:
        assert p.wait(timeout=60) == 0
    assert not caplog.records
    assert counts == sorted(counts) and counts[-1] == 5 + 300
    assert len(set(counts)) > 2  # we did read while rows were being added


# -- damage -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "what"),
    [
        (b'[\n{"step": "a", "run": "x"},\n{"step": "b", "ru', "truncated mid-row, no tail"),
        (b"{not json at all", "garbage"),
        (b'{"step": "a", "run": "x"}', "an object, not an array"),
        (b"[1, 2, 3]", "an array of non-rows"),
        (b'"text"', "a string"),
        (b"\x00\x00\x00\x00", "zero bytes"),
    ],
)
def test_corrupt_file_is_set_aside_intact_and_a_fresh_one_started(
    runs: Path, content: bytes, what: str, caplog
) -> None:
    runs.mkdir()
    (runs / MANIFEST_NAME).write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="flower"):
        Manifest(runs, "r").record(StepResult(step="new"))
    aside = [
        p
        for p in runs.iterdir()
        if p.name.startswith(f"{MANIFEST_NAME}.") and not p.name.endswith(".lock")
    ]
    assert len(aside) == 1, what
    assert aside[0].read_bytes() == content  # never deleted, bytes intact
    rows = json.loads((runs / MANIFEST_NAME).read_bytes())
    kept = [r["step"] for r in rows]
    assert kept[-1] == "new"
    warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warning) == 1
    assert str(runs / MANIFEST_NAME) in warning[0] and str(aside[0]) in warning[0]
    assert "\n" not in warning[0]


def test_torn_last_append_reads_as_the_whole_rows_and_is_repaired(
    runs: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOWER_LANG", "en")  # the English texts are asserted
    old = old_history(runs, 3)
    whole = (runs / MANIFEST_NAME).read_bytes()
    late = json.dumps({"step": "late", "run": "dead", "text": "x" * 50}).encode()
    extra = b",\n" + late + b"\n]\n"
    at = len(whole) - 3
    for cut in range(1, len(extra)):  # every point a killed multi-page pwrite may stop at
        torn = whole[:at] + extra[:cut] + whole[at + cut :]
        (runs / MANIFEST_NAME).write_bytes(torn)
        entries, verdict = decode(torn)
        assert verdict in ("torn", "layout", None), cut
        assert [raw for raw, _ in entries][:3] == old
        assert [r["run"] for r in read_manifest(runs)][:3] == [OLD_RUN] * 3
    (runs / MANIFEST_NAME).write_bytes(whole[:at] + extra[:20])
    with caplog.at_level(logging.WARNING, logger="flower"):
        Manifest(runs, "next").record(StepResult(step="after"))
    data = (runs / MANIFEST_NAME).read_bytes()
    assert [r["step"] for r in json.loads(data)] == ["s0", "s1", "s2", "after"]
    assert raw_lines(runs)[:3] == old
    (aside,) = runs.glob(f"{MANIFEST_NAME}.torn-*")
    assert aside.read_bytes() == whole[:at] + extra[:20]
    assert "cut short" in caplog.records[0].getMessage()


def test_garbage_in_the_middle_is_corruption_not_a_torn_tail() -> None:
    data = b'[\n{"a": 1},\nnot a row\n{"b": 2}\n]\n'
    assert decode(data) == ([], "corrupt")


@pytest.mark.timeout(180)  # 20 rounds of: start a writer, let it append big rows, kill -9
def test_sigkill_in_a_write_loop_never_leaves_an_unreadable_file(
    runs: Path, procs: list, caplog
) -> None:
    """A kill leaves the old file, the new one, or (a multi-page pwrite cut short by
    SIGKILL, which Linux allows) whole rows plus a partial tail that readers skip and the
    next writer repairs. Never anything a reader fails on, never a lost earlier row."""
    rng = random.Random(6)
    old = old_history(runs, 3)
    size = 200_000  # multi-page rows make a cut-short write possible at all
    for k in range(20):
        p = spawn(procs, runs, f"k{k}", -1, size)
        expect_line(p, "first")
        deadline = time.monotonic() + rng.uniform(0.0, 0.05)
        while time.monotonic() < deadline and p.poll() is None:
            pass  # busy-wait: kill at a random instant of the write loop
        p.kill()
        p.wait(timeout=10)
        entries, verdict = decode((runs / MANIFEST_NAME).read_bytes())
        assert verdict in (None, "torn"), k
        rows = read_manifest(runs)
        assert [raw for raw, _ in entries][:3] == old
        for r in rows[3:]:
            assert r["text"] == row_text(r["run"], int(r["step"][1:]), size)
        done = [r["run"] for r in rows]
        for j in range(k):
            assert f"k{j}" in done  # every earlier writer's first row survived
    with caplog.at_level(logging.WARNING, logger="flower"):
        Manifest(runs, "final").record(StepResult(step="end"))
    assert json.loads((runs / MANIFEST_NAME).read_bytes())[-1]["step"] == "end"


def test_pretty_printed_by_hand_keeps_every_row(runs: Path) -> None:
    old_history(runs, 3)
    before = json.loads((runs / MANIFEST_NAME).read_bytes())
    (runs / MANIFEST_NAME).write_text(json.dumps(before, indent=4, ensure_ascii=False))
    Manifest(runs, "r").record(StepResult(step="new"))
    after = json.loads((runs / MANIFEST_NAME).read_bytes())
    assert after[:3] == before and after[3]["step"] == "new"
    assert decode((runs / MANIFEST_NAME).read_bytes())[1] is None  # canonical again
    assert not list(runs.glob(f"{MANIFEST_NAME}.*-*"))


def test_file_replaced_under_a_running_writer_is_noticed(runs: Path) -> None:
    m = Manifest(runs, "r")
    m.record(StepResult(step="a"))
    rows = json.loads((runs / MANIFEST_NAME).read_bytes())
    rows.insert(0, {"step": "added by hand", "run": "person"})
    (runs / MANIFEST_NAME).write_text(json.dumps(rows, indent=2))  # same size is unlikely
    m.record(StepResult(step="b"))
    assert [r["step"] for r in read_manifest(runs)] == ["added by hand", "a", "b"]


def test_own_rows_come_back_after_the_file_was_set_aside(runs: Path) -> None:
    m = Manifest(runs, "mine")
    m.record(StepResult(step="a"))
    m.record(StepResult(step="b"))
    (runs / MANIFEST_NAME).write_bytes(b"garbage")  # someone broke it; next write sets it aside
    Manifest(runs, "theirs").record(StepResult(step="x"))
    m.record(StepResult(step="c"))
    assert [(r["run"], r["step"]) for r in read_manifest(runs)] == [
        ("theirs", "x"),
        ("mine", "a"),
        ("mine", "b"),
        ("mine", "c"),
    ]


def test_failed_write_leaves_the_file_valid_and_lands_later(runs: Path, monkeypatch) -> None:
    m = Manifest(runs, "r")
    m.record(StepResult(step="a"))
    before = (runs / MANIFEST_NAME).read_bytes()
    real_fsync = os.fsync

    def disk_full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(mod.os, "fsync", disk_full)
    with pytest.raises(OSError):
        m.record(StepResult(step="b"))
    monkeypatch.setattr(mod.os, "fsync", real_fsync)
    assert (runs / MANIFEST_NAME).read_bytes() == before  # the overwritten tail was put back
    m.record(StepResult(step="c"))
    assert [r["step"] for r in read_manifest(runs)] == ["a", "b", "c"]


# -- speed (counted, not timed: timing belongs to scripts/bench_manifest.py) -------------


def test_steady_state_write_reads_only_what_others_appended(runs: Path, monkeypatch) -> None:
    old_history(runs, 50)
    other = Manifest(runs, "other")
    m = Manifest(runs, "r")
    m.record(StepResult(step="first"))  # one full validation per object
    full_passes = []
    real_full = FileManifestRows._full_pass  # the file's own writer (Manifest keeps rows there)
    monkeypatch.setattr(
        FileManifestRows,
        "_full_pass",
        lambda self, *a: (full_passes.append(1), real_full(self, *a)),
    )
    read_sizes = []
    real_pread = mod._pread_all
    monkeypatch.setattr(
        mod, "_pread_all", lambda fd, n, off: (read_sizes.append(n), real_pread(fd, n, off))[1]
    )
    for i in range(20):
        other.record(StepResult(step=f"o{i}"))
        m.record(StepResult(step=f"m{i}"))
    assert full_passes == [1]  # only `other`'s first write
    big = os.path.getsize(runs / MANIFEST_NAME)
    assert max(read_sizes[2:]) < big // 10


def test_a_new_manifest_object_per_write_stays_fast(runs: Path, monkeypatch) -> None:
    """Runtime builds a Manifest per write; objects of one run share what they know."""
    old_history(runs, 20)
    full_passes = []
    real_full = FileManifestRows._full_pass  # the file's own writer (Manifest keeps rows there)
    monkeypatch.setattr(
        FileManifestRows,
        "_full_pass",
        lambda self, *a: (full_passes.append(1), real_full(self, *a)),
    )
    for i in range(10):
        Manifest(runs, "per-write").record(StepResult(step=f"s{i}"))
    assert full_passes == [1]
    assert [r["step"] for r in read_manifest(runs)][20:] == [f"s{i}" for i in range(10)]


# -- signals and files ------------------------------------------------------------------


def test_signal_handler_writing_mid_write_does_not_clobber(runs: Path, monkeypatch) -> None:
    """rescue() on SIGTERM writes the manifest from a handler; it must not land mid-append."""
    m = Manifest(runs, "r")
    m.record(StepResult(step="a"))
    fired = []

    def handler(signum, frame) -> None:
        fired.append(signum)
        m.record(StepResult(step="rescued", error="killed-by-signal"))

    real_pwrite = mod._pwrite_all

    def pwrite_after_signal(fd: int, data: bytes, offset: int) -> None:
        if not fired:
            os.kill(os.getpid(), signal.SIGUSR1)  # arrives between our offset and our write
            assert not fired  # held back until the write is done
        real_pwrite(fd, data, offset)

    old = signal.signal(signal.SIGUSR1, handler)
    try:
        monkeypatch.setattr(mod, "_pwrite_all", pwrite_after_signal)
        m.record(StepResult(step="b"))
        deadline = time.monotonic() + 5
        while not fired and time.monotonic() < deadline:
            time.sleep(0.001)
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert [r["step"] for r in read_manifest(runs)] == ["a", "b", "rescued"]


def test_deferred_signals_run_after_the_block() -> None:
    got = []
    old = signal.signal(signal.SIGUSR2, lambda s, f: got.append(s))
    try:
        with deferred_signals():
            os.kill(os.getpid(), signal.SIGUSR2)
            for _ in range(1000):
                pass
            assert got == []
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            time.sleep(0.001)
    finally:
        signal.signal(signal.SIGUSR2, old)
    assert got == [signal.SIGUSR2]


def test_files_are_owner_only(runs: Path) -> None:
    old = os.umask(0o022)
    try:
        Manifest(runs, "r").record(StepResult(step="a"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(runs.stat().st_mode) == 0o700
    assert stat.S_IMODE((runs / MANIFEST_NAME).stat().st_mode) == 0o600
    assert stat.S_IMODE((runs / f"{MANIFEST_NAME}.lock").stat().st_mode) == 0o600


def test_rewritten_file_is_owner_only(runs: Path) -> None:
    runs.mkdir(mode=0o700)
    (runs / MANIFEST_NAME).write_text("[]")  # not canonical: the writer replaces it
    os.chmod(runs / MANIFEST_NAME, 0o644)
    Manifest(runs, "r").record(StepResult(step="a"))
    assert stat.S_IMODE((runs / MANIFEST_NAME).stat().st_mode) == 0o600


def test_reader_threads_and_writer_threads_share_the_lock(runs: Path) -> None:
    errors: list[BaseException] = []

    def write(run_id: str) -> None:
        try:
            m = Manifest(runs, run_id)
            for i in range(30):
                m.record(StepResult(step=f"s{i}"))
        except BaseException as exc:  # noqa: BLE001 - surfaced below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(f"t{k}",)) for k in range(3)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        read_manifest(runs)
    for t in threads:
        t.join()
    assert not errors
    rows = read_manifest(runs)
    for k in range(3):
        assert [r["step"] for r in rows if r["run"] == f"t{k}"] == [f"s{i}" for i in range(30)]
