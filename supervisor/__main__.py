"""``python -m supervisor`` is ``flower-super``."""

from supervisor.commands.cli import main

main()
