"""Test support for flower and its users: a scripted model server and a CLI environment.

``ModelServer`` speaks the Anthropic Messages API on loopback from a script, so the real
Claude Code CLI (and flower on top of it) runs end to end with no network and no API key;
``cli_env`` is the environment that points the CLI at it.
"""

from __future__ import annotations

import importlib
from typing import Any

# Eager, so the name ``cli_env`` is the function and not its submodule.
from .cli_env import claude_path, cli_env

__all__ = ["ModelServer", "RecordedRequest", "Script", "claude_path", "cli_env"]

_HOME = {
    "ModelServer": "model_server",
    "RecordedRequest": "_log",
    "Script": "_script",
}


def __getattr__(name: str) -> Any:
    # Lazy, so ``python -m flower.testing.model_server`` does not import itself twice.
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
