"""``--state`` / ``FLOWER_STATE`` URLs: which PostgreSQL database holds the run state.

Light on purpose (the standard library only): the command line parses the URL before it
knows whether anything will run, and ``flower-super status`` against local files never
loads the driver.

Accepted: ``postgresql://`` and ``postgres://`` URLs as libpq reads them (user, password,
host, port, database, query parameters such as ``sslmode``), plus one parameter of ours,
``schema`` (default ``flower``): the schema flower's tables live in, so one database can
hold other things, or several flower installations, tidily. Anything else is one line and
a hint (:class:`StateURLError`). A password is never shown: :meth:`StateURL.masked`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

from ..._errors import ConfigError
from ...i18n import define, t

__all__ = [
    "DEFAULT_SCHEMA",
    "StateURL",
    "StateURLError",
    "has_password",
    "mask",
    "parse_state_url",
]

define(
    {
        "state.url.scheme": (
            "状态地址 {url} 不是 postgresql:// 开头的地址",
            "the state URL {url} is not a postgresql:// URL",
        ),
        "state.url.scheme.hint": (
            "写成 postgresql://用户:密码@主机:端口/数据库;不设 --state/FLOWER_STATE 就用本地文件",
            "write postgresql://user:password@host:port/database; without --state/"
            "FLOWER_STATE the state stays in local files",
        ),
        "state.url.bad": (
            "状态地址 {url} 读不懂:{why}",
            "the state URL {url} cannot be read: {why}",
        ),
        "state.url.bad.hint": (
            "形如 postgresql://用户:密码@主机:5432/数据库[?schema=flower]",
            "the form is postgresql://user:password@host:5432/database[?schema=flower]",
        ),
        "state.url.why.port": ("端口 {port!r} 不是数字", "port {port!r} is not a number"),
        "state.url.why.schema": (
            "schema {schema!r} 只能用小写字母、数字和下划线,以字母或下划线开头",
            "schema {schema!r} may hold only lower-case letters, digits and underscores, "
            "and starts with a letter or an underscore",
        ),
    }
)

DEFAULT_SCHEMA = "flower"
SCHEMES = ("postgresql", "postgres")
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_SECRET_PARAMS = ("password", "passfile", "sslpassword")
MASK = "***"


class StateURLError(ConfigError):
    """A ``--state``/``FLOWER_STATE`` value that is not a PostgreSQL URL flower can use."""


@dataclass(frozen=True)
class StateURL:
    """A parsed state URL. ``url`` is what the driver gets (``postgresql://``, without our
    ``schema`` parameter); ``schema`` the schema flower's tables live in."""

    url: str
    schema: str = DEFAULT_SCHEMA

    def masked(self) -> str:
        """The URL for people and logs: its password replaced by ``***``."""
        shown = mask(self.url)
        if self.schema != DEFAULT_SCHEMA:
            shown += ("&" if "?" in shown else "?") + f"schema={self.schema}"
        return shown

    @property
    def database_key(self) -> str:
        """A short digest naming this database and schema (user and password left out):
        the name of this database's spool directory on the machine."""
        parts = urlsplit(self.url)
        query = {k: v for k, v in parse_qsl(parts.query) if k in ("host", "port", "dbname")}
        where = f"{(parts.hostname or '').lower()}:{parts.port or ''}{parts.path}"
        text = f"{where}?{sorted(query.items())}#{self.schema}"
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]

    @property
    def has_connect_timeout(self) -> bool:
        return any(k == "connect_timeout" for k, _ in parse_qsl(urlsplit(self.url).query))


def parse_state_url(text: str, *, schema: str | None = None) -> StateURL:
    """Parse a ``--state``/``FLOWER_STATE`` value; :class:`StateURLError` if it is unusable.

    ``schema`` overrides the URL's own ``schema`` parameter.
    """
    raw = text.strip()
    shown = mask(raw)
    scheme, sep, _ = raw.partition("://")
    if not sep or scheme.lower() not in SCHEMES:
        raise StateURLError(t("state.url.scheme", url=shown), hint=t("state.url.scheme.hint"))
    try:
        parts = urlsplit("postgresql://" + raw[len(scheme) + 3 :])
        port = parts.port  # ValueError for a port that is not a number
    except ValueError:
        port_text = _port_text(raw)
        raise StateURLError(
            t("state.url.bad", url=shown, why=t("state.url.why.port", port=port_text)),
            hint=t("state.url.bad.hint"),
        ) from None
    del port
    params = parse_qsl(parts.query, keep_blank_values=True)
    chosen = schema or next((v for k, v in params if k == "schema"), DEFAULT_SCHEMA)
    if not _SCHEMA_NAME.fullmatch(chosen):
        raise StateURLError(
            t("state.url.bad", url=shown, why=t("state.url.why.schema", schema=chosen)),
            hint=t("state.url.bad.hint"),
        )
    rest = urlencode([(k, v) for k, v in params if k != "schema"], quote_via=quote)
    return StateURL(urlunsplit(parts._replace(query=rest)), chosen)


def mask(url: str, *, drop: bool = False) -> str:
    """``url`` with its password (in the authority or as a parameter) shown as ``***``, or
    with ``drop`` left out (a command a person can run again: libpq then takes the password
    from ``PGPASSWORD`` or ``~/.pgpass``)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, tail = rest.partition("/")
    if "@" in authority:
        userinfo, _, hosts = authority.rpartition("@")
        user, colon, _ = userinfo.partition(":")
        authority = f"{user}{':' + MASK if colon and not drop else ''}@{hosts}"
    if "?" in tail:
        path, _, query = tail.partition("?")
        pairs = [
            f"{k}={MASK}" if unquote(k) in _SECRET_PARAMS else f"{k}={v}" if eq else k
            for k, eq, v in (p.partition("=") for p in query.split("&"))
            if not (drop and unquote(k) in _SECRET_PARAMS)
        ]
        tail = f"{path}?{'&'.join(pairs)}" if pairs else path
    return f"{scheme}{sep}{authority}{slash}{tail}"


def has_password(url: str) -> bool:
    """Does ``url`` carry a password (in the authority, or as a secret parameter)?"""
    return mask(url) != url


def _port_text(url: str) -> str:
    authority = url.partition("://")[2].partition("/")[0].rpartition("@")[2]
    return authority.rpartition(":")[2] if ":" in authority else authority
