"""How flower reaches Temporal (issue 25, item 1): the client settings come from
``temporalio.envconfig`` (``TEMPORAL_*``, the TOML profile), the placement URL's address and
namespace over them, and each way of failing is one line that never shows the API key.
Unit tests: no server (the e2e front door is tests/test_e2e_front_door.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.service import RPCError, RPCStatusCode

from flower import FlowerError
from flower.services.temporal_client import Where, failure, settings, settings_for

KEY = "tk-very-secret-api-key-123"


@pytest.fixture(autouse=True)
def english(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWER_LANG", "en")


# ---- the URL ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "want"),
    [
        ("temporal://127.0.0.1:7233/flower", Where("127.0.0.1:7233", "flower", "")),
        ("temporal://h.example:7233/q?namespace=prod", Where("h.example:7233", "q", "prod")),
        ("temporal:///flower", Where("", "flower", "")),
        ("temporal:///flower?namespace=ns.acct", Where("", "flower", "ns.acct")),
        ("  temporal://[::1]:7233/q  ", Where("[::1]:7233", "q", "")),
    ],
)
def test_placement_urls_that_parse(url: str, want: Where) -> None:
    assert Where.parse(url) == want
    assert Where.parse(str(want)) == want  # said back as it is read


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:7233/q",
        "temporal://127.0.0.1:7233",  # no queue
        "temporal://127.0.0.1/q",  # no port
        "temporal://127.0.0.1:x/q",
        "temporal://h:1/q/more",
        "temporal://h:1/q?namespace=",  # an empty namespace
        "temporal://h:1/q?ns=x",  # an unknown field
        "temporal://h:1/q?namespace=a&namespace=b",
        "temporal://nowhere",
    ],
)
def test_placement_urls_that_are_one_line_with_a_hint(url: str) -> None:
    with pytest.raises(FlowerError) as err:
        Where.parse(url)
    assert "temporal://HOST:PORT/QUEUE" in err.value.message and err.value.hint


# ---- the settings ---------------------------------------------------------------------


def no_file(tmp_path: Path) -> dict[str, str]:
    """An environment whose TOML file does not exist (none of this machine's)."""
    return {"TEMPORAL_CONFIG_FILE": str(tmp_path / "none.toml")}


def test_nothing_configured_is_the_default_namespace_without_tls(tmp_path: Path) -> None:
    found = settings("127.0.0.1:7233", env=no_file(tmp_path))
    assert (found.target, found.namespace, found.tls) == ("127.0.0.1:7233", "default", False)
    assert dict(found.options) == {}


def test_the_environment_names_address_namespace_and_key(tmp_path: Path) -> None:
    env = {
        **no_file(tmp_path),
        "TEMPORAL_ADDRESS": "acct.tmprl.cloud:7233",
        "TEMPORAL_NAMESPACE": "acct.ns",
        "TEMPORAL_API_KEY": KEY,
    }
    found = settings_for(Where.parse("temporal:///flower"), env)
    assert (found.target, found.namespace) == ("acct.tmprl.cloud:7233", "acct.ns")
    assert found.options["api_key"] == KEY and found.tls  # an API key means TLS
    assert KEY not in repr(found) and KEY not in found.describe()
    assert found.credentials == "API key"


def test_the_url_s_address_and_namespace_go_over_the_configuration(tmp_path: Path) -> None:
    env = {**no_file(tmp_path), "TEMPORAL_ADDRESS": "a:1", "TEMPORAL_NAMESPACE": "from-env"}
    found = settings_for(Where.parse("temporal://b:2/q?namespace=from-url"), env)
    assert (found.target, found.namespace) == ("b:2", "from-url")
    found = settings_for(Where.parse("temporal://b:2/q"), env)
    assert (found.target, found.namespace) == ("b:2", "from-env")


def test_a_toml_profile_and_temporal_profile(tmp_path: Path) -> None:
    toml = tmp_path / "temporal.toml"
    toml.write_text(
        '[profile.default]\naddress = "dev:7233"\n\n'
        f'[profile.prod]\naddress = "prod:7233"\nnamespace = "prod-ns"\napi_key = "{KEY}"\n',
        encoding="utf-8",
    )
    env = {"TEMPORAL_CONFIG_FILE": str(toml)}
    assert settings(env=env).target == "dev:7233"
    prod = settings(env={**env, "TEMPORAL_PROFILE": "prod"})
    assert (prod.target, prod.namespace, prod.tls) == ("prod:7233", "prod-ns", True)
    assert prod.options["api_key"] == KEY and KEY not in repr(prod)


def test_mtls_paths_are_read_into_the_client_s_tls(tmp_path: Path) -> None:
    for name in ("ca.pem", "client.pem", "client.key"):
        (tmp_path / name).write_bytes(f"-- {name} --".encode())
    env = {
        **no_file(tmp_path),
        "TEMPORAL_ADDRESS": "h:7233",
        "TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(tmp_path / "ca.pem"),
        "TEMPORAL_TLS_CLIENT_CERT_PATH": str(tmp_path / "client.pem"),
        "TEMPORAL_TLS_CLIENT_KEY_PATH": str(tmp_path / "client.key"),
        "TEMPORAL_TLS_SERVER_NAME": "temporal.internal",
    }
    found = settings(env=env)
    tls = found.options["tls"]
    assert tls.server_root_ca_cert == b"-- ca.pem --"
    assert tls.client_cert == b"-- client.pem --"
    assert tls.client_private_key == b"-- client.key --"
    assert tls.domain == "temporal.internal"
    assert found.credentials == "client certificate"
    assert "client.key --" not in repr(found)


@pytest.mark.parametrize(
    "env",
    [
        {"TEMPORAL_PROFILE": "nope"},
        {"TEMPORAL_TLS_CLIENT_CERT_PATH": "/nonexistent/c.pem"},
    ],
    ids=["unknown profile", "missing certificate"],
)
def test_a_configuration_that_cannot_be_read_is_one_line(
    tmp_path: Path, env: dict[str, str]
) -> None:
    toml = tmp_path / "temporal.toml"
    toml.write_text('[profile.default]\naddress = "dev:7233"\n', encoding="utf-8")
    with pytest.raises(FlowerError) as err:
        settings(env={"TEMPORAL_CONFIG_FILE": str(toml), "TEMPORAL_ADDRESS": "h:1", **env})
    assert err.value.message.startswith("Temporal's client configuration cannot be read")
    assert "\n" not in err.value.message and err.value.hint


def test_a_toml_file_that_does_not_parse_never_shows_its_api_key(tmp_path: Path) -> None:
    """The TOML parser quotes the line it stopped at: an unclosed api_key line would put
    the key on the person's terminal (and in a worker's log)."""
    toml = tmp_path / "temporal.toml"
    toml.write_text(
        '[profile.default]\naddress = "dev:7233"\napi_key = "sk-SECRET-123\n', encoding="utf-8"
    )
    with pytest.raises(FlowerError) as err:
        settings(env={"TEMPORAL_CONFIG_FILE": str(toml)})
    assert "cannot be read" in err.value.message and "line 3" in err.value.message
    assert "SECRET" not in err.value.message + (err.value.hint or "")


def test_no_address_anywhere_is_one_line_naming_temporal_address(tmp_path: Path) -> None:
    with pytest.raises(FlowerError) as err:
        settings_for(Where.parse("temporal:///q"), no_file(tmp_path))
    assert "names no address" in err.value.message
    assert "TEMPORAL_ADDRESS" in (err.value.hint or "")


# ---- what failing looks like ----------------------------------------------------------


def keyed(tmp_path: Path) -> object:
    env = {**no_file(tmp_path), "TEMPORAL_API_KEY": KEY, "TEMPORAL_NAMESPACE": "ns1"}
    return settings("h:7233", env=env)


def test_failures_are_one_line_each_and_never_show_the_key(tmp_path: Path) -> None:
    found = keyed(tmp_path)
    cases = {
        "has no namespace ns1": RPCError(
            "Namespace ns1 is not found.", RPCStatusCode.NOT_FOUND, b""
        ),
        "refused the credentials (API key)": RPCError(
            f"bad token {KEY}", RPCStatusCode.UNAUTHENTICATED, b""
        ),
        "TLS handshake": RuntimeError(
            "Failed client connect: Server connection error: tonic::transport::Error(Transport, "
            "ConnectError(Custom { kind: InvalidData, error: InvalidCertificate(UnknownIssuer) }))"
        ),
        "cannot reach Temporal at h:7233: Connection refused": RuntimeError(
            "Failed client connect: Server connection error: tonic::transport::Error(Transport, "
            'ConnectError(ConnectError("tcp connect error", 127.0.0.1:1, Os { code: 111, kind: '
            'ConnectionRefused, message: "Connection refused" })))'
        ),
    }
    for says, exc in cases.items():
        err = failure(found, exc)  # type: ignore[arg-type]
        assert says in err.message, (says, err.message)
        assert "\n" not in err.message and err.hint
        assert KEY not in err.message + (err.hint or "")
        assert "tonic" not in err.message


def test_a_worker_with_no_address_anywhere_is_one_line(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "FLOWER_"))}
    env.update(FLOWER_LANG="en", HOME=str(tmp_path), **no_file(tmp_path))
    done = subprocess.run(
        [str(Path(sys.executable).parent / "flower-super"), "worker", "--queue", "q"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 2, done.stderr
    assert "the worker does not know where Temporal is" in lines[0]
    assert "--temporal HOST:PORT" in lines[1] and "TEMPORAL_ADDRESS" in lines[1]
