"""What the hook layer adds to a tool call, and what learning the CLI's window costs.

Through the real bundled CLI against the scripted model server, in this process (the hooks
run where the attempt runs in every placement, so a step child pays the same):

- bare: the same options as flower's below (session store flushed eagerly, the workbench's
  prompt and directory) with no hooks at all;
- empty: the same with two hooks that do nothing (one ``PreToolUse``, one ``PostToolUse``,
  every tool): what the CLI's control round trips alone cost, the floor of any hook layer
  that sees every call before and after it runs;
- flower: the options a Runtime's attempt gets (``flower.step.attempt.options_for``): the
  whitelist guard, the workbench's index and spill guards, and the tool ledger (its
  ``PreToolUse`` records the start and the message that asked for the call, its
  ``PostToolUse`` commits the result), folded into one matcher per event. A coordinator's
  delegate and Agent guards join the same two callbacks, so they add Python time only.

Each session makes ``--calls`` Bash calls (``true``), each answered at once by the model
server; a call's cycle is the time between the model server receiving two consecutive
requests (the CLI running the tool, the hooks, the next request; a new session's first call,
which also waits for the session to reach sessions.db, is left out). Sessions of the three
kinds alternate in ``--rounds`` rounds, the order reversed every other round, so machine noise
hits them alike; the figures are medians over every call of every round. Each hook callback
is a round trip of the CLI's control protocol (the CLI writes a request, this process wakes,
answers, the CLI wakes): on a loaded machine the wake-ups wait for a free core, so the
figures grow with the load. Goal (issues 8, 17): at most 5 ms added per call at the median.

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

from flower.services.cli_env import cli_env  # noqa: E402
from flower.services.model_server import ModelServer  # noqa: E402


def script(calls: int) -> dict[str, Any]:
    bash = {"tool_use": {"name": "Bash", "input": {"command": "true", "description": "b"}}}
    turns = [bash] * calls + [{"text": "bench done."}]
    return {"conversations": [{"name": "b", "match": {"marker": "[[b]]"}, "turns": turns}]}


async def session(options: Any, prompt: str, ledger: Any = None) -> str:
    """Run one session to its result; its id. ``ledger`` sees the model's messages as an
    attempt's does (its ``PreToolUse`` keeps the message that asked for the call)."""
    from claude_agent_sdk import AssistantMessage, ClaudeSDKClient, ResultMessage

    client = ClaudeSDKClient(options)
    await client.connect()
    sid = ""
    try:
        await client.query(prompt)
        async for msg in client.receive_response():
            if ledger is not None and isinstance(msg, AssistantMessage) and not msg.error:
                ledger.saw(msg)
            if isinstance(msg, ResultMessage):
                if msg.is_error:
                    raise SystemExit(f"bench session failed: {msg.result}")
                sid = msg.session_id
    finally:
        await client.disconnect()
    return sid


def cycles(server: ModelServer, since: int) -> list[float]:
    times = [r.time for r in server.requests[since:] if r.path == "/v1/messages"]
    return [(b - a) * 1000 for a, b in itertools.pairwise(times[1:])]


def spans(rt: Any, sid: str) -> list[float]:
    """Each call's span inside the CLI: from its ``tool_use`` entry to its ``tool_result``
    entry (the CLI's own millisecond timestamps): the hooks, the tool, no model request."""
    from flower.state.ledger import timestamp_epoch
    from flower.state.trim import tool_results, tool_uses

    entries = rt.store.load_sync({"project_key": rt.project_key, "session_id": sid}) or []
    asked: dict[str, float] = {}
    out = []
    for entry in entries:
        when = timestamp_epoch(entry.get("timestamp"))
        if when is None:
            continue
        for _, block in tool_uses(entry):
            asked[block.get("id")] = when
        for _, block in tool_results(entry):
            if block.get("tool_use_id") in asked:
                out.append((when - asked[block["tool_use_id"]]) * 1000)
    return out[1:]  # the first call also waits for the session to reach sessions.db


def runtime(root: Path) -> Any:
    from flower import Runtime

    return Runtime(workspace=root / "ws", run_dir=root / "runs", workbench=True)


def bare_options(rt: Any) -> Any:
    from dataclasses import replace

    return replace(flower_options(rt), hooks=None)


def empty_options(rt: Any) -> Any:
    from dataclasses import replace

    from claude_agent_sdk.types import HookMatcher

    async def nothing(data: Any, tool_use_id: str | None, ctx: Any) -> Any:
        return {}

    matcher = [HookMatcher(matcher=None, hooks=[nothing])]
    return replace(bare_options(rt), hooks={"PreToolUse": matcher, "PostToolUse": matcher})


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
        kinds = {"bare": bare_options, "empty": empty_options, "flower": flower_options}
        cycle: dict[str, list[float]] = {kind: [] for kind in kinds}
        span: dict[str, list[float]] = {kind: [] for kind in kinds}
        for r in range(args.rounds):
            order = list(kinds) if r % 2 == 0 else list(kinds)[::-1]  # no kind always last
            for kind in order:
                since = len(server.requests)
                ledger = rt.store.ledger if kind == "flower" else None
                sid = asyncio.run(session(kinds[kind](rt), f"[[b]] {kind} {r}", ledger))
                got = cycles(server, since)
                if len(got) < args.calls - 2:
                    raise SystemExit(f"{kind} session made {len(got)} calls, not {args.calls}")
                cycle[kind].extend(got)
                span[kind].extend(spans(rt, sid))
        wc = [asyncio.run(window_cost(server)) for _ in range(3)]
        rt.close()
    print(
        f"tool calls: {len(cycle['bare'])} bare, {len(cycle['empty'])} with two empty hooks,"
        f" {len(cycle['flower'])} with flower's hooks ({args.rounds} rounds)"
    )
    for what, got in (("cycle (request to request)", cycle), ("tool span (inside the CLI)", span)):
        b, e, f = (statistics.median(got[kind]) for kind in kinds)
        print(
            f"per call, median {what}: bare {b:.1f} ms, empty hooks {e:.1f} ms,"
            f" flower {f:.1f} ms; added by flower's hooks {f - b:+.1f} ms"
            f" (the CLI's two round trips alone {e - b:+.1f} ms)"
        )
    print("goal: at most 5 ms added per call at the median")
    walls = [w for w, _, _ in wc]
    print(
        "learning the CLI's window (get_context_usage), 3 times: "
        f"wall {', '.join(f'{w:.0f}' for w in walls)} ms; "
        f"CLI CPU {', '.join(f'{c:.0f}' for _, c, _ in wc)} ms; "
        f"{', '.join(str(n) for _, _, n in wc)} count_tokens requests"
    )


if __name__ == "__main__":
    main()
