"""Shared fixtures: the scripted model server, a flower workspace for end-to-end tests, a
PostgreSQL database per test, and a Temporal server with a task queue per test."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from flower.services.model_server import ModelServer

# Fixtures for users' tests and ours alike, made available to every test module by name.
from flower.testing.pytest_helpers import claude_home, model_server, reaper  # noqa: F401

# A real PostgreSQL: the suite's server (scripts/test.sh) and a fresh database per test.
from flower.testing.pytest_postgres import pg_dsn, pg_server  # noqa: F401

# A real Temporal: the suite's dev server (scripts/test.sh) and a task queue per test.
from flower.testing.pytest_temporal import temporal_queue, temporal_target  # noqa: F401

# Both session backends, for the store layers' rules checked on each (tests/backends.py).
from tests.backends import backend  # noqa: F401
from tests.e2e import Flower
from tests.e2e_pg import PgFlower
from tests.pg_own import (
    own_server,  # noqa: F401 - a server of the module's own
    server_up,  # noqa: F401 - the fixture "server"
)


@pytest.fixture(autouse=True)
def _seed_language(monkeypatch: pytest.MonkeyPatch) -> None:
    """flower speaks the seeds' Chinese in tests (their texts are the contract checked);
    a test of the English catalogue sets FLOWER_LANG=en itself."""
    monkeypatch.setenv("FLOWER_LANG", "zh")


@pytest.fixture
def flower_env(tmp_path: Path) -> Iterator[Callable[..., Flower]]:
    """A workspace/run_dir/CLI home wired to a model server; every process reaped at teardown.
    ``state=URL``: the run state in that PostgreSQL database (``FLOWER_STATE``,
    tests/e2e_pg.py); None or absent: local files in the run_dir."""
    made: list[Flower] = []

    def make(server: ModelServer, *, state: str | None = None, **kw: Any) -> Flower:
        root = tmp_path / f"f{len(made)}"
        f = (
            Flower(root, server, **kw)
            if state is None
            else PgFlower(root, server, state=state, **kw)
        )
        made.append(f)
        return f

    yield make
    for f in made:
        f.cleanup()


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    """Children a test starts; all are killed and reaped afterwards, whatever happened."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)
        for stream in (p.stdin, p.stdout):
            if stream:
                stream.close()


@pytest.fixture
def listening_url() -> Iterator[str]:
    """``http://127.0.0.1:<port>`` of a loopback socket that accepts connections (and never
    answers): a reachable endpoint for the loop's network probe."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
