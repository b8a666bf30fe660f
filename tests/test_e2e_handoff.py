"""Handoff (换代) inside a step, end to end with the real CLI and the scripted model server.

When the context a turn reports crosses ``HandoffPolicy.at``, the SAME session is asked to
write its handoff (``HANDOFF_PROMPT``), the handoff is saved under the workbench's notes,
and a NEW session continues with ``Handoff.prompt_block()`` as its first message. A 400
"prompt is too long" hands off on the spot with the ``degraded()`` document. None of it
uses an attempt; ``max_generations`` bounds it.

``ANTHROPIC_MODEL=claude-haiku-4-5`` makes ``default_window()`` 200K (at = 150K, warn at
130K). Nothing here switches the CLI's own auto-compaction off: ``Runtime(handoff=True)``
does that itself (``CompactPolicy(mode="no_summary")``), so flower's handoff is the one that
happens; and for a model whose window ``default_window()`` guesses wrong (Sonnet 4.5: 200K in
this CLI, 1M guessed), each attempt learns the real window from the CLI.
"""

from __future__ import annotations

import asyncio
import re
import stat
from pathlib import Path
from typing import Any

import pytest

from flower.agents.agent import AgentSpec
from flower.docs.handoff import HANDOFF_PROMPT, Handoff, degraded
from flower.services.cli_env import cli_env
from flower.services.model_server import ModelServer, RecordedRequest
from flower.step.runtime import Runtime
from flower.step.window import HandoffPolicy
from tests.e2e import Flower

pytestmark = pytest.mark.e2e

FLOWS = "tests.flows.inside"
WINDOW = 200_000
BIG = {"input_tokens": 155_000}  # past at = 150K, under the CLI's own limits for 200K
ENV_200K = {"ANTHROPIC_MODEL": "claude-haiku-4-5"}
# The CLI's own compaction request (its summary prompt's first words).
CLI_COMPACTION = "CRITICAL: Respond with TEXT ONLY"

HANDOFF_TEXT = """\
## 在做什么
在给 full.txt 逐行写内容,第一行已经写了。

## 已经定下的
用 echo 追加,不重写整个文件。

## 走不通的路
无

## 下一步
[[successor]] 接着写第二行。

## 现场
full.txt 在工作区根目录。
"""


def bash(command: str, **extra: Any) -> dict[str, Any]:
    return {
        "tool_use": {"name": "Bash", "input": {"command": command, "description": "test step"}},
        **extra,
    }


def conversation(name: str, turns: list[Any], marker: str | None = None) -> dict[str, Any]:
    return {"name": name, "match": {"marker": marker or f"[[{name}]]"}, "turns": turns}


def asked(server: ModelServer, conv: str) -> list[RecordedRequest]:
    return [r for r in server.requests if r.path == "/v1/messages" and r.conversation == conv]


def user_texts(req: RecordedRequest) -> list[str]:
    return [
        b.get("text", "")
        for m in req.messages
        if m.get("role") == "user" and isinstance(m.get("content"), list)
        for b in m["content"]
        if b.get("type") == "text"
    ]


def assert_no_rejections(server: ModelServer) -> None:
    bad = [r for r in server.requests if r.answer == "rejected"]
    assert not bad, f"rejected: {bad[0].detail}"


def handoff_request(reqs: list[RecordedRequest]) -> tuple[RecordedRequest, int]:
    """The request that carried HANDOFF_PROMPT, and the ``used`` figure filled into it."""
    for req in reqs:
        for text in user_texts(req):
            m = re.search(r"你的上下文已经用了 (\d+) / (\d+) tokens", text)
            if m:
                used, window = int(m[1]), int(m[2])
                assert text == HANDOFF_PROMPT.format(used=used, window=window), text
                assert window == WINDOW
                return req, used
    raise AssertionError("no request carried the handoff prompt")


