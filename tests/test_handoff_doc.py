"""The handoff document, HandoffPolicy and default_window (seed 003: 换代, 文书)."""

from __future__ import annotations

import os
import stat
from dataclasses import fields
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flower.docs.handoff import (
    HANDOFF_PROMPT,
    HEADINGS,
    PLACEHOLDER,
    SECTIONS,
    Handoff,
    degraded,
    is_overflow,
)
from flower.step.window import HandoffPolicy, default_window

FULL = Handoff(
    doing="给解析器加代码块高亮,做了一半",
    decided="用 pygments,不自己写词法",
    deadends="markdown-it 的插件在 3.x 上装不上",
    next="跑 pytest tests/test_highlight.py,修剩下两个失败",
    scene="改过 md2html.py;产出在 .flower/artifacts/out.html",
    step="干活",
)


# --- HandoffPolicy / default_window ------------------------------------------------------------


def test_policy_defaults_and_thresholds() -> None:
    p = HandoffPolicy(window=1_000_000)
    assert (p.enabled, p.headroom, p.max_generations) == (True, 50_000, 8)
    assert p.at == 950_000
    assert p.warn_at == 930_000
    p = HandoffPolicy(window=200_000, headroom=30_000)
    assert (p.at, p.warn_at) == (170_000, 150_000)


def test_policy_floors() -> None:
    p = HandoffPolicy(window=40_000)  # window - headroom < 10_000
    assert p.at == 10_000
    assert p.warn_at == 1_000  # at - 20_000 < 1_000
    p = HandoffPolicy(window=75_000)
    assert (p.at, p.warn_at) == (25_000, 5_000)


def test_policy_window_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_MODEL", "claude-haiku-4-5")
    assert HandoffPolicy().window == 200_000
    monkeypatch.setenv("ANTHROPIC_MODEL", "claude-sonnet-4-5[1m]")
    assert HandoffPolicy().window == 1_000_000


@pytest.mark.parametrize(
    ("model", "window"),
    [
        ("claude-sonnet-4-5[1m]", 1_000_000),
        ("opus[1m]", 1_000_000),
        ("claude-sonnet-4-5-1m", 1_000_000),
        ("claude-haiku-4-5-20251001", 200_000),
        ("claude-3-5-haiku-latest", 200_000),
        ("haiku", 200_000),
        ("claude-3-7-sonnet-20250219", 200_000),
        ("claude-3-opus-20240229", 200_000),
        ("claude-opus-4-20250514", 200_000),
        ("claude-opus-4-1-20250805", 200_000),
        ("claude-opus-4-5", 200_000),
        ("anthropic.claude-opus-4-1-20250805-v1:0", 200_000),
        ("claude-opus-4-6", 1_000_000),
        ("claude-sonnet-4-5-20250929", 1_000_000),
        ("claude-sonnet-4-6", 1_000_000),
        ("opus", 1_000_000),
        ("some-gateway-model", 1_000_000),
        ("", 1_000_000),
    ],
)
def test_default_window_guesses(monkeypatch: pytest.MonkeyPatch, model: str, window: int) -> None:
    monkeypatch.delenv("ANTHROPIC_DEFAULT_OPUS_MODEL", raising=False)
    monkeypatch.setenv("ANTHROPIC_MODEL", model)
    assert default_window() == window


def test_default_window_falls_back_to_the_opus_model_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ANTHROPIC_MODEL", raising=False)
    monkeypatch.delenv("ANTHROPIC_DEFAULT_OPUS_MODEL", raising=False)
    assert default_window() == 1_000_000  # unset: the aggressive guess
    monkeypatch.setenv("ANTHROPIC_DEFAULT_OPUS_MODEL", "claude-opus-4-1")
    assert default_window() == 200_000
    monkeypatch.setenv("ANTHROPIC_MODEL", "claude-haiku-4-5")
    monkeypatch.setenv("ANTHROPIC_DEFAULT_OPUS_MODEL", "claude-opus-4-6[1m]")
    assert default_window() == 200_000  # ANTHROPIC_MODEL wins


# --- parse -------------------------------------------------------------------------------------


def test_section_table_matches_the_dataclass() -> None:
    assert set(SECTIONS) == {f.name for f in fields(Handoff)} - {"step", "path"}
    assert list(HEADINGS.values()) == ["在做什么", "已经定下的", "走不通的路", "下一步", "现场"]


