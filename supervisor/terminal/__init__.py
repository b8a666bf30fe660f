"""What a person sees and types while a run goes: the terminal, the ``?`` oracle, line and
column helpers.

May import: ``flower``.
"""
