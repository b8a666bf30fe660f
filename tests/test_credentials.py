"""Where credentials come from (the lookup order) and what `flower setup`'s screen writes."""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from flower.i18n import keys, t, texts
from flower.people import credentials
from flower.people.credentials import (
    KNOWN_KEYS,
    config_env_path,
    load_credentials,
    load_dotenv,
    source_above_config,
)
from supervisor.commands import setup
from supervisor.commands.setup import (
    configure,
    describe_credentials,
    looks_like_credentials_error,
    mask,
)

CJK = re.compile(r"[\u2e80-\u9fff\uf900-\ufaff\uff00-\uffef]")
TOKEN = "gw-secret-0123456789abcdef"
API_KEY = "sk-ant-api03-0123456789abcdef"
CLEARED = (
    *KNOWN_KEYS,
    *credentials.KEY_VARS,
    "FLOWER_ENV",
    "CLAUDE_CONFIG_DIR",
    "XDG_CONFIG_HOME",
    "LC_ALL",
    "LC_MESSAGES",
    "LANG",
)


class Home:
    """A person's machine in tmp_path: HOME, XDG_CONFIG_HOME, a project to cd into."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "home"
        self.xdg = root / "xdg"
        self.cwd = root / "proj"
        self.claude = self.home / ".claude"
        for d in (self.home, self.xdg, self.cwd, self.claude):
            d.mkdir(parents=True, exist_ok=True)

    def write(self, path: Path, text: str) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return path


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Home]:
    """Nothing of the real environment leaks in; every variable set is undone afterwards."""
    for name in CLEARED:
        monkeypatch.delenv(name, raising=False)
    m = Home(tmp_path)
    monkeypatch.setenv("HOME", str(m.home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(m.xdg))
    monkeypatch.setenv("FLOWER_LANG", "zh")
    monkeypatch.chdir(m.cwd)
    monkeypatch.setattr(credentials, "_loaded", {})
    monkeypatch.setattr(credentials, "_source_root", lambda: None)
    yield m


class Screen:
    """A scripted person: answers prompts in order, keeps every line flower showed."""

    def __init__(self, *answers: str | None) -> None:
        self.answers = list(answers)
        self.lines: list[str] = []
        self.prompts: list[str] = []

    def read_line(self, prompt: str) -> str | None:
        self.prompts.append(prompt)
        return self.answers.pop(0)

    def say(self, text: str) -> None:
        self.lines.append(text)

    def run(self, reason: str = "还没配过凭证。") -> bool:
        return configure(reason, read_line=self.read_line, say=self.say)


# -- the lookup order ----------------------------------------------------------------------


def _places(m: Home, monkeypatch: pytest.MonkeyPatch) -> list[Callable[[str], None]]:
    """One writer per place of the lookup order, highest first: each puts a model name there."""
    source_root = m.root / "checkout"

    def env_var(v: str) -> None:
        monkeypatch.setenv("ANTHROPIC_MODEL", v)

    def named(v: str) -> None:
        monkeypatch.setenv("FLOWER_ENV", str(m.write(m.root / "named.env", f"ANTHROPIC_MODEL={v}")))

    def workspace(v: str) -> None:
        m.write(m.root / "ws" / ".env", f"ANTHROPIC_MODEL={v}")

    def cwd(v: str) -> None:
        m.write(m.cwd / ".env", f"ANTHROPIC_MODEL={v}")

    def user(v: str) -> None:
        m.write(m.xdg / "flower" / ".env", f"ANTHROPIC_MODEL={v}")

    def checkout(v: str) -> None:
        monkeypatch.setattr(credentials, "_source_root", lambda: source_root)
        m.write(source_root / ".env", f"ANTHROPIC_MODEL={v}")

    def settings(v: str) -> None:
        m.write(m.claude / "settings.json", json.dumps({"env": {"ANTHROPIC_MODEL": v}}))

    def settings_local(v: str) -> None:
        m.write(m.claude / "settings.local.json", json.dumps({"env": {"ANTHROPIC_MODEL": v}}))

    return [env_var, named, workspace, cwd, user, checkout, settings, settings_local]


@pytest.mark.parametrize("first", range(8))
def test_the_first_place_that_has_a_key_wins(
    machine: Home, monkeypatch: pytest.MonkeyPatch, first: int
) -> None:
    places = _places(machine, monkeypatch)
    for i in range(len(places) - 1, first - 1, -1):  # lowest first: the env var is set last
        places[i](f"model-{i}")
    names = load_credentials(machine.root / "ws")
    assert os.environ["ANTHROPIC_MODEL"] == f"model-{first}"
    assert names == ([] if first == 0 else ["ANTHROPIC_MODEL"])


def test_priority_is_per_key_not_per_file(machine: Home) -> None:
    machine.write(machine.cwd / ".env", "ANTHROPIC_BASE_URL=http://project.example\n")
    machine.write(config_env_path(), f"ANTHROPIC_AUTH_TOKEN={TOKEN}\nANTHROPIC_BASE_URL=http://x\n")
    names = load_credentials()
    assert os.environ["ANTHROPIC_BASE_URL"] == "http://project.example"
    assert os.environ["ANTHROPIC_AUTH_TOKEN"] == TOKEN
    assert sorted(names) == ["ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL"]
    assert TOKEN not in repr(names)


def test_the_process_environment_is_never_overridden(
    machine: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "from-shell")
    machine.write(machine.cwd / ".env", "ANTHROPIC_API_KEY=from-file\n")
    assert load_credentials() == []
    assert os.environ["ANTHROPIC_API_KEY"] == "from-shell"
    assert source_above_config("ANTHROPIC_API_KEY") == credentials.SHELL


def test_an_empty_value_does_not_claim_its_key(machine: Home) -> None:
    machine.write(machine.cwd / ".env", "ANTHROPIC_AUTH_TOKEN=\n")
    machine.write(config_env_path(), f"ANTHROPIC_AUTH_TOKEN={TOKEN}\n")
    load_credentials()
    assert os.environ["ANTHROPIC_AUTH_TOKEN"] == TOKEN


def test_only_the_credential_keys_are_borrowed_from_claude_settings(machine: Home) -> None:
    env = {name: f"v-{name}" for name in KNOWN_KEYS} | {"SOMETHING_ELSE": "x", "PATH": "/evil"}
    machine.write(
        machine.claude / "settings.json",
        json.dumps({"env": env, "permissions": {"allow": ["Bash"]}, "model": "opus"}),
    )
    names = load_credentials()
    assert sorted(names) == sorted(KNOWN_KEYS)
    assert "SOMETHING_ELSE" not in os.environ
    assert os.environ["PATH"] != "/evil"


def test_claude_config_dir_is_where_claude_settings_are(
    machine: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = machine.root / "claude-config"
    machine.write(other / "settings.json", json.dumps({"env": {"ANTHROPIC_AUTH_TOKEN": TOKEN}}))
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(other))
    load_credentials()
    assert os.environ["ANTHROPIC_AUTH_TOKEN"] == TOKEN


@pytest.mark.parametrize(
    "text",
    ["{not json", "[1, 2]", '{"env": ["A"]}', '{"env": {"ANTHROPIC_API_KEY": true}}', "\xff"],
)
def test_a_broken_settings_file_is_skipped(machine: Home, text: str) -> None:
    (machine.claude / "settings.json").write_bytes(text.encode("latin-1"))
    assert load_credentials() == []


def test_config_env_path_follows_xdg(machine: Home, monkeypatch: pytest.MonkeyPatch) -> None:
    assert config_env_path() == machine.xdg / "flower" / ".env"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    assert config_env_path() == machine.home / ".config" / "flower" / ".env"
    monkeypatch.setenv("XDG_CONFIG_HOME", "")
    assert config_env_path() == machine.home / ".config" / "flower" / ".env"
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/dir")  # the XDG spec: ignored
    assert config_env_path() == machine.home / ".config" / "flower" / ".env"


def test_load_dotenv_with_directories_reads_only_those(machine: Home) -> None:
    machine.write(config_env_path(), f"ANTHROPIC_AUTH_TOKEN={TOKEN}\n")
    machine.write(machine.root / "ws" / ".env", "ANTHROPIC_MODEL=m\n")
    assert load_dotenv(machine.root / "ws") == ["ANTHROPIC_MODEL"]
    assert "ANTHROPIC_AUTH_TOKEN" not in os.environ
    assert load_dotenv() == ["ANTHROPIC_AUTH_TOKEN"]  # no directories: the whole lookup


def test_env_lines(machine: Home) -> None:
    machine.write(
        machine.cwd / ".env",
        "# a comment\n"
        "export ANTHROPIC_MODEL=exported\n"
        "ANTHROPIC_BASE_URL = 'http://quoted # not a comment'\n"
        "ANTHROPIC_AUTH_TOKEN=tok=with=equals   # a note\n"
        "not a line\n",
    )
    load_credentials()
    assert os.environ["ANTHROPIC_MODEL"] == "exported"
    assert os.environ["ANTHROPIC_BASE_URL"] == "http://quoted # not a comment"
    assert os.environ["ANTHROPIC_AUTH_TOKEN"] == "tok=with=equals"


# -- the interactive screen ----------------------------------------------------------------


def test_the_screen_is_the_references(machine: Home) -> None:
    path = config_env_path()
    screen = Screen(TOKEN, "", "")
    assert screen.run("还没配过凭证。")
    assert screen.lines == [
        "== 配置 flower ========================================",
        "还没配过凭证。",
        f"凭证会存到 {path}(只你可读)。装一次,处处生效。",
        "",
        "1. 你的 API key 或网关 token (Anthropic 官方的 sk-ant-… 或第三方网关签发的)",
        "",
        "2. 网关地址 (直接回车 = Anthropic 官方;第三方网关填它的 BASE_URL)",
        "",
        "3. 模型名 (直接回车 = 默认;网关有自己的模型名就填,如 claude-opus-5[1m])",
        "",
        f"+ 存好了:{path}",
    ]
    assert screen.prompts == ["   > "] * 3


def _file(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_an_api_key_a_gateway_and_a_model(machine: Home) -> None:
    assert Screen(API_KEY, "https://gw.example/v1/", "claude-opus-5[1m]").run()
    path = config_env_path()
    lines = _file(path)
    assert lines[0] == "# flower 凭证 —— 由 `flower setup` 写。别提交进版本库。"
    assert lines[1:] == [
        "",
        f"ANTHROPIC_API_KEY={API_KEY}",
        "ANTHROPIC_BASE_URL=https://gw.example",
        "ANTHROPIC_MODEL=claude-opus-5[1m]",
        "ANTHROPIC_DEFAULT_OPUS_MODEL=claude-opus-5[1m]",
        "ANTHROPIC_DEFAULT_SONNET_MODEL=claude-opus-5[1m]",
    ]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # in effect at once, and read back the same way by the next start
    assert os.environ["ANTHROPIC_API_KEY"] == API_KEY
    assert os.environ["ANTHROPIC_DEFAULT_SONNET_MODEL"] == "claude-opus-5[1m]"
    assert credentials._parse_env_lines(lines) == [
        (k, os.environ[k]) for k in [line.partition("=")[0] for line in lines[2:]]
    ]


def test_a_gateway_token_and_nothing_else(machine: Home) -> None:
    assert Screen(f"  {TOKEN}  ", "", "").run()
    assert _file(config_env_path())[2:] == [f"ANTHROPIC_AUTH_TOKEN={TOKEN}"]
    assert os.environ["ANTHROPIC_AUTH_TOKEN"] == TOKEN
    assert "ANTHROPIC_API_KEY" not in os.environ


def test_setup_overwrites_the_whole_file_and_the_environment(machine: Home) -> None:
    assert Screen(API_KEY, "https://gw.example", "m1").run()
    assert Screen(TOKEN, "", "").run()
    assert _file(config_env_path())[2:] == [f"ANTHROPIC_AUTH_TOKEN={TOKEN}"]
    for gone in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_MODEL"):
        assert gone not in os.environ


def test_the_file_is_never_readable_by_others(
    machine: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Created 0600 even with umask 0, before it gets its name: no instant of 0644."""
    modes: list[int] = []
    real_replace = os.replace

    def replace(src: str, dst: str) -> None:
        modes.append(stat.S_IMODE(os.stat(src).st_mode))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    old = os.umask(0)
    try:
        assert Screen(TOKEN, "", "").run()
    finally:
        os.umask(old)
    path = config_env_path()
    assert modes == [0o600]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700  # the parent was created
    assert [p.name for p in path.parent.iterdir()] == [".env"]  # no temporary file left


