"""Pytest fixtures for tests against a real Temporal server: a fresh task queue per test.

- ``temporal_target`` (session): the ``HOST:PORT`` of a Temporal frontend, namespace
  ``default``. ``FLOWER_TEST_TEMPORAL``'s when set (``scripts/test.sh`` starts one dev
  server for the whole suite and exports it), else a dev server of this pytest session's
  own (:mod:`.temporal`), stopped when the session ends. A server that cannot start fails
  every test that needs it, with the server's own reason in one line: never a skip, on CI or
  anywhere else.
- ``temporal_queue``: a task queue name no other test uses (``t-<random>``): tests share
  the server and its namespace, so what one test starts, another's workers never poll.
  Activity ids a test makes should carry it too (ids are unique per namespace).

Enable them with ``from flower.testing.pytest_temporal import temporal_queue,
temporal_target`` in a ``conftest.py`` (or ``pytest_plugins =
["flower.testing.pytest_temporal"]``).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator

import pytest

from ._suite import suite_server

__all__ = ["ENV", "temporal_queue", "temporal_target"]

ENV = "FLOWER_TEST_TEMPORAL"


@pytest.fixture(scope="session")
def temporal_target() -> Iterator[str]:
    """The suite's Temporal frontend, ``HOST:PORT`` (see the module docstring)."""

    def start() -> tuple[str, Callable[[], None]]:
        from ..services.temporal import start_temporal

        server = start_temporal()
        return server.target, server.stop

    yield from suite_server(ENV, "Temporal", start)


@pytest.fixture
def temporal_queue() -> str:
    """A task queue of this test's own (see the module docstring)."""
    return f"t-{secrets.token_hex(6)}"
