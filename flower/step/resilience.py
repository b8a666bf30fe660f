"""Resilience inside a step: wait out a dead network, tell waiting from stopping, back off.

Seed 000 (韧性) is the contract. Three ideas:

- The probe is DNS plus one TCP handshake (:func:`reachable`, awaitable, as the reference has
  it; :func:`reachable_sync` is the same probe for callers outside an event loop), never
  HTTP, never a credential, never a cent. It probes whatever ``ANTHROPIC_BASE_URL`` names
  (:func:`endpoint`): when the person uses their own gateway, api.anthropic.com being up
  says nothing about the gateway.
- :func:`classify` sorts an error text into ``"transient"`` / ``"fatal"`` / ``"unknown"`` and
  checks *fatal first*: a 401's text often also says "connection", and the wrong order would
  wait an hour on a revoked key.
- Backoff is ``min(base_delay * 2**(n-1), max_delay)`` times a ±25% jitter, expressed as a
  tenacity wait strategy (:class:`wait_jittered_exponential`) so the runtime's sleep between
  attempts (:meth:`Resilience.delay_for`) and the supervisor's retries of a dead step child
  (:meth:`Resilience.backoff`) are the same policy.

The runtime resumes an interrupted session with :attr:`Resilience.resume_prompt`, which on
purpose carries no error detail: the model needs "you were interrupted, carry on", not
ENOTFOUND versus 503.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import tenacity
from tenacity.wait import wait_base

from flower.util.overflow import is_overflow

DEFAULT_BASE_URL = "https://api.anthropic.com"

RESUME_PROMPT = (
    "上一轮在中途被打断,没有跑完。检查一下工作台里已经落盘的东西,从中断处接着做,不要重头来过。"
)

TRANSIENT, FATAL, UNKNOWN, LOCAL = "transient", "fatal", "unknown", "local"

#: How an attempt's error begins when the CLI failed on this machine before it sent any
#: request (a resume it refused, a startup failure): nothing the network or a wait can fix,
#: and never an API outage (see :func:`flower.step.attempt.local_failure`).
CLI_FAILED = "the CLI failed before any request"

# The CLI refusing to resume a session: "No conversation found with session ID: <id>"
# (Claude Code 2.1.332 and 2.1.337), startup_failure_reason "resume_target_not_found"
# (2.1.337's result payload).
_SESSION_GONE = re.compile(
    r"no conversation found with session id|resume_target_not_found", re.IGNORECASE
)
_SESSION_ID = re.compile(
    r"session id:?\s*([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})",
    re.IGNORECASE,
)

# An HTTP status only counts where the text presents it as one ("API Error: 401", "status 503",
# "HTTP/1.1 502"), so a "took 500 ms" or a request id never decides the verdict.
_STATUS_CONTEXT = (
    r"(?:api error|status(?:\s*code)?|http(?:/[\d.]+)?|error code|\"status\")\s*[:=]?\s*"
)


def _status(codes: str) -> str:
    return rf"{_STATUS_CONTEXT}(?:{codes})\b"


# Re-sending the same request cannot fix any of these: a person (or a new prompt) must act.
_FATAL = re.compile(
    "|".join(
        [
            _status(r"400|401|402|403|404|413"),
            r"\b(?:401|403)\s+(?:unauthorized|forbidden)",
            r"invalid[ _-]?x-api-key",
            r"invalid api[ _-]?key",
            r"authentication",  # authentication_error, "Failed to authenticate"
            r"please run /login",
            r"oauth token (?:has )?(?:expired|been revoked)",
            r"permission[ _]denied",
            r"permission_error",
            r"forbidden",
            r"unauthori[sz]ed",
            r"billing",
            r"credit balance",
            r"invalid_request_error",
            r"not_found_error",
            r"request_too_large",
        ]
    ),
    re.IGNORECASE,
)

# The network or the service hiccuped: the same request can succeed a little later.
_TRANSIENT = re.compile(
    "|".join(
        [
            r"connection (?:refused|reset|error|closed|aborted|timed out)",
            r"\bE(?:CONNREFUSED|CONNRESET|CONNABORTED|TIMEDOUT|NOTFOUND|AI_AGAIN|PIPE"
            r"|HOSTUNREACH|NETUNREACH)\b",
            r"timed? ?out",
            r"timeout",
            r"socket hang up",
            r"fetch failed",
            r"network error",
            r"could not resolve",
            r"can'?t reach the api",
            r"unable to connect",
            _status(r"408|429|500|502|503|504|529"),
            r"rate[ _-]?limit",
            r"too many requests",
            r"overloaded",
            r"\bapi_error\b",
            r"internal server error",
            r"bad gateway",
            r"service unavailable",
            r"gateway timeout",
            r"stream (?:ended|closed|terminated|error)",
            r"premature close",
            r"incomplete",
        ]
    ),
    re.IGNORECASE,
)


def classify(text: str | None) -> str:
    """Sort an error text into ``"transient"``, ``"fatal"``, ``"local"`` or ``"unknown"``.

    Empty or None is ``"unknown"``. ``"local"`` first: the CLI failed on this machine before
    it sent any request (:data:`CLI_FAILED`, or a session it refuses to resume), which no
    wait for the network can mend. Fatal next: an authentication, permission or billing
    failure whose text also mentions a connection is still fatal. A context overflow
    ("Prompt is too long", …) is fatal *for retrying* (the same prompt cannot fit next time);
    the runtime checks :func:`flower.util.overflow.is_overflow` before calling this and hands
    off instead.
    """
    text = text or ""
    if text.startswith(CLI_FAILED) or _SESSION_GONE.search(text):
        return LOCAL
    if is_overflow(text) or _FATAL.search(text):
        return FATAL
    if _TRANSIENT.search(text):
        return TRANSIENT
    return UNKNOWN


def session_gone(text: str | None) -> bool:
    """Does an attempt's error say the CLI cannot resume the session it was told to?"""
    return bool(text and _SESSION_GONE.search(text))


