"""The body of the session fixtures that give the tests a server: the suite's own, or one
started for them (:mod:`flower.services`' throwaway servers)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

from .._errors import FlowerError


def suite_server(
    env: str, what: str, start: Callable[[], tuple[str, Callable[[], None]]]
) -> Iterator[str]:
    """The body of a session fixture: ``$env``'s address when set (scripts/test.sh started
    the server), else ``start()``'s (its address and how to stop it), stopped at the end. A
    server that cannot start fails the test with its reason in one line, never a skip."""
    import pytest

    given = os.environ.get(env, "").strip()
    if given:
        yield given
        return
    try:
        address, stop = start()
    except FlowerError as exc:
        pytest.fail(f"{what} for the tests: {exc.one_line()}", pytrace=False)
    try:
        yield address
    finally:
        stop()
