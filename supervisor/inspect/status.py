"""``flower-super status``: what ran here, what is alive, what can be resumed.

Reads only, through the run state (:mod:`flower.state.backends`): the registry, the lineage
and the manifest rows. Against local files (the run_dir's ``flowers/``, lineage.json and
manifest.json, read under the manifest's lock so it never sees a torn file) it never imports
the SDK, so it answers at once; a damaged file is reported (the next start sets it aside),
and so is every file a start already set aside. Against a database it shows the runs of the
workspace (``-w``, default here), under the workspace's identity; there is no file there to
be damaged.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flower.i18n import define, t
from flower.state.registry import (
    FAILED,
    FINISHED,
    KILLED,
    RESUMABLE,
    RUNNING,
    FlowerRecord,
    state_of,
)
from flower.state.reuse import report_lines, summary
from supervisor.inspect.runstate import Seen, lacks_password, resume_line

LAST_ROWS = 10

# States (running, finished, interrupted-resumable …) are printed as they are: they are the
# values of --json's "state", and what a person greps for.
define(
    {
        "status.run_dir": ("运行目录  {path}", "run_dir    {path}"),
        "status.state": ("运行状态  {where}", "state      {where}"),
        "status.workspace": ("工作区    {path}", "workspace  {path}"),
        "status.woke": ("唤醒      {n}", "woke       {n}"),
        "status.step": ("步骤      {name} -> {sid}", "step       {name} -> {sid}"),
        "status.flowers": ("flower ({n})", "flowers ({n})"),
        "status.no_flowers": ("flower    还没有", "flowers    none yet"),
        "status.live": ("在跑", "live"),
        "status.dead": ("已停", "dead"),
        "status.detail": (
            "      步骤 {step}  会话 {session}  第 {attempt} 次尝试  第 {woke} 次唤醒"
            "  已用 {elapsed}",
            "      step {step}  session {session}  attempt {attempt}  woke {woke}"
            "  elapsed {elapsed}",
        ),
        "status.resume": (
            "      接着做: cd {cwd} && {command}",
            "      resume: cd {cwd} && {command}",
        ),
        "status.map_items": (
            "      {step}:{done} 项已完成",
            "      {step}: {done} {done|item|items} done",
        ),
        "status.queued": (
            "      @ {label}  在队列里等一个 worker",
            "      @ {label}  waits on the queue for a worker",
        ),
        "status.placed": (
            "      @ {label}  在 {host} 上跑(worker pid {pid},第 {n} 次派发)",
            "      @ {label}  runs on {host} (worker pid {pid}, dispatch try {n})",
        ),
        "status.commands": ("      命令: {commands}", "      commands: {commands}"),
        "status.rows": ("最近 {n} 行 manifest", "last {n} manifest {n|row|rows}"),
        "status.row": (
            "  {mark} {step}  {took:.1f}s  ${cost:.4f}  尝试 {attempts}  会话 {session}"
            "  run {run}{error}",
            "  {mark} {step}  {took:.1f}s  ${cost:.4f}  attempts {attempts}  session {session}"
            "  run {run}{error}",
        ),
        "status.damaged": ("! {file} {problem}:{consequence}", "! {file} {problem}: {consequence}"),
        "status.gone_fresh": (
            "下次启动时这些步骤从头开始",
            "the next start begins those steps fresh",
        ),
        "status.set_aside_fresh": (
            "下次启动会把它挪到一边,另起一个新的",
            "the next start sets it aside and starts a fresh one",
        ),
        "status.set_aside": (
            "已挪到一边 ({n} 个,留给你查看;flower 从不删除它们)",
            "set aside ({n}, kept for you to look at; flower never deletes them)",
        ),
        "status.unfinished": (
            "有没做完的:运行已停 flower 下面列出的命令就能接着做",
            "unfinished: run the command shown under a dead flower to carry it on",
        ),
    }
)


@dataclass(eq=False, repr=False)  # unused, and ~0.2 ms of start-up each
class FlowerView:
    record: FlowerRecord
    alive: bool
    state: str
    resume_command: list[str] | None = None
    commands: list[str] = field(default_factory=list)  # show / logs / cancel that apply

    @property
    def unfinished_dead(self) -> bool:
        return self.resume_command is not None

    def to_json(self) -> dict[str, Any]:
        r = self.record
        return {
            "run": r.run,
            "flow": r.flow,
            "pid": r.pid,
            "alive": self.alive,
            "state": self.state,
            "step": r.step,
            "session_id": r.session_id,
            "started_at": r.started_at,
            "attempt": r.attempt,
            "woke": r.woke,
            "elapsed_s": round(elapsed(r, self.alive), 1),
            # as status prints it, and the state URL to export first (its password masked)
            "resume": resume_line(self.resume_command)[0] if self.resume_command else None,
            "resume_export": resume_line(self.resume_command)[1] if self.resume_command else None,
            "commands": self.commands,
            "reuse": summary(r.reuse) if r.reuse else None,
            "map_items_done": _map_items(r),
            # attempts running on cluster workers: label -> {id, host, pid, worker, try}
            "placed": {label: dict(where) for label, where in r.placed.items()},
        }


@dataclass(eq=False, repr=False)  # unused, and ~0.2 ms of start-up each
class Report:
    run_dir: Path
    workspace: str | None
    woke: int
    steps: dict[str, str]
    flowers: list[FlowerView] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    damaged: list[dict[str, str]] = field(default_factory=list)  # {"file", "problem"}
    set_aside: list[str] = field(default_factory=list)  # files a start moved aside
    state: str | None = None  # where a shared state lives (its URL, masked); None: local

    @property
    def dead_unfinished(self) -> list[FlowerView]:
        return [f for f in self.flowers if f.unfinished_dead]

    def to_json(self) -> dict[str, Any]:
        return {
            "run_dir": str(self.run_dir),
            "state": self.state or "local",
            "workspace": self.workspace,
            "woke": self.woke,
            "steps": self.steps,
            "flowers": [f.to_json() for f in self.flowers],
            "rows": self.rows,
            "damaged": self.damaged,
            "set_aside": self.set_aside,
        }


def collect(seen: Seen) -> Report:
    """What ``status`` reports of the run state ``seen`` looks at."""
    st = seen.state
    st.present()
    doc = st.peek_lineage()
    steps = dict(doc.get("steps") or {})
    records = st.registry.records()
    views = [_view(r, records, seen) for r in records]
    problems = st.problems(steps)
    # a manifest a start would set aside is not read: its rows are what is wrong with it
    torn = any(p["file"] == str(st.manifest_where) for p in problems)
    rows = [] if torn else st.manifest_rows()
    return Report(
        seen.run_dir,
        doc.get("workspace") or (str(seen.workspace) if st.shared else None),
        int(doc.get("woke") or 0),
        steps,
        views,
        rows[-LAST_ROWS:],
        problems,
        st.set_aside(),
        state=st.where if st.shared else None,
    )


def _view(r: FlowerRecord, everyone: list[FlowerRecord], seen: Seen) -> FlowerView:
    alive = r.alive
    state = state_of(r, alive)
    command = resume_command(r, everyone, alive)
    return FlowerView(r, alive, state, command, commands(r, state == RUNNING, seen))


def resume_command(r: FlowerRecord, everyone: list[FlowerRecord], alive: bool) -> list[str] | None:
    """The command that carries ``r`` on, when it is dead with work left and no later run
    of its flow here finished it or carries it on now (what ``status`` shows under it)."""
    if alive or state_of(r, alive) not in (RESUMABLE, KILLED, FAILED):
        return None
    if _superseded(r, everyone):
        return None
    return r.command or None


def commands(r: FlowerRecord, live: bool, seen: Seen) -> list[str]:
    """The inspection commands that apply to run ``r``: ``show`` once it has a conversation,
    ``logs -f`` and ``cancel`` while it is live, ``logs`` after it when it left an event
    log (a run of an older flower has none; a database keeps every run's). Each names the
    state status looked at when it is not the default here (:meth:`Seen.where_args`)."""
    where = seen.where_args()
    out = []
    if r.session_id or r.completed:
        out.append(["show", r.run])
    if live:
        out += [["logs", "-f", r.run], ["cancel", r.run]]
    elif seen.state.has_events(r.run):
        out.append(["logs", r.run])
    return [shlex.join(["flower-super", *c, *where]) for c in out]


def _superseded(r: FlowerRecord, everyone: list[FlowerRecord]) -> bool:
    """A later run of the same flow here finished, or is carrying it on right now."""
    for other in everyone:
        if (
            other.flow != r.flow
            or other.workspace != r.workspace
            or other.started_at <= r.started_at
        ):
            continue
        if other.state == FINISHED or other.alive:
            return True
    return False


def elapsed(r: FlowerRecord, alive: bool) -> float:
    """Seconds from ``r``'s start to now (live) or to its end."""
    return max(0.0, end_of(r, alive) - r.started_at)


def end_of(r: FlowerRecord, alive: bool) -> float:
    """When ``r`` ended (now while it is live; else its last word on record)."""
    return time.time() if alive else (r.ended_at or r.updated_at or r.started_at)


# -- text ------------------------------------------------------------------------------


def render_text(rep: Report) -> str:
    lines = [
        t("status.state", where=rep.state) if rep.state else t("status.run_dir", path=rep.run_dir),
        t("status.workspace", path=rep.workspace or "-"),
        t("status.woke", n=rep.woke),
    ]
    for name, sid in rep.steps.items():
        lines.append(t("status.step", name=name, sid=sid))
    lines.append("")
    lines.append(t("status.flowers", n=len(rep.flowers)) if rep.flowers else t("status.no_flowers"))
    for f in rep.flowers:
        lines.extend(_flower_lines(f))
    if rep.rows:
        lines.append("")
        lines.append(t("status.rows", n=len(rep.rows)))
        lines.extend(_row_line(row) for row in rep.rows)
    if rep.damaged:
        lines.append("")
        lines.extend(
            t("status.damaged", file=d["file"], problem=d["problem"], consequence=_consequence(d))
            for d in rep.damaged
        )
    if rep.set_aside:
        lines.append("")
        lines.append(t("status.set_aside", n=len(rep.set_aside)))
        lines.extend(f"  {path}" for path in rep.set_aside)
    if rep.dead_unfinished:
        lines.append("")
        lines.append(t("status.unfinished"))
    return "\n".join(lines)


def _flower_lines(f: FlowerView) -> list[str]:
    r = f.record
    live = t("status.live") if f.alive else t("status.dead")
    head = f"  {r.run}  {r.flow}  pid {r.pid} {live}  {f.state}"
    detail = t(
        "status.detail",
        step=r.step or "-",
        session=r.session_id or "-",
        attempt=r.attempt,
        woke=r.woke,
        elapsed=dur(elapsed(r, f.alive)),
    )
    out = [head, detail]
    for label, where in r.placed.items():  # attempts on cluster workers, where each runs
        if not where.get("host"):  # dispatched, on the queue: no worker has taken it yet
            out.append(t("status.queued", label=label))
            continue
        out.append(
            t(
                "status.placed",
                label=label,
                host=where.get("host", "?"),
                pid=where.get("pid", "?"),
                n=where.get("try", 1),
            )
        )
    for name, done in _map_items(r).items():  # a map step's items: how many are done
        out.append(t("status.map_items", step=name, done=done))
    out += ["   " + line for line in report_lines(r.reuse)]  # seed 004: what was reused, and why
    if f.commands:
        out.append(t("status.commands", commands="  ·  ".join(f.commands)))
    if f.resume_command:
        line, export = resume_line(f.resume_command)
        out.append(t("status.resume", cwd=shlex.quote(r.cwd or "."), command=line))
        if export is not None:  # the URL given had a password: it is taken from FLOWER_STATE
            out.append(t("state.export", url=export))  # defined with resume_line
        elif lacks_password(f.resume_command):  # a record from before the export line
            out.append(t("state.no_password"))  # defined with lacks_password
    return out


def _map_items(r: FlowerRecord) -> dict[str, int]:
    """Map steps of the run and how many of their items (``name[i]``) are done."""
    out: dict[str, int] = {}
    for label in r.completed:
        head, bracket, rest = label.partition("[")
        if bracket and rest.endswith("]") and rest[:-1].isdigit():
            out[head] = out.get(head, 0) + 1
    return out


def _consequence(d: dict[str, str]) -> str:
    if "does not have" in d["problem"]:
        return t("status.gone_fresh")
    return t("status.set_aside_fresh")


def _row_line(row: dict[str, Any]) -> str:
    return t(
        "status.row",
        mark="+" if row.get("ok") else "x",
        step=row.get("step"),
        took=float(row.get("duration_s") or 0),
        cost=float(row.get("cost_usd") or 0),
        attempts=row.get("attempts"),
        session=row.get("session_id") or "-",
        run=row.get("run"),
        error=f"  {row.get('error')}" if row.get("error") else "",
    )


def dur(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"
