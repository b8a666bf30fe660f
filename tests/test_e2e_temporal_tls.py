"""Temporal connections as Temporal users configure them (issue 25, item 1), through a
TLS-terminating gRPC proxy (the system's nginx, tests/tls_proxy.py) in front of the suite's
Temporal dev server: one listener requires a client certificate of its own CA (mTLS), one an
API key. The configuration is given only by ``TEMPORAL_*`` variables, or by a TOML profile:
``--placement temporal:///QUEUE`` and workers started without ``--temporal``.

A flow runs end to end through each; a wrong certificate, a wrong key and an unknown
namespace are each one line and a non-zero exit before any model request, with nothing on
record; the key is in no output, log or command line.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from flower.services.model_server import ModelServer
from tests.e2e import Flower, wait_until
from tests.test_e2e_front_door import ABC, SCRIPT, nothing_left, on_record, one_line_refusal
from tests.tls_proxy import TlsProxy

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

KEY = "tk-flower-test-0123456789abcdef"
BIN = Path(sys.executable).parent


@pytest.fixture
def proxy(tmp_path: Path, temporal_target: str) -> Iterator[TlsProxy]:
    if not (shutil.which("nginx") or os.access("/usr/sbin/nginx", os.X_OK)):
        pytest.fail("nginx is missing: scripts/test.sh installs it (apt-get install nginx-light)")
    with TlsProxy(tmp_path / "nginx", temporal_target, KEY) as p:
        yield p


@pytest.fixture
def tls_flower(
    model_server: Callable[..., ModelServer], flower_env: Callable[..., Flower], pg_dsn: str
) -> Flower:
    f = flower_env(model_server(SCRIPT))
    f.env.update({"FLOWER_STATE": pg_dsn, "FLOWER_LANG": "en"})
    for name in [k for k in f.env if k.startswith("TEMPORAL_")]:
        del f.env[name]
    f.env["TEMPORAL_CONFIG_FILE"] = str(f.root / "no-temporal.toml")
    return f


def mtls_env(p: TlsProxy, cert: Path | None = None, key: Path | None = None) -> dict[str, str]:
    return {
        "TEMPORAL_ADDRESS": f"127.0.0.1:{p.mtls}",
        "TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(p.pki.ca),
        "TEMPORAL_TLS_CLIENT_CERT_PATH": str(cert or p.pki.client_cert),
        "TEMPORAL_TLS_CLIENT_KEY_PATH": str(key or p.pki.client_key),
    }


def profile_env(p: TlsProxy, dir: Path, key: str = KEY) -> dict[str, str]:
    """A TOML file whose profile ``proxy`` names the API-key listener, and the two variables
    that choose it."""
    toml = dir / "temporal.toml"
    toml.write_text(
        '[profile.default]\naddress = "127.0.0.1:1"\n\n'
        f'[profile.proxy]\naddress = "127.0.0.1:{p.api_key}"\napi_key = "{key}"\n'
        f'[profile.proxy.tls]\nserver_ca_cert_path = "{p.pki.ca}"\n',
        encoding="utf-8",
    )
    toml.chmod(0o600)
    return {"TEMPORAL_CONFIG_FILE": str(toml), "TEMPORAL_PROFILE": "proxy"}


@contextlib.contextmanager
def worker(f: Flower, env: dict[str, str], queue: str, dsn: str, log: Path) -> Iterator[None]:
    """``flower-super worker`` with no --temporal: everything from ``env``'s TEMPORAL_*."""
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            [str(BIN / "flower-super"), "worker", "--queue", queue, "--state", dsn],
            cwd=f.root,
            env={**f.env, **env},
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until(lambda: "-- worker " in log.read_text() or proc.poll() is not None, 60, "worker")
        assert proc.poll() is None, log.read_text()
        assert "· TLS" in log.read_text(), log.read_text()
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def key_nowhere(*texts: str) -> None:
    for text in texts:
        assert KEY not in text
    for p in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            assert KEY not in " ".join(p.info["cmdline"] or [])


def test_a_flow_runs_through_mtls_configured_by_temporal_variables_only(
    tls_flower: Flower, proxy: TlsProxy, temporal_queue: str, pg_dsn: str, tmp_path: Path
) -> None:
    env = mtls_env(proxy)
    with worker(tls_flower, env, temporal_queue, pg_dsn, tmp_path / "w.log"):
        tls_flower.env.update(env)
        code, out = tls_flower.run(
            "--placement", f"temporal:///{temporal_queue}", flow=ABC, timeout=180
        )
        assert code == 0, out + (tmp_path / "w.log").read_text()
        assert out.count("@ running on") == 3, out


def test_a_flow_runs_through_an_api_key_from_a_toml_profile(
    tls_flower: Flower, proxy: TlsProxy, temporal_queue: str, pg_dsn: str, tmp_path: Path
) -> None:
    env = profile_env(proxy, tmp_path)
    log = tmp_path / "w.log"
    with worker(tls_flower, env, temporal_queue, pg_dsn, log):
        tls_flower.env.update(env)
        code, out = tls_flower.run(
            "--placement", f"temporal:///{temporal_queue}", flow=ABC, timeout=180
        )
        assert code == 0, out + log.read_text()
        assert out.count("@ running on") == 3, out
        key_nowhere(out, log.read_text())


@pytest.mark.parametrize("case", ["wrong certificate", "no certificate", "wrong key", "namespace"])
def test_a_refused_connection_is_one_line_before_any_model_request(
    tls_flower: Flower, proxy: TlsProxy, pg_dsn: str, tmp_path: Path, case: str
) -> None:
    placement = "temporal:///flower"
    if case == "wrong certificate":
        env = mtls_env(proxy, proxy.pki.wrong_cert, proxy.pki.wrong_key)
        says = f"Temporal at 127.0.0.1:{proxy.mtls} refused the credentials (client certificate)"
    elif case == "no certificate":
        env = mtls_env(proxy)
        del env["TEMPORAL_TLS_CLIENT_CERT_PATH"], env["TEMPORAL_TLS_CLIENT_KEY_PATH"]
        says = f"Temporal at 127.0.0.1:{proxy.mtls} refused the credentials"
    elif case == "wrong key":
        env = profile_env(proxy, tmp_path, key="tk-not-the-key-" + KEY[::-1])
        says = f"Temporal at 127.0.0.1:{proxy.api_key} refused the credentials (API key)"
    else:
        env = profile_env(proxy, tmp_path)
        placement = "temporal:///flower?namespace=nope"
        says = f"Temporal at 127.0.0.1:{proxy.api_key} has no namespace nope"
    tls_flower.env.update(env)
    code, out = tls_flower.run("--placement", placement, flow=ABC, timeout=60)
    one_line_refusal(code, out, says)
    nothing_left(tls_flower, pg_dsn)
    key_nowhere(out)
    assert KEY[::-1] not in out
    assert on_record(pg_dsn)["registry"] == 0
