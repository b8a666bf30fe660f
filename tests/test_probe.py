"""Gate two: the probe's four verdicts against a real loopback gateway, and what
ensure_credentials does with them (at most one reconfiguration, then the exit messages)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from flower.people.credentials import config_env_path
from supervisor.commands.setup import SetupExit, ensure_credentials, probe, setup_main
from tests.test_credentials import API_KEY, TOKEN, Home, Screen, machine  # noqa: F401

Reply = tuple[int, str]


class Gateway:
    """A loopback HTTP server answering ``POST /v1/messages`` with ``reply(request)``; keeps
    every request (path, headers, JSON body)."""

    def __init__(self, reply: Callable[[dict[str, Any]], Reply]) -> None:
        self.reply = reply
        self.requests: list[dict[str, Any]] = []
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                size = int(self.headers.get("content-length") or 0)
                request = {
                    "path": self.path,
                    "headers": {k.lower(): v for k, v in self.headers.items()},
                    "body": json.loads(self.rfile.read(size) or b"{}"),
                }
                gateway.requests.append(request)
                status, text = gateway.reply(request)
                data = text.encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the test output stays the test's

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        # A short poll: shutdown() waits up to one interval (0.5 s by default, per test).
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


OK: Reply = (200, '{"type":"message","content":[{"type":"text","text":"hi"}]}')


@pytest.fixture
def gateway(
    machine: Home,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Callable[..., Gateway]]:
    """``gateway(reply)``: a started gateway that ANTHROPIC_BASE_URL points at."""
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    started: list[Gateway] = []

    def start(reply: Reply | Callable[[dict[str, Any]], Reply] = OK) -> Gateway:
        g = Gateway(reply if callable(reply) else (lambda _r: reply))
        started.append(g)
        monkeypatch.setenv("ANTHROPIC_BASE_URL", g.url)
        return g

    yield start
    for g in started:
        g.close()


@pytest.fixture
def closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# -- the probe -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "verdict"),
    [
        ((401, '{"error":{"type":"authentication_error"}}'), "auth"),
        ((403, '{"error":{"type":"permission_error"}}'), "auth"),
        ((404, '{"error":{"type":"not_found_error"}}'), "config"),
        ((400, '{"error":{"message":"model: claude-x does not exist"}}'), "config"),
        ((400, '{"error":{"message":"max_tokens too small"}}'), "ok"),
        ((429, '{"error":{"type":"rate_limit_error"}}'), "ok"),
        ((500, "oops"), "net"),
        ((529, '{"error":{"type":"overloaded_error"}}'), "net"),
        (OK, "ok"),
    ],
)
def test_verdicts(
    gateway: Callable[..., Gateway],
    monkeypatch: pytest.MonkeyPatch,
    reply: Reply,
    verdict: str,
) -> None:
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", TOKEN)
    gateway(reply)
    got, detail = probe(timeout=10)
    assert got == verdict
    assert detail.startswith(f"HTTP {reply[0]}")
    assert len(detail) <= 160 and "\n" not in detail


def test_a_closed_port_is_the_network(
    machine: Home,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    closed_port: str,
) -> None:
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", TOKEN)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", closed_port)
    verdict, detail = probe(timeout=5)
    assert verdict == "net"
    assert "refused" in detail.lower()


def test_a_gateway_that_never_answers_is_the_network(
    machine: Home,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    listening_url: str,
) -> None:
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", TOKEN)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", listening_url)
    assert probe(timeout=0.5)[0] == "net"


def test_no_credentials_and_a_malformed_address(
    machine: Home,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert probe()[0] == "auth"
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", TOKEN)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "gw.example.com")  # no scheme
    assert probe()[0] == "config"
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", "tok\u00e9n-\u4e2d")
    assert probe()[0] == "auth"


def test_the_request(gateway: Callable[..., Gateway], monkeypatch: pytest.MonkeyPatch) -> None:
    g = gateway()
    monkeypatch.setenv("ANTHROPIC_BASE_URL", g.url + "/")
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", TOKEN)
    monkeypatch.setenv("ANTHROPIC_MODEL", "main-model")
    assert probe()[0] == "ok"
    monkeypatch.setenv("ANTHROPIC_DEFAULT_HAIKU_MODEL", "small-model")
    monkeypatch.setenv("ANTHROPIC_API_KEY", API_KEY)
    assert probe()[0] == "ok"
    monkeypatch.delenv("ANTHROPIC_MODEL")
    monkeypatch.delenv("ANTHROPIC_DEFAULT_HAIKU_MODEL")
    assert probe()[0] == "ok"
    first, second, third = g.requests
    assert first["path"] == "/v1/messages"
    assert first["body"]["max_tokens"] == 16
    assert first["body"]["model"] == "main-model"
    assert first["headers"]["authorization"] == f"Bearer {TOKEN}"
    assert "x-api-key" not in first["headers"]
    assert first["headers"]["anthropic-version"]
    assert second["body"]["model"] == "small-model"
    assert second["headers"]["x-api-key"] == API_KEY
    assert "authorization" not in second["headers"]
    assert third["body"]["model"] == "claude-3-5-haiku-20241022"


def test_the_detail_never_holds_the_token(
    gateway: Callable[..., Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some gateways echo what they were given; the detail is printed, so it is masked."""
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", TOKEN)
    gateway(lambda r: (401, f'{{"error":"bad token {r["headers"]["authorization"]}"}}'))
    verdict, detail = probe()
    assert verdict == "auth"
    assert TOKEN not in detail
    assert "gw-s…" in detail


