"""Messages over a byte stream: an incremental reader, a blocking iterator, a whole-line writer."""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Iterator
from typing import BinaryIO, Protocol

from ipc.codec import MAX_LINE_BYTES, decode, encode
from ipc.errors import EXCERPT_BYTES, ProtocolError
from ipc.messages import Message

#: Bytes asked of the OS per read: one Linux pipe buffer.
CHUNK_BYTES = 64 * 1024


class HasFileno(Protocol):
    def fileno(self) -> int: ...


class LineReader:
    """Turns chunks of a byte stream into messages, for a select or asyncio loop.

    ``feed`` returns every complete line's message in order; a malformed line comes back as a
    ``ProtocolError`` item and reading goes on with the next line. A line that outgrows
    ``max_line_bytes`` is reported once, the moment it does, and the rest of it is dropped up to its
    newline without being buffered: memory stays under the bound whatever the writer does.
    """

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        if max_line_bytes < 1:
            raise ValueError("max_line_bytes must be positive")
        self.max_line_bytes = max_line_bytes
        self._buf = bytearray()
        self._skipping = False  # inside an oversized line, already reported

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete line held (never more than ``max_line_bytes``)."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Message | ProtocolError]:
        """Take the next chunk; return the messages (or errors) of the lines it completes."""
        data = bytes(data) if isinstance(data, memoryview) else data
        out: list[Message | ProtocolError] = []
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            self._hold(data, start, end, out)
            self._finish_line(out)
            start = end + 1
        self._hold(data, start, len(data), out)
        return out

    def eof(self) -> list[Message | ProtocolError]:
        """The stream ended: a partial last line is reported as truncated. Resets the reader."""
        out: list[Message | ProtocolError] = []
        if self._buf:
            reason = f"truncated line at end of stream ({len(self._buf)} bytes, no newline)"
            out.append(ProtocolError(reason, self._buf[:EXCERPT_BYTES]))
        self._buf.clear()
        self._skipping = False
        return out

    def _hold(
        self, data: bytes | bytearray, start: int, end: int, out: list[Message | ProtocolError]
    ) -> None:
        if self._skipping or start == end:
            return
        if len(self._buf) + (end - start) > self.max_line_bytes:
            head = bytes(self._buf[:EXCERPT_BYTES]) + data[start : min(end, start + EXCERPT_BYTES)]
            out.append(ProtocolError(f"line longer than the bound of {self.max_line_bytes}", head))
            self._buf.clear()
            self._skipping = True
            return
        self._buf += memoryview(data)[start:end]

    def _finish_line(self, out: list[Message | ProtocolError]) -> None:
        if self._skipping:
            self._skipping = False
            return
        line = bytes(self._buf)
        self._buf.clear()
        try:
            out.append(decode(line, self.max_line_bytes))
        except ProtocolError as exc:
            out.append(exc)


def read_messages(
    source: int | BinaryIO, max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[Message]:
    """Yield messages from a file descriptor or binary file until EOF, blocking as needed.

    Raises ProtocolError at the first malformed, oversized or truncated line.
    """
    reader = LineReader(max_line_bytes)
    while True:
        data = _read_chunk(source)
        for item in reader.feed(data) if data else reader.eof():
            if isinstance(item, ProtocolError):
                raise item
            yield item
        if not data:
            return


def _read_chunk(source: int | BinaryIO) -> bytes:
    while True:
        try:
            if isinstance(source, int):
                data: bytes | None = os.read(source, CHUNK_BYTES)
            else:
                # read1 returns what is there; BufferedReader.read(n) would wait for all n bytes.
                data = getattr(source, "read1", source.read)(CHUNK_BYTES)
        except BlockingIOError:
            data = None
        if data is not None:  # a non-blocking file object returns None instead of raising
            return data
        _wait(source if isinstance(source, int) else source.fileno(), select.POLLIN)


class LineWriter:
    """Writes whole message lines to a pipe, blocking or not.

    ``send`` loops over partial writes, waits for writability when a non-blocking descriptor says
    EAGAIN, and raises BrokenPipeError once the reader is gone (Python ignores SIGPIPE). Sends from
    several threads never interleave.
    """

    def __init__(self, fd: int | HasFileno, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self.fd = fd if isinstance(fd, int) else fd.fileno()
        self.max_line_bytes = max_line_bytes
        self._lock = threading.Lock()

    def send(self, msg: Message) -> None:
        """Encode ``msg`` and write its whole line (ProtocolError if it cannot be encoded)."""
        line = encode(msg, self.max_line_bytes)
        with self._lock:
            write_all(self.fd, line)


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd``, waiting out EAGAIN on a non-blocking descriptor."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            _wait(fd, select.POLLOUT)


def _wait(fd: int, events: int) -> None:
    # poll, not select: select cannot watch a descriptor numbered 1024 or more. An error or hangup
    # also ends the wait; the next read or write then reports it.
    poller = select.poll()
    poller.register(fd, events)
    poller.poll()
