"""What the hook layer adds to a tool call, and what learning the CLI's window costs.

Through the real bundled CLI against the scripted model server, in this process (the hooks
run where the attempt runs in every placement, so a step child pays the same):

- bare: an SDK session with no hooks at all (the same session store, flushed eagerly);
- flower: the options a Runtime's attempt gets (``flower.step.attempt.options_for``): the
  whitelist guard, the workbench's index and spill guards, and the tool ledger (its
  ``PreToolUse`` records the start and the message that asked for the call, its
  ``PostToolUse`` commits the result), folded into one matcher per event. A coordinator's
  delegate and Agent guards join the same two callbacks, so they add Python time only.

Each session makes ``--calls`` Bash calls (``true``), each answered at once by the model
server; a call's cycle is the time between the model server receiving two consecutive
requests (the CLI running the tool, the hooks, the next request; a new session's first
call, which also waits for the session to reach sessions.db, is left out). Sessions of both kinds
alternate in ``--rounds`` rounds so machine noise hits both alike; the figures are medians
over every call of every round. Goal (issue 8): under 5 ms added per call at the median.

Then the cost of learning the real window once (``get_context_usage``), which an attempt
pays before its prompt when the window is a guess nobody has corrected yet: wall time,
the CLI's CPU, and the ``count_tokens`` requests it makes.

Usage: .venv/bin/python scripts/bench_hooks.py [--rounds 5] [--calls 30]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402

from flower.testing.cli_env import cli_env  # noqa: E402
from flower.testing.model_server import ModelServer  # noqa: E402


def script(calls: int) -> dict[str, Any]:
    bash = {"tool_use": {"name": "Bash", "input": {"command": "true", "description": "b"}}}
    turns = [bash] * calls + [{"text": "bench done."}]
    return {"conversations": [{"name": "b", "match": {"marker": "[[b]]"}, "turns": turns}]}


async def session(options: Any, prompt: str) -> None:
    from claude_agent_sdk import ClaudeSDKClient, ResultMessage

    client = ClaudeSDKClient(options)
    await client.connect()
    try:
        await client.query(prompt)
        async for msg in client.receive_response():
            if isinstance(msg, ResultMessage) and msg.is_error:
                raise SystemExit(f"bench session failed: {msg.result}")
    finally:
        await client.disconnect()


def cycles(server: ModelServer, since: int) -> list[float]:
    times = [r.time for r in server.requests[since:] if r.path == "/v1/messages"]
    return [(b - a) * 1000 for a, b in itertools.pairwise(times[1:])]


def runtime(root: Path) -> Any:
    from flower import Runtime

    return Runtime(workspace=root / "ws", run_dir=root / "runs", workbench=True)


def bare_options(rt: Any) -> Any:
    from dataclasses import replace

    from flower import AgentSpec
    from flower.agents.agent import build_options

    spec = AgentSpec("bench", "bench", allowed_tools=["Bash"], permission_mode="acceptEdits")
    opts = build_options(spec, cwd=rt.workspace, session_store=rt.store, portable=True)
    return replace(opts, hooks=None)


def flower_options(rt: Any) -> Any:
    from flower import AgentSpec
    from flower.step.attempt import options_for
    from flower.step.call import StepCall

    spec = AgentSpec("bench", "bench", allowed_tools=["Bash"], permission_mode="acceptEdits")
    return options_for(StepCall(spec, "", "bench"), rt.seat)


def cli_cpu() -> float:
    total = 0.0
    for p in psutil.Process().children(recursive=True):
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            continue
    return total


async def window_cost(server: ModelServer) -> tuple[float, float, int]:
    from claude_agent_sdk import ClaudeAgentOptions, ClaudeSDKClient

    client = ClaudeSDKClient(ClaudeAgentOptions(cwd=tempfile.gettempdir(), setting_sources=[]))
    await client.connect()
    try:
        before, cpu0, t0 = len(server.requests), cli_cpu(), time.perf_counter()
        await client.get_context_usage()
        wall = time.perf_counter() - t0
        return wall * 1000, (cli_cpu() - cpu0) * 1000, len(server.requests) - before
    finally:
        await client.disconnect()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=30)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-hooks-"))
    (root / "ws").mkdir()
    with ModelServer(script(args.calls), log_path=root / "requests.jsonl") as server:
        os.environ.update(cli_env(root / "home", server.url))
        rt = runtime(root)
        bare: list[float] = []
        flower: list[float] = []
        for r in range(args.rounds):
            for kind, make, into in (
                ("bare", bare_options, bare),
                ("flower", flower_options, flower),
            ):
                since = len(server.requests)
                asyncio.run(session(make(rt), f"[[b]] {kind} {r}"))
                got = cycles(server, since)
                if len(got) < args.calls - 2:
                    raise SystemExit(f"{kind} session made {len(got)} calls, not {args.calls}")
                into.extend(got)
        wc = [asyncio.run(window_cost(server)) for _ in range(3)]
        rt.close()
    mb, mf = statistics.median(bare), statistics.median(flower)
    print(f"tool calls: {len(bare)} bare, {len(flower)} with flower's hooks ({args.rounds} rounds)")
    print(f"per call, median: bare {mb:.1f} ms, flower {mf:.1f} ms")
    print(f"added by the hooks: {mf - mb:+.1f} ms per call at the median, ratio {mf / mb:.2f}x")
    q = statistics.quantiles
    print(
        f"p90: bare {q(bare, n=10)[-1]:.1f} ms, flower {q(flower, n=10)[-1]:.1f} ms"
        "  (goal: under 5 ms added at the median)"
    )
    walls = [w for w, _, _ in wc]
    print(
        "learning the CLI's window (get_context_usage), 3 times: "
        f"wall {', '.join(f'{w:.0f}' for w in walls)} ms; "
        f"CLI CPU {', '.join(f'{c:.0f}' for _, c, _ in wc)} ms; "
        f"{', '.join(str(n) for _, _, n in wc)} count_tokens requests"
    )


if __name__ == "__main__":
    main()
