"""What a newcomer tripped over on the command line (issue 17), where no model is needed:
plurals, flower --version, argparse's and click's own words in the person's language, exit
statuses that agree with the help, a missing -w, the run_dir's .gitignore, the language a
flower started through ``cli_env`` speaks, what the venv setup says, and a flow whose steps
need no model that is not held up by an unreachable endpoint."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flower.i18n import t
from flower.services.cli_env import cli_env

REPO = Path(__file__).resolve().parents[1]

# Short processes, no model; the supervisor ones import the SDK (about a second each).
pytestmark = pytest.mark.timeout(90)


def run(
    module: str, *args: str, cwd: Path, lang: str = "zh", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_"))}
    base.update(PYTHONPATH=str(REPO), HOME=str(cwd / "home"), FLOWER_LANG=lang)
    base.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=base,
        input="",
        capture_output=True,
        text=True,
        timeout=60,
    )


def closed_port() -> int:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- English grammar for 1 and for N ----------------------------------------------------------


def test_a_count_agrees_with_its_noun_in_english(monkeypatch):
    import supervisor.run.flows
    import supervisor.terminal.terminal  # noqa: F401  - defines term.* texts
    from flower.workflow import starter  # noqa: F401  - defines starter.* texts

    monkeypatch.setenv("FLOWER_LANG", "en")
    assert t("starter.checks", n=1) == "goal: 1 check"
    assert t("starter.checks", n=7) == "goal: 7 checks"
    one = t("term.status", step="s", turns=1, tools=1, context="1K", cost=0.0, elapsed="0:01")
    assert "1 turn · 1 tool call ·" in one, one
    two = t("term.status", step="s", turns=2, tools=0, context="1K", cost=0.0, elapsed="0:01")
    assert "2 turns · 0 tool calls ·" in two, two
    assert t("flow.not_flow", ref="m:x", kind="int") == "m:x is of type int, not a Workflow"
    monkeypatch.setenv("FLOWER_LANG", "zh")  # Chinese has no plural: the seeds' text as it is
    assert t("starter.checks", n=1) == "目标 1 条"


# -- flower ------------------------------------------------------------------------------


def test_flower_version(tmp_path):
    from flower import __version__

    done = run("supervisor.commands.flower_cli", "--version", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == f"flower {__version__}", done


@pytest.mark.parametrize(
    ("args", "zh", "en"),
    [
        (["once"], "缺了这些参数:prompt", "the following arguments are required: prompt"),
        (["go", "--rounds", "x"], "参数 --rounds:'x' 不是整数", "argument --rounds: 'x' is not"),
        (["--bogus", "x", "y"], "不认识这些参数:--bogus", "unrecognized arguments: --bogus"),
        (["-w"], "参数 -w/--workspace:后面要跟一个值", "expected one argument"),
    ],
)
def test_argparse_errors_are_in_the_persons_language(tmp_path, args, zh, en):
    done = run("supervisor.commands.flower_cli", *args, cwd=tmp_path)
    assert done.returncode == 2 and zh in done.stderr, done.stderr
    assert "error:" not in done.stderr and "the following" not in done.stderr, done.stderr
    done = run("supervisor.commands.flower_cli", *args, cwd=tmp_path, lang="en")
    assert done.returncode == 2 and en in done.stderr, done.stderr


def test_run_verify_exits_2_for_a_target_that_does_not_load(tmp_path):
    verify = run(
        "supervisor.commands.flower_cli", "run", "--verify", "missing.py:flow", cwd=tmp_path
    )
    assert verify.returncode == 2 and verify.stderr.startswith("找不到 missing.py"), verify
    # Without --verify it is the reference's deliberate stop (exit 1), as before.
    plain = run("supervisor.commands.flower_cli", "run", "missing.py:flow", cwd=tmp_path)
    assert plain.returncode == 1 and plain.stderr.startswith("找不到 missing.py"), plain


# -- flower-super ----------------------------------------------------------------------------


def test_status_with_no_run_directory_exits_2_as_its_help_says(tmp_path):
    done = run("supervisor", "status", cwd=tmp_path, lang="en")
    assert done.returncode == 2 and "no run directory at" in done.stderr, done
    helped = run("supervisor", "status", "--help", cwd=tmp_path, lang="en")
    assert "2 when there is no run directory there" in " ".join(helped.stdout.split()), helped


def test_flower_super_help_and_clicks_own_errors_are_in_the_persons_language(tmp_path):
    helped = run("supervisor", "status", "--help", cwd=tmp_path)
    assert helped.stdout.startswith("用法:") and "退出码:0" in helped.stdout, helped.stdout
    assert "选项:" in helped.stdout and "显示这段帮助然后退出。" in helped.stdout
    assert "Show this message" not in helped.stdout and "Options:" not in helped.stdout
    wrong = run("supervisor", "status", "--bogus", cwd=tmp_path)
    assert wrong.returncode == 2 and "错误:没有 '--bogus' 这个选项。" in wrong.stderr, wrong
    missing = run("supervisor", "cancel", cwd=tmp_path)
    assert missing.returncode == 2 and "错误:缺了参数 'RUN'" in missing.stderr, missing
    english = run("supervisor", "status", "--bogus", cwd=tmp_path, lang="en")
    assert "Error: No such option '--bogus'." in english.stderr, english


def test_start_creates_a_missing_workspace_as_flower_does_and_is_not_held_up_offline(
    tmp_path,
):
    # A flow whose only step never runs needs no model: an unreachable endpoint is said in
    # one line and the run finishes (the reference's "net": the run just starts).
    port = closed_port()
    env = {
        "ANTHROPIC_API_KEY": "sk-ant-test-dummy",
        "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}",
    }
    began = time.monotonic()
    done = run(
        "supervisor",
        "start",
        "--flow",
        "tests.flows.basic:idle",
        "-w",
        "new/ws",
        "-r",
        str(tmp_path / "runs"),
        cwd=tmp_path,
        lang="en",
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "new" / "ws").is_dir()
    assert f"cannot reach 127.0.0.1:{port}" in done.stdout, done.stdout
    assert time.monotonic() - began < 45
    # flower run: the probe says "net", the run starts and ends.
    done = run(
        "supervisor.commands.flower_cli",
        "-r",
        str(tmp_path / "runs"),
        "-w",
        str(tmp_path / "new" / "ws"),
        "run",
        "tests.flows.basic:idle",
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "探针没打通" in done.stdout and f"连不上 127.0.0.1:{port}" in done.stdout, done.stdout


def test_a_workspace_that_is_a_file_is_one_line_for_both(tmp_path):
    (tmp_path / "f").write_text("x")
    done = run("supervisor", "start", "--flow", "tests.flows.basic:idle", "-w", "f", cwd=tmp_path)
    assert done.returncode == 2 and "工作区" in done.stderr and "不是目录" in done.stderr, done
    done = run("supervisor.commands.flower_cli", "-w", "f", "做 X", "--timeout", "0", cwd=tmp_path)
    assert done.returncode == 1 and "不是目录" in done.stderr.splitlines()[0], done
    assert "Traceback" not in done.stderr


# -- the run_dir keeps out of git ----------------------------------------------------------


def test_a_new_run_dir_carries_a_gitignore_and_git_does_not_see_it(tmp_path, monkeypatch):
    from flower import Runtime

    ws = tmp_path / "proj"
    ws.mkdir()
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    (ws / "hello.py").write_text("print('hi')\n")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-dummy")
    monkeypatch.chdir(ws)
    rt = Runtime(workspace=ws, run_dir="runs")
    try:
        assert (ws / "runs" / "sessions.db").exists()
    finally:
        rt.close()
    assert (ws / "runs" / ".gitignore").read_text().splitlines()[-1] == "*"
    seen = subprocess.run(
        ["git", "-C", str(ws), "status", "--porcelain", "--untracked-files=all"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert seen.splitlines() == ["?? hello.py"], seen
    # An existing run_dir is the person's: nothing is added to it.
    mine = tmp_path / "mine"
    mine.mkdir()
    Runtime(workspace=ws, run_dir=mine).close()
    assert not (mine / ".gitignore").exists()


# -- cli_env: the language goes with it ------------------------------------------------------


def test_cli_env_keeps_the_persons_language(tmp_path, monkeypatch):
    monkeypatch.setenv("FLOWER_LANG", "zh")
    monkeypatch.setenv("LC_MESSAGES", "zh_CN.UTF-8")
    env = cli_env(tmp_path / "home", "http://127.0.0.1:9")
    assert env["FLOWER_LANG"] == "zh" and env["LC_MESSAGES"] == "zh_CN.UTF-8"


# -- the venv setup says what it does ---------------------------------------------------------


def test_venv_setup_says_what_pip_is_doing(tmp_path):
    # A venv whose python only records how it was called: the setup's words, not pip's work.
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    fake = venv / "bin" / "python"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "calls"}\n')
    fake.chmod(0o755)
    script = f"source {REPO / 'scripts' / '_venv.sh'}"
    env = {**os.environ, "FLOWER_VENV": str(venv), "FLOWER_LANG": "en"}
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0].startswith(f"- first use: making {venv} and installing"), lines
    assert lines[-1].startswith(f"+ {venv} is ready ("), lines
    # Exactly the lock, hashes checked; flower itself on top, without dependencies.
    calls = (tmp_path / "calls").read_text()
    assert f"install --quiet --require-hashes -r {REPO / 'requirements.lock'}" in calls, calls
    assert f"install --quiet --no-deps -e {REPO}" in calls, calls
    # Set up already: nothing to say.
    again = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True)
    assert again.returncode == 0 and again.stderr == "", again.stderr
    # A venv made before the lock (its stamp says nothing of it) is brought to the lock.
    (venv / ".flower-installed").write_text("")
    (tmp_path / "calls").write_text("")
    synced = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True)
    assert synced.returncode == 0, synced.stderr
    assert synced.stderr.startswith("- pyproject.toml or requirements.lock changed"), synced.stderr
    assert "--require-hashes -r" in (tmp_path / "calls").read_text()


# -- the commands that run nothing stay light -------------------------------------------------


@pytest.mark.parametrize("module", ["status", "show", "logs", "cancel"])
def test_the_light_commands_import_nothing_they_do_not_use(module):
    """Issue 17: status, show and logs at most 3x ``python -c pass`` (scripts/bench_cli.py).
    What they need only to write (logging, signal), to open a database (sqlite3) or never
    (shutil with zlib, bz2 and lzma) is not loaded by importing them."""
    probe = (
        f"import supervisor.commands.cli, supervisor.inspect.{module}, sys\n"
        "unused = {'logging', 'sqlite3', 'shutil', 'signal', 'bz2', 'lzma'}\n"
        "print(sorted(unused & set(sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=50
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
