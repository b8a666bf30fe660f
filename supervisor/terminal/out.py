"""Printing for the commands that only read (``show``, ``logs``): one line cut to the screen,
and a print that ends quietly when the reader of a pipe went away (``show | head``).

Light on purpose: ``logs`` imports this, not ``show`` (and with it the transcript reader).
"""

from __future__ import annotations

import sys

import click

from flower.util.sanitize import clean
from supervisor.terminal.columns import fit


def one_line(text: str, limit: int) -> str:
    """The first line of ``text``, cleaned, cut to ``limit`` columns."""
    return fit(clean(text).strip().split("\n", 1)[0].replace("\t", " "), limit)


def echo(text: str) -> None:
    """Print, quietly ending on a closed pipe (``show | head``)."""
    try:
        click.echo(text)
        sys.stdout.flush()
    except BrokenPipeError:
        _quiet_pipe()


def _quiet_pipe() -> None:
    import os

    # Python flushes stdout again at exit and would complain: point it at /dev/null first.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    sys.exit(0)
