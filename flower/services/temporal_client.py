"""Reaching Temporal, as Temporal users configure their clients: the one module every flower
process that talks to Temporal connects through (the supervisor's placement and its front
door check, ``flower-super worker``, the dev server's readiness check that ``cluster up``
and the tests wait on).

The client's settings come from :mod:`temporalio.envconfig`: ``TEMPORAL_ADDRESS``,
``TEMPORAL_NAMESPACE``, ``TEMPORAL_API_KEY``, ``TEMPORAL_TLS*`` (client certificate and key,
server CA, server name), ``TEMPORAL_PROFILE`` and the TOML file
(``~/.config/temporalio/temporal.toml`` or ``TEMPORAL_CONFIG_FILE``). A placement URL may
name the address and the namespace over them:

- ``temporal://HOST:PORT/QUEUE``: that address (TLS and credentials still from the config);
- ``temporal://HOST:PORT/QUEUE?namespace=NS``: and that namespace;
- ``temporal:///QUEUE``: the address from the config (``TEMPORAL_ADDRESS`` or the profile).

With nothing configured the namespace is ``default``. :func:`check` reaches the service and
finds the namespace before anything runs: each way that can fail (the configuration cannot be
read, unreachable, TLS refused, credentials refused, no such namespace) is one line with a
hint, and never shows the API key or what a key file holds.

Light to import: temporalio is imported only when a client is made.
"""

from __future__ import annotations

import asyncio
import gc
import os
import re
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qs

from .._errors import FlowerError
from ..i18n import define, t

if TYPE_CHECKING:
    from temporalio.client import Client
    from temporalio.runtime import Runtime

define(
    {
        "remote.url": (
            "--placement 要写成 temporal://HOST:PORT/QUEUE(可加 ?namespace=NS),不是 {url}",
            "--placement must be temporal://HOST:PORT/QUEUE (with ?namespace=NS if need be), "
            "not {url}",
        ),
        "remote.url.hint": (
            "例如 temporal://127.0.0.1:7233/flower,或 temporal:///flower(地址取 "
            "TEMPORAL_ADDRESS);或者不设它,在本机跑",
            "for example temporal://127.0.0.1:7233/flower, or temporal:///flower (the address "
            "from TEMPORAL_ADDRESS); or leave it unset to run here",
        ),
        "remote.no_address": (
            "{url} 没写地址,Temporal 的客户端配置里也没有",
            "{url} names no address, and neither does Temporal's client configuration",
        ),
        "remote.no_address.hint": (
            "设 TEMPORAL_ADDRESS=HOST:PORT(或在 temporal.toml 的 profile 里写 address),"
            "或者写成 temporal://HOST:PORT/QUEUE",
            "set TEMPORAL_ADDRESS=HOST:PORT (or address in a temporal.toml profile), or write "
            "temporal://HOST:PORT/QUEUE",
        ),
        "remote.config": (
            "Temporal 的客户端配置读不了:{error}",
            "Temporal's client configuration cannot be read: {error}",
        ),
        "remote.config.hint": (
            "查一下 TEMPORAL_CONFIG_FILE / TEMPORAL_PROFILE / TEMPORAL_TLS_* 指的文件和 profile",
            "check the files and the profile TEMPORAL_CONFIG_FILE, TEMPORAL_PROFILE and "
            "TEMPORAL_TLS_* name",
        ),
        "remote.unreachable": (
            "连不上 Temporal {target}:{error}",
            "cannot reach Temporal at {target}: {error}",
        ),
        "remote.unreachable.hint": (
            "先起一个(flower-super cluster up),或查一下地址(--placement、TEMPORAL_ADDRESS)",
            "start one (flower-super cluster up), or check the address (--placement, "
            "TEMPORAL_ADDRESS)",
        ),
        "remote.tls": (
            "和 Temporal {target} 的 TLS 握手没成:{error}",
            "the TLS handshake with Temporal at {target} failed: {error}",
        ),
        "remote.tls.hint": (
            "查一下 TEMPORAL_TLS、TEMPORAL_TLS_SERVER_CA_CERT_PATH、TEMPORAL_TLS_SERVER_NAME、"
            "TEMPORAL_TLS_CLIENT_CERT_PATH/KEY_PATH(或 profile 的 [tls])",
            "check TEMPORAL_TLS, TEMPORAL_TLS_SERVER_CA_CERT_PATH, TEMPORAL_TLS_SERVER_NAME, "
            "TEMPORAL_TLS_CLIENT_CERT_PATH/KEY_PATH (or the profile's [tls])",
        ),
        "remote.tls.not_there": (
            "那边没用 TLS 应答(这边开着 TLS,或者设了 API key)",
            "the server does not answer with TLS (TLS is on here, or an API key is set)",
        ),
        "remote.tls.off": (
            "这边没开 TLS,那边答的不是明文 gRPC(大概要 TLS:TEMPORAL_TLS=true)",
            "TLS is off here and the answer is not plain gRPC (it likely requires TLS: "
            "TEMPORAL_TLS=true)",
        ),
        "remote.refused": (
            "Temporal {target} 不认这份凭据({what}):{error}",
            "Temporal at {target} refused the credentials ({what}): {error}",
        ),
        "remote.refused.hint": (
            "查一下 TEMPORAL_API_KEY(或 profile 的 api_key)和客户端证书",
            "check TEMPORAL_API_KEY (or the profile's api_key) and the client certificate",
        ),
        "remote.no_namespace": (
            "Temporal {target} 上没有命名空间 {namespace}",
            "Temporal at {target} has no namespace {namespace}",
        ),
        "remote.no_namespace.hint": (
            "用 ?namespace=NS 或 TEMPORAL_NAMESPACE 指一个已有的,或者先建它"
            "(temporal operator namespace create --namespace {namespace})",
            "name one that exists with ?namespace=NS or TEMPORAL_NAMESPACE, or create it "
            "(temporal operator namespace create --namespace {namespace})",
        ),
        "remote.creds.api_key": ("API key", "API key"),
        "remote.creds.cert": ("客户端证书", "client certificate"),
        "remote.creds.none": ("没给凭据", "none given"),
    }
)

