"""What ``scripts/_venv.sh`` says while it makes ``./.venv`` (pip is quiet for a minute).

It runs before anything is installed, with the system's ``python3``: this module and what it
imports (:mod:`flower.i18n`) need only the standard library.
``python3 -m supervisor.commands.bootstrap KEY [name=value ...]`` prints the text ``KEY`` on stderr.
"""

from __future__ import annotations

import sys

from flower.i18n import define, t

define(
    {
        "venv.making": (
            "- 第一次用:建 {venv},装上 flower 要的包(pip,一分钟左右,期间没有输出)…",
            "- first use: making {venv} and installing what flower needs (pip, about a "
            "minute, quiet meanwhile)…",
        ),
        "venv.updating": (
            "- pyproject.toml 或 requirements.lock 改过了:把 {venv} 里的包换成锁定的版本"
            "(pip,一会儿)…",
            "- pyproject.toml or requirements.lock changed: bringing the packages in {venv} to "
            "the locked versions (pip, a moment)…",
        ),
        "venv.ready": ("+ {venv} 好了({s} 秒):{sdk}", "+ {venv} is ready ({s} s): {sdk}"),
    }
)


def main(argv: list[str]) -> int:
    key, *pairs = argv
    fields = dict(pair.partition("=")[::2] for pair in pairs)
    print(t(key, **fields), file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
