"""`flower setup` on a real terminal: a pty, a person typing when each question shows."""

from __future__ import annotations

import os
import select
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.test_credentials import TOKEN, Home, machine  # noqa: F401
from tests.test_probe import Gateway, gateway  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
CODE = "from supervisor.commands.setup import setup_main; raise SystemExit(setup_main())"


class Pty:
    """A child on the slave side of a pty; ``expect`` reads the master until a text shows."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        self.master, slave = os.openpty()
        try:
            self.proc = subprocess.Popen(
                argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd,
                start_new_session=True,
            )  # fmt: skip
        finally:
            os.close(slave)
        self.seen = ""
        self.pos = 0

    def expect(self, text: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.seen[self.pos :]:
            left = deadline - time.monotonic()
            assert left > 0, f"no {text!r} within {timeout}s; the screen so far:\n{self.seen}"
            if not self._read(left):
                raise AssertionError(f"the terminal closed before {text!r}:\n{self.seen}")
        self.pos = self.seen.index(text, self.pos) + len(text)

    def type(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\r")

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], min(timeout, 1.0))
        if not ready:
            return True
        try:
            data = os.read(self.master, 4096)
        except OSError:  # EIO: the child closed its side
            return False
        self.seen += data.decode("utf-8", errors="replace").replace("\r\n", "\n")
        return bool(data)

    def finish(self, timeout: float = 20.0) -> int:
        return self.proc.wait(timeout=timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        os.close(self.master)


def test_flower_setup_on_a_terminal(
    machine: Home,  # noqa: F811
    gateway: Callable[..., Gateway],  # noqa: F811
) -> None:
    g = gateway()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(machine.home),
        "XDG_CONFIG_HOME": str(machine.xdg),
        "FLOWER_LANG": "zh",
        "TERM": "dumb",
        "PYTHONPATH": str(REPO),
        "ANTHROPIC_BASE_URL": g.url,
    }
    term = Pty([sys.executable, "-c", CODE], env, machine.cwd)
    try:
        term.expect("还没配过凭证。")
        term.expect("1. 你的 API key 或网关 token")
        term.expect("   > ")
        term.type(TOKEN)
        term.expect("2. 网关地址")
        # The key is typed unseen: the terminal never echoes it (nor any piece of it).
        assert TOKEN not in term.seen and TOKEN[:8] not in term.seen, term.seen
        term.expect("   > ")
        term.type(g.url)
        term.expect("3. 模型名")
        term.expect("   > ")
        term.type("claude-opus-5[1m]")
        path = machine.xdg / "flower" / ".env"
        term.expect(f"+ 存好了:{path}")
        term.expect("+ 凭证能用。")
        assert term.finish() == 0
    finally:
        term.close()
    assert path.read_text(encoding="utf-8").splitlines() == [
        "# flower 凭证 —— 由 `flower setup` 写。别提交进版本库。",
        "",
        f"ANTHROPIC_AUTH_TOKEN={TOKEN}",
        f"ANTHROPIC_BASE_URL={g.url}",
        "ANTHROPIC_MODEL=claude-opus-5[1m]",
        "ANTHROPIC_DEFAULT_OPUS_MODEL=claude-opus-5[1m]",
        "ANTHROPIC_DEFAULT_SONNET_MODEL=claude-opus-5[1m]",
    ]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert g.requests[0]["headers"]["authorization"] == f"Bearer {TOKEN}"
    assert g.requests[0]["body"]["model"] == "claude-opus-5[1m]"
