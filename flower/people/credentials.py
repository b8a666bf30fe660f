"""Credentials: where flower finds them, the per-user file ``flower setup`` writes, and the
check that fails at construction, not mid-run.

The lookup order (:func:`load_credentials`), first value found for a key wins:

1. the process environment (never overridden);
2. the file named by ``$FLOWER_ENV``;
3. ``<workspace>/.env`` (when a workspace is given), then ``$PWD/.env``;
4. ``${XDG_CONFIG_HOME:-~/.config}/flower/.env`` (:func:`config_env_path`, what ``flower setup``
   writes);
5. ``.env`` at the source checkout's root (only when flower runs from a checkout);
6. the ``env`` block of ``~/.claude/settings.json``, then ``settings.local.json`` (under
   ``$CLAUDE_CONFIG_DIR`` when that is set): only the :data:`KNOWN_KEYS`, nothing else of
   Claude Code's settings.

Priority is per key, not per file: a project ``.env`` holding only ``ANTHROPIC_BASE_URL``
still lets the token come from the per-user file. An empty value, in a file or in the
environment, does not claim its key (``ANTHROPIC_AUTH_TOKEN=`` in a project file no longer
hides the token in the per-user one).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from .._errors import FlowerError

# Any one of these lets the CLI talk to a model.
KEY_VARS = (
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "CLAUDE_CODE_OAUTH_TOKEN",
    "CLAUDE_CODE_USE_BEDROCK",
    "CLAUDE_CODE_USE_VERTEX",
    "CLAUDE_CODE_USE_FOUNDRY",
)

# The credential keys: the only ones borrowed from Claude Code's settings.json, and the ones
# the verbose dump shows.
KNOWN_KEYS = (
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "ANTHROPIC_BASE_URL",
    "ANTHROPIC_MODEL",
    "ANTHROPIC_DEFAULT_OPUS_MODEL",
    "ANTHROPIC_DEFAULT_SONNET_MODEL",
    "ANTHROPIC_DEFAULT_HAIKU_MODEL",
    "CLAUDE_CODE_SUBAGENT_MODEL",
    "CLAUDE_CODE_EFFORT_LEVEL",
)

# What `flower setup` writes: a rewrite of the per-user file replaces all of these.
SETUP_KEYS = (
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "ANTHROPIC_BASE_URL",
    "ANTHROPIC_MODEL",
    "ANTHROPIC_DEFAULT_OPUS_MODEL",
    "ANTHROPIC_DEFAULT_SONNET_MODEL",
)

# name -> the file its value came from, for every name a file (not the process) set.
_loaded: dict[str, str] = {}


class CredentialsError(FlowerError, RuntimeError):
    """No way for the CLI to authenticate (seed 003: raised by the Runtime constructor)."""


# -- where ---------------------------------------------------------------------------------


def config_env_path() -> Path:
    """``${XDG_CONFIG_HOME:-~/.config}/flower/.env``: the per-user file ``flower setup`` writes.

    A relative ``XDG_CONFIG_HOME`` is ignored, as the XDG spec says.
    """
    xdg = os.environ.get("XDG_CONFIG_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".config"
    return base / "flower" / ".env"


def claude_dir() -> Path:
    """Claude Code's own directory: ``$CLAUDE_CONFIG_DIR``, else ``~/.claude``."""
    config = os.environ.get("CLAUDE_CONFIG_DIR")
    return Path(config).expanduser() if config else Path.home() / ".claude"


def _source_root() -> Path | None:
    """The checkout flower runs from, or None when it is installed (site-packages)."""
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file() and (root / "flower" / "__init__.py").is_file():
        return root
    return None


def env_files(workspace: str | Path | None = None) -> list[Path]:
    """The ``.env`` files of the lookup order (items 2–5), existing or not, first first."""
    files: list[Path] = []
    named = os.environ.get("FLOWER_ENV")
    if named:
        files.append(Path(named).expanduser())
    if workspace is not None:
        files.append(Path(workspace).expanduser() / ".env")
    files.append(Path.cwd() / ".env")
    files.append(config_env_path())
    root = _source_root()
    if root is not None:
        files.append(root / ".env")
    return files


def settings_files() -> list[Path]:
    """Claude Code's settings whose ``env`` block is the last fallback (item 6)."""
    base = claude_dir()
    return [base / "settings.json", base / "settings.local.json"]


# -- load ----------------------------------------------------------------------------------


def load_credentials(workspace: str | Path | None = None) -> list[str]:
    """Fill ``os.environ`` from the lookup order, never overriding a value already set.

    Returns the names it set (never the values: they are usually keys). A file that is
    missing, unreadable or not what it should be is skipped: a broken fallback must not take
    the run down with it.
    """
    names: list[str] = []
    for path in _each_once(env_files(workspace)):
        names += _apply(_read_env_file(path), path)
    for path in settings_files():
        names += _apply(_borrowed(path), path)
    return list(dict.fromkeys(names))


def load_dotenv(*dirs: str | Path) -> list[str]:
    """Set variables from ``.env`` files in ``dirs`` that the environment does not have yet.

    With no ``dirs``, the whole lookup order (:func:`load_credentials`). Returns the names it
    set (never the values). Lines are ``NAME=value`` with optional ``export``, quotes and a
    `` # comment`` after an unquoted value; anything else is ignored.
    """
    if not dirs:
        return load_credentials()
    names: list[str] = []
    seen: set[Path] = set()
    for d in dirs:
        path = (Path(d) / ".env").resolve()
        if path in seen:
            continue
        seen.add(path)
        names += _apply(_read_env_file(path), path)
    return list(dict.fromkeys(names))


