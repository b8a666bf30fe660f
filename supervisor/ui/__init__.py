"""The web view, ``flower-super ui``: runs, a run's timeline of attempts, a step's
conversation, live. May import ``flower`` and ``supervisor.inspect`` (what ``status``,
``show`` and ``cancel`` read and do); nothing imports it but the command line."""
