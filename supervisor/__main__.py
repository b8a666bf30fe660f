"""``python -m supervisor`` is ``flower-super``."""

from supervisor.cli import main

main()
