"""The brief, the goal and the verdict (seed 003, 文书): parse rules, states, files, round trips."""

from __future__ import annotations

import os
import random
import stat
from collections.abc import Iterable
from pathlib import Path

import pytest

from flower.docs import brief as brief_mod
from flower.docs import goal as goal_mod
from flower.docs import verdict as verdict_mod
from flower.docs.brief import HEADINGS, PLACEHOLDER, Brief
from flower.docs.goal import AMENDED, EMPTY, Goal
from flower.docs.verdict import (
    ACHIEVED,
    NOT_YET,
    STATES,
    UNREACHABLE,
    VAGUE_REASON,
    Verdict,
)

pytestmark = pytest.mark.timeout(60)

FULL = Brief(
    goal="做一个把 md 转成 html 的命令行工具,给写博客的人用",
    accept="- 跑 `python conv.py a.md` 产出 a.html\n- 输出里有 `<h1>`",
    bounds="不做 GUI,不做实时预览",
    unknowns="- 假设输入都是 UTF-8(没问到,超时)",
)


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


# --- Brief: headings ---------------------------------------------------------------------------


def test_brief_constants() -> None:
    assert list(HEADINGS.values()) == ["目标", "验收标准", "边界", "未知与假设"]
    assert list(brief_mod.SECTIONS) == ["goal", "accept", "bounds", "unknowns"]
    assert PLACEHOLDER == "(未填)"


def test_brief_parses_the_canonical_four_sections() -> None:
    text = "## 目标\nA\n\n## 验收标准\nB\n\n## 边界\nC\n\n## 未知与假设\nD\n"
    assert Brief.parse(text) == Brief(goal="A", accept="B", bounds="C", unknowns="D")


@pytest.mark.parametrize(
    "heading",
    [
        "## 边界",
        "# 边界",
        "###### 边界",
        "##边界",
        "**边界**",
        "**边界:**",
        "**边界**:",
        "__边界__",
        "【边界】",
        "边界:",
        "边界：",
        "边界",
        "3. 边界",
        "3、边界",
        "三、边界",
        "3) 边界：",
        "## 边界 (必填)",
        "## 边界（一句话）:",
        "## 边界 ##",
        "### 3. 边界:",
        "   ## 边界",
    ],
)
def test_brief_tolerates_heading_shapes(heading: str) -> None:
    text = f"## 目标\nA\n\n{heading}\n不做 GUI\n"
    assert Brief.parse(text).bounds == "不做 GUI"
    assert Brief.parse(text).goal == "A"


@pytest.mark.parametrize(
    ("line", "body"),
    [
        ("目标: 做一个 X", "做一个 X"),
        ("目标：做一个 X", "做一个 X"),
        ("**目标**:做一个 X", "做一个 X"),
        ("**目标:** 做一个 X", "做一个 X"),
        ("## 目标 做一个 X", "做一个 X"),
        ("【目标】做一个 X", "做一个 X"),
        ("1. 目标: 做一个 X", "做一个 X"),
    ],
)
def test_brief_takes_text_on_the_heading_line(line: str, body: str) -> None:
    brief = Brief.parse(f"{line}\n第二行\n## 边界\nC")
    assert brief.goal == f"{body}\n第二行"
    assert brief.bounds == "C"


@pytest.mark.parametrize(
    ("heading", "name"),
    [
        ("验收条件", "accept"),
        ("不做什么", "bounds"),
        ("未知项与假设", "unknowns"),
        ("未知", "unknowns"),
        ("假设", "unknowns"),
        ("Acceptance Criteria", "accept"),
        ("Goal", "goal"),
    ],
)
def test_brief_accepts_aliases(heading: str, name: str) -> None:
    brief = Brief.parse(f"## {heading}\n内容")
    assert getattr(brief, name) == "内容"
    assert [n for n in brief_mod.SECTIONS if getattr(brief, n)] == [name]


def test_brief_aliases_match_longest_first() -> None:
    # "未知" must not take the start of "未知与假设" and leave "与假设" in the body.
    assert Brief.parse("## 未知与假设\n假设 A").unknowns == "假设 A"
    assert Brief.parse("未知项与假设:假设 B").unknowns == "假设 B"
    assert Brief.parse("## 边界与范围\nC").bounds == "C"


