"""A person's cooperative interrupt (Ctrl-C once) and the sentence they say after it.

One :class:`Interrupts` belongs to a Runtime. ``request()`` reaches whatever is in flight
right now (the handle a placement attached: a CLI client, a step child, or the loop's own
wait) and every handle attached until the loop takes the interrupt; ``take()`` hands the
loop what the person said, waiting for :meth:`reply` if they have not said it yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from .placement import Interruptible

log = logging.getLogger("flower")

#: How long the loop waits for the sentence after an interrupt before carrying on without it.
REPLY_TIMEOUT_S = 600.0


class Interrupts:
    def __init__(self) -> None:
        self.requested = False
        self._text: str | None = None
        self._reply: asyncio.Future[str | None] | None = None
        self._handle: Interruptible | None = None
        self._delivering: set[asyncio.Task[None]] = set()

    async def request(self, text: str | None = None) -> None:
        """Interrupt at the next message boundary. ``text`` is what the person said; None
        means they are still typing (see :meth:`reply`)."""
        self.requested = True
        self._text = text
        if text is None and self._reply is None:  # else: the reply came first, keep it
            self._reply = asyncio.get_running_loop().create_future()
        if self._handle is not None:
            await _interrupt(self._handle)

    def reply(self, text: str | None) -> None:
        """What the person typed after an interrupt (None: nothing, just carry on).

        It may arrive before the interrupt itself (a step child reads both off its pipe at
        once and only schedules the interrupt); it is then kept for it.
        """
        if self._reply is None:
            self._reply = asyncio.get_running_loop().create_future()
        if not self._reply.done():
            self._reply.set_result(text)

    def attach(self, handle: Interruptible | None) -> None:
        """``handle`` is what an interrupt reaches from now on; a pending one reaches it now."""
        self._handle = handle
        if handle is not None and self.requested:
            task = asyncio.get_running_loop().create_task(_interrupt(handle))
            self._delivering.add(task)  # the loop keeps only a weak reference to a task
            task.add_done_callback(self._delivering.discard)

    async def take(self) -> str | None:
        """Consume the pending interrupt: what the person said (waiting for :meth:`reply`,
        at most :data:`REPLY_TIMEOUT_S`)."""
        self.requested = False
        if self._reply is None:
            text, self._text = self._text, None
            return text
        try:
            return await asyncio.wait_for(self._reply, REPLY_TIMEOUT_S)
        except TimeoutError:
            return None
        finally:
            self._reply = None


async def _interrupt(handle: Interruptible) -> None:
    with contextlib.suppress(Exception):  # what was in flight may have just finished
        await handle.interrupt()
