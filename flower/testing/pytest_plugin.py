"""Pytest fixtures for testing your own flow offline against the scripted model server.

Enable them in your ``conftest.py`` (the top-level one: pytest reads ``pytest_plugins``
only there)::

    pytest_plugins = ["flower.testing.pytest_plugin"]

The plugin is not registered as an entry point on purpose: installing flower loads nothing
into anyone's test session unasked.

Fixtures (each a factory; whatever it started is stopped when the test ends):

- ``model_server(script, **kw)`` — a running :class:`~flower.testing.ModelServer`
  (``kw`` as its constructor; the request log also goes to
  ``tmp_path/model-server-<n>.jsonl``).
- ``flower_cli_env(server, *, max_retries=0, extra=None)`` — points this test's process at
  ``server`` (a ModelServer or a base URL): sets :func:`~flower.services.cli_env`'s
  variables in ``os.environ`` for the test's duration (HOME and CLAUDE_CONFIG_DIR in
  ``tmp_path/home``, ANTHROPIC_BASE_URL, a dummy key, no other credential), so an
  in-process ``Runtime`` and the CLI it starts reach only the server; returns the
  environment, complete for ``subprocess`` (e.g. ``flower-super start --flow ...``).
- ``flower_runtime(server, *, workspace=None, run_dir=None, **kw)`` — a ``flower.Runtime``
  wired to ``server`` through ``flower_cli_env``, in ``tmp_path/ws`` with run_dir
  ``tmp_path/runs`` unless given (``kw`` as Runtime's), closed at teardown. Calls in one
  test share the workspace and run_dir, so a second Runtime wakes where the first stopped.
- ``claude_home(server, **kw)`` and ``reaper``: for tests that run the bare ``claude`` CLI
  (see :mod:`flower.testing.pytest_helpers`); every process started through ``reaper`` is
  killed with its whole tree at teardown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ..services.cli_env import cli_env
from ..services.model_server import ModelServer
from .pytest_helpers import claude_home, model_server, reaper

if TYPE_CHECKING:
    from flower.step.runtime import Runtime

__all__ = ["claude_home", "flower_cli_env", "flower_runtime", "model_server", "reaper"]


@pytest.fixture
def flower_cli_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., dict[str, str]]:
    """Factory: ``flower_cli_env(server, *, max_retries=0, extra=None)`` -> the environment.

    Also applied to ``os.environ`` until the test ends (monkeypatch), so anything this
    process starts, the SDK's CLI included, talks to ``server`` and nothing else.
    """

    def apply(
        server: ModelServer | str,
        *,
        max_retries: int | None = 0,
        extra: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        url = server.url if isinstance(server, ModelServer) else server
        env = cli_env(tmp_path / "home", url, max_retries=max_retries, extra=extra)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        return env

    return apply


@pytest.fixture
def flower_runtime(
    tmp_path: Path, flower_cli_env: Callable[..., dict[str, str]]
) -> Iterator[Callable[..., Runtime]]:
    """Factory: ``flower_runtime(server, *, workspace=None, run_dir=None, **kw)`` -> Runtime.

    The server is required: a Runtime made without one would reach whatever the
    environment names, a real API key included.
    """
    made: list[Runtime] = []

    def make(
        server: ModelServer | str,
        *,
        workspace: str | Path | None = None,
        run_dir: str | Path | None = None,
        **kw: Any,
    ) -> Runtime:
        from flower import Runtime  # about 0.1 s of imports: only for tests that use it

        flower_cli_env(server)
        ws = Path(workspace) if workspace is not None else tmp_path / "ws"
        ws.mkdir(parents=True, exist_ok=True)
        rt = Runtime(workspace=ws, run_dir=run_dir or tmp_path / "runs", **kw)
        made.append(rt)
        return rt

    try:
        yield make
    finally:
        for rt in made:
            rt.close()
