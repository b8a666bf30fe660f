"""What the web view shows, as JSON-ready dicts, read through the run-state seam only.

- :func:`runs`: every run ``status`` sees (one flower process each), newest first, with its
  flow, state, elapsed time, steps done of total, cost, reuse, and the command that carries
  a dead unfinished run on (as ``status`` prints it).
- :func:`timeline`: the story of a run: the chain of runs of its flow in its workspace that
  continued one another (from the one after the last finished run before it, to the first
  finished one after it), each step a row (map items and judge rounds under their step),
  each attempt a bar on one time axis, marked with how it ended; kills, wakes, takeovers and
  retries as marks.
- :func:`step`: one conversation as ``show --json`` gives it (the ledger's state on each
  tool call), and the attempts of that step.

An attempt is read from the run's event log (a ``step`` event opens it; a ``retry`` or a
``placed`` event with a higher try opens the next one; the run's manifest row ends it) and
its manifest row (how it ended, cost, session). A run that died during an attempt leaves no
row: the bar ends with the run's last sign of life and says ``killed``; when a later run of
the chain took the step up again, it says ``killed, woken``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flower.state.registry import FINISHED, RUNNING, FlowerRecord, state_of
from flower.state.result import KILLED_BY_SIGNAL
from flower.state.reuse import summary
from supervisor.inspect.status import elapsed, end_of, resume_command

if TYPE_CHECKING:
    from flower.state.backends import RunState

# How an attempt ended (the page's legend and colours use the same words).
OK, FAILED, RETRIED, SIGNAL, KILLED, WOKEN, TAKEN_OVER, REUSED, RUNNING_NOW = (
    "ok",
    "failed",
    "retried",
    "killed-by-signal",
    "killed",
    "killed-woken",
    "taken-over",
    "reused",
    "running",
)


def base_step(label: str) -> str:
    """The flow step a label belongs to: ``work[3]`` and ``work·判定#1`` are ``work``'s."""
    for sep in ("[", "·", "#"):
        label = label.split(sep, 1)[0]
    return label


# -- the runs list -------------------------------------------------------------------------


def runs(state: RunState) -> dict[str, Any]:
    """Every run of the state, of every workspace it holds, newest first (see the module
    docstring)."""
    out: list[dict[str, Any]] = []
    for each in state.workspaces():
        out += _runs_of(each)
    out.sort(key=lambda r: (r["started_at"], r["run"]), reverse=True)
    return {"where": state.where, "runs": out, "now": time.time()}


def state_of_run(state: RunState, run: str) -> RunState:
    """The workspace's state that holds run ``run`` (KeyError when none does)."""
    for each in state.workspaces():
        if each.registry.get(run) is not None:
            return each
    raise KeyError(run)


def _runs_of(state: RunState) -> list[dict[str, Any]]:
    from supervisor.inspect.runstate import resume_line

    records = state.registry.records()
    rows = state.manifest_rows()
    by_run: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_run.setdefault(str(row.get("run")), []).append(row)
    out = []
    for r in records:
        alive = r.alive
        st = state_of(r, alive)
        mine = by_run.get(r.run, [])
        done = {str(row.get("step")) for row in mine if row.get("ok")} | set(r.completed)
        cost = sum(float(row.get("cost_usd") or 0.0) for row in mine)
        reuse = summary(r.reuse) if r.reuse else {"reused": 0, "executed": 0, "saved_usd": 0}
        resume = export = None
        command = resume_command(r, records, alive)  # as status shows it under a dead run
        if command:
            resume, export = resume_line(command)
        out.append(
            {
                "run": r.run,
                "flow": r.flow,
                "workspace": r.workspace,
                "state": st,
                "alive": alive,
                "started_at": r.started_at,
                "elapsed_s": round(elapsed(r, alive), 1),
                "steps_done": len([s for s in r.steps if s in done]),
                "steps_total": len(r.steps),
                "step": r.step,
                "woke": r.woke,
                "cost_usd": round(cost, 6),
                "reused": reuse["reused"],
                "executed": reuse["executed"],
                "saved_usd": reuse["saved_usd"],
                "resume": resume,
                "resume_export": export,
                "host": r.host,
            }
        )
    return out


# -- a run's timeline ---------------------------------------------------------------------


