"""Each kind of durable write of the run state, written once for both backends, and how to
read it back (tests/test_state_conformance.py); also the child process its kill -9 suite
kills:

    python -m tests.state_writes KIND URL|- RUN_DIR WORKSPACE

opens the run state (``-``: local files in RUN_DIR), prints ``ready``, then for each line
``write FIRST LAST`` on stdin performs writes FIRST..LAST-1 of KIND and prints ``written
LAST`` once the last returned; it then waits for the next line (or its kill -9).

A kind's ``write(state, i)`` is its i-th write; ``read(state)`` what a run state holds of
that kind, comparable with ``expect(n)``: what writes 0..n-1 must leave, order included
(a later write of the same thing wins, so writes applied out of order read differently).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flower.cache import Entry
from flower.cache.store import cache_key
from flower.state.backends import RunState, open_state
from flower.state.identity import path_key
from flower.state.records import LedgerRow
from flower.state.registry import FINISHED, FlowerRecord
from flower.state.result import Event, StepResult

SESSION = "5e550000-0000-4000-8000-000000000001"
RUN = "r-conformance"
CREATED = time.time()  # the cache entries': fresh for the test's while


def key(state: RunState, session_id: str = SESSION) -> dict[str, str]:
    """The SDK's key of a main transcript in the state's workspace."""
    return {"project_key": path_key(state.workspace), "session_id": session_id}


def entry(i: int) -> dict[str, Any]:
    return {"type": "user", "uuid": f"00000000-0000-4000-8000-{i:012d}", "i": i}


def events(state: RunState, run: str) -> list[dict[str, Any]]:
    """The run's events where ``logs`` reads them (``state.events``), in order."""
    return [ev for _, ev in state.events.read(run)]


def record(run: str, *, attempt: int = 0, started_at: float = 1.0, **kw: Any) -> FlowerRecord:
    return FlowerRecord(
        run=run,
        flow="f",
        pid=0,  # no process: ``live`` asks the record's state and its process
        pid_started=None,
        workspace="/nowhere",
        started_at=started_at,
        attempt=attempt,
        **kw,
    )


# -- the kinds of write ----------------------------------------------------------------------


def _session_write(state: RunState, i: int) -> None:
    asyncio.run(state.sessions.append(key(state), [entry(i)]))  # type: ignore[arg-type, list-item]


def _session_read(state: RunState) -> Any:
    return [e.get("i") for e in state.transcript(SESSION)]


def _ledger_write(state: RunState, i: int) -> None:
    started = LedgerRow(
        f"toolu_{i}", SESSION, None, "Bash", json.dumps({"i": i}), "started", 1e9 + i
    )
    asyncio.run(state.ledger.started(started))
    done = LedgerRow(
        f"toolu_{i}",
        SESSION,
        None,
        "Bash",
        json.dumps({"i": i}),
        "done",
        1e9 + i,
        response=json.dumps({"out": i}),
        content=json.dumps(f"out {i}"),
        ended_at=1e9 + i + 0.5,
    )
    asyncio.run(state.ledger.finished(done))


def _ledger_read(state: RunState) -> Any:
    return [(r.tool_use_id, r.state, r.content) for r in state.tool_calls(SESSION)]


def _lineage_write(state: RunState, i: int) -> None:
    lineage = state.lineage()
    lineage.remember("a", f"sid-a-{i}")  # the same step again: the last one names it
    lineage.remember(f"step{i}", f"sid-{i}")
    lineage.remember("x", f"sid-x-{i}")
    lineage.forget("x", f"sid-x-{i}")  # still the one it names: dropped
    lineage.forget("a", f"sid-a-{i - 1}")  # names a later one by now: kept


def _lineage_read(state: RunState) -> Any:
    return state.peek_lineage().get("steps", {})


def _manifest_write(state: RunState, i: int) -> None:
    state.manifest(RUN).record(StepResult(f"step{i}", f"sid-{i}", ok=True), {"i": i})