def test_brief_a_heading_word_must_end_the_heading() -> None:
    text = "## 验收标准\n边界条件: 空输入报错\n目标看守会验这一条\n## 边界\nC"
    brief = Brief.parse(text)
    assert brief.accept == "边界条件: 空输入报错\n目标看守会验这一条"
    assert brief.bounds == "C"
    assert brief.goal == ""


def test_brief_a_longer_word_is_not_a_heading_even_when_strong() -> None:
    text = "## 目标\nA\n## 边界条件\nx\n**未知数**\ny"
    assert Brief.parse(text) == Brief(goal="A\n## 边界条件\nx\n**未知数**\ny")


def test_brief_list_items_and_own_section_words_stay_content() -> None:
    text = (
        "## 验收标准\n1. 目标 文件生成在 out/\n验收: 跑通 make\n"
        "**目标 没闭合的粗体不是标题\n## 目标\nA"
    )
    brief = Brief.parse(text)
    assert brief.accept == ("1. 目标 文件生成在 out/\n验收: 跑通 make\n**目标 没闭合的粗体不是标题")
    assert brief.goal == "A"


def test_brief_weak_heading_for_a_filled_section_is_content() -> None:
    text = "## 目标\nA\n## 验收标准\nB\n目标: 这是验收里的一行"
    brief = Brief.parse(text)
    assert brief.goal == "A"
    assert brief.accept == "B\n目标: 这是验收里的一行"


def test_brief_text_before_the_first_heading_is_ignored() -> None:
    text = "好的,问清楚了,确认书如下:\n\n## 目标\nA"
    assert Brief.parse(text) == Brief(goal="A")


# --- Brief: duplicates, placeholders, fences ---------------------------------------------------


def test_brief_duplicate_sections_first_non_empty_wins() -> None:
    text = "## 目标\n\n## 目标\n(未填)\n## 目标\nB\n## 目标\nC\n## 边界\nX\n## 边界\nY"
    brief = Brief.parse(text)
    assert brief.goal == "B"
    assert brief.bounds == "X"


def test_brief_placeholder_counts_as_missing() -> None:
    text = Brief(goal="A").to_markdown()
    assert text.count(PLACEHOLDER) == 3
    parsed = Brief.parse(text)
    assert parsed == Brief(goal="A")
    assert parsed.missing() == ["验收标准", "边界", "未知与假设"]
    assert not parsed.complete()
    # A person editing the file who leaves a placeholder (either width) has not filled it.
    edited = FULL.to_markdown().replace(FULL.bounds, "（未填）")
    assert Brief.parse(edited).missing() == ["边界"]


def test_brief_closed_fences_are_removed_with_their_headings() -> None:
    text = (
        "## 目标\nA\n```python\n## 边界\nprint('fake')\n```\n还是目标\n"
        "~~~\n## 未知与假设\nfake\n~~~\n## 验收标准\nB"
    )
    brief = Brief.parse(text)
    assert brief == Brief(goal="A\n还是目标", accept="B")


def test_brief_unclosed_fence_drops_the_rest() -> None:
    text = "## 目标\nA\n## 验收标准\nB\n```python\nimport os\n## 边界\nC\n## 未知与假设\nD\n"
    brief = Brief.parse(text)
    assert brief == Brief(goal="A", accept="B")
    assert brief.missing() == ["边界", "未知与假设"]
    assert not brief.complete()
    tilde = Brief.parse("## 目标\nA\n~~~~\n## 边界\nC\n~~~\n")  # a shorter ~~~ does not close
    assert tilde == Brief(goal="A")


def test_brief_fence_closer_must_match_the_opener() -> None:
    # ``` does not close ~~~, and a fence closed by a longer run of the same char is closed.
    assert Brief.parse("## 目标\nA\n~~~\n```\n~~~\n## 边界\nC").bounds == "C"
    assert Brief.parse("## 目标\nA\n```\nx\n`````\n## 边界\nC").bounds == "C"
    assert Brief.parse("## 目标\nA\n```\nx\n~~~\n## 边界\nC").bounds == ""


def test_brief_unclosed_markdown_fence_drops_the_rest_too() -> None:
    assert Brief.parse("## 目标\nA\n```markdown\n## 边界\nC\n") == Brief(goal="A")
    # Inside a markdown fence an unclosed code fence still ends the text (the bare ``` closes
    # the markdown fence, leaving ```python open inside it).
    text = "```md\n## 目标\nA\n```python\nx\n```\n## 边界\nC"
    assert Brief.parse(text) == Brief(goal="A")


