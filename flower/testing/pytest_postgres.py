"""Pytest fixtures for tests against a real PostgreSQL: a fresh database per test.

- ``pg_server`` (session): the superuser URL of a server. ``FLOWER_TEST_POSTGRES``'s when
  set (``scripts/test.sh`` starts one throwaway server for the whole suite and exports
  it), else a throwaway server of this pytest session's own (:mod:`.postgres`), stopped
  when the session ends. A server that cannot start fails every test that needs it, with
  the server's own reason in one line: never a skip, on CI or anywhere else.
- ``pg_dsn``: the URL of a database made for this test alone (``CREATE DATABASE
  t_<random>``), dropped afterwards (connections still open are ended). The test's spool
  directory (``XDG_STATE_HOME``) is inside its ``tmp_path``.

Enable them with ``from flower.testing.pytest_postgres import pg_dsn, pg_server`` in a
``conftest.py`` (or ``pytest_plugins = ["flower.testing.pytest_postgres"]``).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from ._suite import suite_server

__all__ = ["ENV", "database_url", "pg_dsn", "pg_server"]

ENV = "FLOWER_TEST_POSTGRES"


def database_url(server_url: str, database: str) -> str:
    """``server_url`` naming ``database`` instead of its own."""
    parts = urlsplit(server_url)
    return urlunsplit(parts._replace(path=f"/{database}"))


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """The superuser URL of the suite's PostgreSQL (see the module docstring)."""

    def start() -> tuple[str, Callable[[], None]]:
        from ..services.postgres import start_postgres

        server = start_postgres(durable=False)
        return server.dsn, server.stop

    yield from suite_server(ENV, "PostgreSQL", start)


@pytest.fixture
def pg_dsn(pg_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh database for this test (see the module docstring)."""
    import psycopg

    name = f"t_{secrets.token_hex(6)}"
    try:
        with psycopg.connect(pg_server, autocommit=True, connect_timeout=10) as admin:
            admin.execute(f"CREATE DATABASE {name}")
    except psycopg.Error as exc:
        line = " ".join(str(exc).split())
        pytest.fail(f"PostgreSQL for the tests ({ENV}={pg_server}): {line}", pytrace=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    try:
        yield database_url(pg_server, name)
    finally:
        with psycopg.connect(pg_server, autocommit=True, connect_timeout=10) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