# -- ensure_credentials --------------------------------------------------------------------


def test_no_credentials_and_no_terminal(machine: Home) -> None:  # noqa: F811
    screen = Screen()
    with pytest.raises(SetupExit) as info:
        ensure_credentials(interactive=False, say=screen.say, read_line=screen.read_line)
    assert info.value.code == 1
    assert info.value.message.splitlines() == [
        "缺少凭证:需要 ANTHROPIC_API_KEY 或 ANTHROPIC_AUTH_TOKEN。",
        f"最省事:跑一次 `flower setup`,把 token 存到 {config_env_path()}(装一次,处处生效)。",
        "或者:在当前目录建 `.env`,或 export 进进程环境。",
        "~/.claude/settings.json 的 env 里也没有 —— flower 只从那里借凭证,别的设置不读。",
    ]
    assert screen.lines == [] and screen.prompts == []


@pytest.mark.parametrize(
    ("reply", "line", "message"),
    [
        (
            (401, "denied"),
            "! 凭证被拒:HTTP 401 denied",
            "凭证被拒,且无法交互配置。跑 `flower setup` 重配。",
        ),
        (
            (404, "no such route"),
            "! 网关地址或模型名不对:HTTP 404 no such route",
            "网关地址或模型名不对,且无法交互配置。跑 `flower setup` 重配。",
        ),
    ],
)
def test_a_bad_probe_without_a_terminal_stops(
    gateway: Callable[..., Gateway],
    monkeypatch: pytest.MonkeyPatch,
    reply: Reply,
    line: str,
    message: str,
) -> None:
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", TOKEN)
    gateway(reply)
    screen = Screen()
    with pytest.raises(SetupExit) as info:
        ensure_credentials(interactive=False, say=screen.say, read_line=screen.read_line)
    assert (info.value.message, info.value.code) == (message, 1)
    assert screen.lines == ["- 验一下凭证…", line]


def test_the_network_is_not_the_credentials(
    machine: Home,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    closed_port: str,
) -> None:
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", TOKEN)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", closed_port)
    screen = Screen()
    ensure_credentials(interactive=False, say=screen.say, read_line=screen.read_line)
    assert screen.lines[0] == "- 验一下凭证…"
    assert screen.lines[1].startswith("  (探针没打通:")
    assert screen.lines[1].endswith(" —— 当作网络问题,照常开跑)")
    assert len(screen.lines) == 2


def test_good_credentials_from_the_user_file_pass_quietly(
    machine: Home,  # noqa: F811
    gateway: Callable[..., Gateway],
) -> None:
    g = gateway()
    machine.write(config_env_path(), f"ANTHROPIC_AUTH_TOKEN={TOKEN}\n")
    screen = Screen()
    ensure_credentials(interactive=False, say=screen.say, read_line=screen.read_line)
    assert screen.lines == ["- 验一下凭证…"]
    assert g.requests[0]["headers"]["authorization"] == f"Bearer {TOKEN}"


def _accepting(good: str) -> Callable[[dict[str, Any]], Reply]:
    def reply(request: dict[str, Any]) -> Reply:
        return OK if request["headers"].get("authorization") == f"Bearer {good}" else (401, "no")

    return reply


