"""Pytest fixtures and helpers for end-to-end tests against the real CLI.

The fixtures ``model_server``, ``claude_home`` and ``reaper`` are defined here; enable them,
with ``flower_cli_env`` and ``flower_runtime``, through
``pytest_plugins = ["flower.testing.pytest_plugin"]`` (see :mod:`.pytest_plugin`), or
import the helpers directly (``run_claude``, ``Reaper``, ``read_transcript``, ...).

Every process a test starts goes through a :class:`Reaper`, which kills the whole tree:
the CLI's Bash tool runs in its own session, so killing the CLI alone leaves it running.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from ..services.cli_env import claude_path, cli_env
from ..services.model_server import ModelServer


@dataclass
class ClaudeRun:
    """What one ``claude -p`` run left: exit code, output, and its final ``result`` message."""

    returncode: int
    stdout: str
    stderr: str
    messages: list[dict[str, Any]]

    @property
    def result(self) -> dict[str, Any]:
        """The last ``{"type": "result", ...}`` message; AssertionError if there is none."""
        for msg in reversed(self.messages):
            if msg.get("type") == "result":
                return dict(msg)
        raise AssertionError(
            f"no result message; stdout={self.stdout[-2000:]!r} stderr={self.stderr[-2000:]!r}"
        )


def parse_output(stdout: str) -> list[dict[str, Any]]:
    """JSON objects of ``--output-format json``/``stream-json`` output (other lines skipped)."""
    out = []
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


class Reaper:
    """Starts processes in their own session and kills every descendant at the end."""

    def __init__(self) -> None:
        self._procs: list[subprocess.Popen[str]] = []
        self._known: dict[int, psutil.Process] = {}

    def popen(
        self, args: Sequence[str], *, env: Mapping[str, str], cwd: Path
    ) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            list(args),
            env=dict(env),
            cwd=cwd,
            text=True,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self._procs.append(proc)
        return proc

    def note_tree(self, pid: int) -> None:
        """Remember ``pid``'s current descendants, so they die even once re-parented."""
        try:
            root = psutil.Process(pid)
            for p in [root, *root.children(recursive=True)]:
                self._known.setdefault(p.pid, p)
        except psutil.Error:
            pass

    def kill_tree(self, pid: int) -> None:
        """SIGKILL ``pid`` and every descendant (known now or noted earlier)."""
        self.note_tree(pid)
        victims = list(self._known.values())
        for p in victims:
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGKILL)
        # Our own children are reaped through Popen, so their exit status stays readable.
        ours = {proc.pid: proc for proc in self._procs}
        for proc in ours.values():
            if proc.pid in self._known:
                proc.wait(timeout=5)
        psutil.wait_procs([p for p in victims if p.pid not in ours], timeout=5)

    def reap(self) -> None:
        for proc in self._procs:
            self.kill_tree(proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired, ValueError, OSError):
                proc.communicate(timeout=5)


def run_claude(
    reaper: Reaper,
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path,
    timeout: float = 45.0,
) -> ClaudeRun:
    """Run the bundled CLI to completion (``claude <args>``) and parse its output."""
    proc = reaper.popen([str(claude_path()), *args], env=env, cwd=cwd)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        reaper.kill_tree(proc.pid)
        out, err = proc.communicate()
        raise AssertionError(
            f"claude {list(args)} did not finish in {timeout}s; stderr={err[-2000:]!r}"
        ) from None
    return ClaudeRun(proc.returncode, out, err, parse_output(out))


def transcript_path(config_dir: Path, session_id: str) -> Path:
    """``$CLAUDE_CONFIG_DIR/projects/<project key>/<session>.jsonl`` (the project key globbed)."""
    found = sorted(Path(config_dir).glob(f"projects/*/{session_id}.jsonl"))
    if not found:
        raise AssertionError(f"no transcript for session {session_id} under {config_dir}/projects")
    return found[0]


def read_transcript(config_dir: Path, session_id: str) -> list[dict[str, Any]]:
    path = transcript_path(config_dir, session_id)
    return [
        json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
    ]


@dataclass
class ClaudeHome:
    """A temporary home for the CLI: ``env`` for it, ``cwd`` to run in, ``config`` dir."""

    root: Path
    cwd: Path
    env: dict[str, str]

    @property
    def config(self) -> Path:
        return Path(self.env["CLAUDE_CONFIG_DIR"])


def make_claude_home(root: Path, base_url: str, **kwargs: Any) -> ClaudeHome:
    cwd = root / "work"
    cwd.mkdir(parents=True, exist_ok=True)
    return ClaudeHome(root=root, cwd=cwd, env=cli_env(root / "home", base_url, **kwargs))


@pytest.fixture
def reaper() -> Iterator[Reaper]:
    r = Reaper()
    try:
        yield r
    finally:
        r.reap()


@pytest.fixture
def model_server(tmp_path: Path) -> Iterator[Callable[..., ModelServer]]:
    """Factory: ``model_server(script, **kw)`` starts a server that stops after the test."""
    servers: list[ModelServer] = []

    def start(script: Any, **kwargs: Any) -> ModelServer:
        kwargs.setdefault("log_path", tmp_path / f"model-server-{len(servers)}.jsonl")
        server = ModelServer(script, **kwargs).start()
        servers.append(server)
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def claude_home(tmp_path: Path) -> Callable[..., ClaudeHome]:
    """Factory: ``claude_home(server_or_url, max_retries=0, extra=None)`` -> ClaudeHome."""
    count = [0]

    def make(server: ModelServer | str, **kwargs: Any) -> ClaudeHome:
        count[0] += 1
        url = server.url if isinstance(server, ModelServer) else server
        return make_claude_home(tmp_path / f"claude-{count[0]}", url, **kwargs)

    return make


def pids_alive(pids: Sequence[int]) -> list[int]:
    """Those of ``pids`` still running (zombies count as gone)."""
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.Error:
            continue
    return alive


__all__ = [
    "ClaudeHome",
    "ClaudeRun",
    "Reaper",
    "claude_home",
    "make_claude_home",
    "model_server",
    "parse_output",
    "pids_alive",
    "read_transcript",
    "reaper",
    "run_claude",
    "transcript_path",
]