def gone_session_id(text: str | None) -> str | None:
    """The session id a "No conversation found with session ID: …" error names, if any."""
    found = _SESSION_ID.search(text or "")
    return found.group(1).lower() if found else None


def endpoint() -> tuple[str, int]:
    """The ``(host, port)`` the CLI talks to: ``ANTHROPIC_BASE_URL``, else api.anthropic.com:443.

    The port comes from the URL, else 443 for https (and anything that is not http), 80 for
    http. A URL without a scheme is read as https; one without a host probes the default host.
    """
    url = (os.environ.get("ANTHROPIC_BASE_URL") or "").strip() or DEFAULT_BASE_URL
    if "://" not in url:
        url = "https://" + url
    parts = urlsplit(url)
    default_port = 80 if parts.scheme.lower() == "http" else 443
    try:
        port = parts.port or default_port
    except ValueError:  # a port that is not a number or out of range
        port = default_port
    return parts.hostname or urlsplit(DEFAULT_BASE_URL).hostname or "", port


async def reachable(host: str, port: int, timeout: float = 5.0) -> bool:  # noqa: ASYNC109
    """True if ``host:port`` resolves and accepts one TCP handshake within ``timeout`` seconds.

    :func:`reachable_sync` in a worker thread, so the event loop keeps serving meanwhile.
    ``timeout`` is the reference's parameter: the probe bounds itself (the resolver has no
    timeout of its own, so ``asyncio.timeout`` around it could not stop it).
    """
    return await asyncio.to_thread(reachable_sync, host, port, timeout)


def reachable_sync(host: str, port: int, timeout: float = 5.0) -> bool:
    """:func:`reachable` for callers outside an event loop (or that must not start a thread).

    No HTTP, no credentials. Addresses are tried in resolver order until one connects, all
    within the one deadline. Any exception means unreachable.
    """
    deadline = time.monotonic() + timeout
    try:
        for family, kind, proto, _, addr in _resolve(host, port, timeout):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            with socket.socket(family, kind, proto) as sock:
                sock.settimeout(left)
                try:
                    sock.connect(addr)
                except OSError:
                    continue
                return True
    except Exception:  # noqa: BLE001 - whatever a probe meets (resolver, socket) is "unreachable"
        return False
    return False


