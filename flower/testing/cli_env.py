"""``flower.testing.cli_env``: kept for flows tested with it; the module is
:mod:`flower.services.cli_env` (what ``flower-super`` serves a person is product code, which
this test kit uses)."""

from __future__ import annotations

from flower.services.cli_env import DUMMY_API_KEY, claude_path, cli_env

__all__ = ["DUMMY_API_KEY", "claude_path", "cli_env"]
