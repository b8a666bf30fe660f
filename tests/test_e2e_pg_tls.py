"""PostgreSQL the secure way, end to end (issue 25, point 2).

A server of this module's own with its own CA: TLS on, and the test role allowed in only
over TLS (``hostssl``) with a password. The real ``flower-super start`` and the real CLI
against the scripted model server:

- ``sslmode=verify-full`` and ``sslrootcert`` in the state URL, the password from a pgpass
  file (``PGPASSFILE``) and nowhere on a command line: the flow runs and its rows are in the
  database;
- a CA that did not sign the server's certificate: one line saying the TLS connection was
  refused, a non-zero exit within seconds (not the wait a start gives a database that is
  down), nothing sent to the model;
- the password on the command line (``--state postgresql://alice:…@``): it runs, and says
  once on stderr how to move the password out of sight of ``ps``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from flower.services.postgres import PgServer
from flower.testing.pytest_postgres import database_url
from tests.e2e import answers
from tests.e2e_pg import PgFlower

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

FLOW = "tests.flows.basic:two"
PASSWORD = "tls-" + secrets.token_hex(6)


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(where: Path, name: str) -> tuple[Path, Path]:
    """A CA of its own: (certificate, key)."""
    where.mkdir(parents=True, exist_ok=True)
    key, cert = where / f"{name}.key", where / f"{name}.crt"
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
            f"/CN={name}", "-keyout", str(key), "-out", str(cert), cwd=where)  # fmt: skip
    return cert, key


@pytest.fixture(scope="module")
def tls(own_server: PgServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The module's server with TLS on (its own CA), a role that may come in only over TLS,
    and a pgpass file holding its password."""
    work = tmp_path_factory.mktemp("tls")
    ca, ca_key = make_ca(work, "flower-test-ca")
    other_ca, _ = make_ca(work, "some-other-ca")
    ext = work / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
            "-keyout", "server.key", "-out", "server.csr", cwd=work)  # fmt: skip
    openssl("x509", "-req", "-in", "server.csr", "-CA", str(ca), "-CAkey", str(ca_key),
            "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", "server.crt",
            cwd=work)  # fmt: skip
    data = own_server.data
    owner = data.stat()
    for name in ("server.crt", "server.key"):
        shutil.copy(work / name, data / name)
        os.chown(data / name, owner.st_uid, owner.st_gid)
        os.chmod(data / name, 0o600)
    with open(data / "postgresql.conf", "a", encoding="utf-8") as conf:
        conf.write("\nssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n")
    hba = data / "pg_hba.conf"
    hba.write_text(
        "hostssl all alice 127.0.0.1/32 scram-sha-256\n"
        "host all alice 127.0.0.1/32 reject\n" + hba.read_text()
    )
    own_server.down()
    own_server.up()
    name = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(own_server.dsn, autocommit=True) as admin:
        admin.execute("DROP ROLE IF EXISTS alice")
        admin.execute(f"CREATE ROLE alice LOGIN PASSWORD '{PASSWORD}'")
        admin.execute(f"CREATE DATABASE {name} OWNER alice")
    passfile = work / "pgpass"
    passfile.write_text(f"127.0.0.1:{own_server.port}:{name}:alice:{PASSWORD}\n")
    passfile.chmod(0o600)
    base = database_url(own_server.dsn, name).replace("postgres@", "alice@")
    yield {
        "url": f"{base}?sslmode=verify-full&sslrootcert={ca}",
        "wrong_ca": f"{base}?sslmode=verify-full&sslrootcert={other_ca}",
        "with_password": f"{base.replace('alice@', f'alice:{PASSWORD}@')}"
        f"?sslmode=verify-full&sslrootcert={ca}",
        "passfile": passfile,
    }


