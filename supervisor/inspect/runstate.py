"""Which run state a command uses, the same way for ``flower`` and every ``flower-super``
command: ``--state URL`` on the command line, else ``FLOWER_STATE`` from the environment or
from any ``.env`` file of the credentials' lookup order
(:func:`flower.people.credentials.lookup`), else the run_dir's local files. ``--state ''``
chooses the local files even where ``FLOWER_STATE`` is set.

What a command prints never holds a password. A resume command (the one ``status`` shows
under a dead flower) keeps ``--state`` only when the start was given it on the command
line; a state that came from the environment or a ``.env`` file is found there again by the
resumed command. The record keeps the URL with its password shown as ``***``
(:meth:`Choice.carry_args`); ``status`` then prints ``--state "${FLOWER_STATE:?}"`` in the
command and, beside it, the ``export FLOWER_STATE=…`` line with the password masked and
where to take it from (:func:`resume_line`), never a URL that silently lost its password.
A record written before that kept the URL without its password: its line says to give the
password with ``PGPASSWORD`` or ``~/.pgpass`` (:func:`lacks_password`).

Light on purpose (no driver, no SDK): ``status`` against local files loads nothing more.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from flower.i18n import define
from flower.state.backends import STATE_ENV, RunState, open_state

define(
    {
        "state.help.placement": (
            "把每次步骤尝试放到 Temporal 队列上,由 flower-super worker 去跑(默认:本机 fork 子进程;"
            "也可设 FLOWER_PLACEMENT)。运行状态必须在 PostgreSQL 里(--state / FLOWER_STATE)。",
            "place each step attempt on a Temporal queue for `flower-super worker`s to run "
            "(default: a forked child here; or set FLOWER_PLACEMENT). Needs the run state in "
            "PostgreSQL (--state / FLOWER_STATE).",
        ),
        "state.help.option": (
            "运行状态存在哪:postgresql:// 地址(默认:环境变量或 .env 里的 FLOWER_STATE;"
            "都没有就用运行目录里的本地文件;--state '' 强制用本地文件)。",
            "where the run state lives: a postgresql:// URL (default: FLOWER_STATE from the "
            "environment or a .env file; without one, the run directory's local files; "
            "--state '' forces the local files).",
        ),
        "state.help.where": (
            "用了状态地址时,运行目录里不写任何运行状态(会话、血缘、清单、运行记录、缓存、"
            "事件都在数据库里);只有每个步骤的日志 <运行目录>/logs/<run>/<步骤>.log "
            "留在跑那个步骤的机器上。",
            "With a state URL nothing of the run's state is written under the run directory "
            "(sessions, lineage, manifest, run records, cache and events are in the "
            "database); only each step's log, <run_dir>/logs/<run>/<step>.log, stays on the "
            "machine that ran the step.",
        ),
        "state.no_password": (
            "      (地址里没写密码:用 PGPASSWORD 或 ~/.pgpass 给它,或者把带密码的地址设成 "
            "FLOWER_STATE、去掉 --state)",
            "      (the URL has no password: give it with PGPASSWORD or ~/.pgpass, or set "
            "FLOWER_STATE to the URL with it and drop --state)",
        ),
        "state.export": (
            "      先设: export FLOWER_STATE={url}"
            "  # *** 换成启动它时给的地址里的密码(flower 不存密码)",
            "      first: export FLOWER_STATE={url}"
            "  # *** is the password of the URL it was started with (flower keeps none)",
        ),
    }
)

#: What a printed resume command passes ``--state`` when the URL given had a password:
#: the shell takes it from FLOWER_STATE (and says so when it is not set).
STATE_REF = '"${FLOWER_STATE:?}"'

__all__ = [
    "Choice",
    "Seen",
    "choose",
    "looking",
    "open_chosen",
    "resume_line",
    "without_password",
]


@dataclass(frozen=True, eq=False, repr=False)  # unused, and start-up time each
class Choice:
    """The state a command uses: ``url`` ("" for the local files) and whether it was given
    on the command line (``given``)."""

    url: str
    given: bool

    def resume_args(self) -> list[str]:
        """What a printed inspection command (show, logs, cancel) repeats of it: ``--state
        URL`` (without a password) when it was given on the command line, else nothing. A
        resume command keeps :meth:`carry_args` instead."""
        if not self.given:
            return []
        return ["--state", without_password(self.url) if self.url else ""]

    def carry_args(self) -> list[str]:
        """What a start keeps of it in the command that carries the run on: ``--state URL``
        when it was given on the command line, the URL's password shown as ``***`` (so
        :func:`resume_line` knows one is needed), else nothing."""
        if not self.given:
            return []
        from flower.state.postgres.url import mask

        return ["--state", mask(self.url) if self.url else ""]


def choose(given: str | None, workspace: str | Path | None) -> Choice:
    """``--state`` as given (None: not given), else ``FLOWER_STATE`` as a start in
    ``workspace`` finds it; "" means the local files."""
    if given is not None:
        return Choice(given.strip(), True)
    from flower.people.credentials import lookup

    return Choice((lookup(STATE_ENV, workspace) or "").strip(), False)


def open_chosen(choice: Choice, *, run_dir: Path, workspace: Path, create: bool) -> RunState:
    """The run state ``choice`` names (:func:`flower.state.backends.open_state`): a URL that
    is not PostgreSQL's, a refused password, a database that is missing or down, a schema
    from a newer flower are each one FlowerError line with a hint. ``create=False`` (the
    commands that only look) writes nothing into the workspace.

    A start (``create``) waits up to :data:`START_WAIT_S` for a database that cannot be
    reached, saying so in one line on stderr: a restart of the server, or an outage as a
    scheduled run begins, delays the run instead of losing it. A command that only looks
    says at once that the database is down."""
    return open_state(
        choice.url,
        run_dir=run_dir,
        workspace=workspace,
        create=create,
        wait_s=START_WAIT_S if create else 0.0,
        waiting=warn,
    )


START_WAIT_S = 30.0


def starting(state: RunState) -> AbstractContextManager[None]:
    """The block of a start between its state's opening and its run: what it reads there
    (the last run, the placement's checks) waits for a database that went away as the
    opening did (up to :data:`START_WAIT_S`, one line on stderr), instead of stopping the
    start with its error (the run itself waits through an outage its own way)."""
    return state.patient(START_WAIT_S, warn)


def warn(line: str) -> None:
    """A line a start says while it waits (``! …`` on stderr)."""
    import sys

    print(f"! {line}", file=sys.stderr, flush=True)


@dataclass(eq=False, repr=False)
class Seen:
    """What a command that only looks was pointed at: the run state (opened, never
    creating anything), how it was chosen, and the run directory and workspace."""

    state: RunState
    chosen: Choice
    run_dir: Path
    workspace: Path

    def where_args(self) -> list[str]:
        """What a printed inspection command repeats so that it looks at the same state:
        ``-r DIR`` (local, when not ./runs here), ``-w DIR`` (shared, when not here) and
        ``--state URL`` when it was given on the command line (never with a password)."""
        return self.state.scope.args() + self.chosen.resume_args()


@contextlib.contextmanager
def looking(run_dir: Path, workspace: Path, given: str | None) -> Iterator[Seen]:
    """The run state ``status``/``show``/``logs``/``cancel`` read (chosen as the module
    docstring says), closed afterwards."""
    ws = workspace.expanduser().resolve()
    rd = run_dir.expanduser().absolute()
    chosen = choose(given, ws)
    opened = open_chosen(chosen, run_dir=rd, workspace=ws, create=False)
    try:
        yield Seen(opened, chosen, rd, ws)
    finally:
        opened.close()


def without_password(url: str) -> str:
    """``url`` with its password left out (in the authority, or as a parameter)."""
    from flower.state.postgres.url import mask

    return mask(url, drop=True)


def lacks_password(command: list[str]) -> bool:
    """Does ``command`` pass ``--state`` a URL that names a user and no password (what
    :meth:`Choice.resume_args` leaves of one that had it)?"""
    try:
        url = command[command.index("--state") + 1]
    except (ValueError, IndexError):
        return False
    authority = url.partition("://")[2].partition("/")[0]
    return "@" in authority and ":" not in authority.rpartition("@")[0]


def resume_line(command: list[str]) -> tuple[str, str | None]:
    """``command`` as a person pastes it into a shell (each word quoted), and the masked
    state URL to export first when it needs a password (None when it does not): a
    ``--state`` URL kept with its password as ``***`` is printed as ``--state
    "${FLOWER_STATE:?}"``."""
    import shlex

    if "--state" not in command:  # the common case: no URL to mask, nothing more to load
        return shlex.join(command), None
    from flower.state.postgres.url import MASK

    words, export = [], None
    for i, word in enumerate(command):
        if i and command[i - 1] == "--state" and MASK in word:
            words.append(STATE_REF)
            export = word
        else:
            words.append(shlex.quote(word))
    return " ".join(words), (shlex.quote(export) if export is not None else None)
