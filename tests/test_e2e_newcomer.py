"""What a newcomer tripped over, end to end (issue 17): the real CLI, the scripted model server,
the supervisor. An empty request reaches no model; ``once`` says at once that the endpoint
cannot be reached; ``--timeout 0`` never waits at a prompt on a terminal (and
``--clarify-only`` in a clarified directory does nothing); status tells how long a kill -9'd
flower lived; the demo speaks one language and says only what it measured."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from flower.services.model_server import ModelServer
from supervisor.run.start import HEARTBEAT_S
from tests import e2e
from tests.e2e import REPO, Flower, wait_until
from tests.test_e2e_starter import BRIEF, conv

pytestmark = pytest.mark.e2e

EMPTY = {
    "zh": '诉求是空的。直接 `flower` 然后按提示输入,或者 flower "帮我做一个 X"。',
    "en": (
        'The request is empty. Run `flower` and type it at the prompt, or flower "build me an X".'
    ),
}


def flower(f: Flower, *args: str, lang: str = "zh", stdin: str = "") -> tuple[int, str, str]:
    done = subprocess.run(
        [sys.executable, "-m", "supervisor.commands.flower_cli", "-r", str(f.runs), *args],
        cwd=f.ws,
        env={**f.env, "FLOWER_LANG": lang},
        input=stdin.encode(),
        capture_output=True,
        timeout=60,
    )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


@pytest.mark.timeout(120)  # six short flower processes (no CLI is started)
def test_an_empty_request_is_refused_before_any_request_reaches_the_model(model_server, flower_env):
    server: ModelServer = model_server({"default": ["ok"]})
    f: Flower = flower_env(server)
    for lang in ("zh", "en"):
        for args, stdin in (([""], ""), ([], ""), ([], "\n"), (["--timeout", "0"], "")):
            code, out, err = flower(f, *args, lang=lang, stdin=stdin)
            assert code == 1 and err.splitlines() == [EMPTY[lang]], (args, out, err)
            assert "Traceback" not in err
    assert server.requests == []  # not even the credentials probe
    assert not f.runs.exists() and not (f.ws / ".flower").exists()


@pytest.mark.timeout(60)
def test_once_says_at_once_that_the_endpoint_cannot_be_reached(flower_env, model_server, tmp_path):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    f: Flower = flower_env(model_server({"default": ["ok"]}))
    env = {**f.env, "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}", "FLOWER_LANG": "en"}
    out = tmp_path / "once.out"
    with open(out, "wb") as sink:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "supervisor.commands.flower_cli",
                "-r",
                str(f.runs),
                "once",
                "hi",
            ],
            cwd=f.ws,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # Ctrl-C as a terminal has it: a shell that started these tests in the
            # background (`cmd &`) left SIGINT ignored, and a child inherits that
            preexec_fn=_sigint_as_a_terminal_has_it,
        )
    f.procs.append(proc)  # type: ignore[arg-type]
    try:
        wait_until(
            lambda: f"cannot reach 127.0.0.1:{port}" in out.read_text(),
            20,
            "once's line about the unreachable endpoint",
        )
        assert proc.poll() is None, "it waits for the endpoint, it does not give up"
        assert e2e.cli_under(proc.pid) == [], "no CLI is started while the endpoint is down"
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: once ends
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGUSR1)  # its threads' stacks, into its output
            time.sleep(2)
            raise AssertionError(f"once did not end on Ctrl-C:\n{out.read_text()}") from None
    assert "Traceback" not in out.read_text(), out.read_text()
    f.assert_no_survivors()


@pytest.mark.timeout(90)
def test_timeout_0_never_waits_at_the_prompt_and_clarify_only_on_a_clarified_dir_does_nothing(
    model_server, flower_env
):
    server: ModelServer = model_server({"default": ["ok"]})
    f: Flower = flower_env(server)
    notes = f.ws / ".flower" / "notes"
    notes.mkdir(parents=True)
    (notes / "需求.md").write_text(BRIEF, encoding="utf-8")  # clarified: something to wake
    argv = [sys.executable, "-m", "supervisor.commands.flower_cli", "-r", str(f.runs)]
    term = e2e.Pty(f, [*argv, "--clarify-only", "--timeout", "0"], cwd=f.ws)
    try:
        assert term.wait(60) == 0, term.pump()
        screen = term.pump()
    finally:
        term.close()
    assert "接着上次?" not in screen and "要做什么?" not in screen, screen
    assert "-- 完成 · 第 1 次唤醒" in screen, screen
    # Nothing ran: the probe's one request, no step row, the brief as it was.
    assert [r.conversation for r in server.requests] == ["default"]
    assert f.manifest() == []
    assert (notes / "需求.md").read_text(encoding="utf-8") == BRIEF


@pytest.mark.timeout(120)
def test_status_tells_how_long_a_kill_9d_flower_lived(model_server, flower_env):
    # The model "thinks" for a minute: nothing is written while the flower waits on it.
    server: ModelServer = model_server(
        {"conversations": [conv("only", [{"text": "done", "delay": 60}], marker="[[only]]")]}
    )
    f: Flower = flower_env(server)
    proc = f.start(flow="tests.flows.basic:one")
    server.wait_for(lambda reqs: any(r.conversation == "only" for r in reqs), timeout=60)
    lived = 3 * HEARTBEAT_S
    began = wait_until(lambda: f.status_json()[1]["flowers"], 30, "the flower's record")[0][
        "started_at"
    ]
    wait_until(lambda: time.time() - began >= lived, lived + 10, f"the flower living {lived} s")
    e2e.kill(proc)
    code, report = f.status_json()
    assert code == 3, report  # dead and unfinished
    (view,) = report["flowers"]
    assert not view["alive"] and view["state"] == "interrupted-resumable", view
    # It was last seen at most one heartbeat (and a moment) before it died.
    assert view["elapsed_s"] >= lived - HEARTBEAT_S - 1, (view["elapsed_s"], lived)
    f.assert_no_survivors()


@pytest.mark.timeout(240)  # two runs of a three-step flow with the real CLI, one killed
def test_the_demo_speaks_chinese_throughout_and_says_only_what_it_measured(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_"))}
    env.update(
        PYTHONPATH=str(REPO),
        HOME=str(tmp_path / "home"),
        TMPDIR=str(tmp_path),
        FLOWER_LANG="zh",
        PYTHONUNBUFFERED="1",
    )
    done = subprocess.run(
        [sys.executable, "-m", "supervisor", "demo"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=220,
    )
    out = done.stdout.decode()
    assert done.returncode == 0, out + done.stderr.decode()
    assert "模拟数" in out, out
    # What it measured after the kill, not a claim about 5 s it did not wait.
    gone = re.search(r"那个 flower 的 (\d+) 个进程在 kill 之后 ([0-9.]+) 秒内全都没了", out)
    assert gone and int(gone.group(1)) >= 1, out
    assert "5 秒内还活着" not in out
    # The resumed run speaks Chinese too: the same step names as the first run.
    resumed = out.split("==> 再跑一次同一条命令:", 1)[1].split("==> 模型服务器看到的:", 1)[0]
    assert "写稿" in resumed and "收尾" in resumed, resumed
    assert not re.search(r"\b(draft|wrap-up|research)\b(?!\.md)|done · wake", resumed), resumed
    # The show/logs commands it printed name a directory it then deleted: it says so.
    (root,) = re.findall(r"临时目录 (\S+) 已删掉", out)
    assert "--keep" in out.rsplit("临时目录", 1)[1]
    assert not os.path.exists(root)


def _sigint_as_a_terminal_has_it() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
