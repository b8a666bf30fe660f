"""The environment for running the real Claude Code CLI against a scripted model server.

Measured with the bundled CLI 2.1.332: with a fresh HOME/CLAUDE_CONFIG_DIR and a custom
``ANTHROPIC_API_KEY``, ``claude -p`` starts with no prompt at all (no onboarding, no key
approval, no trust dialog); ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1`` keeps it to the
Messages requests of the conversation itself.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path

# Inherited variables a CLI in a test may keep: what a shell and its tools need, and the
# person's language (a flower started in this environment speaks it too).
_KEEP = (
    "PATH",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "LC_MESSAGES",
    "FLOWER_LANG",
    "TZ",
    "TMPDIR",
    "TERM",
    "USER",
    "LOGNAME",
    "SHELL",
)

# The SDK lays ClaudeAgentOptions.env over the parent's os.environ, so a real credential or
# another provider there would win unless blanked; the CLI treats "" as unset (measured).
_BLANK = (
    "ANTHROPIC_AUTH_TOKEN",
    "CLAUDE_CODE_OAUTH_TOKEN",
    "CLAUDE_CODE_USE_BEDROCK",
    "CLAUDE_CODE_USE_VERTEX",
    "CLAUDE_CODE_USE_FOUNDRY",
    "ANTHROPIC_MODEL",
    "ANTHROPIC_SMALL_FAST_MODEL",
    "CLAUDECODE",
)

DUMMY_API_KEY = "sk-ant-test-dummy-key"


def claude_path() -> Path:
    """The CLI bundled with claude-agent-sdk (the one flower runs)."""
    # find_spec, not import: importing claude_agent_sdk costs about a second.
    spec = importlib.util.find_spec("claude_agent_sdk")
    if spec is None or spec.origin is None:
        raise RuntimeError("claude-agent-sdk is not installed")
    return Path(spec.origin).parent / "_bundled" / "claude"


def cli_env(
    home: Path,
    base_url: str,
    *,
    max_retries: int | None = 0,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """A complete environment for the real CLI: isolated home, scripted server, no traffic.

    Usable as ``Popen(env=...)`` and as ``ClaudeAgentOptions(env=...)``. ``home`` becomes
    HOME, ``home/.claude`` CLAUDE_CONFIG_DIR (transcripts land in its ``projects/``).
    ``max_retries`` sets CLAUDE_CODE_MAX_RETRIES (None: the CLI's own default, which keeps
    retrying a refused connection for about three minutes). Of this process's environment
    it keeps what a shell needs and the person's language (``FLOWER_LANG``, the locale).
    ``extra`` is applied last.
    """
    home = Path(home)
    config = home / ".claude"
    config.mkdir(parents=True, exist_ok=True, mode=0o700)
    env = {k: os.environ[k] for k in _KEEP if k in os.environ}
    env.update({k: "" for k in _BLANK})
    env.update(
        {
            "HOME": str(home),
            "CLAUDE_CONFIG_DIR": str(config),
            "ANTHROPIC_BASE_URL": base_url,
            "ANTHROPIC_API_KEY": DUMMY_API_KEY,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        }
    )
    if os.geteuid() == 0:
        # As root the CLI refuses bypassPermissions unless told it runs in a sandbox.
        env["IS_SANDBOX"] = "1"
    if max_retries is not None:
        env["CLAUDE_CODE_MAX_RETRIES"] = str(max_retries)
    env.update(extra or {})
    return env
