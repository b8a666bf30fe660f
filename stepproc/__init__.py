"""The step child: one attempt of a step, run through the SDK, reported over the pipe.

The supervisor imports only this entry point (``child_main`` and the ``ChildSetup`` it takes);
everything about forking, watching and reaping children lives with the parent, in
``supervisor/``.
"""

from stepproc.child import ChildSetup, child_main

__all__ = ["ChildSetup", "child_main"]
