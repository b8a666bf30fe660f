"""Credentials for the ``flower`` command: ``flower setup``, the probe, and the two gates.

Gate one (are there credentials) looks them up in the order of
:mod:`flower.people.credentials` and, when there are none, asks for them on the terminal
(:func:`configure`) or stops with the four-line message. Gate two (do they work) sends one
tiny request (:func:`probe`): a rejected key or a wrong gateway/model gets one chance to be
reconfigured; a network problem is reported and the run starts anyway, since the runtime
waits out outages on its own.

Cheap to import: no SDK, and urllib only when the probe runs.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flower._errors import FlowerError
from flower.i18n import define, t
from flower.people.credentials import (
    KNOWN_KEYS,
    SETUP_KEYS,
    SHELL,
    claude_dir,
    config_env_path,
    has_key,
    load_credentials,
    loaded,
    other_auth,
    source_above_config,
    write_config_env,
)

ReadLine = Callable[[str], str | None]
Say = Callable[[str], None]

PROMPT = "   > "
DEFAULT_BASE_URL = "https://api.anthropic.com"
DEFAULT_PROBE_MODEL = "claude-3-5-haiku-20241022"
MODEL_KEYS = ("ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL", "ANTHROPIC_DEFAULT_SONNET_MODEL")
SECRET_KEYS = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")

# The reference's words for a failure caused by credentials: a crashed run whose error
# matches this is offered a reconfiguration.
_CREDENTIALS_ERROR = re.compile(
    r"\b401\b|invalid[ _-]?api[ _-]?key|authentication|unauthori[sz]ed|无效.*(?:key|token|密钥)",
    re.IGNORECASE,
)

define(
    {
        "setup.title": (
            "== 配置 flower ========================================",
            "== Configure flower ===================================",
        ),
        "setup.where": (
            "凭证会存到 {path}(只你可读)。装一次,处处生效。",
            "Credentials are saved to {path} (readable only by you). "
            "Set up once, works everywhere.",
        ),
        "setup.q.token": (
            "1. 你的 API key 或网关 token (Anthropic 官方的 sk-ant-… 或第三方网关签发的)",
            "1. Your API key or gateway token (Anthropic's own sk-ant-…, or one a third-party "
            "gateway issued)",
        ),
        "setup.q.base_url": (
            "2. 网关地址 (直接回车 = Anthropic 官方;第三方网关填它的 BASE_URL)",
            "2. Gateway address (Enter = Anthropic's own; for a third-party gateway, its BASE_URL)",
        ),
        "setup.q.model": (
            "3. 模型名 (直接回车 = 默认;网关有自己的模型名就填,如 claude-opus-5[1m])",
            "3. Model name (Enter = the default; if the gateway has its own model names, give "
            "one, e.g. claude-opus-5[1m])",
        ),
        "setup.saved": ("+ 存好了:{path}", "+ Saved: {path}"),
        "setup.no_token": ("没给 token,取消。", "No token given, cancelled."),
        "setup.cancelled": ("已取消", "Cancelled."),
        "setup.write_failed": (
            "x 写不了 {path}:{error}",
            "x Cannot write {path}: {error}",
        ),
        "setup.env_comment": (
            "# flower 凭证 —— 由 `flower setup` 写。别提交进版本库。",
            "# flower credentials — written by `flower setup`. Never commit this file.",
        ),
        "setup.shadowed": (
            "! 这些比刚存的配置优先,照旧生效:{items}。不想要就去掉。",
            "! These come first and still apply over what was just saved: {items}. "
            "Remove them if you do not want them.",
        ),
        "setup.from_shell": ("进程环境", "the shell's environment"),
        "setup.reason.again": ("重新配置。", "Reconfiguring."),
        "setup.reason.first": ("还没配过凭证。", "No credentials are configured yet."),
        "setup.probing": ("- 验一下凭证…", "- Checking the credentials…"),
        "setup.verified": ("+ 凭证能用。", "+ The credentials work."),
        "setup.rejected": ("! 凭证被拒:{detail}", "! The credentials were rejected: {detail}"),
        "setup.bad_config": (
            "! 网关地址或模型名不对:{detail}",
            "! The gateway address or the model name is wrong: {detail}",
        ),
        "setup.net": (
            "  (探针没打通:{detail} —— 当作网络问题,照常开跑)",
            "  (the probe did not get through: {detail} — taken as a network problem, "
            "starting anyway)",
        ),
        "setup.net_saved": (
            "  (探针没打通:{detail} —— 当作网络问题,配置已存好)",
            "  (the probe did not get through: {detail} — taken as a network problem; "
            "the configuration is saved)",
        ),
        "setup.missing": (
            "缺少凭证:需要 ANTHROPIC_API_KEY 或 ANTHROPIC_AUTH_TOKEN。\n"
            "最省事:跑一次 `flower setup`,把 token 存到 {path}(装一次,处处生效)。\n"
            "或者:在当前目录建 `.env`,或 export 进进程环境。\n"
            "{claude}/settings.json 的 env 里也没有 —— flower 只从那里借凭证,别的设置不读。",
            "Missing credentials: ANTHROPIC_API_KEY or ANTHROPIC_AUTH_TOKEN is needed.\n"
            "Easiest: run `flower setup` once; it saves the token to {path} "
            "(set up once, works everywhere).\n"
            "Or: create a `.env` in the current directory, or export it into the environment.\n"
            "Not in the env block of {claude}/settings.json either — flower borrows only "
            "credentials from there, no other setting.",
        ),
        "setup.exit.auth_batch": (
            "凭证被拒,且无法交互配置。跑 `flower setup` 重配。",
            "The credentials were rejected, and there is no terminal to reconfigure them. "
            "Run `flower setup`.",
        ),
        "setup.exit.config_batch": (
            "网关地址或模型名不对,且无法交互配置。跑 `flower setup` 重配。",
            "The gateway address or the model name is wrong, and there is no terminal to "
            "reconfigure them. Run `flower setup`.",
        ),
        "setup.exit.auth": (
            "凭证被拒。核对一下 token,再跑 `flower setup` 重配。",
            "The credentials were rejected. Check the token, then run `flower setup`.",
        ),
        "setup.exit.config": (
            "网关地址或模型名不对。核对一下,再跑 `flower setup` 重配。",
            "The gateway address or the model name is wrong. Check them, then run `flower setup`.",
        ),
        "setup.crash.looks_like_auth": (
            "! 看起来是凭证不对:{detail}",
            "! This looks like a credentials problem: {detail}",
        ),
        "setup.crash.configured": (
            "配好了。再跑一次刚才的命令 —— 同一目录会接着上次。",
            "Configured. Run the same command again — in the same directory it carries on "
            "where it stopped.",
        ),
        "setup.describe": ("- 在用的凭证配置:", "- Credentials in effect:"),
    }
)


class SetupExit(FlowerError):
    """Stop before a run: no usable credentials and no way (or no second chance) to fix them.

    ``message`` is what the person sees (on stderr), ``code`` the exit status.
    """

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code

    def __reduce__(self) -> tuple[Any, ...]:
        return (SetupExit, (self.message, self.code))


# -- small helpers -------------------------------------------------------------------------


def mask(secret: str) -> str:
    """``sk-a…``: the first 4 characters and an ellipsis (just ``…`` for a secret of 8 or
    fewer characters, where 4 would be half of it)."""
    return f"{secret[:4]}…" if len(secret) > 8 else "…"


def looks_like_credentials_error(text: str) -> bool:
    """A failed step's error reads like a credentials problem (401, invalid api key,
    authentication, unauthorized, 无效…key/token/密钥)."""
    return bool(_CREDENTIALS_ERROR.search(text or ""))


def describe_credentials() -> list[str]:
    """The verbose dump: each credential key in effect, secrets masked, and where it came
    from."""
    sources = loaded()
    lines = [t("setup.describe")]
    for name in KNOWN_KEYS:
        value = os.environ.get(name)
        if not value:
            continue
        shown = mask(value) if name in SECRET_KEYS else value
        where = _home(sources[name]) if name in sources else t("setup.from_shell")
        lines.append(f"  {name}={shown}  ({where})")
    return lines


def _home(path: str | Path) -> str:
    text, home = str(path), str(Path.home())
    return "~" + text[len(home) :] if text == home or text.startswith(home + os.sep) else text


def _read_line(prompt: str) -> str | None:
    try:
        return input(prompt)
    except EOFError:
        return None
    except KeyboardInterrupt:
        print(flush=True)
        return None


def _say(text: str) -> None:
    print(text, flush=True)


def _typed_unseen(read_line: ReadLine) -> ReadLine:
    """How a secret is read: on a terminal without echo (what is typed never shows on the
    screen, nor in its scrollback), else as ``read_line`` reads any line."""
    import sys

    if not sys.stdin.isatty():
        return read_line

    def read(prompt: str) -> str | None:
        import getpass

        try:
            return getpass.getpass(prompt)
        except EOFError:
            return None
        except KeyboardInterrupt:
            print(flush=True)
            return None

    return read


# -- the interactive screen ----------------------------------------------------------------


def configure(reason: str, *, read_line: ReadLine, say: Say) -> bool:
    """Ask for the token, gateway and model; save them to :func:`config_env_path` (mode 0600,
    a full overwrite) and use them in this process at once.

    ``reason`` is the line under the title. The token is typed unseen on a terminal.
    Returns False when the person gave no token (blank line or Ctrl-D) or cancelled:
    nothing is written then.
    """
    say(t("setup.title"))
    say(reason)
    say(t("setup.where", path=config_env_path()))
    answers: list[str] = []
    for question in ("setup.q.token", "setup.q.base_url", "setup.q.model"):
        say("")
        say(t(question))
        line = (_typed_unseen(read_line) if question == "setup.q.token" else read_line)(PROMPT)
        if line is None and answers:
            say("")
            say(t("setup.cancelled"))
            return False
        answers.append((line or "").strip())
        if not answers[0]:
            say(t("setup.no_token"))
            return False
    return _save(*answers, say=say)


def _values(token: str, base_url: str, model: str) -> dict[str, str]:
    name = "ANTHROPIC_API_KEY" if token.startswith("sk-ant-") else "ANTHROPIC_AUTH_TOKEN"
    values = {name: token, "ANTHROPIC_BASE_URL": _base_url(base_url)}
    if model:
        values.update(dict.fromkeys(MODEL_KEYS, model))
    return values


def _base_url(text: str) -> str:
    """The root without ``/v1``: the CLI and the probe add ``/v1/messages`` themselves, and
    a pasted ``…/v1`` would make every request a 404."""
    url = text.strip().rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _save(token: str, base_url: str, model: str, *, say: Say) -> bool:
    values = _values(token, base_url, model)
    shadows = _shadowing(values)
    try:
        path = write_config_env(values, comment=t("setup.env_comment"))
    except OSError as exc:
        say(t("setup.write_failed", path=config_env_path(), error=exc.strerror or exc))
        return False
    say("")
    say(t("setup.saved", path=path))
    if shadows:
        say(t("setup.shadowed", items=", ".join(shadows)))
    return True


def _shadowing(values: dict[str, str]) -> list[str]:
    """The keys ``flower setup`` writes that a place above the per-user file (the shell,
    ``$FLOWER_ENV``, a project ``.env``) sets to something else: that value keeps winning."""
    out = []
    for name in SETUP_KEYS:
        where = source_above_config(name)
        if where is not None and os.environ.get(name) != values.get(name):
            shown = t("setup.from_shell") if where == SHELL else _home(where)
            out.append(f"{name} ({shown})")
    return out


# -- the probe -----------------------------------------------------------------------------


def probe(timeout: float = 20.0) -> tuple[str, str]:
    """Send one tiny request; say what came of it: ``(verdict, detail)``.

    ``POST {ANTHROPIC_BASE_URL}/v1/messages`` with ``max_tokens=16`` (a model that must
    think first cannot answer in 1 and keeps the server busy for half a minute), the model
    ``ANTHROPIC_DEFAULT_HAIKU_MODEL`` → ``ANTHROPIC_MODEL`` → ``claude-3-5-haiku-20241022``,
    ``x-api-key`` when there is an API key, else ``authorization: Bearer``. Verdicts: ``auth``
    (401/403 or no credentials), ``config`` (404, 400 naming the model, a malformed address),
    ``net`` (no connection, timeout, DNS, TLS, 5xx), ``ok`` (below 400 or undecidable). The
    detail is one line and never holds the key or token.
    """
    import http.client
    import urllib.error
    import urllib.request

    key = os.environ.get("ANTHROPIC_API_KEY", "")
    token = os.environ.get("ANTHROPIC_AUTH_TOKEN", "")
    if not key and not token:
        return "auth", "no ANTHROPIC_API_KEY or ANTHROPIC_AUTH_TOKEN"
    secrets = [s for s in (key, token) if s]
    if not all(s.isascii() and s.isprintable() for s in secrets):
        return "auth", "the key or token holds characters an HTTP header cannot carry"
    headers = {"content-type": "application/json", "anthropic-version": "2023-06-01"}
    if key:
        headers["x-api-key"] = key
    else:
        headers["authorization"] = f"Bearer {token}"
    base = (os.environ.get("ANTHROPIC_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
    body = {
        "model": _probe_model(),
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "hi"}],
    }
    try:
        request = urllib.request.Request(
            f"{base}/v1/messages", data=json.dumps(body).encode(), headers=headers, method="POST"
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return "ok", f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        text = _one_line(f"HTTP {exc.code} {_read_body(exc)}", secrets)
        return _judge(exc.code, text), text
    except urllib.error.URLError as exc:
        return "net", _one_line(str(exc.reason), secrets)
    except ValueError as exc:  # urllib's word for an address it cannot even parse
        return "config", _one_line(f"{base}: {exc}", secrets)
    except (OSError, http.client.HTTPException) as exc:  # timeouts, resets, bad status lines
        return "net", _one_line(f"{type(exc).__name__}: {exc}", secrets)


def _probe_model() -> str:
    env = os.environ
    return (
        env.get("ANTHROPIC_DEFAULT_HAIKU_MODEL")
        or env.get("ANTHROPIC_MODEL")
        or DEFAULT_PROBE_MODEL
    )


def _judge(status: int, text: str) -> str:
    if status in (401, 403):
        return "auth"
    if status == 404 or (status == 400 and "model" in text.lower()):
        return "config"
    if status >= 500:
        return "net"
    return "ok"  # 429, other 4xx: not the credentials' fault as far as one request can tell


def _read_body(exc: Any) -> str:
    try:
        data: bytes = exc.read(4096)
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace")


def _one_line(text: str, secrets: list[str], limit: int = 160) -> str:
    for secret in secrets:
        text = text.replace(secret, mask(secret))
    flat = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return flat[:limit]


# -- the two gates and `flower setup` ------------------------------------------------------


def missing_message() -> str:
    """The four lines of "no credentials anywhere"."""
    return t("setup.missing", path=config_env_path(), claude=_home(claude_dir()))


def ensure_credentials(
    *, interactive: bool, say: Say, read_line: ReadLine, workspace: str | Path | None = None
) -> None:
    """Gate one and gate two, before a run starts (:func:`have_credentials`, then
    :func:`credentials_work`)."""
    have_credentials(interactive=interactive, say=say, read_line=read_line, workspace=workspace)
    credentials_work(interactive=interactive, say=say, read_line=read_line)


def have_credentials(
    *, interactive: bool, say: Say, read_line: ReadLine, workspace: str | Path | None = None
) -> None:
    """Gate one: looks the credentials up (``workspace``'s ``.env`` too, when given); with
    none, asks for them when ``interactive``, else raises :class:`SetupExit` with the
    four-line message. Sends nothing."""
    load_credentials(workspace)
    if has_key() or other_auth():
        return
    if not interactive or not configure(t("setup.reason.first"), read_line=read_line, say=say):
        raise SetupExit(missing_message())


def credentials_work(*, interactive: bool, say: Say, read_line: ReadLine) -> None:
    """Gate two: the probe. A CLI logged in another way (OAuth, Bedrock/Vertex/Foundry,
    ``claude login``) passes unprobed. ``ok`` and ``net`` go on; ``auth`` and ``config``
    get one reconfiguration when ``interactive`` and raise :class:`SetupExit` otherwise or
    on a second failure."""
    if not has_key() and other_auth():
        return
    reconfigured = False
    while True:
        say(t("setup.probing"))
        verdict, detail = probe()
        if verdict == "ok":
            return
        if verdict == "net":
            say(t("setup.net", detail=detail[:80]))
            return
        say(t("setup.rejected" if verdict == "auth" else "setup.bad_config", detail=detail))
        if not interactive:
            raise SetupExit(t(f"setup.exit.{verdict}_batch"))
        if reconfigured or not configure(t("setup.reason.again"), read_line=read_line, say=say):
            raise SetupExit(t(f"setup.exit.{verdict}"))
        reconfigured = True


def setup_main(*, read_line: ReadLine | None = None, say: Say | None = None) -> int:
    """``flower setup``: configure (again), probe once and report; no run starts.

    0 when the configuration was saved and works (or the network could not tell), 1 when
    the person cancelled or the probe rejected what was saved (it stays saved, and is
    reported: ``flower setup && flower "…"`` does not go on with credentials that fail).
    """
    read_line = read_line or _read_line
    say = say or _say
    load_credentials(Path.cwd())
    reason = t("setup.reason.again") if has_key() else t("setup.reason.first")
    if not configure(reason, read_line=read_line, say=say):
        return 1
    say(t("setup.probing"))
    verdict, detail = probe()
    if verdict == "ok":
        say(t("setup.verified"))
    elif verdict == "net":
        say(t("setup.net_saved", detail=detail[:80]))
    else:
        say(t("setup.rejected" if verdict == "auth" else "setup.bad_config", detail=detail))
        return 1
    return 0
