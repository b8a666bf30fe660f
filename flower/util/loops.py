"""Running a callable on a given asyncio loop from whatever thread the caller is on."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


def call_on(loop: asyncio.AbstractEventLoop | None, fn: Callable[[], None]) -> None:
    """Run ``fn`` on ``loop``: at once when called on that loop (or when there is no usable
    loop), else scheduled thread-safely for its next iteration."""
    if loop is None or loop.is_closed():
        fn()
        return
    try:
        here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        here = None
    if here is loop:
        fn()
        return
    try:
        loop.call_soon_threadsafe(fn)
    except RuntimeError:  # closed in the meantime
        fn()