@pytest.mark.parametrize(
    "text",
    [
        "## 在做什么\n写解析器\n\n## 下一步\n跑测试\n",
        "# 在做什么\n写解析器\n### 下一步\n跑测试",
        "**在做什么**\n写解析器\n**下一步**\n跑测试",
        "**在做什么:**\n写解析器\n**下一步：**\n跑测试",
        "在做什么:写解析器\n下一步：跑测试",
        "在做什么：\n写解析器\n下一步:\n跑测试",
        "1. 在做什么\n写解析器\n2. 下一步\n跑测试",
        "1、在做什么:写解析器\n4) 下一步:跑测试",
        "【在做什么】写解析器\n【下一步】跑测试",
        "## 在做什么 写解析器\n## 下一步 跑测试",
        "## 正在做什么\n写解析器\n## 接下来\n跑测试",
        "## Doing\n写解析器\n## Next steps\n跑测试",
        "好的,下面是交接书。\n\n## 在做什么(必填)\n写解析器\n## 下一步\n跑测试",
    ],
)
def test_heading_styles(text: str) -> None:
    h = Handoff.parse(text)
    assert (h.doing, h.next) == ("写解析器", "跑测试")
    assert h.complete()


def test_all_five_sections_and_aliases() -> None:
    h = Handoff.parse(
        "## 当前任务\nA\n## 已经决定的\nB\n## 踩过的坑\nC\n## 下一步做什么\nD\n## 现场状态\nE"
    )
    assert (h.doing, h.decided, h.deadends, h.next, h.scene) == ("A", "B", "C", "D", "E")
    assert h.sections() == ["在做什么", "已经定下的", "走不通的路", "下一步", "现场"]


def test_longer_alias_wins_over_its_prefix() -> None:
    h = Handoff.parse("## 下一步做什么\n跑测试\n## 现场状态\n干净")
    assert h.next == "跑测试"  # not "做什么\n跑测试"
    assert h.scene == "干净"


def test_body_lines_that_start_with_a_section_word_stay_content() -> None:
    h = Handoff.parse(
        "## 已经定下的\n决定用 SQLite\n决定:不做缓存\n1. 下一步 先不管\n- 现场:别动\n"
        "## 在做什么\n迁移\n## 下一步\n写迁移脚本"
    )
    assert h.decided == "决定用 SQLite\n决定:不做缓存\n1. 下一步 先不管\n- 现场:别动"
    assert (h.doing, h.next) == ("迁移", "写迁移脚本")


def test_duplicate_section_takes_the_first_with_content() -> None:
    h = Handoff.parse("## 下一步\n\n## 在做什么\nX\n## 下一步\n第二个\n## 下一步\n第三个")
    assert h.next == "第二个"
    h = Handoff.parse("## 下一步\n第一个\n## 下一步\n第二个\n## 在做什么\nX")
    assert h.next == "第一个"


def test_missing_required_sections() -> None:
    h = Handoff.parse("## 已经定下的\n用 pygments\n## 现场\n见 notes/")
    assert h.missing() == ["在做什么", "下一步"]
    assert not h.complete()
    h = Handoff.parse("## 在做什么\n迁移")
    assert h.missing() == ["下一步"]
    assert Handoff.parse("").missing() == ["在做什么", "下一步"]
    assert Handoff.parse("just chatter, no headings").missing() == ["在做什么", "下一步"]


def test_placeholder_counts_as_missing() -> None:
    h = Handoff.parse(Handoff(doing="迁移").to_markdown())
    assert h.next == "" and h.missing() == ["下一步"]
    assert PLACEHOLDER in Handoff(doing="迁移").to_markdown()


def test_closed_fences_are_dropped_with_the_headings_inside_them() -> None:
    # api.md: Handoff.parse reuses the brief's section splitter, which strips fenced code
    # blocks first (HANDOFF_PROMPT asks for commands and paths in plain lines).
    text = (
        "## 在做什么\n迁移\n## 现场\n跑到一半的命令:\n```bash\n# 下一步\nmake migrate\n```\n"
        "## 下一步\n看日志"
    )
    h = Handoff.parse(text)
    assert h.scene == "跑到一半的命令:"
    assert h.next == "看日志"


