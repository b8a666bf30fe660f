"""Starting and driving one flower run: ``start``, loading flows, the forked placement (one
child per step attempt, :mod:`.placement`).

May import: ``supervisor.terminal``, ``flower``, ``stepproc`` (its entry point), ``ipc``.
"""
