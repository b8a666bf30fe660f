"""``python -m supervisor`` is ``flower-super``."""

from .cli import main

main()