def test_reads_like_the_brief_a_fence_inside_a_section_and_the_reference_headings() -> None:
    """The reference's handoff (api.md: "reuses Brief's section splitter"): a fenced block
    inside a section is no part of it, a heading in the fence starts nothing, and its own
    headings (``## 现在在做什么`` …) name the sections."""
    text = (
        "好,交接如下。\n"
        "## 现在在做什么\n给 Makefile 加 macOS 的垫片头。\n"
        "## 已经定下的\n不改业务源码(边界里说过)。\n"
        "```make\n## 下一步 围栏里的假标题\nCFLAGS += -include shim.h\n```\n"
        "## 走不通的路\n- 关掉 _ANSI_SOURCE:别的宏也跟着没了\n- 调 include 顺序:没用\n"
        "## 下一步\n在干净的 clone 上跑 make。\n"
        "## 现场\nsrc/proc.cpp, Makefile\n"
    )
    h = Handoff.parse(text, step="干活")
    assert h.doing == "给 Makefile 加 macOS 的垫片头。"
    assert h.decided == "不改业务源码(边界里说过)。"
    assert h.next == "在干净的 clone 上跑 make。"
    assert len(h.deadends.splitlines()) == 2 and h.scene == "src/proc.cpp, Makefile"
    assert h.complete()
    for heading, field in (
        ("现在在做", "doing"),
        ("当前进度", "doing"),
        ("已定的事", "decided"),
        ("试过不行的", "deadends"),
        ("排除的路", "deadends"),
    ):
        assert getattr(Handoff.parse(f"## {heading}\nX"), field) == "X", heading


def test_markdown_fence_and_whole_reply_fence_are_unwrapped() -> None:
    for fence in ("```markdown", "```md", "~~~markdown", "```"):
        close = fence[:3]
        h = Handoff.parse(f"{fence}\n## 在做什么\n迁移\n## 下一步\n看日志\n{close}\n")
        assert (h.doing, h.next) == ("迁移", "看日志"), fence


def test_unclosed_fence_drops_everything_from_it_on() -> None:
    text = "## 在做什么\n迁移\n## 现场\n代码如下\n```python\nprint('x')\n## 下一步\n看日志\n"
    h = Handoff.parse(text)
    assert h.doing == "迁移"
    assert h.scene == "代码如下"
    assert h.next == "" and not h.complete()
    # a shorter or different closing mark does not close the fence
    h = Handoff.parse("## 在做什么\n迁移\n````\nx\n```\n~~~~\n## 下一步\n看日志")
    assert h.next == ""


def test_title_line_gives_the_step() -> None:
    h = Handoff.parse("# 交接书 · 干活·判定#2\n\n## 在做什么\nX\n## 下一步\nY")
    assert h.step == "干活·判定#2"
    assert Handoff.parse("# 交接书\n## 在做什么\nX").step == ""


def test_round_trip_through_markdown() -> None:
    assert Handoff.parse(FULL.to_markdown()) == FULL
    sparse = Handoff(doing="迁移", next="看日志")
    assert Handoff.parse(sparse.to_markdown()) == sparse
    multiline = Handoff(doing="第一行\n\n第三行", next="- a\n- b\n  - c", scene="见 notes/\n# x")
    assert Handoff.parse(multiline.to_markdown()) == multiline
    # A fenced block is no part of a section (it is stripped before the sections are read).
    fenced = Handoff(doing="迁移", next="看日志", scene="改过 a.py\n```\n# x\n```")
    assert Handoff.parse(fenced.to_markdown()).scene == "改过 a.py"


_BODY = st.text(alphabet="甲乙丙丁戊己庚辛壬癸 ,。0123456789\n", max_size=80).map(str.strip)


@given(
    _BODY, _BODY, _BODY, _BODY, _BODY, st.text(alphabet="干活取词ab#", max_size=8).map(str.strip)
)
def test_round_trip_property(
    doing: str, decided: str, deadends: str, nxt: str, scene: str, step: str
) -> None:
    h = Handoff(doing=doing, decided=decided, deadends=deadends, next=nxt, scene=scene, step=step)
    assert Handoff.parse(h.to_markdown()) == h


# --- prompt_block / prompts / overflow ----------------------------------------------------------


def test_prompt_block_tells_the_successor_and_lists_sections() -> None:
    block = FULL.prompt_block()
    assert "接手「干活」" in block and "上下文快满了" in block
    for heading in HEADINGS.values():
        assert f"## {heading}" in block
    assert FULL.next in block and FULL.scene in block
    sparse = Handoff(doing="迁移", next="看日志").prompt_block()
    assert "## 走不通的路" not in sparse and "## 下一步\n看日志" in sparse


