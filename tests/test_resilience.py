"""Resilience policy: backoff, error classification, the DNS+TCP probe, waiting for the network."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flower.step.resilience import (
    RESUME_PROMPT,
    Resilience,
    classify,
    endpoint,
    reachable,
    wait_jittered_exponential,
)


def probe(host: str, port: int, timeout: float = 5.0) -> bool:
    """The public, async ``reachable`` as a test calls it."""
    return asyncio.run(reachable(host, port, timeout=timeout))


# Texts the real CLI produces (DESIGN.md, "Facts measured"; issue 4).
CONNECTION_REFUSED = "API Error: Connection refused - server may be down"
OVERLOADED = (
    'API Error: 529 {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'
)
RATE_LIMITED = (
    'API Error: 429 {"type":"error","error":{"type":"rate_limit_error",'
    '"message":"Number of request tokens has exceeded your per-minute rate limit"}}'
)
SERVER_ERROR = (
    'API Error: 500 {"type":"error","error":{"type":"api_error","message":"Internal server error"}}'
)
UNAUTHORIZED = (
    'Failed to authenticate. API Error: 401 {"type":"error","error":'
    '{"type":"authentication_error","message":"invalid x-api-key"}}'
)
TOO_LONG = "Prompt is too long"
TIMED_OUT = "API Error: Request timed out."


@pytest.fixture
def closed_port() -> Iterator[tuple[socket.socket, int]]:
    """A loopback port that is bound but not listening: a connect is refused at once."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    try:
        yield sock, sock.getsockname()[1]
    finally:
        sock.close()


@pytest.fixture
def listening_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


# --- backoff ---------------------------------------------------------------------------------


@given(st.integers(min_value=1, max_value=12))
def test_delay_for_stays_within_jitter_band(n: int) -> None:
    nominal = min(4.0 * 2 ** (n - 1), 120.0)
    assert 0.75 * nominal <= Resilience().delay_for(n) <= 1.25 * nominal


@given(
    st.integers(min_value=1, max_value=10_000),
    st.floats(min_value=0.01, max_value=50),
    st.floats(min_value=0.01, max_value=500),
)
def test_delay_for_any_policy_and_huge_attempt_numbers(n: int, base: float, cap: float) -> None:
    r = Resilience(base_delay=base, max_delay=cap)
    nominal = min(base * 2.0 ** min(n - 1, 64), cap)
    assert 0.75 * nominal * (1 - 1e-9) <= r.delay_for(n) <= 1.25 * nominal * (1 + 1e-9)


def test_jitter_actually_varies_and_spans_the_band() -> None:
    r = Resilience()
    samples = [r.delay_for(3) for _ in range(400)]
    assert len(set(samples)) > 300
    # 400 uniform draws over [12, 20]: both outer fifths are hit with overwhelming probability.
    assert min(samples) < 13.6 and max(samples) > 18.4


def test_delay_for_reaches_the_cap_and_counts_from_one() -> None:
    r = Resilience()
    assert 3.0 <= r.delay_for(1) <= 5.0
    assert 3.0 <= r.delay_for(0) <= 5.0  # below 1 counts as the first attempt
    assert 90.0 <= r.delay_for(50) <= 150.0


def test_delay_for_delegates_to_the_tenacity_wait() -> None:
    r = Resilience(base_delay=2.0, max_delay=10.0)
    assert isinstance(r.wait, wait_jittered_exponential)
    assert (r.wait.base, r.wait.maximum, r.wait.jitter) == (2.0, 10.0, 0.25)


def test_backoff_sleeps_the_policy_and_retries_until_success() -> None:
    r = Resilience()
    slept: list[float] = []
    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 4:
            raise ConnectionError("child died")
        return "done"

    async def record(seconds: float) -> None:
        slept.append(seconds)

    async def main() -> str:
        async for attempt in r.backoff(sleep=record):
            with attempt:
                return await flaky()
        raise AssertionError("unreachable")

    assert asyncio.run(main()) == "done"
    assert calls == 4
    assert len(slept) == 3
    for i, s in enumerate(slept):
        nominal = min(4.0 * 2**i, 120.0)
        assert 0.75 * nominal <= s <= 1.25 * nominal


def test_backoff_gives_up_after_max_attempts_with_the_original_error() -> None:
    calls = 0

    async def always_dies() -> None:
        nonlocal calls
        calls += 1
        raise ConnectionError(f"died #{calls}")

    async def no_sleep(_: float) -> None:
        return None

    async def main(r: Resilience) -> None:
        await r.backoff(sleep=no_sleep)(always_dies)

    with pytest.raises(ConnectionError, match="died #6"):
        asyncio.run(main(Resilience()))
    assert calls == 6
    calls = 0
    with pytest.raises(ConnectionError, match="died #1"):
        asyncio.run(main(Resilience(enabled=False)))
    assert calls == 1