def test_one_reconfiguration_then_it_runs(
    gateway: Callable[..., Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    g = gateway(_accepting(TOKEN))
    config_env_path().parent.mkdir(parents=True)
    config_env_path().write_text("ANTHROPIC_AUTH_TOKEN=stale-token\n", encoding="utf-8")
    screen = Screen(TOKEN, g.url, "")
    ensure_credentials(interactive=True, say=screen.say, read_line=screen.read_line)
    assert len(g.requests) == 2
    assert screen.lines.count("== 配置 flower ========================================") == 1
    assert "重新配置。" in screen.lines
    assert screen.lines[-1] == "- 验一下凭证…"
    assert f"ANTHROPIC_AUTH_TOKEN={TOKEN}" in config_env_path().read_text(encoding="utf-8")


def test_a_second_rejection_stops_after_one_reconfiguration(
    gateway: Callable[..., Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    g = gateway((401, "no"))
    machine_file = config_env_path()
    machine_file.parent.mkdir(parents=True)
    machine_file.write_text(f"ANTHROPIC_AUTH_TOKEN={TOKEN}\n", encoding="utf-8")
    screen = Screen("another-bad-token", g.url, "", "never", "asked", "again")
    with pytest.raises(SetupExit) as info:
        ensure_credentials(interactive=True, say=screen.say, read_line=screen.read_line)
    assert info.value.message == "凭证被拒。核对一下 token,再跑 `flower setup` 重配。"
    assert len(g.requests) == 2
    assert len(screen.prompts) == 3  # one screen, three questions
    assert screen.lines.count("! 凭证被拒:HTTP 401 no") == 2


def test_cancelling_the_reconfiguration_stops(
    gateway: Callable[..., Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", TOKEN)
    gateway((404, "nope"))
    screen = Screen("")
    with pytest.raises(SetupExit) as info:
        ensure_credentials(interactive=True, say=screen.say, read_line=screen.read_line)
    assert info.value.message == "网关地址或模型名不对。核对一下,再跑 `flower setup` 重配。"
    assert screen.lines[-1] == "没给 token,取消。"


def test_first_run_on_a_terminal_asks_then_probes(gateway: Callable[..., Gateway]) -> None:
    g = gateway()
    screen = Screen(TOKEN, g.url, "")
    ensure_credentials(interactive=True, say=screen.say, read_line=screen.read_line)
    assert screen.lines[1] == "还没配过凭证。"
    assert screen.lines[-1] == "- 验一下凭证…"
    assert len(g.requests) == 1


def test_first_run_cancelled_stops_with_the_four_lines(machine: Home) -> None:  # noqa: F811
    screen = Screen(None)
    with pytest.raises(SetupExit) as info:
        ensure_credentials(interactive=True, say=screen.say, read_line=screen.read_line)
    assert info.value.message.startswith("缺少凭证:")
    assert len(info.value.message.splitlines()) == 4


def test_another_way_to_log_in_is_not_probed(
    gateway: Callable[..., Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    g = gateway()
    monkeypatch.setenv("CLAUDE_CODE_OAUTH_TOKEN", "oauth")
    screen = Screen()
    ensure_credentials(interactive=False, say=screen.say, read_line=screen.read_line)
    assert screen.lines == [] and g.requests == []


def test_setup_exit_survives_pickling() -> None:
    import pickle

    err = pickle.loads(pickle.dumps(SetupExit("msg", code=3)))
    assert (err.message, err.code) == ("msg", 3)


# -- flower setup --------------------------------------------------------------------------


def test_setup_main(gateway: Callable[..., Gateway], machine: Home) -> None:  # noqa: F811
    g = gateway(_accepting(TOKEN))
    first = Screen(TOKEN, g.url, "")
    assert setup_main(read_line=first.read_line, say=first.say) == 0
    assert first.lines[1] == "还没配过凭证。"
    assert first.lines[-2:] == ["- 验一下凭证…", "+ 凭证能用。"]
    again = Screen("bad", g.url, "")
    assert (
        setup_main(read_line=again.read_line, say=again.say) == 1
    )  # saved, but rejected: not a success
    assert again.lines[1] == "重新配置。"
    assert again.lines[-1] == "! 凭证被拒:HTTP 401 no"
    cancelled = Screen("")
    assert setup_main(read_line=cancelled.read_line, say=cancelled.say) == 1
    assert "ANTHROPIC_AUTH_TOKEN=bad" in Path(config_env_path()).read_text(encoding="utf-8")