def test_brief_inline_triple_backticks_are_not_a_fence() -> None:
    text = "## 目标\n```x``` 是行内代码\n## 边界\nC"
    assert Brief.parse(text) == Brief(goal="```x``` 是行内代码", bounds="C")


def test_brief_markdown_fence_is_unwrapped() -> None:
    inner = FULL.prompt_block()
    assert Brief.parse(f"```markdown\n{inner}\n```") == FULL
    assert Brief.parse(f"```\n{inner}\n```") == Brief()  # a bare fence is code


def test_brief_reads_crlf_text() -> None:
    assert Brief.parse(FULL.to_markdown().replace("\n", "\r\n")) == FULL


def test_brief_parse_of_nothing() -> None:
    assert Brief.parse("") == Brief()
    assert Brief.parse("随便说点什么,没有标题") == Brief()
    assert Brief().missing() == ["目标", "验收标准", "边界", "未知与假设"]


# --- Brief: forms and files --------------------------------------------------------------------


def test_brief_missing_and_complete() -> None:
    assert FULL.complete()
    assert FULL.missing() == []
    assert Brief(goal="A", accept=" \n", bounds="C").missing() == ["验收标准", "未知与假设"]


def test_brief_to_markdown_has_a_header_and_all_sections_in_order() -> None:
    md = FULL.to_markdown()
    assert md.startswith("# 需求确认书\n")
    at = [md.index(f"## {h}\n") for h in HEADINGS.values()]
    assert at == sorted(at)
    assert PLACEHOLDER not in md
    assert md.endswith("\n")


def test_brief_prompt_block_is_compact() -> None:
    block = Brief(goal="A", bounds="C").prompt_block()
    assert block == "## 目标\nA\n\n## 边界\nC"
    assert "需求确认书" not in FULL.prompt_block()
    assert Brief().prompt_block() == ""