@pytest.mark.timeout(90)  # one flower run: three CLI turns over two sessions
def test_crossing_the_threshold_hands_off_to_a_new_session(model_server, flower_env):
    server = model_server(
        {
            "conversations": [
                conversation(
                    "full", [bash("echo one >> full.txt", usage=BIG), {"text": HANDOFF_TEXT}]
                ),
                conversation("successor", [{"text": "successor done."}]),
            ]
        }
    )
    f: Flower = flower_env(server, extra_env=ENV_200K)
    code, out = f.run(flow=f"{FLOWS}:full", timeout=75)
    assert code == 0, out

    full = asked(server, "full")
    old = full[0].session_id
    req, used = handoff_request(full)
    assert req.session_id == old and used >= BIG["input_tokens"], "HANDOFF_PROMPT went elsewhere"

    path = f.ws / ".flower" / "notes" / "交接-full.md"
    saved = Handoff.load(path)
    expected = Handoff.parse(HANDOFF_TEXT)
    expected.step = "full"
    assert saved == expected, path.read_text(encoding="utf-8")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600

    successor = asked(server, "successor")
    new = successor[0].session_id
    assert new and new != old
    first = next(r for r in server.requests if r.session_id == new)
    assert first.conversation == "successor"
    assert expected.prompt_block() in user_texts(first), (
        "the new session did not start from the handoff"
    )

    (row,) = f.rows("full")
    assert row["ok"] and row["text"] == "successor done.", row
    assert row["retired"] == [old] and row["session_id"] == new, row
    assert row["attempts"] == 1 and row["errors"] == [] and not row["resumed"], (
        "a handoff used an attempt"
    )
    assert f.lineage()["steps"]["full"] == new
    # near / writing / done travelled child -> supervisor -> terminal.
    # The reference's handoff block: the size against the window, the four sections, where.
    assert f"# 上下文 {used / 1000:.1f}K/200K,快满了" in out, out
    assert "—— 写交接准备换代" in out, out
    assert "  - 现在在做    " in out and "  - 下一步      " in out, out
    assert f"<- 交接写在 {path}" in out and "<- 新会话接手,上下文从 " in out, out
    assert_no_rejections(server)
    assert_no_cli_compaction(server)
    f.assert_no_survivors()


def assert_no_cli_compaction(server: ModelServer) -> None:
    for req in server.requests:
        assert not any(t.startswith(CLI_COMPACTION) for t in user_texts(req)), (
            f"request {req.seq} is the CLI's own compaction"
        )


@pytest.mark.timeout(90)  # one flower run: three CLI turns over two sessions
def test_a_model_whose_window_is_guessed_wrong_still_hands_off_before_the_cli_compacts(
    model_server, flower_env
):
    """Sonnet 4.5 has a 200K window in this CLI; default_window() guesses 1M for it. The
    attempt asks the CLI, hands off at 200K - 50K, with the old session's own document."""
    server = model_server(
        {
            "conversations": [
                conversation(
                    "full", [bash("echo one >> full.txt", usage=BIG), {"text": HANDOFF_TEXT}]
                ),
                conversation(
                    "successor",
                    [
                        bash("printenv DISABLE_AUTO_COMPACT > compact.txt"),
                        {"text": "successor done."},
                    ],
                ),
            ]
        }
    )
    f: Flower = flower_env(server, extra_env={"ANTHROPIC_MODEL": "claude-sonnet-4-5"})
    assert "DISABLE_AUTO_COMPACT" not in f.env
    code, out = f.run(flow=f"{FLOWS}:full", timeout=75)
    assert code == 0, out
    assert (f.ws / "compact.txt").read_text().strip() == "1", "auto-compaction was left on"
    full = asked(server, "full")
    req, used = handoff_request(full)  # the prompt names the real 200K window
    assert req.session_id == full[0].session_id and used >= BIG["input_tokens"]
    saved = Handoff.load(f.ws / ".flower" / "notes" / "交接-full.md")
    assert saved is not None and not saved.degraded
    expected = Handoff.parse(HANDOFF_TEXT)
    expected.step = "full"
    assert saved == expected
    (row,) = f.rows("full")
    assert row["ok"] and row["text"] == "successor done." and len(row["retired"]) == 1, row
    assert_no_cli_compaction(server)
    assert_no_rejections(server)
    f.assert_no_survivors()