T = TypeVar("T")

DEFAULT_NAMESPACE = "default"
#: One connect and one namespace lookup, at the front door.
CHECK_TIMEOUT_S = 10.0
#: How much longer the check waits on an address where something listens (see check()).
SLOW_CHECK_S = 50.0


# ---------------------------------------------------------------------------------------
# the placement's address
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Where:
    """``temporal://[HOST:PORT]/QUEUE[?namespace=NS]``: ``target`` and ``namespace`` are ""
    when the URL leaves them to the client configuration."""

    target: str
    queue: str
    namespace: str = ""

    @classmethod
    def parse(cls, url: str) -> Where:
        text = url.strip()
        rest = text.removeprefix("temporal://")
        rest, _, query = rest.partition("?")
        target, _, queue = rest.partition("/")
        host, _, port = target.rpartition(":")
        namespace = ""
        wrong = rest == text.partition("?")[0] or not queue or "/" in queue
        if target and (not host or not port.isdigit()):
            wrong = True
        if query:
            fields = parse_qs(query, keep_blank_values=True)
            names = fields.pop("namespace", [])
            if fields or len(names) != 1 or not names[0].strip():
                wrong = True
            else:
                namespace = names[0].strip()
        if wrong:
            raise FlowerError(t("remote.url", url=url), hint=t("remote.url.hint"))
        return cls(target, queue, namespace)

    def __str__(self) -> str:
        tail = f"?namespace={self.namespace}" if self.namespace else ""
        return f"temporal://{self.target}/{self.queue}{tail}"


# ---------------------------------------------------------------------------------------
# the client's settings
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """What ``Client.connect`` is given: the configuration's, with the URL's address and
    namespace over it. ``options`` may hold the API key: never print it (``__repr__`` hides
    it); :meth:`describe` is what a person may see."""

    target: str
    namespace: str
    options: Mapping[str, Any]  # tls, api_key, rpc_metadata

    def __repr__(self) -> str:
        return f"Settings({self.describe()})"

    @property
    def credentials(self) -> str:
        tls = self.options.get("tls")
        if self.options.get("api_key"):
            return t("remote.creds.api_key")
        if tls not in (None, False, True) and getattr(tls, "client_cert", None):
            return t("remote.creds.cert")
        return t("remote.creds.none")

    @property
    def tls(self) -> bool:
        return self.options.get("tls") not in (None, False)

    def describe(self) -> str:
        """``HOST:PORT namespace NS`` and whether TLS is on (nothing secret)."""
        return f"{self.target} · namespace {self.namespace}" + (" · TLS" if self.tls else "")

    def hide(self, text: str) -> str:
        """``text`` with the API key (should the SDK ever quote it) blotted out."""
        key = self.options.get("api_key")
        return text.replace(str(key), "***") if key else text