def _manifest_read(state: RunState) -> Any:
    return [(r["step"], r["i"], r["run"]) for r in state.manifest_rows()]


def _registry_write(state: RunState, i: int) -> None:
    registry = state.registry
    registry.write(record(RUN, attempt=i, state=FINISHED))  # rewritten: the last one stands
    registry.write(record(f"r{i}", started_at=10.0 + i, state=FINISHED))
    if i:
        registry.remove(f"r{i - 1}")  # a record forgotten, in order after its write


def _registry_read(state: RunState) -> Any:
    return [(r.run, r.attempt) for r in state.registry.records()]


def _event_write(state: RunState, i: int) -> None:
    log = state.event_log(RUN)
    log.write(Event("text", f"e{i}", payload={"step": "a", "i": i}))
    log.close()


def _event_read(state: RunState) -> Any:
    return [ev["text"] for ev in events(state, RUN)]


def _cache_write(state: RunState, i: int) -> None:
    e = cache_entry(i)
    state.cache.put(e.key, e)


def _cache_read(state: RunState) -> Any:
    out = []
    for i in range(8):
        got = state.cache.get(cache_entry(i).key, ttl_s=None)
        if got is not None:
            out.append(got.ctx_value)
    return out


def cache_entry(i: int) -> Entry:
    k = cache_key(f"in-{i}", "fp")
    return Entry(k, f"step{i}", f"in-{i}", {"m": "fp"}, {"ok": True}, {"i": i}, CREATED, "f")


@dataclass(frozen=True)
class Kind:
    write: Callable[[RunState, int], None]
    read: Callable[[RunState], Any]
    expect: Callable[[int], Any]


KINDS: dict[str, Kind] = {
    "session": Kind(_session_write, _session_read, lambda n: list(range(n))),
    "ledger": Kind(
        _ledger_write,
        _ledger_read,
        lambda n: [(f"toolu_{i}", "done", json.dumps(f"out {i}")) for i in range(n)],
    ),
    "lineage": Kind(
        _lineage_write,
        _lineage_read,
        lambda n: (
            {"a": f"sid-a-{n - 1}", **{f"step{i}": f"sid-{i}" for i in range(n)}} if n else {}
        ),
    ),
    "manifest": Kind(
        _manifest_write, _manifest_read, lambda n: [(f"step{i}", i, RUN) for i in range(n)]
    ),
    "registry": Kind(
        _registry_write,
        _registry_read,
        lambda n: [(RUN, n - 1), (f"r{n - 1}", 0)] if n else [],
    ),
    "event": Kind(_event_write, _event_read, lambda n: [f"e{i}" for i in range(n)]),
    # A cache is no durable record (a put the database cannot take is lost, a miss later):
    # it is in the kill -9 suite, not the outage one.
    "cache": Kind(_cache_write, _cache_read, lambda n: [{"i": i} for i in range(n)]),
}
#: the writes that must survive the database being away
DURABLE = [k for k in KINDS if k != "cache"]
_EACH = tuple(DURABLE)


def _every_write(state: RunState, i: int) -> None:
    for name in _EACH:
        KINDS[name].write(state, i)


# Every durable kind interleaved, as a step writes them (its session, the ledger, the lineage
# that names the session, the manifest row, the registry record, the events).
KINDS["every"] = Kind(
    _every_write,
    lambda state: {name: KINDS[name].read(state) for name in _EACH},
    lambda n: {name: KINDS[name].expect(n) for name in _EACH},
)
DURABLE.append("every")


def main(argv: list[str]) -> int:
    kind, url, run_dir, workspace = argv
    state = open_state(None if url == "-" else url, run_dir=run_dir, workspace=workspace)
    if kind in ("session", "ledger", "every"):  # the store (and the SDK) loaded before any outage
        state.sessions  # noqa: B018
    state.workspace_id  # noqa: B018
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if words[:1] == ["write"]:
            first, last = int(words[1]), int(words[2])
            for i in range(first, last):
                KINDS[kind].write(state, i)
            print(f"written {last}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
