"""A logger that imports :mod:`logging` at its first use.

``logging`` (with ``traceback``, ``string``, ``threading`` …) is a few milliseconds that the
commands which run nothing (``flower-super status``, ``show``, ``logs``) never need: the
modules they import name their logger with :func:`lazy_logger` and pay for logging only
when they actually log something.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import logging


class _Lazy:
    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        import logging

        return getattr(logging.getLogger(self._name), attr)


def lazy_logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)``, looked up at each use (the same logger every time)."""
    return cast("logging.Logger", _Lazy(name))