def chain(records: list[FlowerRecord], run: FlowerRecord) -> list[FlowerRecord]:
    """The runs of ``run``'s flow in its workspace that carried one another on, oldest
    first: after the last finished one before ``run``, up to the first finished one from
    it on."""
    same = sorted(
        (o for o in records if o.flow == run.flow and o.workspace == run.workspace),
        key=lambda o: (o.started_at, o.run),
    )
    i = same.index(run)
    start = i
    while start > 0 and same[start - 1].state != FINISHED:
        start -= 1
    end = i
    while end < len(same) - 1 and same[end].state != FINISHED:
        end += 1
    return same[start : end + 1]


def timeline(state: RunState, run_id: str) -> dict[str, Any]:
    """The timeline of the run ``run_id`` (KeyError when there is none)."""
    return _timeline(state_of_run(state, run_id), run_id)


def _timeline(state: RunState, run_id: str) -> dict[str, Any]:
    """:func:`timeline` in the workspace's state that holds ``run_id``."""
    records = state.registry.records()
    run = next((r for r in records if r.run == run_id), None)
    if run is None:
        raise KeyError(run_id)
    runs_ = chain(records, run)
    ids = {r.run for r in runs_}
    rows = [row for row in state.manifest_rows() if str(row.get("run")) in ids]
    attempts: list[dict[str, Any]] = []
    marks: list[dict[str, Any]] = []
    for n, r in enumerate(runs_):
        alive = r.alive
        events = [ev for _, ev in state.events.read(r.run)]
        mine = [row for row in rows if row.get("run") == r.run]
        made = _attempts(r, alive, events, mine)
        for a in made:
            a["nth"] = n  # the run's place in the chain (clocks of two machines may differ)
        if n:
            marks.append({"kind": "wake", "t": r.started_at, "run": r.run, "woke": r.woke})
        marks += _marks(r, events)
        attempts += made
    # a killed attempt whose step a later run of the chain took up again was woken
    for a in attempts:
        if a["outcome"] == KILLED and any(
            b["label"] == a["label"] and b["nth"] > a["nth"] for b in attempts
        ):
            a["outcome"] = WOKEN
    for a in attempts:
        a["id"] = f"{a['run']}:{a['label']}:{a['start']:.3f}"
        if a["outcome"] == TAKEN_OVER:
            marks.append({"kind": "takeover", "t": a["end"], "run": a["run"], "step": a["label"]})
    order = _step_order(runs_, attempts)
    steps = []
    for name in order:
        labels = sorted(
            {a["label"] for a in attempts if base_step(a["label"]) == name} - {name},
            key=_label_key,
        )
        steps.append({"step": name, "children": labels})
    t0 = min([r.started_at for r in runs_] + [a["start"] for a in attempts])
    t1 = max([end_of(r, r.alive) for r in runs_] + [a["end"] for a in attempts] + [t0 + 1.0])
    last = runs_[-1]
    return {
        "run": run.run,
        "flow": run.flow,
        "workspace": run.workspace,
        "state": state_of(last),
        "runs": [
            {"run": r.run, "state": state_of(r), "started_at": r.started_at, "woke": r.woke}
            for r in runs_
        ],
        "steps": steps,
        "attempts": attempts,
        "marks": sorted(marks, key=lambda m: float(m["t"])),
        "t0": t0,
        "t1": t1,
        "cost_usd": round(sum(float(a.get("cost_usd") or 0.0) for a in attempts), 6),
        "questions": questions(state, last) if last.state == RUNNING and last.alive else [],
        "now": time.time(),
    }


def questions(state: RunState, r: FlowerRecord) -> list[dict[str, Any]]:
    """The questions run ``r`` waits on an answer to, oldest first (its ``ask`` events)."""
    waiting: dict[str, dict[str, Any]] = {}
    for _, ev in state.events.read(r.run):
        if ev.get("kind") != "ask":
            continue
        p = _payload(ev)
        qid = str(p.get("id") or "")
        if not qid:
            continue
        if p.get("state") == "asked":
            options = [str(o) for o in p.get("options") or []]
            waiting[qid] = {"id": qid, "run": r.run, "question": ev.get("text"), "options": options}
        else:
            waiting.pop(qid, None)
    return list(waiting.values())


def _payload(ev: dict[str, Any]) -> dict[str, Any]:
    payload = ev.get("payload")
    return payload if isinstance(payload, dict) else {}


def _label_key(label: str) -> tuple[int, str]:
    digits = "".join(c for c in label.rsplit("[", 1)[-1] if c.isdigit())
    return (int(digits) if digits else 0, label)


def _step_order(runs_: list[FlowerRecord], attempts: list[dict[str, Any]]) -> list[str]:
    order: list[str] = []
    for r in runs_:
        for s in r.steps:
            if s not in order:
                order.append(s)
    for a in attempts:
        name = base_step(a["label"])
        if name not in order:
            order.append(name)
    return order