def test_verify_full_and_a_pgpass_file_run_a_flow(
    model_server: Any, flower_env: Any, tls: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGPASSFILE", str(tls["passfile"]))  # the test's own reads, too
    server = model_server(answers("first", "second"))
    f: PgFlower = flower_env(
        server, state=tls["url"], extra_env={"PGPASSFILE": str(tls["passfile"])}
    )
    code, out = f.run(flow=FLOW, timeout=120)
    assert code == 0, out
    assert PASSWORD not in out
    assert [(r["step"], r["ok"]) for r in f.manifest()] == [("first", True), ("second", True)]
    with psycopg.connect(tls["url"]) as conn:  # only TLS lets alice in: the rows came so
        assert conn.info.pgconn.ssl_in_use


def test_a_ca_that_did_not_sign_the_server_is_one_line_at_once(
    model_server: Any, flower_env: Any, tls: dict[str, Any]
) -> None:
    server = model_server({"conversations": [], "default": ["never"]})
    f: PgFlower = flower_env(
        server, state=tls["wrong_ca"], extra_env={"PGPASSFILE": str(tls["passfile"])}
    )
    started = time.monotonic()
    code, out = f.run(flow=FLOW, timeout=60)
    took = time.monotonic() - started
    assert code != 0, out
    lines = [line for line in out.splitlines() if line.strip()]
    refused = [line for line in lines if "TLS" in line]
    assert len(refused) == 1 and "certificate verify failed" in refused[0], out
    assert took < 20, f"a refused certificate was waited for ({took:.0f} s)"
    assert not [r for r in server.requests if r.path == "/v1/messages"]


def test_a_password_on_the_command_line_runs_and_is_said_once(
    model_server: Any, flower_env: Any, tls: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGPASSFILE", raising=False)  # the URL's password is the only one
    monkeypatch.delenv("PGPASSWORD", raising=False)
    server = model_server(answers("first", "second"))
    f: PgFlower = flower_env(server, state=tls["url"])
    f.env.pop("FLOWER_STATE")
    assert "PGPASSFILE" not in f.env and "PGPASSWORD" not in f.env
    code, out = f.run("--state", tls["with_password"], flow=FLOW, timeout=120)
    assert code == 0, out
    said = [line for line in out.splitlines() if "ps" in line and "pgpass" in line]
    assert len(said) == 1, out
    assert PASSWORD not in "\n".join(line for line in out.splitlines() if line not in said)


def test_a_worker_on_verify_full_runs_the_flows_steps(
    model_server: Any,
    flower_env: Any,
    tls: dict[str, Any],
    temporal_target: str,
    temporal_queue: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cluster on the same secured state: a worker given the verify-full URL (no password
    in it: the pgpass file) runs the steps."""
    from tests.test_e2e_cluster import ABC, Cluster, abc_script

    monkeypatch.setenv("PGPASSFILE", str(tls["passfile"]))
    f = flower_env(model_server(abc_script([{"text": "B done."}])))
    f.env["PGPASSFILE"] = str(tls["passfile"])
    c = Cluster(f, temporal_target, temporal_queue, tls["url"], tmp_path / "workers")
    try:
        w = c.worker("W1")
        proc = c.start(ABC)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out.decode() + c.logs_text()
        assert w.took("B") == 1
        assert [r["ok"] for r in c.db.rows("B")] == [True]
        assert PASSWORD not in w.out()
    finally:
        c.stop()


def test_the_web_view_on_a_state_url_with_a_password_shows_no_password(
    model_server: Any, flower_env: Any, tls: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``flower-super ui --state`` with the password in it (as a person may type it): it
    serves the workspace's runs, says once how to move the password, and neither its pages
    nor its answers hold the password or the URL with it."""
    import re
    import urllib.request

    monkeypatch.setenv("PGPASSFILE", str(tls["passfile"]))
    server = model_server(answers("first", "second"))
    f: PgFlower = flower_env(
        server, state=tls["url"], extra_env={"PGPASSFILE": str(tls["passfile"])}
    )
    code, out = f.run(flow=FLOW, timeout=120)
    assert code == 0, out
    f.env.pop("FLOWER_STATE")
    argv = f.argv("ui", "--state", tls["with_password"], "-w", str(f.ws), "--port", "0")
    ui = subprocess.Popen(
        argv, cwd=f.root, env=f.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    f.procs.append(ui)
    assert ui.stdout is not None and ui.stderr is not None
    line = ui.stdout.readline().decode()
    found = re.search(r"(http://\S+)/\?token=(\S+)", line)
    assert found, line
    base, token = found.group(1), found.group(2)
    seen = []
    for path in ("/", "/api/runs", "/static/app.js"):
        req = urllib.request.Request(base + path, headers={"X-Flower-Token": token})
        with urllib.request.urlopen(req, timeout=10) as res:
            seen.append(res.read().decode("utf-8", "replace"))
    runs = json.loads(seen[1])
    # every workspace that ran on this database, this one among them
    spaces = {r["workspace"] for r in runs["runs"]}
    assert str(f.ws.resolve()) in spaces, spaces
    assert all(PASSWORD not in page for page in seen), "a page shows the password"
    assert tls["with_password"] not in "".join(seen)
    ui.terminate()
    _, err = ui.communicate(timeout=10)
    said = [x for x in err.decode().splitlines() if "pgpass" in x]
    assert len(said) == 1 and PASSWORD not in err.decode(), err
