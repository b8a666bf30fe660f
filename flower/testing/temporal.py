"""``python -m flower.testing.temporal``: kept for scripts that start the tests' server this
way; the server is :mod:`flower.services.temporal` (``flower-super cluster up`` starts it too)."""

from __future__ import annotations

import sys

from flower.services.temporal import *  # noqa: F403 - this module is only a second name
from flower.services.temporal import main

if __name__ == "__main__":
    sys.exit(main())
