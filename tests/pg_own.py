"""A PostgreSQL server of a test module's own, for tests that stop and start it (never the
suite's shared server). ``own_server`` (module-scoped) and ``server`` (up again after each
test) reach every test module through tests/conftest.py (imported there); a module
that defines its own fixture of the same name keeps its own.

``own_database(server, tmp_path, monkeypatch)`` makes a fresh database on it and keeps this
test's spool under its ``tmp_path``.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from flower.services.postgres import PgServer, postgres_server
from flower.testing.pytest_postgres import database_url


@pytest.fixture(scope="module")
def own_server() -> Iterator[PgServer]:
    """A server of the module's own: its tests stop and start it."""
    with postgres_server(durable=False) as made:
        yield made


@pytest.fixture(name="server")
def server_up(own_server: PgServer) -> Iterator[PgServer]:
    """The module's server, up again after the test whatever it did."""
    yield own_server
    if not (own_server.data / "postmaster.pid").exists():
        own_server.up()


def own_database(own: PgServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh database on ``own``; this test's spool under its tmp_path."""
    name = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(own.dsn, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return database_url(own.dsn, name)
