"""What the throwaway servers (:mod:`.postgres`, :mod:`.temporal`) share: a free loopback
port, reading what a log got since an offset, and their ``start``/``stop`` command line for
``scripts/test.sh``."""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from .._errors import FlowerError


def free_port() -> int:
    """A loopback port nobody listens on now (someone may take it before it is bound)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def file_size(path: Path) -> int:
    """``path``'s size, 0 if it does not exist (yet): where what comes next will start."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def text_after(path: Path, start: int) -> str:
    """What ``path`` got after offset ``start`` ("" if it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def command_line(
    argv: Sequence[str] | None,
    module: str,
    start: Callable[[str | None], Sequence[str]],
    stop: Callable[[Path], None],
) -> int:
    """``python -m <module> start [DIR]`` prints what ``start(DIR)`` returns (the server's
    address and its directory) on one line; ``stop DIR`` calls ``stop``. A
    :class:`FlowerError` is one line on stderr and exit status 1; a usage mistake, 2."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args[:1] == ["start"] and len(args) <= 2:
            print(" ".join(start(args[1] if len(args) == 2 else None)))
            return 0
        if args[:1] == ["stop"] and len(args) == 2:
            stop(Path(args[1]))
            return 0
    except FlowerError as exc:
        print(exc.one_line(), file=sys.stderr)
        return 1
    print(f"usage: python -m {module} start [DIR] | stop DIR", file=sys.stderr)
    return 2