def settings(
    target: str = "", namespace: str = "", env: Mapping[str, str] | None = None
) -> Settings:
    """The client's settings: ``TEMPORAL_*`` and the TOML profile through
    :mod:`temporalio.envconfig` (``env``: the environment to read, this process's when None),
    with ``target`` and ``namespace`` over them when given."""
    from temporalio.envconfig import ClientConfigProfile

    env = dict(os.environ if env is None else env)
    try:
        profile = ClientConfigProfile.load(override_env_vars=env)
        config = dict(profile.to_client_connect_config())  # reads the TLS files it names
    except Exception as exc:  # noqa: BLE001 - a file missing, a profile unknown, bad TOML
        raise FlowerError(
            t("remote.config", error=_config_error(str(exc), env) or type(exc).__name__),
            hint=t("remote.config.hint"),
        ) from None
    address = target or str(config.pop("target_host", "") or "")
    config.pop("target_host", None)
    ns = namespace or str(config.pop("namespace", "") or "") or DEFAULT_NAMESPACE
    config.pop("namespace", None)
    return Settings(address, ns, config)


def settings_for(where: Where, env: Mapping[str, str] | None = None) -> Settings:
    """:func:`settings` for a placement URL; one line when no address is to be found."""
    found = settings(where.target, where.namespace, env)
    if not found.target:
        raise FlowerError(t("remote.no_address", url=where), hint=t("remote.no_address.hint"))
    return found


# ---------------------------------------------------------------------------------------
# connecting
# ---------------------------------------------------------------------------------------


class MetricsUnavailable(Exception):
    """The runtime cannot serve Prometheus metrics where it was asked (the port is taken,
    the address is not HOST:PORT): the runtime's own words."""