def _resolve(host: str, port: int, timeout: float) -> list[Any]:
    """``getaddrinfo`` bounded by ``timeout``.

    getaddrinfo has no timeout of its own; with the resolver unreachable (exactly the offline
    case) it can block for tens of seconds. It runs in a daemon thread that is abandoned, not
    waited for, when the deadline passes.
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["infos"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller: "unreachable"
            box["error"] = exc

    worker = threading.Thread(target=run, name="flower-resolve", daemon=True)
    worker.start()
    worker.join(timeout)
    if "error" in box:
        raise box["error"]
    if "infos" not in box:
        raise TimeoutError(f"resolving {host!r} took longer than {timeout}s")
    infos: list[Any] = box["infos"]
    return infos


class wait_jittered_exponential(wait_base):
    """tenacity wait: ``min(base * 2**(n-1), maximum) * uniform(1 - jitter, 1 + jitter)``.

    ``n`` is the number of the attempt that just failed, so the first sleep is about ``base``.
    """

    # 2**64 * any sane base exceeds any sane maximum; capping the exponent keeps a huge attempt
    # number from overflowing the float conversion.
    _MAX_EXPONENT = 64

    def __init__(self, base: float, maximum: float, jitter: float = 0.25) -> None:
        self.base = base
        self.maximum = maximum
        self.jitter = jitter

    def for_attempt(self, n: int) -> float:
        """The delay after failed attempt ``n`` (1-based; values below 1 count as 1)."""
        exponent = min(max(n, 1) - 1, self._MAX_EXPONENT)
        delay = min(self.base * 2.0**exponent, self.maximum)
        return delay * random.uniform(1 - self.jitter, 1 + self.jitter)

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        return self.for_attempt(retry_state.attempt_number)


class _wait_until_deadline(wait_base):
    """wait_fixed(interval), shortened so the last probe lands on the deadline, not after it."""

    def __init__(self, interval: float, limit: float) -> None:
        self.fixed = tenacity.wait_fixed(interval)
        self.limit = limit

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        left = self.limit - (retry_state.seconds_since_start or 0.0)
        return max(0.0, min(self.fixed(retry_state), left))


@dataclass
class Resilience:
    """The retry policy inside a step (seed 000, 韧性). Defaults are the seed's.

    ``max_attempts`` counts the first attempt. ``max_offline_wait`` (one hour) bounds how long
    :meth:`wait_online` hangs on a dead network before giving up.
    """

    enabled: bool = True
    max_attempts: int = 6
    base_delay: float = 4.0
    max_delay: float = 120.0
    probe_timeout: float = 5.0
    probe_interval: float = 15.0
    max_offline_wait: float = 3600.0
    retry_unknown: bool = True
    resume_prompt: str = RESUME_PROMPT

    @property
    def wait(self) -> wait_jittered_exponential:
        """The backoff as a tenacity wait strategy (built from the current fields)."""
        return wait_jittered_exponential(self.base_delay, self.max_delay)

    def delay_for(self, attempt: int) -> float:
        """Seconds to sleep after failed attempt ``attempt`` (1-based), jitter included."""
        return self.wait.for_attempt(attempt)

    def classify(self, text: str | None) -> str:
        """:func:`classify` (fatal before transient)."""
        return classify(text)

    def should_retry(self, kind: str) -> bool:
        """Transient → True, fatal and local → False, unknown → ``retry_unknown``.

        ``kind`` is what :func:`classify` returns; any other text is an error text and is
        classified first, so ``should_retry(result.error)`` works as well.
        """
        if kind not in (TRANSIENT, FATAL, UNKNOWN, LOCAL):
            kind = classify(kind)
        return kind == TRANSIENT or (kind == UNKNOWN and self.retry_unknown)

    def endpoint(self) -> tuple[str, int]:
        """:func:`endpoint`: where the CLI's requests go."""
        return endpoint()

    def reachable(self) -> bool:
        """Probe :meth:`endpoint` with ``probe_timeout`` (synchronously, in this thread)."""
        host, port = self.endpoint()
        return reachable_sync(host, port, self.probe_timeout)

    async def wait_online(
        self,
        notify: Callable[[str], None] | None = None,
        *,
        on_wait: Callable[[float], None] | None = None,
    ) -> bool:
        """Return True as soon as the endpoint answers, False after ``max_offline_wait``.

        The first probe happens at once; then one every ``probe_interval`` seconds, the last
        on the deadline. ``notify(line)`` is called once when the first probe fails and once
        when the endpoint answers again; ``on_wait(elapsed_seconds)`` after every failed
        probe. Probes run in a worker thread, so the event loop keeps serving (interrupts,
        other steps).
        """
        started = time.monotonic()
        failed = False

        async def probe() -> bool:
            nonlocal failed
            ok = await asyncio.to_thread(self.reachable)
            if not ok:
                if not failed and notify is not None:
                    host, port = self.endpoint()
                    notify(
                        f"{host}:{port} 连不上,等网络恢复(最多等 {self.max_offline_wait:.0f} 秒)"
                    )
                failed = True
                if on_wait is not None:
                    on_wait(time.monotonic() - started)
            elif failed and notify is not None:
                host, port = self.endpoint()
                notify(f"{host}:{port} 又连得上了,接着做")
            return ok

        retrying = tenacity.AsyncRetrying(
            stop=tenacity.stop_after_delay(self.max_offline_wait),
            wait=_wait_until_deadline(self.probe_interval, self.max_offline_wait),
            retry=tenacity.retry_if_result(lambda ok: not ok),
            retry_error_callback=lambda state: False,
        )
        return bool(await retrying(probe))

    def backoff(self, **overrides: Any) -> tenacity.AsyncRetrying:
        """A tenacity ``AsyncRetrying`` with this policy: ``max_attempts`` tries, jittered waits.

        The step loop counts a step's attempts with it, for every placement (a 529 and a dead
        step child are both one failed attempt)::

            async for attempt in resilience.backoff(retry=retry_if_exception_type(Overloaded)):
                with attempt:
                    await call_the_api()

        By default every exception is retried and the last one is re-raised as itself (not
        wrapped in ``tenacity.RetryError``). ``overrides`` go to ``AsyncRetrying`` unchanged
        (``retry``, ``before_sleep``, ``sleep`` …). With ``enabled=False`` there is one attempt.
        """
        options: dict[str, Any] = {
            "stop": tenacity.stop_after_attempt(self.max_attempts if self.enabled else 1),
            "wait": self.wait,
            "retry": tenacity.retry_if_exception_type(Exception),
            "reraise": True,
        }
        options.update(overrides)
        return tenacity.AsyncRetrying(**options)


__all__ = [
    "CLI_FAILED",
    "DEFAULT_BASE_URL",
    "RESUME_PROMPT",
    "Resilience",
    "classify",
    "endpoint",
    "gone_session_id",
    "reachable",
    "reachable_sync",
    "session_gone",
    "wait_jittered_exponential",
]
