"""The workbench: where it is, what its index says, and that no file in it — however named
or whatever it holds — can break the index or the system prompt built from it."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from flower.agents.workbench import Workbench

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    (tmp_path / "ws").mkdir()
    return tmp_path / "ws"


def test_paths_are_resolved_and_derived(ws: Path, tmp_path: Path) -> None:
    wb = Workbench(ws / "sub" / "..")
    assert wb.workspace == ws.resolve()
    assert wb.root == ws.resolve() / ".flower" and not wb.external
    assert (wb.scripts, wb.artifacts, wb.notes, wb.index_path) == (
        wb.root / "scripts",
        wb.root / "artifacts",
        wb.root / "notes",
        wb.root / "INDEX.md",
    )
    assert Workbench(ws, dirname="bench").root == ws.resolve() / "bench"
    away = Workbench(ws, dirname="ignored", home=tmp_path / "run" / "." / "workbench")
    assert away.root == (tmp_path / "run" / "workbench").resolve() and away.external


def test_show_is_relative_inside_and_absolute_outside(ws: Path, tmp_path: Path) -> None:
    wb = Workbench(ws)
    assert wb.show(wb.notes / "a.md") == ".flower/notes/a.md"
    assert wb.show(tmp_path / "elsewhere.txt") == str(tmp_path / "elsewhere.txt")
    away = Workbench(ws, home=tmp_path / "wb")
    assert away.show(away.notes) == str(tmp_path.resolve() / "wb" / "notes")


def test_ensure_makes_owner_only_directories(ws: Path) -> None:
    wb = Workbench(ws)
    assert wb.ensure() is wb
    for d in (wb.root, wb.scripts, wb.artifacts, wb.notes):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    assert wb.ensure() is wb  # again: nothing to do, nothing raised


def test_scan_is_recursive_sorted_and_skips_dot_names(ws: Path) -> None:
    wb = Workbench(ws).ensure()
    b = "# desc: 第二个\nprint(2)\n"
    (wb.scripts / "b.py").write_text(b)
    (wb.scripts / "a.sh").write_text("echo hi\n")
    (wb.scripts / "deep" / "er").mkdir(parents=True)
    c = "-- desc: 查订单\nselect 1;\n"
    (wb.scripts / "deep" / "er" / "c.sql").write_text(c)
    (wb.scripts / ".hidden.py").write_text("# desc: no\n")
    (wb.scripts / ".cache").mkdir()
    (wb.scripts / ".cache" / "visible-name.py").write_text("# desc: no\n")
    assert wb.scan(wb.scripts) == [
        (".flower/scripts/a.sh", "", 8),
        (".flower/scripts/b.py", "第二个", len(b.encode())),
        (".flower/scripts/deep/er/c.sql", "查订单", len(c.encode())),
    ]
    assert wb.scan(wb.root / "missing") == []


@pytest.mark.parametrize(
    ("text", "desc"),
    [
        ("# desc: 统计日志里的错误\nimport sys\n", "统计日志里的错误"),
        ("// desc: build the bundle\nconst x = 1;\n", "build the bundle"),
        ("-- desc: 月度汇总\nselect 1;\n", "月度汇总"),
        ("#!/usr/bin/env python\n# a comment\n" + "x = 1\n" * 5 + "# desc: line 8\n", "line 8"),
        ("#!/bin/sh\n" + "true\n" * 7 + "# desc: line 9 is too late\n", ""),
        ("#!/bin/sh\n# -*- coding: utf-8 -*-\n\n# 清理临时文件\nrm -f /tmp/x\n", "清理临时文件"),
        ('"""Fetch the data.\n\nMore words.\n"""\n', "Fetch the data."),
        ('"""\n    Opens on its own line.\n"""\n', "Opens on its own line."),
        ("'''Short.'''\nx = 1\n", "Short."),
        ("# 决定:用 SQLite 而不是 JSON\n\n理由……\n", "决定:用 SQLite 而不是 JSON"),
        ("---\ntitle: x\n---\nbody\n", ""),
        ("plain text, no comment\n", ""),
        ("", ""),
        ("# desc:\n# fallback comment\n", "fallback comment"),
    ],
)
def test_the_description_rules(ws: Path, text: str, desc: str) -> None:
    wb = Workbench(ws).ensure()
    (wb.scripts / "f").write_text(text, encoding="utf-8")
    assert wb.scan(wb.scripts)[0][1] == desc


def test_a_description_is_cut_at_100_characters(ws: Path) -> None:
    wb = Workbench(ws).ensure()
    (wb.notes / "long.md").write_text("# desc: " + "长" * 300 + "\n", encoding="utf-8")
    desc = wb.scan(wb.notes)[0][1]
    assert len(desc) == 100 and desc.endswith("…") and desc.startswith("长" * 99)


def test_binary_and_undecodable_files_are_harmless(ws: Path) -> None:
    wb = Workbench(ws).ensure()
    (wb.artifacts / "img.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR")
    (wb.artifacts / "latin1.txt").write_bytes(b"# caf\xe9 r\xe9sum\xe9\n")
    (wb.artifacts / "ctl.txt").write_bytes(b"# tab\there\x1b[31m red\n")
    found = {Path(p).name: desc for p, desc, _ in wb.scan(wb.artifacts)}
    assert found["img.png"] == ""
    assert found["latin1.txt"].startswith("caf")
    assert "\x1b" not in found["ctl.txt"] and "\t" not in found["ctl.txt"]
    wb.index_path.parent.mkdir(exist_ok=True)
    assert "img.png" in wb.refresh()


def test_oddly_named_and_unusual_files_never_break_anything(ws: Path) -> None:
    wb = Workbench(ws).ensure()
    (wb.notes / "line\nbreak.md").write_text("# 换行的名字\n")
    (wb.notes / "`tick` and | pipe.md").write_text("# 反引号\n")
    (wb.notes / ("n" * 200 + ".md")).write_text("x\n")
    os.mkfifo(wb.notes / "fifo")  # opening it would block: never opened
    (wb.notes / "dangling").symlink_to(wb.root / "nowhere")
    (wb.notes / "loop").symlink_to(wb.notes, target_is_directory=True)
    raw = os.fsencode(wb.notes) + b"/bad\xff\xfename.md"  # not UTF-8
    with open(raw, "wb") as f:
        f.write(b"# desc: bytes name\n")

    names = [Path(p).name for p, _, _ in wb.scan(wb.notes)]
    assert len(names) == 4 and "line\nbreak.md" in names
    text = wb.refresh()
    assert wb.index_path.read_text(encoding="utf-8") == text
    block = wb.prompt_block()
    for out in (text, block):
        assert "line\\nbreak.md" in out and "bad\\xff\\xfename.md" in out
        out.encode("utf-8")  # valid UTF-8 throughout
    entries = [line for line in text.splitlines() if line.startswith("- ")]
    assert len(entries) == 4


def test_refresh_lists_everything_and_returns_the_file(ws: Path) -> None:
    wb = Workbench(ws, max_index_entries=3)
    text = wb.refresh()  # creates what is missing
    assert wb.index_path.read_text(encoding="utf-8") == text
    assert stat.S_IMODE(wb.index_path.stat().st_mode) == 0o600
    assert text.count("(空)") == 3
    for i in range(5):
        (wb.scripts / f"s{i}.py").write_text(f"# desc: 脚本 {i}\n")
    (wb.root / "spill").mkdir()
    (wb.root / "spill" / "0123456789abcdef.txt").write_text("spilled")
    text = wb.refresh()
    assert all(f"脚本 {i}" in text for i in range(5))  # the cap is the prompt's only
    assert "spill" not in text
    size = len("# desc: 脚本 0\n".encode())
    assert f"- `.flower/scripts/s0.py` — 脚本 0 ({size} 字节)" in text


def test_refresh_on_an_unwritable_index_warns_and_returns_the_text(
    ws: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOWER_LANG", "en")  # the English texts are asserted
    wb = Workbench(ws).ensure()
    (wb.notes / "n.md").write_text("# 一个决定\n")
    wb.index_path.mkdir()
    with caplog.at_level(logging.WARNING, logger="flower"):
        text = wb.refresh()
    assert "一个决定" in text
    assert "not written" in caplog.text


def test_prompt_block_says_the_three_rules_with_the_real_paths(ws: Path) -> None:
    block = Workbench(ws).prompt_block()
    assert block.startswith("## 工作台")
    assert "`.flower/scripts/`" in block and "# desc:" in block
    assert "2000 字符" in block and "`.flower/artifacts/`" in block and "结论" in block
    assert "`.flower/notes/`" in block and "一个决定一个文件" in block
    assert "绝对路径" not in block
    assert block.count(" 空") == 3


def test_prompt_block_caps_each_category(ws: Path) -> None:
    wb = Workbench(ws, max_index_entries=40).ensure()
    for i in range(45):
        (wb.scripts / f"s{i:02d}.py").write_text(f"# desc: 第 {i} 个\n")
    (wb.notes / "only.md").write_text("# 唯一的决定\n")
    block = wb.prompt_block()
    assert "第 39 个" in block and "第 40 个" not in block
    assert "… 还有 5 个" in block
    assert "唯一的决定" in block and block.count("还有") == 1
    assert "第 44 个" in wb.refresh()


def test_an_external_workbench_says_to_use_absolute_paths(ws: Path, tmp_path: Path) -> None:
    wb = Workbench(ws, home=tmp_path / "run" / "workbench")
    block = wb.prompt_block()
    assert "绝对路径" in block
    assert f"`{tmp_path.resolve() / 'run' / 'workbench' / 'scripts'}/`" in block
