"""Helpers for end-to-end tests: the real ``flower-super`` and the real CLI, against the
scripted model server, judged by files, exit codes, the request log and the process table.

Every process a test starts is tagged through its environment (``FLOWER_TEST_TAG``), which
the CLI and the tool shells it runs inherit, so "no process of the flower survives" is
checked against the whole process table, not against a snapshot taken too early.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from flower.services.cli_env import cli_env
from flower.services.model_server import ModelServer
from flower.testing.rundir import has_tool_result, transcript

REPO = Path(__file__).resolve().parents[1]
TAG = "FLOWER_TEST_TAG"


def wait_until(
    predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.02
) -> Any:
    """Poll ``predicate`` until truthy; fail the test with ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def answers(*names: str) -> dict[str, Any]:
    """A model-server script where each of ``names`` (a step, matched by its ``[[name]]``
    marker) answers ``<name> done.`` at once."""
    return {
        "conversations": [
            {"name": n, "match": {"marker": f"[[{n}]]"}, "turns": [{"text": f"{n} done."}]}
            for n in names
        ]
    }


def tagged(tag: str) -> list[psutil.Process]:
    """Running (non-zombie) processes whose environment carries ``tag``."""
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.pid == os.getpid() or p.status() == psutil.STATUS_ZOMBIE:
                continue
            if p.environ().get(TAG) == tag:
                out.append(p)
        except (psutil.Error, OSError):
            continue
    return out


class Flower:
    """One workspace + run_dir + CLI home, and the flower-super processes run in it."""

    def __init__(
        self,
        root: Path,
        server: ModelServer,
        *,
        max_retries: int = 0,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.root = root
        self.ws = root / "ws"
        self.runs = root / "runs"
        self.ws.mkdir(parents=True, exist_ok=True)
        self.server = server
        self.tag = uuid.uuid4().hex
        self.env = cli_env(root / "home", server.url, max_retries=max_retries)
        self.env.update({TAG: self.tag, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)})
        # The language the test asked for (conftest: the seeds' Chinese, unless a module says en).
        self.env["FLOWER_LANG"] = os.environ.get("FLOWER_LANG", "zh")
        self.env.update(extra_env or {})
        self.procs: list[subprocess.Popen[bytes]] = []

    # -- running ----------------------------------------------------------------------

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "supervisor", *args]

    def start(
        self, *args: str, flow: str | None = None, stdin: Any = subprocess.DEVNULL
    ) -> subprocess.Popen[bytes]:
        """``flower-super start`` in the background (its own session, like a shell job)."""
        cmd = self.argv("start", *args, "-w", str(self.ws), "-r", str(self.runs))
        if flow:
            cmd += ["--flow", flow]
        proc = subprocess.Popen(
            cmd,
            cwd=self.root,
            env=self.env,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def run(self, *args: str, flow: str | None = None, timeout: float = 60) -> tuple[int, str]:
        proc = self.start(*args, flow=flow)
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out.decode("utf-8", "replace")

    def status(self, *extra: str, timeout: float = 30) -> tuple[int, str]:
        done = subprocess.run(
            self.argv("status", "-r", str(self.runs), *extra),
            cwd=self.root,
            env=self.env,
            capture_output=True,
            timeout=timeout,
        )
        return done.returncode, done.stdout.decode("utf-8", "replace") + done.stderr.decode(
            "utf-8", "replace"
        )

    def status_json(self) -> tuple[int, dict[str, Any]]:
        code, out = self.status("--json")
        return code, json.loads(out)

    # -- reading the run_dir ----------------------------------------------------------

    def lineage(self) -> dict[str, Any]:
        return json.loads((self.runs / "lineage.json").read_text(encoding="utf-8"))

    def manifest(self) -> list[dict[str, Any]]:
        """The rows, read as flower's own readers read them: under the writers' lock (a
        bare read can land between the file's creation and its first append, and see '')."""
        from flower.state.manifest import read_manifest

        return read_manifest(self.runs)

    def transcript(self, session_id: str) -> list[dict[str, Any]]:
        return transcript(self.runs, session_id)

    def has_tool_result(self, session_id: str) -> bool:
        return has_tool_result(self.runs, session_id)

    def rows(self, step: str) -> list[dict[str, Any]]:
        return [r for r in self.manifest() if r["step"] == step]

    def assert_state_home(self) -> None:
        """The run state is where this backend keeps it: the run_dir's files (local)."""
        for name in ("sessions.db", "lineage.json", "manifest.json"):
            assert (self.runs / name).is_file(), f"{name} missing from the run_dir"

    # -- processes --------------------------------------------------------------------

    def step_child(self, sup_pid: int) -> psutil.Process | None:
        """The supervisor's step child (a direct child that is a python process)."""
        try:
            kids = psutil.Process(sup_pid).children()
        except psutil.Error:
            return None
        return next(
            (k for k in kids if "python" in (k.name() or "") or k.name().startswith("flower")), None
        )

    def survivors(self) -> list[psutil.Process]:
        return tagged(self.tag)

    def assert_no_survivors(self, within: float = 5.0) -> None:
        """No process of this flower (supervisor, child, CLI, tool shell) is running."""
        deadline = time.monotonic() + within
        left = self.survivors()
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = self.survivors()
        assert not left, "processes survived: " + ", ".join(f"{p.pid} {_cmd(p)}" for p in left)

    def cleanup(self) -> None:
        for p in self.survivors():
            with contextlib.suppress(psutil.Error):
                p.kill()
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired, ValueError):
                proc.communicate(timeout=10)