# --- classify ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        (CONNECTION_REFUSED, "transient"),
        (OVERLOADED, "transient"),
        (RATE_LIMITED, "transient"),
        (SERVER_ERROR, "transient"),
        (TIMED_OUT, "transient"),
        (UNAUTHORIZED, "fatal"),
        (TOO_LONG, "fatal"),
        ("API Error: 401 Invalid API key · Please run /login", "fatal"),
        ("Credit balance is too low", "fatal"),
        ('API Error: 403 {"type":"error","error":{"type":"permission_error"}}', "fatal"),
        ("prompt is too long: 210000 tokens > 200000 maximum", "fatal"),
        ("API Error: Can't reach the API server", "transient"),
        ("request to https://api.anthropic.com/v1/messages failed: socket hang up", "transient"),
        ("getaddrinfo ENOTFOUND api.anthropic.com", "transient"),
        ("getaddrinfo EAI_AGAIN api.anthropic.com", "transient"),
        ("read ECONNRESET", "transient"),
        ("TypeError: fetch failed", "transient"),
        ("API Error: 502 Bad Gateway", "transient"),
        ("API Error: 503 Service Unavailable", "transient"),
        ("API Error: 504 Gateway Timeout", "transient"),
        ("stream ended before message_stop", "transient"),
        ("the model returned an incomplete response", "transient"),
    ],
)
def test_classify_real_texts(text: str, kind: str) -> None:
    assert classify(text) == kind
    assert Resilience().classify(text) == kind


def test_fatal_wins_even_when_the_text_mentions_a_connection() -> None:
    text = "Connection error: API Error: 401 authentication_error (connection reset while reading)"
    assert classify(text) == "fatal"
    assert classify("connection refused; 403 Forbidden") == "fatal"
    assert not Resilience().should_retry(text)


def test_unknown_text_follows_retry_unknown() -> None:
    text = "the flux capacitor is misaligned"
    assert classify(text) == "unknown"
    assert classify("") == "unknown"
    assert Resilience().should_retry(text) is True
    assert Resilience(retry_unknown=False).should_retry(text) is False
    assert Resilience(retry_unknown=False).should_retry(OVERLOADED) is True
    assert Resilience().should_retry(UNAUTHORIZED) is False


def test_a_number_that_is_not_a_status_decides_nothing() -> None:
    assert classify("tool call took 401 ms and printed 500 lines") == "unknown"


def test_resume_prompt_is_the_seeds_neutral_text() -> None:
    assert Resilience().resume_prompt == RESUME_PROMPT
    assert RESUME_PROMPT == (
        "上一轮在中途被打断,没有跑完。检查一下工作台里已经落盘的东西,从中断处接着做,不要重头来过。"
    )


def test_defaults_are_the_seeds() -> None:
    r = Resilience()
    assert (r.enabled, r.max_attempts, r.base_delay, r.max_delay) == (True, 6, 4.0, 120.0)
    assert (r.probe_timeout, r.probe_interval, r.max_offline_wait) == (5.0, 15.0, 3600.0)
    assert r.retry_unknown is True


# --- endpoint ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (None, ("api.anthropic.com", 443)),
        ("", ("api.anthropic.com", 443)),
        ("https://gateway.example.com", ("gateway.example.com", 443)),
        ("http://gateway.example.com/v1", ("gateway.example.com", 80)),
        ("http://127.0.0.1:8765", ("127.0.0.1", 8765)),
        ("https://gw.example.com:9443/anthropic", ("gw.example.com", 9443)),
        ("HTTP://Gateway.Example.com", ("gateway.example.com", 80)),
        ("http://[::1]:8080", ("::1", 8080)),
        ("gw.example.com:7000", ("gw.example.com", 7000)),
        ("http://gw.example.com:notaport", ("gw.example.com", 80)),
    ],
)
def test_endpoint_follows_base_url(
    monkeypatch: pytest.MonkeyPatch, url: str | None, expected: tuple[str, int]
) -> None:
    if url is None:
        monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    else:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", url)
    assert endpoint() == expected
    assert Resilience().endpoint() == expected


# --- reachable ---------------------------------------------------------------------------------


