"""A password on the command line: said once, with where to put it instead.

``ps`` shows every process's command line to every user of the machine, so a state URL given
with ``--state postgresql://user:secret@…`` hands the secret to all of them for as long as
the supervisor or worker runs. flower still runs (the person may have no other way today),
and says once, on stderr, how to move it: ``~/.pgpass`` or ``PGPASSFILE`` (libpq reads it),
``PGPASSWORD``, or ``FLOWER_STATE`` in the environment or a ``.env`` file.
"""

from __future__ import annotations

import sys

from flower.i18n import define, t

define(
    {
        "secrets.argv_password": (
            "! --state 的地址里带着密码,这台机器上任何人用 ps 都看得见。把密码放进 ~/.pgpass"
            "(或 PGPASSFILE 指的文件,权限 0600)、PGPASSWORD,或者把整个地址设成 FLOWER_STATE"
            "(环境变量或 .env),再从 --state 里去掉它",
            "! the --state URL carries a password, which ps shows to every user of this "
            "machine. Put it in ~/.pgpass (or the file PGPASSFILE names, mode 0600) or "
            "PGPASSWORD, or set the whole URL as FLOWER_STATE (environment or .env), and drop "
            "it from --state",
        ),
    }
)


def warn_if_password_in_argv(given: str | None) -> bool:
    """Say it once on stderr when ``given`` (a ``--state`` value from the command line)
    holds a password; True when it did."""
    if not given:
        return False
    from flower.state.postgres.url import has_password

    if not has_password(given):
        return False
    print(t("secrets.argv_password"), file=sys.stderr, flush=True)
    return True
