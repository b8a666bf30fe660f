"""The two command lines and their words: ``flower-super`` (click, :mod:`.cli`) and
``flower`` (argparse, the original's rules, :mod:`.flower_cli`), setup and the demo.

May import: every other room of ``supervisor``, ``flower``, ``stepproc``'s entry point, ``ipc``.
"""