def lookup(name: str, workspace: str | Path | None = None) -> str | None:
    """``name``'s value as a start would find it, without setting anything: the process
    environment, else the first of the ``.env`` files of the lookup order (items 2-5) that
    gives it a non-empty value; None when none does. Reads those few small files only, so a
    command that only looks (``flower-super status``) finds what a start finds, cheaply."""
    value = os.environ.get(name)
    if value:
        return value
    for path in _each_once(env_files(workspace)):
        for key, found in _read_env_file(path):
            if key == name and found:
                return found
    return None


def _each_once(paths: Iterable[Path]) -> Iterable[Path]:
    """``paths`` in order, each file once (two names of one file count as one)."""
    seen: set[Path] = set()
    for path in paths:
        resolved = path.resolve()
        if resolved not in seen:
            seen.add(resolved)
            yield path


def loaded() -> dict[str, str]:
    """``name -> file`` for every variable a file set in this process (not the shell's own)."""
    return dict(_loaded)


SHELL = "<environment>"


def source_above_config(name: str) -> str | None:
    """Where ``name``'s value comes from when that place outranks :func:`config_env_path`:
    :data:`SHELL` for the process environment, else a file (``$FLOWER_ENV``, a workspace's or
    the current directory's ``.env``); None when ``name`` is unset or empty, or comes from the
    per-user file or below it."""
    if not os.environ.get(name):
        return None
    source = _loaded.get(name)
    if source is None:
        return SHELL
    root = _source_root()
    below = {config_env_path(), *settings_files(), *([root / ".env"] if root else [])}
    return None if Path(source) in below else source


def _apply(pairs: Iterable[tuple[str, str]], source: Path) -> list[str]:
    set_names = []
    for name, value in pairs:
        if os.environ.get(name):
            continue  # the first non-empty value seen is final
        if value or name not in os.environ:
            os.environ[name] = value
            _loaded[name] = str(source)
            set_names.append(name)
    return set_names


def _read_env_file(path: Path) -> list[tuple[str, str]]:
    try:
        return _parse_env_lines(path.read_text(encoding="utf-8").splitlines())
    except (OSError, UnicodeDecodeError):
        return []


_COMMENT = re.compile(r"\s+#.*$")


def _parse_env_lines(lines: list[str]) -> list[tuple[str, str]]:
    out = []
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        name, _, value = line.partition("=")
        name, value = name.strip(), value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        else:
            value = _COMMENT.sub("", value)
        if name.isidentifier():
            out.append((name, value))
    return out


def _borrowed(path: Path) -> list[tuple[str, str]]:
    """The credential keys of a Claude Code settings file's ``env`` block, nothing else."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return []
    env = data.get("env") if isinstance(data, dict) else None
    if not isinstance(env, dict):
        return []
    out = []
    for name in KNOWN_KEYS:
        value = env.get(name)
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            out.append((name, str(value)))
    return out


# -- write ---------------------------------------------------------------------------------


def write_config_env(values: Mapping[str, str], *, comment: str) -> Path:
    """Replace the per-user file with ``values`` (empty ones skipped) and use them now.

    The file is created mode 0600 (it holds a token: never readable by others, not even for
    an instant) beside the old one and renamed over it, so a crash leaves the old file or the
    new one, never half of either. ``comment`` is its first line.

    It takes effect in this process at once: each :data:`SETUP_KEYS` name takes its new value
    (or goes, when not written) unless a place above the per-user file sets it
    (:func:`source_above_config`): that value wins on every start, so this process keeps it
    too and a probe now tests what the runs will use.
    """
    path = config_env_path()
    if path.is_symlink():  # a dotfiles checkout links it: write the file, keep the link
        path = path.resolve()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    kept = {k: v.strip() for k, v in values.items() if v and v.strip()}
    text = "\n".join([comment, "", *(f"{k}={v}" for k, v in kept.items())]) + "\n"
    import tempfile  # with shutil (zlib, bz2, lzma): not for the light commands' lookup

    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".env.", suffix=".tmp")  # mode 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    for name in SETUP_KEYS:
        if source_above_config(name) is not None:
            continue  # it wins over the file on every start: keep what the runs will use
        if name in kept:
            os.environ[name] = kept[name]
            _loaded[name] = str(path)
        else:
            os.environ.pop(name, None)
            _loaded.pop(name, None)
    return path


# -- check ---------------------------------------------------------------------------------


def has_key() -> bool:
    """``ANTHROPIC_API_KEY`` or ``ANTHROPIC_AUTH_TOKEN`` is set (the two ``flower setup``
    writes and the probe can try)."""
    return bool(os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("ANTHROPIC_AUTH_TOKEN"))


def _credentials_file() -> Path:
    return claude_dir() / ".credentials.json"


def other_auth() -> bool:
    """The CLI can authenticate some other way: an OAuth token, a cloud provider, or a
    ``claude login`` (``.credentials.json``)."""
    if any(os.environ.get(name) for name in KEY_VARS if name not in SETUP_KEYS):
        return True
    return _credentials_file().is_file()


def check_credentials() -> None:
    """Raise :class:`CredentialsError` when the CLI would have no way to authenticate."""
    if has_key() or other_auth():
        return
    raise CredentialsError(
        "no Anthropic credentials: ANTHROPIC_API_KEY is not set",
        hint="export ANTHROPIC_API_KEY=... or put it in a .env file in the workspace; "
        "to try flower without a key run `flower-super demo`",
    )
