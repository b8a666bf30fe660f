"""Attempts on other machines: the Temporal placement (:mod:`.remote`), the worker that runs
them (:mod:`.worker`), and ``cluster up``/``down`` (:mod:`.local`).

May import: ``supervisor.run`` (a worker runs attempts in forked children), ``flower``, ``ipc``.
"""