def test_handoff_prompt_formats_and_names_every_section() -> None:
    text = HANDOFF_PROMPT.format(used="812,345", window="1,000,000")
    assert "812,345" in text and "1,000,000" in text
    assert "{" not in text
    for heading in HEADINGS.values():
        assert f"## {heading}" in text
    # the model's reply in exactly that shape parses back complete
    echoed = Handoff.parse(HANDOFF_PROMPT.format(used=1, window=2))
    assert echoed.sections() == list(HEADINGS.values())


@pytest.mark.parametrize(
    "text",
    [
        "Prompt is too long",
        'API Error: 400 {"type":"error","error":{"type":"invalid_request_error",'
        '"message":"prompt is too long: 210843 tokens > 200000 maximum"}}',
        "This model's maximum context length is 200000 tokens",
        "context_length_exceeded",
        "Context length exceeded",
        "too many total text bytes: 9000000 > 8000000",
        "input length and `max_tokens` exceed context limit: 188240 + 21333 > 200000",
        "input length and max_tokens exceed context limit",
    ],
)
def test_is_overflow_matches(text: str) -> None:
    assert is_overflow(text)
    assert is_overflow(None, "", text)


def test_is_overflow_rejects_other_errors() -> None:
    assert not is_overflow("API Error: Connection refused", None, "")
    assert not is_overflow()


# --- degraded ----------------------------------------------------------------------------------


def test_degraded_is_complete_and_bounded() -> None:
    task = "任" * 1000 + "务" * 1000 + "尾巴"
    h = degraded("干活", task, why="API 报 prompt is too long,会话写不出交接书")
    assert h.complete() and h.step == "干活"
    assert task[:1200] in h.scene and task[:1201] not in h.scene and "尾巴" not in h.scene
    assert "prompt is too long" in h.scene
    assert len(h.scene) < 1200 + 200
    bare = degraded("干活", "短任务")
    assert "短任务" in bare.scene and "原因" not in bare.scene
    assert Handoff.parse(h.to_markdown()) == h


# --- write / load ------------------------------------------------------------------------------


def test_write_is_private_and_loads_back(tmp_path: Path) -> None:
    target = tmp_path / "notes" / "交接-干活.md"
    assert FULL.write(target) == target
    assert FULL.path == target
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(target.parent).st_mode) == 0o700
    loaded = Handoff.load(target)
    assert loaded == FULL and loaded is not None and loaded.path == target
    assert not list(target.parent.glob(".*.tmp"))


def test_write_archives_the_old_handoff(tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    target = notes / "交接-干活.md"
    first = Handoff(doing="第一代", next="A", step="干活")
    second = Handoff(doing="第二代", next="B", step="干活")
    third = Handoff(doing="第三代", next="C", step="干活")
    first.write(target)
    second.write(target)
    third.write(target)
    archive = notes / "archive" / "交接"
    old = sorted(archive.iterdir())
    assert len(old) == 2
    assert all(p.name.startswith("交接-干活-") and p.suffix == ".md" for p in old)
    assert {h.doing for h in map(Handoff.load, old) if h} == {"第一代", "第二代"}
    assert Handoff.load(target) == third
    assert stat.S_IMODE(os.stat(archive).st_mode) == 0o700
    third.write(target)  # the same text again: nothing new to archive
    assert len(list(archive.iterdir())) == 2


def test_write_takes_an_archive_dir(tmp_path: Path) -> None:
    target = tmp_path / "交接-x.md"
    Handoff(doing="1", next="1").write(target, archive_dir=tmp_path / "old")
    Handoff(doing="2", next="2").write(target, archive_dir=tmp_path / "old")
    archived = [Handoff.load(p) for p in (tmp_path / "old").iterdir()]
    assert [h.doing for h in archived if h] == ["1"] and len(archived) == 1


def test_load_missing_or_unreadable(tmp_path: Path) -> None:
    assert Handoff.load(tmp_path / "nope.md") is None
    bad = tmp_path / "bad.md"
    bad.write_bytes(b"\xff\xfe\x00garbage")
    assert Handoff.load(bad) is None
    assert Handoff.load(tmp_path) is None  # a directory