def _attempts(
    r: FlowerRecord, alive: bool, events: list[dict[str, Any]], rows: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The attempts run ``r`` made, from its events and manifest rows."""
    out: list[dict[str, Any]] = []
    open_: dict[str, dict[str, Any]] = {}  # label -> its latest attempt
    end_of_run = end_of(r, alive)
    if events:
        end_of_run = max(end_of_run, float(events[-1].get("t") or 0.0))

    def begin(label: str, at: float, **more: Any) -> dict[str, Any]:
        a: dict[str, Any] = {
            "run": r.run,
            "label": label,
            "start": at,
            "end": at,
            "outcome": RUNNING_NOW,
            "session_id": None,
            "host": r.host,
            "worker": None,
            "try": 0,
            "cost_usd": 0.0,
            "error": None,
            "resumed": False,
            "tools": 0,
            "tokens": 0,
        }
        a.update(more)
        open_[label] = a
        out.append(a)
        return a

    for ev in events:
        kind = ev.get("kind")
        at = float(ev.get("t") or 0.0)
        payload = _payload(ev)
        label = str(payload.get("step") or ev.get("step") or "")
        if not label:
            continue
        cur = open_.get(label)
        flying = cur is not None and cur["outcome"] == RUNNING_NOW
        if kind == "step":
            if "items" in payload or payload.get("item_done"):
                continue  # a map's own line, and an item's end (its row says how it ended)
            if not flying:
                begin(label, at, resumed=bool(payload.get("resumed")))
            continue
        if kind == "retry" and cur is not None and flying:
            cur["end"], cur["outcome"] = at, RETRIED
            cur["error"] = str(ev.get("text") or payload.get("error") or "") or None
            begin(label, at, session_id=cur["session_id"])
            continue
        if kind == "placed":
            where = {"host": payload.get("host"), "worker": payload.get("worker")}
            tried = payload.get("try") if isinstance(payload.get("try"), int) else 0
            if cur is None or not flying:
                begin(label, at, **where, **{"try": tried})
            elif cur["worker"] is None:
                cur.update(where, **{"try": tried})
            elif (
                tried > cur["try"]
                or payload.get("took_over")
                or (cur["host"], cur["worker"]) != (where["host"], where["worker"])
            ):
                cur["end"], cur["outcome"] = at, TAKEN_OVER
                begin(
                    label, at, **where, session_id=cur["session_id"], resumed=True, **{"try": tried}
                )
            continue
        if cur is None or not flying:
            cur = begin(label, at)  # an attempt whose first sign is not a step event (an item)
        _note(cur, kind, payload)
        cur["end"] = max(cur["end"], at)
    for row in rows:
        label = str(row.get("step") or "")
        cur = open_.get(label)
        start = float(row.get("started_at") or row.get("ended_at") or r.started_at)
        if cur is None or cur["outcome"] != RUNNING_NOW:
            cur = begin(label, start)
        if next(a for a in out if a["label"] == label) is cur:
            # the step's first attempt here: the row knows when it began (a map's item may
            # show no sign before it has run a while); a later try's start is its own
            cur["start"] = min(cur["start"], start)
        cur["end"] = max(cur["start"], float(row.get("ended_at") or cur["end"]))
        cur["session_id"] = row.get("session_id") or cur["session_id"]
        cur["cost_usd"] = float(row.get("cost_usd") or 0.0)
        cur["num_turns"] = row.get("num_turns")
        cur["resumed"] = bool(row.get("resumed")) or cur["resumed"]
        error = row.get("error")
        if row.get("reused"):
            cur["outcome"], cur["reused"] = REUSED, row.get("reused")
        elif row.get("ok"):
            cur["outcome"] = OK
        elif error == KILLED_BY_SIGNAL:
            cur["outcome"] = SIGNAL
        else:
            cur["outcome"] = FAILED
        cur["error"] = error
    for a in out:
        if a["outcome"] == RUNNING_NOW:
            if alive and r.state == RUNNING:
                a["end"] = max(a["end"], time.time())
            else:
                a["end"] = max(a["end"], end_of_run)
                a["outcome"] = KILLED
    return out


def _note(cur: dict[str, Any], kind: Any, payload: dict[str, Any]) -> None:
    """What an event of an attempt in flight tells of it: a tool call, tokens, its session."""
    if kind == "tool_call":
        cur["tools"] += 1
    elif kind == "result" and isinstance(payload.get("tokens"), int):
        cur["tokens"] += payload["tokens"]
    sid = payload.get("session_id")
    if isinstance(sid, str) and sid and cur["session_id"] is None:
        cur["session_id"] = sid


def _marks(r: FlowerRecord, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for ev in events:
        kind = ev.get("kind")
        if kind in ("handoff", "reset", "retry", "ask"):
            payload: dict[str, Any] = _payload(ev)
            out.append(
                {
                    "kind": kind,
                    "t": float(ev.get("t") or 0.0),
                    "run": r.run,
                    "step": str(payload.get("step") or ev.get("step") or ""),
                    "text": str(ev.get("text") or "")[:200],
                }
            )
    if not r.alive and r.state != FINISHED:
        out.append({"kind": "end", "t": end_of(r, False), "run": r.run, "state": state_of(r)})
    return out


# -- one step --------------------------------------------------------------------------------


def step(state: RunState, run_id: str, label: str) -> dict[str, Any]:
    """The conversation of ``label`` as the run ``run_id``'s chain ran it, the ledger's
    state on each tool call, and that step's attempts. KeyError when there is none."""
    from supervisor.inspect.show import conversation

    state = state_of_run(state, run_id)
    tl = _timeline(state, run_id)
    mine = [a for a in tl["attempts"] if a["label"] == label]
    if not mine:
        raise KeyError(label)
    sessions = list(dict.fromkeys(a["session_id"] for a in mine if a["session_id"]))
    if not sessions:
        lineage = dict(state.peek_lineage().get("steps") or {})
        if lineage.get(label):
            sessions = [str(lineage[label])]
    conversations = []
    for sid in sessions:
        calls = state.tool_calls(sid)
        conversations.append(
            {
                "session_id": sid,
                "turns": conversation(state, sid),
                "tool_calls": [
                    {
                        "id": c.tool_use_id,
                        "name": c.name,
                        "state": c.state,
                        "started_at": c.started_at,
                        "ended_at": c.ended_at,
                    }
                    for c in calls
                ],
            }
        )
    from flower.util.fsutil import file_name

    logs = []
    for run in dict.fromkeys(a["run"] for a in mine):
        path = state.run_dir / "logs" / run / f"{file_name(label)}.log"
        text = _tail(path)
        if text is not None:
            logs.append({"run": run, "path": str(path), "text": text})
    handoff = Path(tl["workspace"]) / ".flower" / "notes" / f"交接-{base_step(label)}.md"
    handoff_text = _tail(handoff)
    return {
        "run": run_id,
        "label": label,
        "flow": tl["flow"],
        "attempts": mine,
        "conversations": conversations,
        "logs": logs,
        "handoff": None if handoff_text is None else {"path": str(handoff), "text": handoff_text},
        "live": any(a["outcome"] == RUNNING_NOW for a in mine),
    }


TAIL_BYTES = 64 * 1024  # of a step's log on the page: its end, where a run is now


def _tail(path: Path) -> str | None:
    """The last :data:`TAIL_BYTES` of ``path`` as text, or None (absent, unreadable: a step
    that ran on another machine keeps its log there)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - TAIL_BYTES))
            data = f.read()
    except OSError:
        return None
    text = data.decode("utf-8", "replace")
    return text if size <= TAIL_BYTES else "…" + text.split("\n", 1)[-1]


def tool_calls(state: RunState, run_id: str, session_id: str) -> list[dict[str, Any]]:
    """The tool calls the ledger holds for ``session_id`` (of run ``run_id``'s workspace):
    name, state and times, never their input or output (those are the conversation's)."""
    state = state_of_run(state, run_id)
    return [
        {"name": c.name, "state": c.state, "started_at": c.started_at, "ended_at": c.ended_at}
        for c in state.tool_calls(session_id)
        if c.agent_id is None
    ]


def signature(state: RunState, positions: dict[str, int]) -> tuple[Any, ...]:
    """What changes whenever anything a page shows changes (the live stream compares it).
    ``positions`` keeps how far each live run's events were read, so a look reads only what
    is new."""
    out: list[Any] = []
    for each in state.workspaces():
        records = each.registry.records()
        # not updated_at: the heartbeat rewrites it every few seconds, changing nothing shown
        out += [(r.run, r.state, r.step, r.attempt, r.woke, r.ended_at) for r in records]
        out.append(len(each.manifest_rows()))
        for r in records:
            if r.state == RUNNING:
                new = each.events.read(r.run, positions.get(r.run, 0))
                if new:
                    positions[r.run] = new[-1][0]
                out.append((r.run, positions.get(r.run, 0)))
    return tuple(out)
