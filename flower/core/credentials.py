"""Credentials: ``.env`` loading and the check that fails at construction, not mid-run."""

from __future__ import annotations

import os
from pathlib import Path

from .._errors import FlowerError

# Any one of these lets the CLI talk to a model.
KEY_VARS = (
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "CLAUDE_CODE_OAUTH_TOKEN",
    "CLAUDE_CODE_USE_BEDROCK",
    "CLAUDE_CODE_USE_VERTEX",
    "CLAUDE_CODE_USE_FOUNDRY",
)


class CredentialsError(FlowerError, RuntimeError):
    """No way for the CLI to authenticate (seed 003: raised by the Runtime constructor)."""


def load_dotenv(*dirs: str | Path) -> list[str]:
    """Set variables from ``.env`` files in ``dirs`` that the environment does not have yet.

    Returns the names it set (never the values: they are usually keys). Lines are
    ``NAME=value`` with optional ``export`` and quotes; anything else is ignored.
    """
    set_names: list[str] = []
    seen: set[Path] = set()
    for d in dirs:
        path = (Path(d) / ".env").resolve()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        for name, value in _parse_env_lines(lines):
            if name not in os.environ:
                os.environ[name] = value
                set_names.append(name)
    return set_names


def _parse_env_lines(lines: list[str]) -> list[tuple[str, str]]:
    out = []
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        name, _, value = line.partition("=")
        name, value = name.strip(), value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        if name.isidentifier():
            out.append((name, value))
    return out


def _credentials_file() -> Path:
    config = os.environ.get("CLAUDE_CONFIG_DIR")
    base = Path(config) if config else Path.home() / ".claude"
    return base / ".credentials.json"


def check_credentials() -> None:
    """Raise :class:`CredentialsError` when the CLI would have no way to authenticate."""
    if any(os.environ.get(name) for name in KEY_VARS):
        return
    if _credentials_file().is_file():
        return
    raise CredentialsError(
        "no Anthropic credentials: ANTHROPIC_API_KEY is not set",
        hint="export ANTHROPIC_API_KEY=... or put it in a .env file in the workspace; "
        "to try flower without a key run `flower-super demo`",
    )
