"""Testing a flower flow offline: a scripted model server and the CLI environment for it.

:class:`ModelServer` speaks the Anthropic Messages API on loopback and answers from a
*script* of turns (the format is :data:`SCRIPT_FORMAT`, appended at the end of this
docstring), so the real Claude Code CLI, and flower on top of it, runs end to end with no
network and no API key. Every request is recorded, so a test judges what happened by what
the model was sent and answered.

In pytest
---------

Enable the fixtures in your top-level ``conftest.py``::

    pytest_plugins = ["flower.testing.pytest_plugin"]

then ``model_server(script)`` gives a running server (stopped after the test),
``flower_runtime(server)`` a ``flower.Runtime`` in a temporary workspace wired to it, and
``flower_cli_env(server)`` the environment for anything else (a ``flower-super start
--flow ...`` subprocess). See :mod:`flower.testing.pytest_plugin`; the README's "Testing
your own flow offline" has a complete two-step example.

Scripting the starter flow
--------------------------

:func:`starter_script` (``starter_script(*, work, brief=None, goal=None, verdicts=None,
questions=())``) builds the script for ``flower "…"`` (seed 003's ``starter_flow``): the
clarifier's questions and brief, the goal, each round's work and the judge's verdict on it,
and the answer to ``flower``'s credentials probe, every role matched for you by what flower
sends it. A round of ``work`` is the turns of the ``coder`` worker the coordinator
dispatches (or a string, the coordinator's own answer); ``verdicts`` default to "not yet"
for every round but the last. In ``server.requests`` each request's ``conversation`` names
its role: ``clarifier``, ``goal``, ``work``, ``coder-N``, ``judge-N`` (round N, a fresh
session each) or ``probe``. See :mod:`flower.testing.starter`; the README's "Testing your
own flow offline" runs ``flower "make hi.txt"`` with it.

Pointing the CLI at the server
------------------------------

:func:`cli_env` (``cli_env(home, server.url, *, max_retries=0, extra=None)``) returns a
complete environment, for ``subprocess`` and for ``ClaudeAgentOptions(env=...)`` alike:

- ``HOME`` = ``home`` and ``CLAUDE_CONFIG_DIR`` = ``home/.claude``, both fresh, so the CLI
  finds no login, settings or history of yours (it starts with no prompt at all);
- ``ANTHROPIC_BASE_URL`` = ``server.url`` and a dummy ``ANTHROPIC_API_KEY``; other
  credentials and providers (``ANTHROPIC_AUTH_TOKEN``, ``CLAUDE_CODE_OAUTH_TOKEN``,
  ``CLAUDE_CODE_USE_BEDROCK``/``_VERTEX``/``_FOUNDRY``, ``ANTHROPIC_MODEL``, ...) are
  set to ``""``, which the CLI treats as unset, because the SDK lays a spec's ``env``
  over the parent's environment and a real one there would win;
- ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1``, so the CLI sends only the conversation's
  own requests; ``CLAUDE_CODE_MAX_RETRIES`` = ``max_retries`` (0: a scripted error
  reaches flower at once; None keeps the CLI's own retries); ``IS_SANDBOX=1`` as root
  (the CLI refuses ``bypassPermissions`` to root otherwise);
- of your environment only ``PATH``, the locale and ``FLOWER_LANG`` (a flower started with
  it speaks your language), ``TZ``, ``TMPDIR``, ``TERM`` and the user and shell names;
  ``extra`` is applied last.

An in-process ``Runtime`` starts the CLI from this process's environment, so put the
variables in ``os.environ`` (``flower_cli_env`` does it for the test's duration).
:func:`claude_path` is the CLI bundled with claude-agent-sdk, the one flower runs.

Reading the request log
-----------------------

``server.requests`` is every request so far, oldest first, as :class:`RecordedRequest`:
``seq``, ``method``, ``path`` (``/v1/messages``, ``/v1/messages/count_tokens``, ...),
``headers`` (credentials redacted), ``session_id`` (the CLI's), ``conversation`` and
``turn`` (the conversation that took the request and the index of the turn chosen; None
when no conversation did), ``system``, ``messages`` (the request's whole history),
``tools`` (names offered), ``model``, ``stream``, ``answer``, ``status``, ``delay``,
``detail``, and ``texts()`` (every text it carried: system, messages, tool inputs and
results).
``answer`` says what the server did: ``text`` or ``tool_use`` (a turn's content),
``error``, ``cut``, ``outage`` (a fault fired), ``rejected`` (tool_use/tool_result did not
pair up; ``detail`` has the API's message), ``exhausted`` (the conversation had no turn
left), ``unmatched`` (no conversation, no default), or ``count_tokens``, ``models``,
``head``, ``not_found``. So a step that ran as scripted shows as one request per turn of
its conversation, each answered ``text`` or ``tool_use``; anything ``exhausted``,
``unmatched`` or ``rejected`` is a flow that asked more, or otherwise, than the script
expected.

Helpers: ``server.requests_for(session_id)``, ``server.texts_sent(session_id=None)`` (the
text of every Messages request), ``server.wait_for(predicate, timeout)`` (block until
``predicate(requests)`` is truthy, e.g. until a held turn is reached, then kill something).
``ModelServer(script, log_path=...)`` also appends each request as a JSON line (0600,
credential headers redacted) for reading after the fact.

Also here
---------

- ``python -m flower.services.model_server --script FILE [--port N] [--log FILE]``, or
  ``flower-super model-server``: the server standalone; prints its URL, serves until
  SIGTERM/SIGINT.
- :mod:`flower.testing.rundir`: a run_dir's transcripts as ``sessions.db`` holds them.
- :mod:`flower.testing.pytest_helpers`: running the bare ``claude`` CLI (``run_claude``,
  ``Reaper``, which kills a whole process tree, ``read_transcript``).

"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Eager, so the name ``cli_env`` is the function and not its submodule.
from ..services._format import SCRIPT_FORMAT
from ..services.cli_env import DUMMY_API_KEY, claude_path, cli_env

if TYPE_CHECKING:
    from ..services._log import RecordedRequest
    from ..services._script import Script
    from ..services.model_server import ModelServer
    from .starter import starter_script

__doc__ = f"{__doc__}{SCRIPT_FORMAT}"

__all__ = [
    "DUMMY_API_KEY",
    "SCRIPT_FORMAT",
    "ModelServer",
    "RecordedRequest",
    "Script",
    "claude_path",
    "cli_env",
    "starter_script",
]

# Loaded on first use: the server pulls in http.server and threads, the script parser
# dataclasses and regexes; ``flower-super --help`` imports this package for SCRIPT_FORMAT.
_HOME = {
    "ModelServer": "flower.services.model_server",
    "RecordedRequest": "flower.services._log",
    "Script": "flower.services._script",
    "starter_script": "flower.testing.starter",
}


def __getattr__(name: str) -> Any:
    # Lazy, so ``python -m flower.services.model_server`` does not import itself twice.
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
