"""How a command that may have placed attempts on Temporal ends (light: imports nothing)."""

from __future__ import annotations

import sys


def ended(code: int) -> int:
    """``code``, or the process ends with it here when it placed attempts on Temporal
    (:func:`supervisor.cluster.remote.leave`; looked at only when the cluster was loaded)."""
    remote = sys.modules.get("supervisor.cluster.remote")
    return code if remote is None else int(remote.leave(code))