def test_reachable_against_a_listening_socket(listening_port: int) -> None:
    assert probe("127.0.0.1", listening_port, timeout=2.0) is True
    assert probe("localhost", listening_port, timeout=2.0) is True


def test_unreachable_closed_port_and_bad_names_fail_fast(
    closed_port: tuple[socket.socket, int],
) -> None:
    _, port = closed_port
    started = time.monotonic()
    assert probe("127.0.0.1", port, timeout=2.0) is False
    assert probe("nonexistent.invalid", 443, timeout=2.0) is False  # RFC 6761: never resolves
    assert probe("", 443, timeout=2.0) is False
    assert probe("127.0.0.1", 70000, timeout=2.0) is False  # bad port: False, not a crash
    assert time.monotonic() - started < 8.0


def test_reachable_is_bounded_when_the_resolver_hangs(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()

    def hanging_getaddrinfo(*_: object, **__: object) -> list[object]:
        release.wait(30)
        raise socket.gaierror("resolver gave up")

    monkeypatch.setattr(socket, "getaddrinfo", hanging_getaddrinfo)
    started = time.monotonic()
    try:
        assert probe("api.anthropic.com", 443, timeout=0.3) is False
        assert time.monotonic() - started < 3.0
    finally:
        release.set()


def test_resilience_reachable_probes_the_endpoint(
    monkeypatch: pytest.MonkeyPatch, listening_port: int, closed_port: tuple[socket.socket, int]
) -> None:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", f"http://127.0.0.1:{listening_port}")
    assert Resilience(probe_timeout=2.0).reachable() is True
    monkeypatch.setenv("ANTHROPIC_BASE_URL", f"http://127.0.0.1:{closed_port[1]}")
    assert Resilience(probe_timeout=2.0).reachable() is False


# --- wait_online -------------------------------------------------------------------------------


def test_wait_online_returns_at_once_when_reachable(
    monkeypatch: pytest.MonkeyPatch, listening_port: int
) -> None:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", f"http://127.0.0.1:{listening_port}")
    waits: list[float] = []
    r = Resilience(probe_timeout=2.0, probe_interval=30.0, max_offline_wait=60.0)
    assert asyncio.run(r.wait_online(on_wait=waits.append)) is True
    assert waits == []


def test_wait_online_notices_the_server_coming_back(
    monkeypatch: pytest.MonkeyPatch, closed_port: tuple[socket.socket, int]
) -> None:
    sock, port = closed_port
    monkeypatch.setenv("ANTHROPIC_BASE_URL", f"http://127.0.0.1:{port}")
    waits: list[float] = []

    def on_wait(elapsed: float) -> None:
        waits.append(elapsed)
        if len(waits) == 3:
            sock.listen()  # the server comes back while we wait

    r = Resilience(probe_timeout=1.0, probe_interval=0.05, max_offline_wait=30.0)
    started = time.monotonic()
    assert asyncio.run(r.wait_online(on_wait=on_wait)) is True
    assert len(waits) == 3
    assert waits == sorted(waits)
    assert time.monotonic() - started < 10.0  # well before max_offline_wait


def test_wait_online_gives_up_after_max_offline_wait(
    monkeypatch: pytest.MonkeyPatch, closed_port: tuple[socket.socket, int]
) -> None:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", f"http://127.0.0.1:{closed_port[1]}")
    waits: list[float] = []
    r = Resilience(probe_timeout=1.0, probe_interval=0.1, max_offline_wait=0.5)
    started = time.monotonic()
    assert asyncio.run(r.wait_online(on_wait=waits.append)) is False
    took = time.monotonic() - started
    assert 0.5 <= took < 5.0
    # one probe at once, then one every 0.1 s, the last on the deadline: no busy loop
    assert 3 <= len(waits) <= 8
    assert waits[-1] >= 0.5


def test_wait_online_keeps_the_event_loop_free(monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow probe must not stall other coroutines (interrupts, other steps' pipes)."""
    ticked = threading.Event()

    def slow_probe(self: Resilience) -> bool:
        # Blocks until the loop has run the ticker; on the loop itself this would deadlock.
        return ticked.wait(10)

    monkeypatch.setattr(Resilience, "reachable", slow_probe)

    async def main() -> tuple[bool, int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while ticks < 5:
                await asyncio.sleep(0.01)
                ticks += 1
            ticked.set()

        ticking = asyncio.create_task(ticker())
        ok = await Resilience(probe_interval=0.05, max_offline_wait=5.0).wait_online()
        await ticking
        return ok, ticks

    assert asyncio.run(main()) == (True, 5)