def cli_under(pid: int) -> list[psutil.Process]:
    """The claude CLI processes below ``pid`` (zombies excluded)."""
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    out = []
    for k in kids:
        try:
            if k.name() == "claude" and k.status() != psutil.STATUS_ZOMBIE:
                out.append(k)
        except psutil.Error:
            continue
    return out


def attempt_child(sup_pid: int) -> psutil.Process | None:
    """The supervisor's step child that has a CLI running. For one-step flows, where no
    child is prepared ahead, that is the child running the attempt."""
    try:
        kids = psutil.Process(sup_pid).children()
    except psutil.Error:
        return None
    return next((k for k in kids if cli_under(k.pid)), None)


def _cmd(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())[:120]
    except psutil.Error:
        return "?"


def kill(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> int:
    os.kill(proc.pid, sig)
    try:
        proc.communicate(timeout=30)
    except ValueError:
        proc.wait(timeout=30)
    return proc.returncode


class Pty:
    """A command on a pseudo-terminal that is its controlling terminal, as under a shell
    (so a typed ``^C`` signals it alone); collects what it prints. Reaped with ``f``."""

    def __init__(
        self,
        f: Flower,
        argv: list[str],
        *,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        import pty

        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(
            argv,
            cwd=cwd or f.root,
            env=env or f.env,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            preexec_fn=_controlling_tty,
            close_fds=True,
        )
        f.procs.append(self.proc)
        os.close(slave)
        self.raw = b""

    def pump(self) -> str:
        """Everything printed so far (reads what is waiting, never blocks)."""
        import fcntl

        fcntl.fcntl(self.master, fcntl.F_SETFL, os.O_NONBLOCK)
        while True:
            try:
                data = os.read(self.master, 65536)
            except (BlockingIOError, OSError):
                break
            if not data:
                break
            self.raw += data
        return self.raw.decode("utf-8", "replace")

    def expect(self, text: str, timeout: float = 60) -> None:
        wait_until(lambda: text in self.pump(), timeout, f"{text!r} on the terminal")

    def type(self, data: str | bytes) -> None:
        os.write(self.master, data.encode() if isinstance(data, str) else data)

    def wait(self, timeout: float = 120) -> int:
        wait_until(
            lambda: self.pump() is not None and self.proc.poll() is not None, timeout, "exit"
        )
        self.pump()
        return self.proc.wait(timeout=1)

    def close(self) -> None:
        os.close(self.master)


def _controlling_tty() -> None:
    import fcntl
    import termios

    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    # Ctrl-C as a terminal's shell gives it: a suite started in the background (cmd &)
    # has SIGINT ignored, and every child would inherit that
    signal.signal(signal.SIGINT, signal.SIG_DFL)