def run_on_own_runtime(
    main: Callable[[Runtime], Coroutine[Any, Any, T]], *, metrics: str | None = None
) -> T:
    """``asyncio.run(main(runtime))`` on a Temporal runtime of its own, whose threads have
    ended when this returns.

    A process that exits while the default runtime's threads live aborts (SIGABRT,
    sometimes SIGSEGV) in about half of the exits, measured here: temporalio's Rust threads
    touch the interpreter while it finalizes (sdk-python issue 300). Give every client and
    worker of the process ``runtime`` (``Client.connect(..., runtime=runtime)``), keep
    neither anywhere ``main`` does not own, and the runtime is collected here, before the
    interpreter ends.

    ``metrics``: HOST:PORT where the runtime serves Prometheus metrics (its own, and what is
    recorded on ``runtime.metric_meter``); :class:`MetricsUnavailable` when it cannot.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _run_on_own_runtime(main, metrics)
    # called from a thread that runs an event loop (a caller's own, e.g. a browser driver's):
    # asyncio.run cannot run there, so it runs on a thread of its own, waited for
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1, thread_name_prefix="flower-temporal") as pool:
        return pool.submit(_run_on_own_runtime, main, metrics).result()


def _run_on_own_runtime(
    main: Callable[[Runtime], Coroutine[Any, Any, T]], metrics: str | None
) -> T:
    from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

    exporter = PrometheusConfig(bind_address=metrics) if metrics else None
    try:
        runtime = Runtime(telemetry=TelemetryConfig(metrics=exporter))
    except ValueError as exc:
        if exporter is None:
            raise
        raise MetricsUnavailable(str(exc)) from None
    try:
        return asyncio.run(main(runtime))
    finally:
        del runtime
        gc.collect()  # clients and workers sit in reference cycles: refcounts alone keep it


async def connect(found: Settings, runtime: Runtime, *, check: bool = True) -> Client:
    """A client for ``found`` on ``runtime``; with ``check``, the namespace is looked up as
    well. Every failure is a :class:`FlowerError` of one line with a hint."""
    from temporalio.client import Client

    try:
        client = await Client.connect(
            found.target, namespace=found.namespace, runtime=runtime, **found.options
        )
        if check:
            from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest

            await client.workflow_service.describe_namespace(
                DescribeNamespaceRequest(namespace=found.namespace)
            )
    except Exception as exc:  # noqa: BLE001 - one line for a person, whatever it was
        raise failure(found, exc) from None
    return client


def check(found: Settings, timeout: float = CHECK_TIMEOUT_S) -> None:
    """Reach Temporal and find the namespace now (synchronous: the front door's check, on a
    runtime of its own that is gone when this returns). An address that takes no answer in
    ``timeout`` s is unreachable, unless something listens there: a server that is only slow
    (a loaded machine, many flows starting at once) is given :data:`SLOW_CHECK_S` more."""

    async def probe(runtime: Runtime) -> None:
        asking = asyncio.ensure_future(connect(found, runtime))
        done, _ = await asyncio.wait({asking}, timeout=timeout)
        if not done and unreachable(found.target) is None:
            done, _ = await asyncio.wait({asking}, timeout=SLOW_CHECK_S)
        if not done:
            asking.cancel()
            waited = timeout + (SLOW_CHECK_S if unreachable(found.target) is None else 0.0)
            raise TemporalUnreachable(
                t("remote.unreachable", target=found.target, error=f"no answer in {waited:g} s"),
                hint=t("remote.unreachable.hint"),
            )
        asking.result()

    run_on_own_runtime(probe)


def unreachable(target: str) -> str | None:
    """Why ``host:port`` takes no TCP connection now (None: it does)."""
    import socket

    host, _, port = target.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
            return None
    except (OSError, ValueError) as exc:
        return exc.strerror or str(exc) if isinstance(exc, OSError) else str(exc)


class TemporalUnreachable(FlowerError):
    """Temporal did not answer (refused, reset, no route, no answer in time): an outage
    once a run has started, a mistake at the front door."""


def failure(found: Settings, exc: BaseException) -> FlowerError:
    """What went wrong reaching ``found``, as one line with a hint (never the key)."""
    from temporalio.service import RPCError, RPCStatusCode

    text = found.hide(_one_line(str(exc)) or type(exc).__name__)
    target = found.target
    if isinstance(exc, RPCError):
        if exc.status == RPCStatusCode.NOT_FOUND and "amespace" in text:
            return FlowerError(
                t("remote.no_namespace", target=target, namespace=found.namespace),
                hint=t("remote.no_namespace.hint", namespace=found.namespace),
            )
        if exc.status in (RPCStatusCode.UNAUTHENTICATED, RPCStatusCode.PERMISSION_DENIED):
            return FlowerError(
                t("remote.refused", target=target, what=found.credentials, error=text),
                hint=t("remote.refused.hint"),
            )
    reason = _transport_reason(text)
    http = re.search(r"status: (\d{3}\b[A-Za-z ]*)", text)
    if http:
        # a proxy in front of the service answered in HTTP: 401/403 is the API key refused,
        # 400 from a TLS endpoint the client certificate missing or not accepted (nginx)
        code = http.group(1).split()[0]
        if code in ("401", "403") or (code == "400" and found.tls):
            return FlowerError(
                t(
                    "remote.refused",
                    target=target,
                    what=found.credentials,
                    error=f"HTTP {http.group(1).strip()}",
                ),
                hint=t("remote.refused.hint"),
            )
    if not found.tls and "h2 protocol error" in text:
        return FlowerError(
            t("remote.tls", target=target, error=t("remote.tls.off")), hint=t("remote.tls.hint")
        )
    if _is_tls(text):
        return FlowerError(t("remote.tls", target=target, error=reason), hint=t("remote.tls.hint"))
    if re.search(r"unauthori[sz]ed|forbidden|permission denied", text, re.I):
        return FlowerError(
            t("remote.refused", target=target, what=found.credentials, error=reason),
            hint=t("remote.refused.hint"),
        )
    return TemporalUnreachable(
        t("remote.unreachable", target=target, error=reason), hint=t("remote.unreachable.hint")
    )


_TLS_WORDS = (
    "tls",
    "certificate",
    "handshake",
    "InvalidContentType",
    "AlertReceived",
    "CorruptMessage",
    "InvalidMessage",
    "UnknownIssuer",
    "NotValidForName",
)


def _is_tls(text: str) -> bool:
    low = text.lower()
    return any(word.lower() in low for word in _TLS_WORDS)


def _transport_reason(text: str) -> str:
    """The part of a tonic transport error a person can act on: "Connection refused",
    "failed to lookup address information: …", "InvalidCertificate(UnknownIssuer)"."""
    if "tonic::transport" not in text and "Failed client connect" not in text:
        return text
    for pattern in (
        r'message: "([^"]+)"',
        r'error: "([^"]+)"',
        r"(InvalidCertificate\(\w+\))",
        r"(AlertReceived\(\w+\))",
        r"(InvalidContentType)",
        r'ConnectError\("([^"]+)"',
    ):
        found = re.search(pattern, text)
        if found:
            word = found.group(1)
            if word == "InvalidContentType":
                return t("remote.tls.not_there")
            return word
    return text.removeprefix("Failed client connect: ")[:200]


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _config_error(text: str, env: Mapping[str, str]) -> str:
    """What a configuration that cannot be read says, on one line, with no secret: a TOML
    parse error quotes the offending line of the file (an ``api_key`` line, say), so only
    where it is stays; a key from the environment is blotted wherever it appears."""
    where = re.search(r"TOML parse error at line \d+, column \d+", text)
    if where:
        text = text[: where.end()]
    text = re.sub(r"(?i)(api[_-]?key\W{0,3}\s*[=:]\s*)\S+", r"\1***", text)
    key = env.get("TEMPORAL_API_KEY", "")
    if len(key) >= 4:
        text = text.replace(key, "***")
    return _one_line(text)
