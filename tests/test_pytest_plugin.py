"""``flower.testing.pytest_plugin``: the fixtures users enable with ``pytest_plugins``."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import textwrap

import pytest

from flower.testing import cli_env, pytest_plugin
from tests.e2e import REPO

# The plugin's own fixtures, by name (our suite does not enable the plugin as a whole).
flower_cli_env = pytest_plugin.flower_cli_env
flower_runtime = pytest_plugin.flower_runtime


def test_flower_cli_env_points_this_process_at_the_server(
    model_server, flower_cli_env, tmp_path, monkeypatch
):
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", "a-real-token")
    server = model_server({"default": ["ok"]})
    env = flower_cli_env(server)
    assert env == {k: os.environ[k] for k in env}
    assert os.environ["ANTHROPIC_BASE_URL"] == server.url
    assert os.environ["HOME"] == str(tmp_path / "home")
    assert os.environ["CLAUDE_CONFIG_DIR"] == str(tmp_path / "home" / ".claude")
    assert os.environ["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert os.environ["ANTHROPIC_AUTH_TOKEN"] == ""  # blank: the CLI treats it as unset
    assert flower_cli_env("http://127.0.0.1:9", extra={"X": "1"})["X"] == "1"


def test_flower_runtimes_of_one_test_share_workspace_and_run_dir(
    model_server, flower_runtime, tmp_path
):
    server = model_server({"default": ["ok"]})
    first, second = flower_runtime(server), flower_runtime(server)
    assert first.workspace == second.workspace == (tmp_path / "ws").resolve()
    assert first.run_dir == second.run_dir == tmp_path / "runs"
    assert os.environ["ANTHROPIC_BASE_URL"] == server.url
    elsewhere = flower_runtime(server, workspace=tmp_path / "other", handoff=False)
    assert elsewhere.workspace == (tmp_path / "other").resolve()
    assert not elsewhere.handoff.enabled


def test_the_plugin_is_no_entry_point():
    """Installing flower must not load it into every pytest session, ours included."""
    plugins = importlib.metadata.entry_points(group="pytest11")
    assert not [ep for ep in plugins if ep.value.startswith("flower")]


@pytest.mark.timeout(60)  # one pytest in a fresh interpreter, no model
def test_pytest_plugins_enables_it_and_the_environment_comes_back(tmp_path):
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["flower.testing.pytest_plugin"]\n')
    (tmp_path / "test_user.py").write_text(
        textwrap.dedent(
            """
            import http.client, json, os

            def test_a_server_and_its_env(model_server, flower_cli_env):
                server = model_server({"default": ["hello"]})
                flower_cli_env(server)
                conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
                body = {"model": "m", "max_tokens": 9, "messages": [
                    {"role": "user", "content": "hi"}]}
                conn.request("POST", "/v1/messages", json.dumps(body))
                reply = json.loads(conn.getresponse().read())
                assert reply["content"][0]["text"] == "hello"
                assert [r.answer for r in server.requests] == ["text"]
                assert os.environ["ANTHROPIC_BASE_URL"] == server.url

            def test_then_the_environment_is_back():
                assert os.environ["ANTHROPIC_BASE_URL"] == "http://outer.invalid"
            """
        )
    )
    env = cli_env(tmp_path / "home", "http://outer.invalid")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error"],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout, done.stdout


def test_fixture_names_are_the_documented_ones():
    for name in pytest_plugin.__all__:
        assert f"``{name}" in (pytest_plugin.__doc__ or ""), name
