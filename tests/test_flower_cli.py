"""The ``flower`` command's argv handling and the stops that need no model (pure logic and
quick subprocesses): the default-subcommand rewrite, the flags, the run-target messages."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.commands.flower_cli import build_parser, with_default_cmd

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("typed", "parsed"),
    [
        ([], ["go"]),
        (["-v"], ["-v", "go"]),
        (["帮我做一个 X"], ["go", "帮我做一个 X"]),
        (["-w", "/tmp", "做 X"], ["-w", "/tmp", "go", "做 X"]),
        (["--workspace=/tmp", "做 X"], ["--workspace=/tmp", "go", "做 X"]),
        (["做 X", "--timeout", "0"], ["go", "做 X", "--timeout", "0"]),
        (["--timeout", "0", "做 X"], ["go", "--timeout", "0", "做 X"]),
        (["--new"], ["go", "--new"]),
        (["once", "hi"], ["once", "hi"]),
        (["run", "flows:main"], ["run", "flows:main"]),
        (["run"], ["run"]),
        (["go", "run"], ["go", "run"]),
        (["setup"], ["setup"]),  # reachable here (the original rewrote it into a run)
        (["-v", "setup"], ["-v", "setup"]),
        (["go", "setup"], ["go", "setup"]),
        (["--help"], ["--help"]),
        (["做 X", "-h"], ["做 X", "-h"]),
        (["-w"], ["-w"]),  # the value is missing: argparse says so
        (["-r", "runs"], ["-r", "runs", "go"]),
    ],
)
def test_the_default_subcommand_rewrite_is_the_references(typed, parsed):
    assert with_default_cmd(typed, build_parser()) == parsed


def test_the_flags_have_the_references_types_and_defaults():
    p = build_parser()
    go = p.parse_args(["go"])
    assert (go.workspace, go.run_dir, go.verbose, go.workbench, go.trim) == (
        ".",
        "runs",
        False,
        False,
        False,
    )
    assert (go.ask, go.asks, go.rounds, go.timeout, go.window) == (None, -1, 3, 1800.0, None)
    for flag in ("no_goal", "judge_can_run", "isolate", "no_handoff", "new", "clarify_only"):
        assert getattr(go, flag) is False
    assert go.no_trim is False
    # global flags before or after the subcommand, neither copy overwriting the other
    a = p.parse_args(["-w", "/a", "go", "x", "-v"])
    assert (a.workspace, a.verbose, a.ask) == ("/a", True, "x")
    once = p.parse_args(["once", "hi"])
    assert (once.instructions, once.tools, once.permission_mode, once.budget) == (
        "",
        None,
        "default",
        None,
    )
    assert (once.resume, once.fork) == (None, False)
    assert p.parse_args(["once", "hi", "-t", "Read", "-p", "plan", "-b", "0.5"]).budget == 0.5


def test_counted_flags_are_5_global_11_go_6_once():
    p = build_parser()
    sub = next(a for a in p._actions if a.dest == "cmd")
    choices = sub.choices  # type: ignore[attr-defined]

    def own(parser):
        flags = {a.dest for a in parser._actions if a.option_strings and a.dest != "help"}
        return flags - {
            "workspace",
            "run_dir",
            "verbose",
            "workbench",
            "trim",
            "state",
            "placement",
        }

    glob = {a.dest for a in p._actions if a.option_strings and a.dest != "help"}
    # The reference's five global flags, --version (issue 17: flower-super had one) and
    # --state (issue 18: where the run state lives, on flower and every flower-super command),
    # --placement (issue 19: where the attempts run).
    assert glob == {
        "workspace",
        "run_dir",
        "verbose",
        "workbench",
        "trim",
        "version",
        "state",
        "placement",
    }
    assert len(own(choices["go"])) == 11
    assert len(own(choices["once"])) == 6
    # run's one flag is issue 11's --verify (the reference's run had none); setup has none.
    assert own(choices["run"]) == {"verify"} and own(choices["setup"]) == set()


def flower(*args: str, cwd: Path, env_extra: dict[str, str] | None = None, stdin: str = ""):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    env.update({"PYTHONPATH": str(REPO), "HOME": str(cwd / "home"), "FLOWER_LANG": "zh"})
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "supervisor.commands.flower_cli", *args],
        cwd=cwd,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_a_bad_permission_mode_is_argparses_exit_2(tmp_path):
    done = flower("once", "hi", "-p", "yolo", cwd=tmp_path)  # in Chinese, as conftest has it
    assert done.returncode == 2 and "'yolo' 不是可选的值" in done.stderr, done.stderr
    done = flower("once", "hi", "-p", "yolo", cwd=tmp_path, env_extra={"FLOWER_LANG": "en"})
    assert done.returncode == 2 and "invalid choice: 'yolo'" in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("flows", "需要 模块:属性 形式,例如 flows:main"),
        ("missing.py:main", "找不到 missing.py(当前目录 {cwd})"),
        ("broken:flow", "导入 'broken' 失败:"),
        ("tests.flows.basic:nope", "'tests.flows.basic' 里没有 'nope'"),
    ],
)
def test_run_target_mistakes_are_the_references_lines_exit_1(tmp_path, target, message):
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom')\n")
    done = flower("run", target, cwd=tmp_path, env_extra={"PYTHONPATH": f"{REPO}:{tmp_path}"})
    assert done.returncode == 1, done
    first = done.stderr.splitlines()[0]
    if target in ("flows", "tests.flows.basic:nope"):  # the reference's line exactly
        assert first == message.format(cwd=tmp_path), done.stderr
    assert first.startswith(message.format(cwd=tmp_path)), done.stderr
    assert "Traceback" not in done.stderr


def test_isolate_outside_git_is_the_references_line(tmp_path):
    done = flower("--isolate", "做 X", "--timeout", "0", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.splitlines()[0] == (
        f"--isolate 要求 {tmp_path.resolve()} 是 git 仓库(每个 subagent 要分一份 worktree)。"
        "先 git init,或者去掉 --isolate。"
    )
    assert not (tmp_path / "runs").exists() and not (tmp_path / ".flower").exists()


def test_no_credentials_and_no_terminal_is_the_four_line_message(tmp_path):
    done = flower(
        "做 X", "--timeout", "0", cwd=tmp_path, env_extra={"XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    )
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert lines[0] == "缺少凭证:需要 ANTHROPIC_API_KEY 或 ANTHROPIC_AUTH_TOKEN。", done.stderr
    assert len(lines) == 4 and "flower setup" in lines[1]
    assert not (tmp_path / "runs").exists()


def test_a_missing_flag_value_is_a_usage_error_not_a_traceback(tmp_path):
    for args in (["-w"], ["-r"], ["go", "--timeout"]):
        done = flower(*args, cwd=tmp_path)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr


def test_help_is_english_under_flower_lang_en(tmp_path):
    done = flower("--help", cwd=tmp_path, env_extra={"FLOWER_LANG": "en"})
    assert done.returncode == 0
    assert "Without a subcommand it is `go`" in done.stdout
    assert not any("\u4e00" <= c <= "\u9fff" for c in done.stdout), done.stdout
    for sub in ("go", "run", "once", "setup"):
        done = flower(sub, "--help", cwd=tmp_path, env_extra={"FLOWER_LANG": "en"})
        assert done.returncode == 0 and not any("\u4e00" <= c <= "\u9fff" for c in done.stdout)
    zh = flower("--help", cwd=tmp_path, env_extra={"FLOWER_LANG": "zh"})
    assert "不写子命令时就是 go" in zh.stdout and zh.stdout.startswith("用法:flower ")
    wrong = flower("once", cwd=tmp_path, env_extra={"FLOWER_LANG": "zh"})
    assert wrong.returncode == 2 and "flower once:参数不对:" in wrong.stderr


def test_run_verify_checks_without_running(tmp_path):
    bad = flower(
        "run", "--verify", "tests.flows.memo:bad", cwd=tmp_path, env_extra={"FLOWER_LANG": "en"}
    )
    assert bad.returncode == 2, bad.stderr
    assert "step 'odd': unknown fingerprint prefix 'svn:'" in bad.stderr
    assert "step 'deploy': cross-run is not allowed: idempotent=False" in bad.stderr
    good = flower("run", "--verify", "tests.flows.memo:flow", cwd=tmp_path)
    assert good.returncode == 0 and "流程 'memo' 没问题:4 个步骤" in good.stdout, good
    assert not (tmp_path / "runs").exists()