def test_brief_write_is_owner_only_atomic_and_sets_path(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "需求.md"
    brief = Brief(goal="A", accept="B")
    out = brief.write(target)
    assert out == target.resolve()
    assert out.is_absolute()
    assert brief.path == out
    assert _mode(out) == 0o600
    assert _mode(tmp_path / "a") == 0o700
    assert _mode(tmp_path / "a" / "b") == 0o700
    assert out.read_text(encoding="utf-8") == brief.to_markdown()
    assert sorted(p.name for p in out.parent.iterdir()) == ["需求.md"]  # no temp file left
    os.chmod(out, 0o644)
    FULL.write(out)  # a rewrite replaces the file, owner-only again
    assert _mode(out) == 0o600
    assert Brief.load(out) == FULL


def test_brief_write_relative_path_resolves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    out = FULL.write("notes/需求.md")
    assert out == (tmp_path / "notes" / "需求.md").resolve()


def test_brief_load(tmp_path: Path) -> None:
    path = tmp_path / "需求.md"
    assert Brief.load(path) is None  # missing: None, no exception
    assert Brief.load(tmp_path) is None  # a directory cannot be read
    path.write_bytes(b"\xff\xfe\x00 not utf-8")
    assert Brief.load(path) is None
    path.write_text(Brief(goal="A", unknowns="D").to_markdown(), encoding="utf-8")
    loaded = Brief.load(str(path))
    assert loaded == Brief(goal="A", unknowns="D")
    assert loaded is not None and loaded.accept == "" and loaded.path == path.resolve()


def test_brief_path_takes_no_part_in_equality() -> None:
    assert Brief(goal="A", path=Path("/x")) == Brief(goal="A", path=Path("/y"))
    assert Brief(goal="A") != Brief(goal="B")


# --- Goal --------------------------------------------------------------------------------------

GOAL_FILE = """\
# 目标
让 conv.py 能把 md 转成 html。

# 判定清单
- 跑 `python conv.py a.md` 产出 a.html
* 输出里含 `<h1>`
1. 列表被转成 `<ul><li>`
2) 在 macOS 终端直接运行 [此环境无法验证:容器里没有 macOS]
"""


def test_goal_parses_the_file_form_and_strips_one_marker() -> None:
    goal = Goal.parse(GOAL_FILE)
    assert goal.statement == "让 conv.py 能把 md 转成 html。"
    assert goal.checks == [
        "跑 `python conv.py a.md` 产出 a.html",
        "输出里含 `<h1>`",
        "列表被转成 `<ul><li>`",
        "在 macOS 终端直接运行 [此环境无法验证:容器里没有 macOS]",
    ]
    assert Goal.parse("## 判定清单\n- - 嵌套的记号只去一层\n- 1.5 秒内返回").checks == [
        "- 嵌套的记号只去一层",
        "1.5 秒内返回",
    ]


def test_goal_tolerates_heading_shapes_like_the_brief() -> None:
    text = "目标:做 X\n\n**判定清单**\n\n- a\n\n- b\n(空)\n"
    assert Goal.parse(text) == Goal(statement="做 X", checks=["a", "b"])


def test_goal_unverifiable() -> None:
    goal = Goal(checks=["a", "b [此环境无法验证:没授权]", "c 【此环境无法验证：无屏幕】"])
    assert goal.unverifiable == ["b [此环境无法验证:没授权]", "c 【此环境无法验证：无屏幕】"]
    assert Goal(checks=["此环境无法验证这句话只是提到"]).unverifiable == []


def test_goal_missing_needs_both_parts() -> None:
    assert Goal().missing() == ["目标", "判定清单"]
    assert Goal(statement="X").missing() == ["判定清单"]
    assert Goal(checks=["a"]).missing() == ["目标"]
    assert Goal(statement="X", checks=["  "]).missing() == ["判定清单"]
    assert Goal(statement="X", checks=["a"]).complete()
    assert not Goal(statement="X").complete()


def test_goal_to_markdown_writes_empty_for_an_empty_list() -> None:
    md = Goal(statement="X").to_markdown()
    assert md == f"# 目标\nX\n\n# 判定清单\n{EMPTY}\n"
    assert EMPTY == "(空)"
    assert Goal.parse(md) == Goal(statement="X")
    assert Goal.parse(Goal().to_markdown()) == Goal()


def test_goal_prompt_block() -> None:
    assert Goal(statement="X", checks=["a", "b"]).prompt_block() == (
        "## 目标\nX\n\n## 判定清单\n- a\n- b"
    )
    assert Goal(checks=["a"]).prompt_block() == "## 判定清单\n- a"
    assert Goal().prompt_block() == ""


def test_goal_amend_appends_and_returns_self() -> None:
    goal = Goal(statement="做 X", checks=["a"])
    out = goal.amend("还要支持表格")
    assert out is goal
    assert goal.statement == "做 X\n\n(已修改)还要支持表格"
    assert AMENDED == "(已修改)"
    goal.amend("再加目录")
    assert goal.statement.startswith("做 X\n\n(已修改)还要支持表格")
    assert goal.statement.endswith("\n\n(已修改)再加目录")
    assert goal.checks == ["a"]
    assert Goal.parse(goal.to_markdown()) == goal


def test_goal_write_and_load(tmp_path: Path) -> None:
    target = tmp_path / "notes" / "目标.md"
    goal = Goal.parse(GOAL_FILE)
    out = goal.write(target)
    assert out == target.resolve() and goal.path == out
    assert _mode(out) == 0o600 and _mode(out.parent) == 0o700
    loaded = Goal.load(out)
    assert loaded == goal
    assert loaded is not None and loaded.path == out
    assert Goal.load(tmp_path / "nope.md") is None


# --- Verdict -----------------------------------------------------------------------------------


def test_verdict_constants() -> None:
    assert (ACHIEVED, NOT_YET, UNREACHABLE) == ("achieved", "not_yet", "unreachable")
    assert STATES == (ACHIEVED, NOT_YET, UNREACHABLE)
    assert list(verdict_mod.HEADINGS.values()) == ["结论", "理由", "未通过"]
    assert VAGUE_REASON == "判定者没给出明确结论,按未达成处理"


@pytest.mark.parametrize(
    ("word", "state"),
    [
        ("达成", ACHIEVED),
        ("已达成", ACHIEVED),
        ("achieved", ACHIEVED),
        ("未达成", NOT_YET),
        ("没达成", NOT_YET),
        ("部分达成", NOT_YET),
        ("没到", NOT_YET),
        ("not achieved", NOT_YET),
        ("Not Yet", NOT_YET),
        ("无法达成", UNREACHABLE),
        ("无法验证", UNREACHABLE),
        ("没法验证", UNREACHABLE),
        ("验证不了", UNREACHABLE),
        ("无法判定", UNREACHABLE),
        ("unverifiable", UNREACHABLE),
        ("Unverifiable", UNREACHABLE),
    ],
)
def test_verdict_state_words_under_a_heading(word: str, state: str) -> None:
    for text in (f"## 结论\n{word}\n\n## 理由\nr", f"结论:{word}\n理由:r", f"**判定**:{word}"):
        verdict = Verdict.parse(text)
        assert verdict.state == state, text
        assert verdict.ok


@pytest.mark.parametrize("word", ["无法验证", "没法验证", "验证不了", "无法判定", "unverifiable"])
def test_verdict_cannot_verify_is_unreachable_not_not_yet(word: str) -> None:
    verdict = Verdict.parse(f"## 结论\n{word}(这个环境是 Linux 容器,目标平台是 macOS)")
    assert verdict.unreachable
    assert verdict.state != NOT_YET
    assert not verdict.achieved


def test_verdict_step1_the_heading_section_decides() -> None:
    # The reason's words do not count once a conclusion section exists.
    text = "## 结论\n未达成\n\n## 理由\n大部分已经达成\n\n## 未通过\n- 第 2 条:没有 <h1>"
    verdict = Verdict.parse(text)
    assert verdict == Verdict(state=NOT_YET, reason="大部分已经达成", failed=["第 2 条:没有 <h1>"])
    # A conclusion section with nothing readable is vague even if the reason says 达成.
    vague = Verdict.parse("## 结论\n看起来可以\n## 理由\n达成")
    assert vague.state == "" and not vague.ok
    # An empty conclusion section does not fall back to the rest of the text.
    assert Verdict.parse("## 结论\n\n## 理由\n达成").state == ""


def test_verdict_step1_a_bare_word_under_the_heading_is_the_conclusion() -> None:
    # "未通过" alone is also the third section's heading; right under 结论 it is the conclusion.
    verdict = Verdict.parse("## 结论\n\n未通过\n\n## 理由\nr\n\n## 未通过\n- a")
    assert verdict == Verdict(state=NOT_YET, reason="r", failed=["a"])


@pytest.mark.parametrize(
    ("text", "state"),
    [
        ("1", ACHIEVED),
        (" true \n", ACHIEVED),
        ("TRUE", ACHIEVED),
        ("0", NOT_YET),
        ("false", NOT_YET),
    ],
)
def test_verdict_step2_a_bare_answer(text: str, state: str) -> None:
    verdict = Verdict.parse(text)
    assert verdict.state == state
    assert verdict.reason == ""


def test_verdict_step2_only_without_a_heading_section() -> None:
    # "true" as the whole conclusion section is not a state word and not a lone 1/0.
    assert Verdict.parse("## 结论\ntrue").state == ""
    assert Verdict.parse("## 结论\n1").state == ACHIEVED  # reached by step 4


def test_verdict_step3_words_longest_first() -> None:
    assert Verdict.parse("这一轮未达成,README 还缺安装步骤").state == NOT_YET
    assert Verdict.parse("判断:无法达成,缺 X 依赖").state == UNREACHABLE
    # The longest word wins wherever it sits, and on a tie the cautious state.
    assert Verdict.parse("达成了大半,但第 3 条无法验证").state == UNREACHABLE
    assert Verdict.parse("已达成。没有达成的只有文档").state == NOT_YET
    assert Verdict.parse("目标达成").state == ACHIEVED


def test_verdict_step3_length_before_caution_and_caution_on_a_tie() -> None:
    assert Verdict.parse("achieved; no test failed").state == ACHIEVED  # 8 letters before 6
    assert Verdict.parse("已达成一半,另一半未达成").state == NOT_YET  # 3 = 3: the cautious one
    assert Verdict.parse("没有达成,其中两条也无法验证").state == UNREACHABLE  # 4 = 4


def test_verdict_step3_ascii_words_are_whole_words() -> None:
    assert Verdict.parse("conclusion: achieved").state == ACHIEVED
    assert Verdict.parse("unachievedness is a made-up word").state == ""
    assert Verdict.parse("failure-free run, achieved").state == ACHIEVED


def test_verdict_step3_before_step4() -> None:
    assert Verdict.parse("未达成,1 条没过").state == NOT_YET
    assert Verdict.parse("达成,0 个问题").state == ACHIEVED


def test_verdict_step4_lone_digits() -> None:
    assert Verdict.parse("score 1 of 1").state == ACHIEVED
    assert Verdict.parse("result = 0").state == NOT_YET
    assert Verdict.parse("## 结论\n0\n## 理由\nx").state == NOT_YET
    assert Verdict.parse("第1条和第0条").state == ""  # digits inside words are not alone
    assert Verdict.parse("10 / 20").state == ""


@pytest.mark.parametrize(
    "text", ["", "看起来应该可以", "## 理由\n做得不错", "```\n达成\n```", "yes"]
)
def test_verdict_step5_nothing_readable_is_not_met(text: str) -> None:
    verdict = Verdict.parse(text)
    assert verdict.state == ""
    assert not verdict.ok
    assert not verdict.achieved
    assert not verdict.unreachable


def test_verdict_without_headings_keeps_the_text_as_reason() -> None:
    assert Verdict.parse("没到,还差 README") == Verdict(state=NOT_YET, reason="没到,还差 README")
    assert Verdict.parse("## 结论\n达成").reason == ""


def test_verdict_failed_items() -> None:
    text = "## 结论\n未达成\n## 未通过\n1. 第 2 条:没有 <h1>\n- 第 3 条\n\n* 第 4 条"
    assert Verdict.parse(text).failed == ["第 2 条:没有 <h1>", "第 3 条", "第 4 条"]
    assert Verdict.parse("## 结论\n达成\n## 未通过\n无").failed == []
    assert Verdict.parse("## 结论\n达成\n## 未通过\n- 无\n").failed == []


def test_verdict_properties() -> None:
    table = {
        ACHIEVED: (True, False, True),
        NOT_YET: (False, False, True),
        UNREACHABLE: (False, True, True),
        "": (False, False, False),
        "maybe": (False, False, False),
    }
    for state, expected in table.items():
        v = Verdict(state=state)
        assert (v.achieved, v.unreachable, v.ok) == expected, state


def test_verdict_feedback_gives_what_is_missing() -> None:
    verdict = Verdict(state=NOT_YET, reason="README 没写安装步骤", failed=["第 2 条", "第 5 条"])
    fb = verdict.feedback()
    assert "- 第 2 条\n- 第 5 条" in fb
    assert "README 没写安装步骤" in fb
    assert "接着做" in fb
    assert Verdict.parse(fb).state == NOT_YET  # it says "not met", never "met"
    bare = Verdict(state=NOT_YET).feedback()
    assert bare and "第 2 条" not in bare and "理由" not in bare


def test_verdict_to_markdown_form() -> None:
    md = Verdict(state=UNREACHABLE, reason="没有 macOS", failed=["a"]).to_markdown()
    assert md == "## 结论\n\n无法达成\n\n## 理由\n\n没有 macOS\n\n## 未通过\n\n- a\n"
    assert Verdict().to_markdown() == "## 结论\n\n(空)\n\n## 理由\n\n(空)\n\n## 未通过\n\n无\n"


# --- round trips over random documents ---------------------------------------------------------

_WORDS = [
    "做一个",
    "转换器",
    "用户",
    "支持",
    "表格",
    "UTF-8",
    "make test",
    "`python conv.py a.md`",
    "C#",
    "#42",
    "issue #7",
    "a # b",
    "达成",
    "未达成",
    "无法验证",
    "1",
    "0",
    "true",
    "目标",
    "边界",
    "结论",
    "判定清单",
    "**粗体**",
    "【注】",
    "(括号)",
    "(未填)",
    "(空)",
    "：",
    ":",
    "——",
    "~",
    "`",
    "foo",
    "bar_baz",
    "x > y",
    "<h1>",
    "1.5 秒",
    "[此环境无法验证:没授权]",
]
_PREFIXES = ["", "", "", "- ", "* ", "1. ", "2) ", "• ", "# ", "## 注意 ", "> ", "   ", "+ "]


def _aliases(*tables: dict[str, tuple[str, ...]]) -> list[str]:
    return [a.lower() for table in tables for aliases in table.values() for a in aliases]


ALIASES = {
    "brief": _aliases(brief_mod.SECTIONS),
    "goal": _aliases(goal_mod.SECTIONS),
    "verdict": _aliases(verdict_mod.SECTIONS),
}


def _could_be_heading(line: str, aliases: Iterable[str]) -> bool:
    """A line a document's content may not hold: one that starts like a section heading."""
    head = line.lstrip(" \t#*_【0123456789.、)）一二三四五六七八九十").lower()
    return any(head.startswith(a) for a in aliases)


def _line(rng: random.Random, aliases: list[str]) -> str:
    while True:
        words = rng.choices(_WORDS, k=rng.randint(1, 6))
        line = rng.choice(_PREFIXES) + rng.choice([" ", "", ","]).join(words)
        if not _could_be_heading(line, aliases) and not line.lstrip().startswith(("```", "~~~")):
            return line.rstrip()


def _text(rng: random.Random, aliases: list[str], *, empty: float = 0.25) -> str:
    if rng.random() < empty:
        return ""
    lines = [_line(rng, aliases) for _ in range(rng.randint(1, 5))]
    for _ in range(rng.randint(0, 2)):
        lines.insert(rng.randint(1, len(lines)), "")
    text = "\n".join(lines).strip()
    return "" if text in brief_mod.PLACEHOLDERS else text


def _items(rng: random.Random, *, nothing: frozenset[str] = frozenset()) -> list[str]:
    items = []
    for _ in range(rng.randint(0, 5)):
        item = _line(rng, []).strip()  # a "- " prefix keeps any item from being a heading
        if item and item not in brief_mod.PLACEHOLDERS and item.lower() not in nothing:
            items.append(item)
    return items


def _brief(rng: random.Random) -> Brief:
    a = ALIASES["brief"]
    return Brief(
        goal=_text(rng, a), accept=_text(rng, a), bounds=_text(rng, a), unknowns=_text(rng, a)
    )


def test_random_texts_are_adversarial() -> None:
    # The generators do reach the cases the round trips are meant to stress.
    rng = random.Random(7)
    texts = [_text(rng, ALIASES["brief"], empty=0) for _ in range(200)]
    joined = "\n".join(texts)
    for needle in ("\n- ", "\n1. ", "#", "\n\n", "未达成", "(未填)", "：", "目标"):
        assert needle in joined, needle
    items = [i for _ in range(200) for i in _items(rng)]
    assert any(i.startswith(("- ", "1. ", "# ")) for i in items)


def test_brief_round_trip_over_random_briefs() -> None:
    rng = random.Random(20240601)
    for _ in range(400):
        brief = _brief(rng)
        assert Brief.parse(brief.to_markdown()) == brief, brief
        assert Brief.parse(brief.prompt_block()) == brief, brief


def test_goal_round_trip_over_random_goals() -> None:
    rng = random.Random(1234)
    for _ in range(400):
        goal = Goal(
            statement=_text(rng, ALIASES["goal"]),
            checks=_items(rng),
        )
        assert Goal.parse(goal.to_markdown()) == goal, goal
        assert Goal.parse(goal.prompt_block()) == goal, goal


def test_verdict_round_trip_over_random_verdicts() -> None:
    rng = random.Random(99)
    nothing = frozenset({"无", "无。", "没有", "none", "n/a"})
    seen = set()
    for _ in range(400):
        verdict = Verdict(
            state=rng.choice(["", *STATES]),
            reason=_text(rng, ALIASES["verdict"]),
            failed=_items(rng, nothing=nothing),
        )
        seen.add(verdict.state)
        assert Verdict.parse(verdict.to_markdown()) == verdict, verdict
    assert seen == {"", *STATES}


def test_round_trip_through_files(tmp_path: Path) -> None:
    rng = random.Random(5)
    for i in range(20):
        brief = _brief(rng)
        assert Brief.load(brief.write(tmp_path / f"b{i}.md")) == brief
        goal = Goal(_text(rng, ALIASES["goal"]), _items(rng))
        assert Goal.load(goal.write(tmp_path / f"g{i}.md")) == goal


@pytest.mark.parametrize(
    ("conclusion", "state"),
    [
        ("达成\n上一轮未通过的两条这轮都过了", "achieved"),
        ("达成。\n无法验证的条目:无", "achieved"),
        ("**未达成**\n大部分达成了", "not_yet"),
        ("无法验证\n这里没有 macOS,其余都达成", "unreachable"),
        ("达成(上一轮未通过的两条这轮都过了)", "not_yet"),  # one line: the table decides
    ],
)
def test_a_first_line_that_is_one_state_word_decides(conclusion: str, state: str) -> None:
    assert Verdict.parse(f"## 结论\n{conclusion}\n## 理由\nx").state == state