@pytest.mark.timeout(90)  # one flower run: three CLI turns over two sessions
def test_prompt_too_long_hands_off_with_the_degraded_document(model_server, flower_env):
    server = model_server(
        {
            "conversations": [
                # The degraded handoff quotes the original task (with its marker) in 现场, so
                # the successor is recognised by the handoff's own lead line, listed first.
                conversation("successor", [{"text": "successor done."}], marker="你在接手"),
                conversation(
                    "over",
                    [
                        bash("echo one >> over.txt"),
                        {"error": "prompt_too_long", "times": 1, "text": "never"},
                    ],
                ),
            ]
        }
    )
    f: Flower = flower_env(server, extra_env=ENV_200K)
    code, out = f.run(flow=f"{FLOWS}:over", timeout=75)
    assert code == 0, out
    over = asked(server, "over")
    assert [r.status for r in over] == [200, 400], (
        "the overflow was retried or the old session asked again"
    )
    old = over[0].session_id
    (row,) = f.rows("over")
    new = row["session_id"]
    assert row["ok"] and row["retired"] == [old] and new != old and row["attempts"] == 1, row
    assert f.lineage()["steps"]["over"] == new

    saved = Handoff.load(f.ws / ".flower" / "notes" / "交接-over.md")
    assert saved is not None
    mechanical = degraded("over", "[[over]] go")
    assert (saved.doing, saved.next) == (mechanical.doing, mechanical.next)
    assert saved.scene.startswith(mechanical.scene) and "Prompt is too long" in saved.scene, (
        saved.scene
    )
    first = next(r for r in server.requests if r.session_id == new)
    saved.path = None
    assert saved.prompt_block() in user_texts(first)
    assert "交接没写成,用了降级版本 —— 接手的人会自己去现场看" in out, out
    assert_no_rejections(server)
    f.assert_no_survivors()


# --- max_generations, in-process (the same loop code as in a step child) -------------------


@pytest.fixture
def inprocess(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Point this process's environment (the SDK passes it to the CLI) at a model server."""

    def setup(server: ModelServer) -> Path:
        for key, value in cli_env(tmp_path / "home", server.url).items():
            monkeypatch.setenv(key, value)
        ws = tmp_path / "ws"
        ws.mkdir()
        return ws

    return setup


@pytest.mark.timeout(90)  # three generations of two CLI turns each, in-process
def test_max_generations_stops_the_step_with_a_diagnostic(model_server, inprocess, tmp_path):
    # Every generation reports a context past the threshold before it finishes.
    server = model_server(
        {
            "conversations": [
                conversation(
                    "gen",
                    [
                        bash("echo step >> gen.txt", usage=BIG),
                        {"text": HANDOFF_TEXT.replace("[[successor]]", "[[gen]]")},
                    ],
                )
            ]
        }
    )
    ws = inprocess(server)
    rt = Runtime(
        workspace=ws,
        run_dir=tmp_path / "runs",
        workbench=True,
        handoff=HandoffPolicy(window=WINDOW, max_generations=2),
    )
    spec = AgentSpec(
        name="gen", instructions="test agent", allowed_tools=["Bash"], permission_mode="acceptEdits"
    )
    try:
        res = asyncio.run(rt.run(spec, "[[gen]] go", step_name="gen"))
    finally:
        rt.close()
    sessions = list(dict.fromkeys(r.session_id for r in asked(server, "gen")))
    assert len(sessions) == 3, sessions
    assert not res.ok and res.retired == sessions[:2] and res.session_id == sessions[2], res
    assert res.error and "max_generations=2" in res.error and "交接-gen.md" in res.error, res.error
    assert res.attempts == 1 and res.errors == []
    last = [t for r in asked(server, "gen") if r.session_id == sessions[2] for t in user_texts(r)]
    assert not any("你的上下文已经用了" in t for t in last), (
        "the generation past the limit was asked for a handoff"
    )
    assert_no_rejections(server)