@pytest.mark.parametrize("answers", [("",), (None,), ("   ",)])
def test_no_token_cancels(machine: Home, answers: tuple[str | None, ...]) -> None:
    screen = Screen(*answers)
    assert not screen.run()
    assert screen.lines[-1] == "没给 token,取消。"
    assert not config_env_path().exists()


def test_ctrl_d_at_a_later_question_cancels(machine: Home) -> None:
    screen = Screen(TOKEN, None)
    assert not screen.run()
    assert screen.lines[-1] == "已取消"
    assert not config_env_path().exists()
    assert "ANTHROPIC_AUTH_TOKEN" not in os.environ


def test_a_value_the_shell_sets_still_wins_and_setup_says_so(
    machine: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://from-the-shell")
    screen = Screen(TOKEN, "http://typed", "")
    assert screen.run()
    assert os.environ["ANTHROPIC_BASE_URL"] == "http://from-the-shell"
    assert _file(config_env_path())[3] == "ANTHROPIC_BASE_URL=http://typed"
    assert screen.lines[-1] == (
        "! 这些比刚存的配置优先,照旧生效:ANTHROPIC_BASE_URL (进程环境)。不想要就去掉。"
    )


def test_the_token_is_shown_nowhere_and_written_only_to_the_env_file(machine: Home) -> None:
    screen = Screen(TOKEN, "http://gw.example", "m")
    assert screen.run()
    load_credentials()
    shown = [*screen.lines, *describe_credentials()]
    assert not [line for line in shown if TOKEN in line]
    holders = [
        p for p in machine.root.rglob("*") if p.is_file() and TOKEN.encode() in p.read_bytes()
    ]
    assert holders == [config_env_path()]


def test_english(machine: Home, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWER_LANG", "en")
    screen = Screen(TOKEN, "", "")
    assert screen.run(t("setup.reason.first"))
    assert screen.lines[0].startswith("== Configure flower ==")
    assert screen.lines[-1] == f"+ Saved: {config_env_path()}"
    assert not [line for line in screen.lines if CJK.search(line)]
    assert not CJK.search(config_env_path().read_text(encoding="utf-8"))
    assert not CJK.search(setup.missing_message())


def test_every_setup_text_has_english_without_chinese() -> None:
    ours = [k for k in keys() if k.startswith("setup.")]
    assert len(ours) >= 25
    for key in ours:
        zh, en = texts(key)
        assert zh and en and not CJK.search(en), key


# -- the small helpers ---------------------------------------------------------------------


def test_mask() -> None:
    assert mask("sk-ant-api03-xyz") == "sk-a…"
    assert mask("short") == "…"
    assert mask("") == "…"


def test_describe_masks_both_secrets(machine: Home, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", API_KEY)
    machine.write(config_env_path(), f"ANTHROPIC_AUTH_TOKEN={TOKEN}\nANTHROPIC_MODEL=m\n")
    load_credentials()
    assert describe_credentials() == [
        "- 在用的凭证配置:",
        "  ANTHROPIC_API_KEY=sk-a…  (进程环境)",
        f"  ANTHROPIC_AUTH_TOKEN=gw-s…  ({config_env_path()})",
        f"  ANTHROPIC_MODEL=m  ({config_env_path()})",
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("API Error: 401 {'type':'authentication_error'}", True),
        ("Invalid API key · Please run /login", True),
        ("invalid_api_key", True),
        ("HTTP 403 Unauthorized", True),
        ("令牌无效:token 已过期", True),
        ("无效的 token", True),
        ("密钥无效", False),
        ("key 无效的密钥", True),
        ("API Error: 529 overloaded", False),
        ("listening on port 4010", False),
        ("", False),
    ],
)
def test_looks_like_credentials_error(text: str, expected: bool) -> None:
    assert looks_like_credentials_error(text) is expected
