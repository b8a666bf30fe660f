"""``flower``: the command a person types (being built; see issue 10)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("flower: not built yet", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
