"""``flower-super demo``: the whole continuity story in under a minute, offline.

It starts the scripted model server, runs a three-step flow with the real CLI in a temporary
workspace, SIGKILLs its own supervisor while the second step waits on the model, shows that
no process of that flower survived, starts it again, and lets the person watch the wake:
the finished step is not sent to the model again, the killed one continues its session.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from flower import FlowerError
from flower.i18n import define, t
from supervisor.commands.demo_flow import RESEARCH, WRAP, WRITE

STEP_TIMEOUT = 60.0
GONE_WITHIN = 5.0  # the children notice their parent's death within moments


define(
    {
        "demo.where": (
            "临时工作区 {ws},脚本化的模型服务器 {url}(不联网、不要 key)",
            "a temporary workspace {ws}, a scripted model server {url} (no network, no key)",
        ),
        "demo.simulated": (
            "   下面的 $ 花费是按脚本服务器报的 token 数算出来的模拟数:一分钱也没花",
            "   the $ costs below are computed from the scripted server's token counts: "
            "simulated, nothing is paid",
        ),
        "demo.first": ("第一次跑:{steps}", "first run: {steps}"),
        "demo.kill": (
            "kill -9 {pid}(supervisor,正在等模型回话;它的子进程:{n} 个)",
            "kill -9 {pid} (the supervisor, waiting for the model; its children: {n})",
        ),
        "demo.gone": (
            "   那个 flower 的 {n} 个进程在 kill 之后 {s:.1f} 秒内全都没了,一个不剩",
            "   all {n} {n|process|processes} of that flower were gone {s:.1f} s after the kill",
        ),
        "demo.left": (
            "   kill 之后 {s:g} 秒还活着的 flower 进程:{n} 个 {pids}",
            "   flower processes still alive {s:g} s after the kill: {n} {pids}",
        ),
        "demo.again": ("再跑一次同一条命令:", "the same command again:"),
        "demo.server_saw": ("模型服务器看到的:", "what the model server saw:"),
        "demo.reused": (
            "   第二次跑,调研 发给模型的请求:{n} 个(上次做完了,输入没变,复用)",
            "   second run, requests of research: {n} (finished last time, same input: reused)",
        ),
        "demo.sessions": (
            "   写稿 前后两次跑的请求共用 {n} 条会话:{ids}",
            "   draft's requests of both runs share {n} {n|session|sessions}: {ids}",
        ),
        "demo.carried": (
            "   第二次跑 写稿 的第一个请求带着之前的 {n} 次工具调用和它的结果,模型接着说",
            "   the second run's first request of draft carries the {n} earlier tool "
            "{n|call|calls} and {n|its result|their results}; the model carries on",
        ),
        "demo.status": ("flower-super status:", "flower-super status:"),
        "demo.kept": ("留着:{root}", "kept: {root}"),
        "demo.deleted": (
            "临时目录 {root} 已删掉:上面的 show / logs 命令要加 --keep 再跑一次演示才能试",
            "the temporary directory {root} is deleted now: to try the show / logs commands "
            "above, run the demo again with --keep",
        ),
    }
)


def demo_script(ws: Path) -> dict[str, Any]:
    return {
        "conversations": [
            {
                "name": "research",
                "match": {"marker": "[[demo:research]]"},
                "turns": [
                    {
                        "tool_use": {
                            "name": "Bash",
                            "input": {
                                "command": "echo 'flower 演示' > notes.txt && ls",
                                "description": "look around",
                            },
                        }
                    },
                    {"text": "调研完成:工作区里现在有 notes.txt。"},
                ],
            },
            {
                "name": "write",
                "match": {"marker": "[[demo:write]]"},
                "turns": [
                    {
                        "tool_use": {
                            "name": "Write",
                            "input": {
                                "file_path": str(ws / "draft.md"),
                                "content": "# 草稿\n\nflower 接着上次那段对话往下说。\n",
                            },
                        }
                    },
                    # The model "thinks" long here, once: the demo kills the supervisor now.
                    {"text": "草稿写好了:draft.md。", "delay": STEP_TIMEOUT, "times": 1},
                ],
            },
            {
                "name": "wrap",
                "match": {"marker": "[[demo:wrap]]"},
                "turns": [
                    {"text": "收尾:notes.txt 和 draft.md 都在,三步做完。"},
                ],
            },
        ],
        "default": [{"text": "(demo) 好的。"}],
    }


def run_demo(*, keep: bool = False) -> int:
    from flower.services.cli_env import cli_env
    from flower.services.model_server import ModelServer

    root = Path(tempfile.mkdtemp(prefix="flower-demo-"))
    ws, runs = root / "workspace", root / "runs"
    ws.mkdir()
    server = ModelServer(demo_script(ws), log_path=root / "requests.jsonl").start()
    env = {**cli_env(root / "home", server.url, max_retries=0), "PYTHONUNBUFFERED": "1"}
    cmd = [
        sys.executable,
        "-m",
        "supervisor",
        "start",
        "--flow",
        "supervisor.commands.demo_flow:flow",
        "-w",
        str(ws),
        "-r",
        str(runs),
    ]
    say = _Narrator()
    try:
        say.title(t("demo.where", ws=ws, url=server.url))
        say.line(t("demo.simulated"))
        killed_at = _first_run(cmd, env, root, server, say)
        say.title(t("demo.again"))
        code = _stream(
            subprocess.Popen(
                cmd, env=env, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            ),
            say,
        )
        if code != 0:
            raise FlowerError(f"the resumed run exited with {code}", hint=f"see {runs}/logs")
        _show_resume_facts(server, say, killed_at)
        say.title(t("demo.status"))
        out = subprocess.run(
            [sys.executable, "-m", "supervisor", "status", "-r", str(runs)],
            env=env,
            cwd=root,
            capture_output=True,
            text=True,
        )
        say.block(out.stdout)
        return 0
    finally:
        server.stop()
        if keep:
            say.title(t("demo.kept", root=root))
        else:
            import shutil

            shutil.rmtree(root, ignore_errors=True)
            say.title(t("demo.deleted", root=root))


def _first_run(cmd: list[str], env: dict[str, str], root: Path, server: Any, say: _Narrator) -> int:
    """Run until 写稿 waits on the model, SIGKILL the supervisor; return the last request seq."""
    say.title(t("demo.first", steps=" -> ".join([RESEARCH, WRITE, WRAP])))
    proc = subprocess.Popen(
        cmd, env=env, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    pump = threading.Thread(target=_stream, args=(proc, say), daemon=True)
    pump.start()
    # Wait until 写稿 has run its Write tool and the model is "thinking" on the next turn.
    try:
        server.wait_for(
            lambda reqs: any(r.conversation == "write" and r.turn == 1 for r in reqs),
            timeout=STEP_TIMEOUT,
        )
    except TimeoutError:
        proc.kill()
        raise FlowerError(
            "the demo flow never reached the step it kills",
            hint="run with --keep and read runs/logs",
        ) from None
    _wait_persisted(root / "runs", WRITE)
    family = _family(proc.pid)
    say.title(t("demo.kill", pid=proc.pid, n=len(family)))
    os.kill(proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    proc.wait()
    pump.join(5)
    left = _wait_gone(family, GONE_WITHIN)
    if left:
        say.line(t("demo.left", s=GONE_WITHIN, n=len(left), pids=left))
    else:  # what was measured: the moment the last of them was gone
        say.line(t("demo.gone", n=len(family), s=time.monotonic() - killed))
    return max((r.seq for r in server.requests), default=0)


def _show_resume_facts(server: Any, say: _Narrator, killed_at: int) -> None:
    reqs = [r for r in server.requests if r.conversation]
    after = [r for r in reqs if r.seq > killed_at]
    research_again = [r for r in after if r.conversation == "research"]
    write = [r for r in reqs if r.conversation == "write"]
    sessions = sorted({r.session_id or "?" for r in write})
    resumed = next((r for r in after if r.conversation == "write"), None)
    say.title(t("demo.server_saw"))
    say.line(t("demo.reused", n=len(research_again)))
    say.line(t("demo.sessions", n=len(sessions), ids=", ".join(sessions)))
    if resumed is not None:
        kinds = [
            b.get("type")
            for m in resumed.messages
            for b in (m.get("content") if isinstance(m.get("content"), list) else [])
        ]
        say.line(t("demo.carried", n=kinds.count("tool_use")))


def _wait_persisted(runs: Path, step: str, timeout: float = 10.0) -> None:
    """Wait until sessions.db holds the step's tool result (the CLI persists a turn a few
    tens of ms after sending the next request; the demo means to kill after that)."""
    import json

    from flower.state.dbfile import read_transcript

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            sid = json.loads((runs / "lineage.json").read_text())["steps"].get(step)
        except (OSError, ValueError, KeyError):
            sid = None
        if sid and any('"tool_result"' in json.dumps(e) for e in read_transcript(runs, sid)):
            return
        time.sleep(0.02)


def _family(pid: int) -> list[int]:
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _wait_gone(pids: list[int], seconds: float) -> list[int]:
    """The ones of ``pids`` still running after ``seconds`` (returns as soon as none is)."""
    deadline = time.monotonic() + seconds
    alive = [p for p in pids if _running(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if _running(p)]
    return alive


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _stream(proc: subprocess.Popen[bytes], say: _Narrator) -> int:
    assert proc.stdout is not None
    for raw in proc.stdout:
        say.line("   | " + raw.decode("utf-8", "replace").rstrip())
    return proc.wait()


class _Narrator:
    def __init__(self) -> None:
        self.lock = threading.Lock()

    def title(self, text: str) -> None:
        self.line(f"\n==> {text}")

    def line(self, text: str) -> None:
        with self.lock:
            print(text, flush=True)

    def block(self, text: str) -> None:
        for line in text.rstrip().splitlines():
            self.line("   " + line)
