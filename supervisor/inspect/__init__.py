"""Looking at runs without running anything: ``status``, ``show``, ``logs``, ``cancel`` and
which run state a command reads (:mod:`.runstate`). Fast to start: never the SDK.

May import: ``supervisor.terminal`` (its text helpers), ``flower``.
"""
